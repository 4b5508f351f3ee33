"""Files and directories: atomic writes (a temporary name, then a rename), checksums, paths kept inside a directory, locks.

A crash (or Ctrl-C, or a full disk) while writing never leaves a half-written file under the final name:
the reader sees the old content or the new, never a mix. Files keep the user's umask (0644 under the
usual 022), unlike ``tempfile.mkstemp``'s private 0600.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cramkit.errors import CramkitError


def _umask_mode(base: int) -> int:
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _umask_mode(0o666))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` (file or directory) to write; on success it replaces
    ``path`` (an old directory there is removed); on any failure it is deleted."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if path.is_dir() and not path.is_symlink():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        _remove(tmp)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists() or p.is_symlink():
        p.unlink(missing_ok=True)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def inside(root: str | os.PathLike, name: str) -> Path:
    """``root / name`` if it stays inside ``root`` (no absolute path, no ``..``, no escaping link), else
    a ValueError; for names read from files."""
    root_r = Path(root).resolve()
    target = (root_r / name).resolve()
    if Path(name).is_absolute() or (target != root_r and root_r not in target.parents):
        raise ValueError(f"{name!r} points outside {root}")
    return target


@contextlib.contextmanager
def dir_lock(directory: str | os.PathLike, what: str = "--out") -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` (``fcntl.flock`` on ``directory/.lock``) while the body runs.

    A second cramkit process on the same run directory gets one clear error instead of both writing
    checkpoints and metrics into it. The lock dies with its process (kill -9 included): no stale lock."""
    import fcntl

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, _umask_mode(0o666))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            raise CramkitError(
                f"{what} {directory} is in use by another cramkit process (pid {other}); wait for it to finish "
                "(or stop it), or choose another directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def claim_dir(directory: str | os.PathLike, file_name: str, settings: Any, what: str) -> bool:
    """Record ``settings`` (JSON) in ``directory/file_name``, or check that they equal those recorded there,
    so that a rerun continues the work of the same settings and never mixes another's into it. Returns
    whether they were recorded before; a CramkitError naming the fix when they differ."""
    directory = Path(directory)
    file = directory / file_name
    if not file.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        write_json_atomic(file, settings)
        return False
    try:
        before = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        before = None
    if before != json.loads(json.dumps(settings)):
        raise CramkitError(
            f"--out {directory} holds {what} with other settings ({file}); choose another --out, or delete "
            f"{directory} to start over"
        )
    return True
