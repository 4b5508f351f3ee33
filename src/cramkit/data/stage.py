"""Staging a token store from a shared file system (Lustre, Ceph, NFS) to a node-local cache.

``data.stage=local`` copies the store's files once per node into ``data.stage_dir`` and trains on the copy:
sequential reads in large blocks instead of small random page faults over the network. Local rank 0 of
each node copies while the node's other ranks wait; every process then opens the copy.

- Each file is read once, in ``BLOCK``-byte blocks, hashed (sha256) as it is read, written to a hidden
  temporary name and renamed when complete: a process killed during staging leaves no file that looks
  staged (the next run copies it again). Its sha256 is checked against the one the store's NAME.json
  records (`cramkit data build` records them); a store without checksums is hashed as it is copied and
  the hash kept with the source's size and mtime.
- The cache folder of a store (``STAGE_DIR/<hash of its path>``) holds ``stage.json``: per file the
  source's size, mtime and sha256 and the copy's size and mtime. A file whose source and copy still match
  it is reused without reading the shared file system; a copy changed since it was made is copied again.
- The cache is cleaned by size: other stores' copies go, least recently used first, when
  ``data.stage_max_size`` would be exceeded or the disk lacks room.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cramkit.data.tokenstore import TokenStore
from cramkit.errors import CramkitError
from cramkit.io import json_loads, json_text
from cramkit.progress import Progress
from cramkit.runtime import resolve_device, torchrun

BLOCK = 16 << 20  # bytes per read from the shared file system
RECORD = "stage.json"
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 10**3, "m": 10**6, "g": 10**9})


def parse_size(text: str, what: str) -> int:
    """``"1GB"`` -> 10**9, ``"512MiB"`` -> 2**29, ``"4096"`` -> 4096 (bytes); CramkitError naming ``what``."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS or float(m.group(1)) * _UNITS[unit] < 1:
        raise CramkitError(f"{what} {text!r} is not a size; give e.g. 1GB, 512MiB or a number of bytes")
    return int(float(m.group(1)) * _UNITS[unit])


def default_stage_dir() -> Path:
    """$CRAMKIT_STAGE_DIR, else ~/.cache/cramkit/stage."""
    return Path(os.environ.get("CRAMKIT_STAGE_DIR") or Path.home() / ".cache" / "cramkit" / "stage")


def _gb(n: float) -> str:
    """Bytes in GB, or MB / kB when smaller."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n / 1e3:,.1f} kB"


def _not_writable(where: Path, exc: OSError) -> CramkitError:
    return CramkitError(
        f"data.stage_dir {where} is not writable ({exc.strerror or exc}); give a writable node-local "
        "directory with --set data.stage_dir=DIR (or $CRAMKIT_STAGE_DIR), or train in place with data.stage=none"
    )


def _read_json(path: Path) -> dict:
    try:
        data = json_loads(json_text(path))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def _entry_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def _make_room(root: Path, keep: Path, need: int, max_size: int | None) -> None:
    """Remove other stores' copies, least recently used first, until ``need`` more bytes fit."""
    entries = []
    for d in root.iterdir():
        if d.is_dir() and d != keep and (d / RECORD).is_file():
            entries.append((_read_json(d / RECORD).get("last_used", 0), d))
    entries.sort()
    used = sum(_entry_size(d) for _, d in entries) + _entry_size(keep)

    def fits() -> bool:
        return (max_size is None or used + need <= max_size) and shutil.disk_usage(root).free >= need

    while not fits() and entries:
        _, d = entries.pop(0)
        with open(d / ".lock", "a+") as lock:  # not while another process is staging into it
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            size = _entry_size(d)
            shutil.rmtree(d, ignore_errors=True)
        used -= size
        print(f"cramkit: removed the staged copy {d} ({_gb(size)}, least recently used)", file=sys.stderr)
    if not fits():
        free = shutil.disk_usage(root).free
        limit = f"data.stage_max_size {_gb(max_size)}, " if max_size is not None else ""
        raise CramkitError(
            f"data.stage_dir {root} is too small for the token store: staging needs {_gb(need)} more, "
            f"{limit}{_gb(free)} free on that disk (other staged stores already removed); free space, "
            f"point data.stage_dir at a larger node-local disk, {'raise data.stage_max_size, ' if limit else ''}"
            "or set data.stage=none"
        )


def _fresh(rec: dict | None, src: os.stat_result, copy: Path, want: str | None) -> bool:
    """Whether the copy recorded in ``rec`` is complete and of the source as it is now."""
    if not rec or not copy.is_file():
        return False
    st = copy.stat()
    return (
        rec.get("source") == [src.st_size, src.st_mtime_ns]
        and rec.get("copy") == [st.st_size, st.st_mtime_ns]
        and (want is None or rec.get("sha256") == want)
    )


def _copy(src: Path, tmp: Path, progress: Progress) -> str:
    """Copy ``src`` to ``tmp`` in large blocks, flushed to disk; the sha256 of what was read."""
    sha = hashlib.sha256()
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    with open(src, "rb", buffering=0) as fin, open(tmp, "wb") as fout:
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fin.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while n := fin.readinto(buf):
            sha.update(view[:n])
            fout.write(view[:n])
            progress.update(n)
        fout.flush()
        os.fsync(fout.fileno())
    return "sha256:" + sha.hexdigest()


def stage(store: TokenStore, stage_dir: str | os.PathLike | None = None, max_size: int | None = None) -> Path:
    """Copy ``store``'s files to the node-local ``stage_dir`` (once per node); the staged prefix.

    Local rank 0 copies; the node's other ranks wait until it has. Raises CramkitError (one line) when the
    cache cannot be written, is too small, or a file does not match its recorded checksum.
    """
    root = Path(stage_dir).expanduser() if stage_dir else default_stage_dir()
    source = store.prefix.resolve()
    folder = root / hashlib.sha256(str(source).encode()).hexdigest()[:16]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock_file = open(folder / ".lock", "a+")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise _not_writable(root, exc) from None
    files = store.files()
    want = store.meta.get("checksums") or {}
    waited = False
    with lock_file:
        while True:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            record = _read_json(folder / RECORD)
            recs = record.get("files", {}) if record.get("source") == str(source) else {}
            try:
                stats = {f: (source.parent / f).stat() for f in files}
            except FileNotFoundError as exc:
                raise CramkitError(
                    f"token store file {exc.filename} disappeared: the shared store changed under this job "
                    "(rebuilt or removed); rerun when nothing writes to it"
                ) from None
            todo = [f for f in files if not _fresh(recs.get(f), stats[f], folder / f, want.get(f))]
            if not todo or torchrun().local_rank == 0:
                break
            fcntl.flock(lock_file, fcntl.LOCK_UN)  # local rank 0 copies; the others wait for it
            if not waited:
                print(f"cramkit: waiting for local rank 0 to stage {source}", file=sys.stderr, flush=True)
                waited = True
            time.sleep(0.5)
        try:
            _stage_files(store, source, folder, root, todo, recs, stats, want, max_size)
        except OSError as exc:
            if exc.filename and not str(exc.filename).startswith(str(root)):
                raise  # opening a file of the shared store failed: not the cache's fault
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise CramkitError(
                    f"data.stage_dir {root}: the disk filled up while staging {source} ({exc.strerror}); "
                    "free space, set data.stage_max_size below the disk's size, point data.stage_dir at a "
                    "larger node-local disk, or set data.stage=none"
                ) from None
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise _not_writable(root, exc) from None
            raise
        finally:
            for f in files:  # a copy interrupted now is not kept half-written
                with contextlib.suppress(FileNotFoundError):
                    (folder / f".{f}.part").unlink()
    return folder / source.name


def _stage_files(
    store: TokenStore,
    source: Path,
    folder: Path,
    root: Path,
    todo: list[str],
    recs: dict,
    stats: dict[str, os.stat_result],
    want: dict[str, str],
    max_size: int | None,
) -> None:
    """Copy the files in ``todo`` (room made first, each verified), then record the use in stage.json."""
    record = {"source": str(source), "files": recs}
    if todo:
        need = sum(stats[f].st_size for f in todo)
        for f in todo:
            with contextlib.suppress(FileNotFoundError):
                stale = folder / f
                if f in recs and stale.is_file():
                    print(
                        f"cramkit: the staged copy {stale} changed since it was staged or its source "
                        "changed: copying it again",
                        file=sys.stderr,
                    )
                stale.unlink()
        _make_room(root, folder, need, max_size)
        progress = Progress(f"staging {source.name}", need, unit="B")
        t0 = time.perf_counter()
        try:
            for f in todo:
                src, part = source.parent / f, folder / f".{f}.part"
                sha = _copy(src, part, progress)
                after = src.stat()
                if want.get(f) is not None and sha != want[f]:
                    raise CramkitError(
                        f"token store file {src} does not match the checksum its {store.prefix.name}.json records "
                        f"({sha[:20]}... read, {want[f][:20]}... recorded): the shared store changed under this "
                        "job (rebuilt, or still being written) or is damaged; rerun when nothing writes to it, "
                        "or rebuild it with `cramkit data build`"
                    )
                if (after.st_size, after.st_mtime_ns) != (stats[f].st_size, stats[f].st_mtime_ns):
                    raise CramkitError(
                        f"token store file {src} changed while it was being staged (size or mtime): the shared "
                        "store was rewritten under this job; rerun when nothing writes to it"
                    )
                os.replace(part, folder / f)  # only a complete, verified copy takes the file's name
                st = (folder / f).stat()
                recs[f] = {
                    "source": [after.st_size, after.st_mtime_ns],
                    "copy": [st.st_size, st.st_mtime_ns],
                    "sha256": sha,
                }
                _write_json(folder / RECORD, {**record, "last_used": time.time()})
        finally:
            progress.close()
        dt = time.perf_counter() - t0
        print(
            f"cramkit: staged {source} ({_gb(need)}, {len(todo)} files) to {folder} in {dt:.1f}s "
            f"({need / max(dt, 1e-9) / 1e6:,.0f} MB/s)",
            file=sys.stderr,
        )
    elif torchrun().local_rank == 0:
        print(f"cramkit: using the staged copy of {source} in {folder}", file=sys.stderr)
    _write_json(folder / RECORD, {**record, "last_used": time.time()})


def cached_index(store: TokenStore, key: dict, compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``compute()`` (arrays derived from the store's index), saved beside a staged copy and loaded from
    there by later runs: keyed by the sha256 of the store's files and ``key`` (the settings it depends on).
    Computed each time for a store read where it lies."""
    record = _read_json(store.prefix.parent / RECORD) if store.staged else {}
    sums = sorted(r.get("sha256", "") for r in record.get("files", {}).values())
    if not sums:
        return compute()
    name = hashlib.sha256(json.dumps([sums, key], sort_keys=True).encode()).hexdigest()[:16]
    path = store.prefix.parent / f"index-{name}.npz"
    with (
        contextlib.suppress(OSError, ValueError, EOFError, zipfile.BadZipFile),
        np.load(path, allow_pickle=False) as saved,
    ):
        return {k: saved[k] for k in saved.files}
    arrays = compute()
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.npz")
    with contextlib.suppress(OSError):  # a cache that cannot be written is only slower
        np.savez(tmp, **arrays)  # type: ignore[arg-type]  # numpy's stub: **kwds would also meet allow_pickle
        os.replace(tmp, path)
    return arrays


def open_store(store: TokenStore, *, stage_to: str | None, stage_dir: str, max_size: str, mmap: bool) -> TokenStore:
    """The store to train on: ``store`` itself, or its node-local copy (``stage_to == "local"``),
    memory-mapped or read with pread (pinned buffers when CUDA is present)."""
    pin = not mmap and resolve_device("auto").type == "cuda"  # runtime's rule: CUDA whenever it is there
    if stage_to == "local":
        limit = parse_size(max_size, "data.stage_max_size") if max_size else None
        staged = TokenStore(stage(store, stage_dir, limit), mmap=mmap, pin_memory=pin)
        staged.verified = bool(store.meta.get("checksums"))
        staged.staged = True
        return staged
    if mmap and store.mmap:
        return store
    return TokenStore(store.prefix, mmap=mmap, pin_memory=pin)
