"""The test zoo: tiny artefacts made by the real commands once, shared by every test, worker and tier.

An artefact (a pretraining run, a fine-tuned classifier, an export) is built by ``artefact(name, recipe,
build)`` into ``.pytest_cache/zoo/NAME-RECIPE-N`` (or ``$CRAMKIT_TEST_ZOO``), keyed by what it depends on:
RECIPE hashes the name, the recipe (which names the artefacts it is built from) and the libraries' versions,
and the build records the repository files it depended on (``.zoo-deps.json``): every file whose code ran
while it was built, every module it imported, and what those modules import at their top. The artefact is
used again while those files are unchanged, so an edit to the server does not rebuild the pretraining run.
pytest-xdist's workers wait on one lock per artefact, so each is built once per machine, not once per
worker or per module. A build that fails leaves nothing behind. Tests must treat an artefact as read-only.
"""

from __future__ import annotations

import ast
import builtins
import fcntl
import functools
import hashlib
import json
import os
import secrets
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ROOT = Path(os.environ.get("CRAMKIT_TEST_ZOO", REPO / ".pytest_cache" / "zoo"))
DONE = ".zoo-done"
DEPS = ".zoo-deps.json"
KEEP = 3  # versions of one artefact kept (most recently used first): a second checkout's tests keep theirs
SNAPSHOT_ENV = "CRAMKIT_TEST_ZOO_FILES"  # set by conftest's pytest_configure for the whole session


@functools.cache
def snapshot() -> dict[str, str]:
    """The hash of every source file of the repository (cramkit's and the tests'), once per session: the
    controller's, passed to xdist workers through the environment, so that every worker judges artefacts by
    the same files even if one is saved while the tests run."""
    if os.environ.get(SNAPSHOT_ENV):
        return json.loads(os.environ[SNAPSHOT_ENV])
    files = [f for top in ("src", "tests") for ext in ("py", "yaml") for f in (REPO / top).rglob(f"*.{ext}")]
    return {str(f.relative_to(REPO)): hashlib.sha256(f.read_bytes()).hexdigest()[:16] for f in sorted(files)}


def _recipe_key(name: str, recipe: object) -> str:
    from importlib.metadata import version

    libs = f"{sys.version} torch {version('torch')} tokenizers {version('tokenizers')}"
    return hashlib.sha256(json.dumps([libs, name, recipe], sort_keys=True, default=str).encode()).hexdigest()[:12]


def _current(built: Path) -> bool:
    """Whether ``built`` is a finished artefact whose recorded files are all as they are now."""
    try:
        deps = json.loads((built / DEPS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    files = snapshot()
    return (built / DONE).is_file() and all(files.get(path) == digest for path, digest in deps.items())


def _versions(name: str, key: str | None = None) -> Iterator[Path]:
    pattern = f"{name}-{key}-*" if key else f"{name}-*-*"
    return (p for p in ROOT.glob(pattern) if p.is_dir() and p.name.count("-") == name.count("-") + 2)


def artefact(name: str, recipe: object, build: Callable[[Path], object]) -> Path:
    """The directory ``build(path)`` makes for ``name`` and ``recipe`` (JSON-able), built at most once while
    the files it depends on are unchanged."""
    key = _recipe_key(name, recipe)
    found = next((p for p in _versions(name, key) if _current(p)), None)
    if found is not None:
        return _used(found)
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / f"{name}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = next((p for p in _versions(name, key) if _current(p)), None)
        if found is not None:  # another worker built it while this one waited
            return _used(found)
        for dead in _versions(name, key):  # a build that died (builds happen only under this lock)
            if not (dead / DONE).is_file():
                shutil.rmtree(dead, ignore_errors=True)
        final = ROOT / f"{name}-{key}-{secrets.token_hex(4)}"
        try:
            with _tracing() as ran:
                build(final)
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
        (final / DEPS).write_text(json.dumps(_depends_on(ran), indent=1, sort_keys=True), encoding="utf-8")
        (final / DONE).write_text(key + "\n", encoding="utf-8")
        _prune(name)
    return final


def _used(built: Path) -> Path:
    (built / DONE).touch()  # most recently used: kept longest
    return built


def _prune(name: str) -> None:
    """Keep the ``KEEP`` most recently used versions of ``name``."""
    done = sorted((p for p in _versions(name) if (p / DONE).is_file()), key=lambda p: -(p / DONE).stat().st_mtime)
    for old in done[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


class _Ran:
    """What a build ran: the code objects called (``sys.setprofile``, every thread it starts) and the modules
    its import statements named (``builtins.__import__``; a module imported before the build is named too)."""

    def __init__(self) -> None:
        self.codes: set[Any] = set()
        self.imported: set[str] = set()

    def profile(self, frame: Any, event: str, arg: object) -> None:
        if event == "call":
            self.codes.add(frame.f_code)

    def files(self) -> set[Path]:
        named = {m for m in self.imported if m in sys.modules}
        found = {Path(c.co_filename) for c in self.codes}
        found |= {Path(f) for m in named if (f := getattr(sys.modules[m], "__file__", None))}
        return {f.resolve() for f in found if f.is_absolute() and f.resolve().is_relative_to(REPO)}


class _tracing:
    def __enter__(self) -> _Ran:
        self.ran = ran = _Ran()
        self.real_import = real = builtins.__import__

        def recording(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
            module = real(name, globals, locals, fromlist, level)
            if level == 0:
                ran.imported.add(name)
                ran.imported.update(f"{name}.{f}" for f in fromlist or ())
            return module

        builtins.__import__ = recording
        sys.setprofile(ran.profile)
        threading.setprofile(ran.profile)
        return ran

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        builtins.__import__ = self.real_import


def _top_imports(path: Path) -> set[str]:
    """The modules ``path`` imports at its top (a constant read from one runs none of its code)."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            pending += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
    return names


def _depends_on(ran: _Ran) -> dict[str, str]:
    """Every repository file the build depended on, with its hash in this session's snapshot."""
    files = ran.files()
    tops = {m for f in files for m in _top_imports(f) if m in sys.modules}
    files |= {Path(p).resolve() for m in tops if (p := getattr(sys.modules[m], "__file__", None))}
    snap = snapshot()
    rel = (str(f.relative_to(REPO)) for f in files if f.is_relative_to(REPO))
    deps = {r: snap[r] for r in sorted(rel) if r in snap}
    presets = {r: h for r, h in snap.items() if r.startswith("src/") and r.endswith(".yaml")}  # read as data
    return deps | presets | {"tests/zoo.py": snap.get("tests/zoo.py", "")}
