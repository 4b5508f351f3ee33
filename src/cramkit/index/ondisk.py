"""An IVF index that never has to be in one process: trained once on a sample, filled part by part (in
parallel processes, or by ``--shard i/N`` runs on several machines sharing ``--out``), merged into Faiss's
on-disk inverted lists (one ``lists.ivfdata`` file) and opened memory-mapped.

The work folder (``IDX/.build/ondisk/``)::

    prepared.json            the build's settings and everything the manifest needs (written after training)
    trained.index            the empty, trained IVF index (coarse centroids + SQ8/PQ codebooks)
    held_out.npy             rows kept out of the parts: the queries recall is tuned on, added after tuning
    part-PPPPP-of-QQQQQ.index   one filled part (rows p*n/Q .. (p+1)*n/Q of the vectors), written under a
                             temporary name and renamed: a finished part is never built again
    part-....json            its rows, seconds and the peak RSS of the process that filled it
    part-....lock            claimed while being filled (flock: it dies with its process, kill -9 included)

Shard ``i`` of ``N`` fills the parts ``p`` with ``p % N == i``; whoever finds every part finished merges
them (under the index folder's lock). The merged lists keep each list's entries in row order, the order a
single process adds them in, so the result does not depend on how many parts or processes built it.
"""

from __future__ import annotations

import contextlib
import errno
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.errors import CramkitError
from cramkit.index import ann
from cramkit.index.checks import validate_faiss_index
from cramkit.io import disk_problem, file_lock, json_loads, read_json_object, write_json_atomic
from cramkit.runtime import die_with_parent

PART_ROWS = 2_000_000  # rows per part at most: a part is in one process's memory while it is filled
PREPARED = "prepared.json"
TRAINED = "trained.index"
HELD_OUT = "held_out.npy"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def peak_rss_mb() -> float | None:
    """This process's peak resident set (VmHWM), MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def part_name(p: int, parts: int) -> str:
    return f"part-{p:05d}-of-{parts:05d}"


def part_count(n: int, workers: int, shards: int) -> int:
    return max(1, workers, shards, math.ceil(n / PART_ROWS))


def read_rows(path: Path, a: int, b: int) -> np.ndarray:
    """Rows ``a:b`` of the float32 ``.npy`` at ``path``, read (not memory-mapped: the pages do not stay in the
    process, so its memory stays bounded by one block however many rows it reads)."""
    mm = np.load(path, mmap_mode="r", allow_pickle=False)  # for its header only: no page of it is touched
    if mm.dtype != np.float32 or mm.ndim != 2 or not mm.flags.c_contiguous:
        raise CramkitError(f"{path}: not a float32 [n, dim] array; rebuild the index")
    d, offset = int(mm.shape[1]), int(mm.offset)
    del mm
    with open(path, "rb") as f:
        f.seek(offset + a * d * 4)
        return np.fromfile(f, dtype=np.float32, count=(b - a) * d).reshape(-1, d)


@contextlib.contextmanager
def waiting_lock(path: Path, what: str, log: Callable[[str], None] = _log) -> Iterator[None]:
    """``file_lock`` that waits for another process to release it (saying so once) instead of failing."""
    said = False
    while True:
        held = contextlib.ExitStack()
        try:  # only taking the lock waits: an error of the work inside it is the work's own
            held.enter_context(file_lock(path, lambda pid: pid))
        except CramkitError as exc:
            if not said:
                log(f"waiting for {what} (held by pid {exc})")
                said = True
            time.sleep(0.5)
            continue
        with held:
            yield
        return


# ---------------------------------------------------------------------------------------------- prepare


def read_prepared(work: Path, settings: dict[str, Any], *, overwrite: bool) -> dict[str, Any] | None:
    """The prepared state of an on-disk build in ``work`` for these ``settings`` (None: none yet). Another
    build's state is an error, or discarded with ``overwrite``."""
    file = work / PREPARED
    if not file.is_file():
        return None
    prep = read_json_object(file, "; remove it or pass --overwrite")
    if prep.get("settings") != json_loads(_json(settings)):
        if overwrite:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
            return None
        raise CramkitError(
            f"{work} holds a part-built on-disk index of other settings; rerun with the same source and options to "
            "finish it, or pass --overwrite to start again"
        )
    return prep


def _json(obj: Any) -> str:
    import json

    return json.dumps(obj, sort_keys=True)


def prepare(
    vectors_path: Path, plan: dict[str, Any], work: Path, *, parts: int, seed: int = 0, log: Callable = _log
) -> None:
    """Choose the held-out rows and train the index, exactly as ``ann.build_and_tune`` does in RAM (the same
    random draws), into ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    vectors = np.load(vectors_path, mmap_mode="r", allow_pickle=False)
    rng = np.random.default_rng(seed)
    qids = ann.held_out(rng, len(vectors))
    index = ann.train_ivf(vectors, plan, rng, log)
    tmp = work / f".{TRAINED}.tmp-{os.getpid()}"
    ann.write(index, tmp)
    os.replace(tmp, work / TRAINED)
    np.save(work / HELD_OUT, qids.astype(np.int64), allow_pickle=False)
    log(f"on-disk build: {len(vectors)} vectors in {parts} part(s) of <= {math.ceil(len(vectors) / parts)} rows")


# ------------------------------------------------------------------------------------------------- fill


def part_rows(n: int, p: int, parts: int) -> tuple[int, int]:
    return p * n // parts, (p + 1) * n // parts


def fill_part(work: str, vectors_path: str, p: int, parts: int, threads: int = 0) -> dict[str, Any] | None:
    """Add part ``p``'s rows (the held-out ones left out) to a copy of the trained index and write it; its
    record, or None when it is finished already or another process is filling it."""
    faiss = ann._faiss()
    if threads:
        faiss.omp_set_num_threads(threads)
    wd, name = Path(work), part_name(p, parts)
    final = wd / f"{name}.index"
    if final.is_file():
        return None
    try:
        with file_lock(wd / f"{name}.lock", lambda pid: pid):
            if final.is_file():
                return None
            t0 = time.perf_counter()
            index = faiss.read_index(str(wd / TRAINED))
            qids = np.load(wd / HELD_OUT, allow_pickle=False)
            n = int(np.load(vectors_path, mmap_mode="r", allow_pickle=False).shape[0])
            a, b = part_rows(n, p, parts)
            added = 0
            for s in range(a, b, 65536):
                e = min(s + 65536, b)
                rows = np.arange(s, e, dtype=np.int64)
                keep = ~np.isin(rows, qids, assume_unique=True)
                block = read_rows(Path(vectors_path), s, e)[keep]
                index.add_with_ids(np.ascontiguousarray(block), rows[keep])
                added += int(keep.sum())
            tmp = wd / f".{name}.index.tmp-{os.getpid()}"
            ann.write(index, tmp)
            rec = {
                "part": p,
                "parts": parts,
                "rows": [a, b],
                "added": added,
                "seconds": round(time.perf_counter() - t0, 2),
                "peak_rss_mb": peak_rss_mb(),
                "pid": os.getpid(),
            }
            write_json_atomic(wd / f"{name}.json", rec)
            os.replace(tmp, final)  # last: the part counts as finished only once its record is there too
            return rec
    except CramkitError:
        return None  # another process holds this part


def _fill_one(args: tuple[str, str, int, int, int]) -> tuple[int, dict[str, Any] | None]:
    return args[2], fill_part(*args)


def missing_parts(work: Path, parts: int) -> list[int]:
    return [p for p in range(parts) if not (work / f"{part_name(p, parts)}.index").is_file()]


def fill_parts(
    work: Path, vectors_path: Path, todo: list[int], parts: int, *, workers: int = 1, log: Callable = _log
) -> None:
    """Fill the parts ``todo`` (those not finished) with ``workers`` processes; progress with rate and ETA."""
    todo = [p for p in todo if p in set(missing_parts(work, parts))]
    if not todo:
        return
    from cramkit.runtime import cpu_cores

    workers = max(1, min(workers, len(todo)))
    threads = max(1, cpu_cores() // workers)
    n = int(np.load(vectors_path, mmap_mode="r", allow_pickle=False).shape[0])
    total_rows = sum(part_rows(n, p, parts)[1] - part_rows(n, p, parts)[0] for p in todo)
    jobs = [(str(work), str(vectors_path), p, parts, threads if workers > 1 else 0) for p in todo]
    t0, rows_done, done = time.perf_counter(), 0, 0
    if workers == 1:
        results: Any = map(_fill_one, jobs)
        pool = None
    else:  # spawn: a forked Faiss/OpenMP runtime can hang the child
        pool = multiprocessing.get_context("spawn").Pool(workers, initializer=die_with_parent, initargs=(os.getpid(),))
        results = pool.imap_unordered(_fill_one, jobs)
    try:
        for p, rec in results:
            a, b = part_rows(n, p, parts)
            rows_done += b - a
            done += 1
            dt = time.perf_counter() - t0
            rate = rows_done / dt if dt > 0 else 0.0
            eta = (total_rows - rows_done) / rate if rate > 0 else 0.0
            what = (
                f"{rec['seconds']:.1f}s, peak RSS {rec['peak_rss_mb']} MiB"
                if rec
                else "finished or claimed by another process"
            )
            log(f"part {p + 1}/{parts} ({what}); {done}/{len(todo)} parts, {rate:,.0f} vectors/s, ETA {eta:.0f}s")
    finally:
        if pool is not None:
            pool.close()
            pool.join()


# ------------------------------------------------------------------------------------------------ merge


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Faiss's C++ prints to stdout when it grows the list file; keep the command's stdout its own."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _merge_lists(faiss: Any, ivf: Any, parts: list[Any], path: Path) -> int:
    """The inverted lists ``parts`` merged, list by list in their order, into a new list file at ``path``
    (Faiss's ``OnDiskInvertedLists`` layout: each list's codes then its ids), installed in ``ivf``; the entries.

    The file's blocks are allocated (posix_fallocate) before a byte of it is written through its memory map:
    a disk that cannot hold it is one line here, never SIGBUS while Faiss writes a sparse page."""
    nlist, cs = int(ivf.nlist), int(ivf.code_size)
    per = np.array([[il.list_size(j) for j in range(nlist)] for il in parts], dtype=np.uint64).reshape(-1, nlist)
    sizes = np.ascontiguousarray(per.sum(axis=0), dtype=np.uint64)
    ntotal, total = int(sizes.sum()), int(sizes.sum()) * (cs + 8)
    path.unlink(missing_ok=True)
    on_disk = faiss.OnDiskInvertedLists(nlist, cs, str(path))
    with _stdout_to_stderr():
        on_disk.update_totsize(max(total, 1))  # creates the file (sparse) and maps it; nothing written yet
    try:
        _allocate(path, total)
    except BaseException:
        del on_disk
        path.unlink(missing_ok=True)
        raise
    on_disk.set_all_lists_sizes(faiss.swig_ptr(sizes))  # offsets as merge_from_multiple lays them out
    for j in range(nlist):
        at = 0
        for i, il in enumerate(parts):
            n = int(per[i, j])
            if n:
                on_disk.update_entries(j, at, n, il.get_ids(j), il.get_codes(j))
                at += n
    ivf.replace_invlists(on_disk, True)
    on_disk.this.disown()
    return ntotal


def _allocate(path: Path, size: int) -> None:
    """Allocate ``size`` bytes of ``path`` for real; a full disk is one line (the file is removed by the caller)."""
    try:
        with open(path, "r+b") as f:
            try:
                os.posix_fallocate(f.fileno(), 0, max(size, 1))
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                # a file system without fallocate: at least refuse what the free space cannot hold
                st = os.statvfs(path)
                if st.f_bavail * st.f_frsize < size:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from None
    except OSError as exc:
        problem = disk_problem(exc) or exc.strerror or str(exc)
        raise CramkitError(
            f"cannot write {path} ({size / 2**20:,.1f} MiB, the merged inverted lists): {problem}; free space there "
            "and run the same command again: the filled parts are kept, and any index already in --out is untouched"
        ) from None


def merge(
    work: Path, vectors_path: Path, plan: dict[str, Any], data: Path, *, target: float, parts: int, log: Callable = _log
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Merge the finished parts into ``data/lists.ivfdata``, tune on the held-out rows, add them, write
    ``data/faiss.index``; (search params, recall, build record)."""
    faiss = ann._faiss()
    t0 = time.perf_counter()
    vectors = np.load(vectors_path, mmap_mode="r", allow_pickle=False)
    qids = np.load(work / HELD_OUT, allow_pickle=False)
    index = faiss.read_index(str(work / TRAINED))
    ivf = faiss.extract_index_ivf(index)
    opened = []  # the parts' indexes, kept alive while their memory-mapped lists are read
    lists = []
    records = []
    for p in range(parts):
        name = part_name(p, parts)
        part = faiss.read_index(str(work / f"{name}.index"), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        validate_faiss_index(part, work / f"{name}.index", rows=int(part.ntotal), dim=int(index.d))
        opened.append(part)
        lists.append(faiss.extract_index_ivf(part).invlists)
        records.append(read_json_object(work / f"{name}.json", ""))
    # the held-out rows go in last (where an in-RAM build adds them after tuning): a list file is never grown
    # after the merge, and tuning leaves them out of the results instead
    held = faiss.read_index(str(work / TRAINED))
    ann.add(held, vectors, qids)
    opened.append(held)
    lists.append(faiss.extract_index_ivf(held).invlists)
    ivfdata = data / plan.get("ivfdata", ann.IVFDATA)
    ntotal = _merge_lists(faiss, ivf, lists, ivfdata)
    ivf.ntotal = index.ntotal = ntotal
    del opened, lists
    t_merge = time.perf_counter() - t0
    log(f"merged {parts} part(s) and the held-out rows, {ntotal} vectors, into {ivfdata.name} in {t_merge:.1f}s")
    params, recall = ann.tune(index, vectors, plan, qids, target=target, log=log, holds_queries=True)
    faiss.downcast_InvertedLists(ivf.invlists).filename = ivfdata.name  # recorded bare: opened beside faiss.index
    ann.write(index, data / "faiss.index")
    del index
    build = {
        "parts": parts,
        "part_seconds": [r.get("seconds") for r in records],
        "part_peak_rss_mb": [r.get("peak_rss_mb") for r in records],
        "merge_seconds": round(t_merge, 2),
        "merge_tune_seconds": round(time.perf_counter() - t0, 2),
        "merge_peak_rss_mb": peak_rss_mb(),
    }
    return params, recall, build
