"""The test zoo: tiny artefacts made by the real commands once, shared by every test, worker and tier.

An artefact (a pretraining run, a fine-tuned classifier, an export) is built by ``artefact(name, recipe,
build)`` into ``.pytest_cache/zoo/NAME-KEY`` (or ``$CRAMKIT_TEST_ZOO``), where KEY hashes cramkit's source,
these helpers and the recipe: a change to any of them builds it again, nothing else does. pytest-xdist's
workers wait on one lock per artefact, so each is built once per machine, not once per worker or per module.
A build that fails leaves nothing behind. Tests must treat an artefact as read-only (copy it to change it).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = Path(os.environ.get("CRAMKIT_TEST_ZOO", REPO / ".pytest_cache" / "zoo"))
DONE = ".zoo-done"
ZOO_KEY_ENV = "CRAMKIT_TEST_ZOO_KEY"  # set by conftest's pytest_configure for the whole session


@functools.cache
def source_key() -> str:
    """A hash of what decides an artefact's bytes: cramkit's source and the tests' build helpers (once per
    session: the controller's, passed to xdist workers through the environment)."""
    if os.environ.get(ZOO_KEY_ENV):
        return os.environ[ZOO_KEY_ENV]
    from importlib.metadata import version

    h = hashlib.sha256(f"{sys.version} torch {version('torch')} tokenizers {version('tokenizers')}".encode())
    here = Path(__file__).parent
    files = sorted((REPO / "src" / "cramkit").rglob("*.py")) + sorted((REPO / "src" / "cramkit").rglob("*.yaml"))
    files += [here / "zoo.py", here / "conftest.py", here / "clirun.py", here / "infer" / "models.py"]
    for f in files:
        if f.is_file():
            h.update(str(f.relative_to(REPO)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def artefact(name: str, recipe: object, build: Callable[[Path], object]) -> Path:
    """The directory ``build(path)`` makes for ``name`` and ``recipe`` (JSON-able), built at most once."""
    key = hashlib.sha256(json.dumps([source_key(), name, recipe], sort_keys=True, default=str).encode()).hexdigest()
    final = ROOT / f"{name}-{key[:16]}"
    if (final / DONE).is_file():
        return final
    ROOT.mkdir(parents=True, exist_ok=True)
    lock_file = ROOT / f"{name}-{key[:16]}.lock"
    with open(lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / DONE).is_file():  # another worker built it while this one waited
            return final
        for stale in ROOT.iterdir():  # older versions of this artefact and their locks, and a build that died
            if not re.fullmatch(re.escape(name) + r"-[0-9a-f]{16}(\.lock)?", stale.name) or stale == lock_file:
                continue
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
        try:
            build(final)
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
        (final / DONE).write_text(key + "\n", encoding="utf-8")
    return final
