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


def test_trace_dev_reads_what_each_checkpoint_rule_would_have_scored(
    tiny_run: Path, real_glue_dir: Path, tmp_path: Path
) -> None:
    """bench/_trace_dev.py scores every dev evaluation of a real few-shot run on the scored split; the rule cramkit
    keeps by (the best dev score, of equal ones the lowest dev loss) is the one whose score the run reports."""
    import cramkit

    sys.path.insert(0, str(BENCH))
    try:
        trace_dev = importlib.import_module("_trace_dev")
    finally:
        sys.path.remove(str(BENCH))
    from cramkit.recipes.finetune_objective import ClassifierObjective

    plain = ClassifierObjective.evaluate
    undo = trace_dev.install()
    assert ClassifierObjective.evaluate is not plain
    try:
        res = cramkit.finetune(
            tiny_run,
            task="glue/sst2",
            data_dir=real_glue_dir,
            few_shot=4,
            splits=1,
            out=tmp_path / "fs",
            min_steps=12,
            eval_every="3steps",
            max_length=48,
            progress=False,
        )
    finally:
        undo()
    assert ClassifierObjective.evaluate is plain  # undone: the rest of the process is not traced
    picks = trace_dev.picks(tmp_path / "fs" / "split-0")
    assert picks is not None and set(picks) == set(trace_dev.RULES)
    assert picks["last"]["step"] == 12 and all(p["full_dev"] <= picks["oracle"]["full_dev"] for p in picks.values())
    assert picks["tie"]["full_dev"] == pytest.approx(res["fewshot"]["per_split"]["0"]["score"], abs=0.01)
    assert trace_dev.picks(tmp_path / "nothing") is None
