"""Values decided in exactly one place (issue 64): the code is searched for a second place deciding them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "cramkit"


def _code_strings(value: str) -> list[str]:
    """Where ``value`` is written as a string in the code (docstrings and help texts aside: a string that is a
    whole statement, or one argument of a call named ``help``, says, it does not decide)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        said = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        said |= {id(k.value) for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords if k.arg == "help"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == value and id(node) not in said:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_the_default_preset_is_written_once() -> None:
    assert _code_strings("tiny-cpu") == ["config.py:" + str(_line("config.py", 'DEFAULT_PRESET = "tiny-cpu"'))]


def _line(module: str, text: str) -> int:
    lines = (PACKAGE / module).read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.startswith(text))


def _functions_writing(prefix: str) -> set[str]:
    """The functions whose code builds a string starting with ``prefix`` (a default folder's name)."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            said = {id(n.value) for n in ast.walk(func) if isinstance(n, ast.Expr)}
            for node in ast.walk(func):
                if isinstance(node, ast.JoinedStr) and node.values and id(node) not in said:
                    head = node.values[0]
                    if isinstance(head, ast.Constant) and str(head.value).startswith(prefix):
                        found.add(f"{path.relative_to(PACKAGE)}:{func.name}")
    return found


def test_the_default_output_folders_are_named_in_one_function_each() -> None:
    assert _functions_writing("eval-") == {"evaluation/__init__.py:results_dir"}
    assert _functions_writing("finetune-") == {"recipes/finetune_request.py:out_dir"}
