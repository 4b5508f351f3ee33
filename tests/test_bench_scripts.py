"""Every bench script still runs: each answers ``--help``, and every cramkit name it imports (at the top or
inside a function, where ``--help`` never reaches) exists, so a rename in src/ cannot break a benchmark in
silence."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import runpy
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))  # _NAME.py: a helper they import


def test_there_are_bench_scripts() -> None:
    assert len(SCRIPTS) >= 30


def _cramkit_imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name or None, line) for every ``import cramkit...`` / ``from cramkit... import name``."""
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == "cramkit"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "cramkit":
            out += [(node.module or "", a.name, node.lineno) for a in node.names]
    return out


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_script_imports_resolve(script: Path) -> None:
    for module, name, line in _cramkit_imports(script):
        try:
            mod = importlib.import_module(module)
            if name is not None and not hasattr(mod, name):
                importlib.import_module(f"{module}.{name}")  # a submodule: `from cramkit.train import checkpoint`
        except ImportError as exc:
            pytest.fail(f"{script.name}:{line} imports {module}{'.' + name if name else ''}, which is gone: {exc}")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_script_answers_help(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(BENCH))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code in (0, None), out.getvalue()
    assert "usage:" in out.getvalue()
