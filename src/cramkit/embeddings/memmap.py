"""Embeddings streamed to a memory-mapped matrix: resumable after a kill, sharded across torchrun processes.

``OUT/embeddings.npy`` float32 [n, dim] and ``OUT/ids.npy`` int64 [n] (row ids) are created first at their
full size; rows are written block by block, and after each block (flushed to disk) the committed-row
counter ``OUT/progress-RANK.json`` is replaced atomically, so a killed job restarts after its last committed
block. ``OUT/state.json`` records what is being embedded (a key over the inputs, the encoder and the pooling);
a different key starts over. ``OUT/embed.json`` is written last: its presence means every row is there.

Under torchrun each process embeds a contiguous range of the rows into the same files (disjoint regions of
one memory map: nothing to merge afterwards); rank 0 writes ``embed.json`` after a barrier.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.embeddings import BLOCK
from cramkit.errors import CramkitError
from cramkit.io import json_loads, json_text, open_memmap, write_json_atomic
from cramkit.meta import meta_int
from cramkit.progress import Progress

DONE_FILE = "embed.json"


def texts_key(texts: Sequence[str], *parts: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p.encode() + b"\0")
    h.update(str(len(texts)).encode())
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def dist_info() -> tuple[int, int]:
    """(rank, world size) under torchrun (``cramkit.runtime``); (0, 1) otherwise."""
    from cramkit.runtime import torchrun

    t = torchrun()
    return t.rank, t.world


def barrier(world: int) -> None:
    if world <= 1:
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    dist.barrier()


def _read_json(path: Path) -> dict | None:
    try:
        data = json_loads(json_text(path))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# the fields of what `cramkit embed` writes: its record (embed.json) and an unfinished job's state.json. A file
# of that name without them is not cramkit's (a user's): it proves nothing and is never taken for a job
RECORD_FIELDS = ("key", "rows", "dim")
STATE_FIELDS = ("key", "rows", "dim", "world_size")


def finished(out: str | os.PathLike, key: str | None = None) -> dict | None:
    """The ``embed.json`` of a complete embedding in ``out`` (with that key, when given), else None (a file of
    that name without the record's fields is none)."""
    done = _read_json(Path(out) / DONE_FILE)
    if done is None or not all(f in done for f in RECORD_FIELDS) or (key is not None and done.get("key") != key):
        return None
    return done


def embed_to_memmap(
    texts: Sequence[str],
    engine: Any,
    out: str | os.PathLike,
    *,
    key: str,
    pooling: str,
    normalize: bool,
    ids: np.ndarray | None = None,
    block: int = BLOCK,
    progress: bool | str = "auto",
    desc: str = "embed",
    meta: dict | None = None,
    alone: bool = False,
    prompt: str = "",
    dimensions: int | None = None,
) -> dict:
    """Embed ``texts`` into ``out/embeddings.npy`` (resuming a matching unfinished job); the ``embed.json``
    record (rows, dim, seconds, examples/s). Every torchrun process calls it; all get the record.
    ``alone``: this process embeds every row itself, whatever torchrun says (a Parquet part: one per process).
    ``prompt``: a text put before each (a model's named prompt, resolved by the caller; part of ``key``).
    ``dimensions``: the vectors cut to their leading ``dimensions``, renormalised (a Matryoshka model's,
    checked by the caller with ``Engine.check_dimensions``; part of ``key``)."""
    out = Path(out)
    rank, world = (0, 1) if alone else dist_info()
    n = len(texts)
    dim = int(dimensions or engine.hidden_size or 0)
    done = finished(out, key)
    if done is not None and (out / "embeddings.npy").is_file() and (done.get("rows"), done.get("dim")) == (n, dim):
        return done
    state = {"key": key, "rows": n, "dim": dim, "world_size": world}
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / DONE_FILE).unlink(missing_ok=True)
        old = _read_json(out / "state.json")
        if old is not None and {k: old.get(k) for k in state} == state and (out / "embeddings.npy").is_file():
            pass  # resume
        else:
            if old is not None and old.get("key") == key and old.get("world_size") != world:
                print(
                    f"{out}: the unfinished embedding ran on {old.get('world_size')} processes, now {world}; "
                    "starting it over",
                    file=sys.stderr,
                )
            for p in out.glob("progress-*.json"):
                p.unlink()
            # the job's state first (a key no job has: it is not resumed): a kill from here on leaves a folder
            # the rerun knows for this command's own (cramkit.outdir), and starts over
            write_json_atomic(out / "state.json", state | {"key": None})
            mm = open_memmap(out / "embeddings.npy", np.float32, (n, dim))
            del mm
            np.save(out / "ids.npy", np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, np.int64))
            write_json_atomic(out / "state.json", state)
    barrier(world)
    start, end = n * rank // world, n * (rank + 1) // world
    prog_file = out / f"progress-{rank}.json"
    prog = _read_json(prog_file) or {}
    committed = 0
    if prog.get("start") == start and prog.get("end") == end:  # rows of this job: a number past them is damage
        fix = f"remove {prog_file} to embed those rows again (or restore it)"
        committed = meta_int(prog, "committed", prog_file, fix, hi=end - start, default=0)
    mm = np.load(out / "embeddings.npy", mmap_mode="r+", allow_pickle=False)
    if mm.shape != (n, dim):
        raise CramkitError(f"{out / 'embeddings.npy'} has shape {mm.shape}, expected {(n, dim)}; remove {out}")
    t0 = time.perf_counter()
    resumed = committed
    bar = Progress(desc, end - start, unit="texts", initial=committed, enabled=progress if rank == 0 else False)
    pos = start + committed
    truncated = 0
    try:  # the bar's line is ended whatever happens: an error is printed on a line of its own
        while pos < end:
            b = min(pos + block, end)
            vecs, cut = engine.embed_truncated(
                list(texts[pos:b]), pooling=pooling, normalize=normalize, prompt=prompt, dimensions=dimensions
            )
            mm[pos:b] = vecs
            truncated += int(cut.sum())
            mm.flush()
            pos = b
            write_json_atomic(prog_file, {"start": start, "end": end, "committed": pos - start})
            bar.to(pos - start)
    finally:
        bar.close()
    del mm
    seconds = time.perf_counter() - t0
    barrier(world)
    record = {
        "key": key,
        "rows": n,
        "dim": dim,
        "pooling": pooling,
        "normalize": bool(normalize),
        "world_size": world,
        "resumed_rows": int(resumed) * world if world > 1 else int(resumed),
        "seconds": round(seconds, 3),
        "truncated": truncated,
        "examples_per_s": round((end - start - resumed) * world / seconds, 2) if seconds > 0 else None,
        **(meta or {}),
    }
    if rank == 0:
        write_json_atomic(out / DONE_FILE, record)
    barrier(world)
    return record
