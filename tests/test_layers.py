"""The import graph of src/cramkit: no circle between modules, nothing imported from a higher layer.

Every ``import`` and ``from ... import`` of a cramkit module is read with ``ast`` (at module level and
inside functions; imports under ``if TYPE_CHECKING:`` are for type checkers only and are skipped). The
layers, lowest first, are those of the design (../shared/DESIGN.md): a module may import from its
own layer and the ones below it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "cramkit"

# lowest first; a module belongs to the longest prefix listed
LAYERS: list[tuple[str, ...]] = [
    # the ground: errors, files, settings, where and how a process computes (runtime; doctor: the machine's
    # measured ceilings, which the engine's progress line reads; peak: the instruction set's theoretical peak
    # bounding them), metadata numbers checked, progress shown, names imported on first use (lazy)
    (
        "cramkit.errors",
        "cramkit.io",
        "cramkit.outdir",
        "cramkit.readback",
        "cramkit.config",
        "cramkit.runtime",
        "cramkit.doctor",
        "cramkit.peak",
        "cramkit.meta",
        "cramkit.progress",
        "cramkit.lazy",
        "cramkit.request",
    ),
    ("cramkit.text",),
    ("cramkit.data", "cramkit.tasks"),
    ("cramkit.model",),
    ("cramkit.rundir",),
    ("cramkit.train",),  # the engine: it imports neither load nor tasks
    ("cramkit.backends",),  # the export formats: cramkit.load opens exports through them; below load and infer
    ("cramkit.loading",),
    ("cramkit.recipes",),  # pretraining, adaptation, fine-tuning, mixtures, suites: run on the engine
    (
        "cramkit.distillation",
        "cramkit.selftraining",
        "cramkit.infer",
        "cramkit.serve",
        "cramkit.embeddings",
        "cramkit.index",
        "cramkit.evaluation",
    ),
    ("cramkit.api",),  # the verbs as Python functions: the one front door, called by the command line
    ("cramkit.commands", "cramkit.cli", "cramkit.__main__"),
]
# the stages that sit side by side above load and train: none reaches into another's privates
STAGES = LAYERS[-3]
# stages of one layer that build on each other, (lower, higher): the lower never imports the higher. The index
# embeds its chunks (embeddings); embedding evaluation embeds, and searches through an index; self-training labels
# text with distillation's teacher
ONE_WAY = [
    ("cramkit.distillation", "cramkit.selftraining"),
    ("cramkit.embeddings", "cramkit.index"),
    ("cramkit.embeddings", "cramkit.evaluation"),
    ("cramkit.index", "cramkit.evaluation"),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every cramkit import in ``path``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, list[str], int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, [], child.lineno) for a in child.names if a.name.split(".")[0] == "cramkit")
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                if base.split(".")[0] != "cramkit":
                    continue
                for alias in child.names:  # `from cramkit.train import checkpoint`: the module itself
                    sub = f"{base}.{alias.name}"
                    out.append((sub, [], child.lineno) if sub in modules else (base, [alias.name], child.lineno))
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return out


def _layer(module: str) -> int | None:
    best, level = -1, None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    return level


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: {target for target, _, _ in _imports(p, modules) if target in modules} for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), and modules importing themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_every_module_has_a_layer() -> None:
    missing = [m for m in _modules() if m != "cramkit" and _layer(m) is None]
    assert not missing, f"add these modules to a layer in tests/test_layers.py: {missing}"


def test_no_import_circle() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "modules that import each other (directly or round a circle): " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def test_nothing_imports_from_a_higher_layer() -> None:
    modules = _modules()
    bad = []
    for module, path in modules.items():
        here = _layer(module)
        if here is None:  # the package itself: the public API, above everything (and imported by users)
            continue
        for target, _, line in _imports(path, modules):
            there = _layer(target)
            if there is not None and there > here:
                bad.append(f"{path.relative_to(SRC)}:{line} {module} imports {target}")
    assert not bad, "imports that run up a layer:\n" + "\n".join(bad)


def test_nothing_imports_the_command_line() -> None:
    modules = _modules()
    bad = []
    for module, path in modules.items():
        if _layer(module) == len(LAYERS) - 1:
            continue
        for target, _, line in _imports(path, modules):
            if target == "cramkit.cli" or target.startswith("cramkit.commands"):
                bad.append(f"{path.relative_to(SRC)}:{line} imports {target}")
    assert not bad, "the command line is imported by:\n" + "\n".join(bad)


def test_stages_keep_out_of_each_others_privates() -> None:
    modules = _modules()
    bad = []
    for module, path in modules.items():
        mine = next((s for s in STAGES if module == s or module.startswith(s + ".")), None)
        if mine is None:
            continue
        for target, names, line in _imports(path, modules):
            theirs = next((s for s in STAGES if target == s or target.startswith(s + ".")), None)
            if theirs is None or theirs == mine:
                continue
            private = [n for n in names if n.startswith("_")]
            if private or any(part.startswith("_") and part != "__init__" for part in target.split(".")):
                bad.append(f"{path.relative_to(SRC)}:{line} {module} takes {private or target} from {theirs}")
    assert not bad, "\n".join(bad)


def test_stages_that_build_on_each_other_point_one_way() -> None:
    modules = _modules()
    bad = []
    for lower, higher in ONE_WAY:
        for module, path in modules.items():
            if not (module == lower or module.startswith(lower + ".")):
                continue
            for target, _, line in _imports(path, modules):
                if target == higher or target.startswith(higher + "."):
                    bad.append(f"{path.relative_to(SRC)}:{line} {module} imports {target} (a stage above it)")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_circle_finder_finds_circles(source: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert _cycles(source) == expected
