"""RETRO neighbours of a token store: for every chunk of the store, its ``k`` nearest chunks of a RETRO index
from other documents, written resumably block by block."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.embeddings import store_text
from cramkit.embeddings.memmap import STATE_FIELDS, embed_to_memmap, texts_key
from cramkit.errors import CramkitError
from cramkit.index import RETRO_CHUNK
from cramkit.index.chunking import document_hashes, save_npy
from cramkit.index.ondisk import peak_rss_mb
from cramkit.index.request import NeighboursRequest
from cramkit.index.search import Index
from cramkit.io import check_out, dir_lock, disk_errors, open_memmap, read_json_object, write_json_atomic
from cramkit.meta import meta_int
from cramkit.progress import Progress
from cramkit.request import verb


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@verb(NeighboursRequest)
def retro_neighbours(request: NeighboursRequest) -> dict[str, Any]:
    """For every ``chunk_tokens`` chunk of ``store``: its ``k`` nearest index chunks from other documents.
    Takes a :class:`~cramkit.index.request.NeighboursRequest` or its fields.

    Writes ``OUT/neighbours.npy`` (int32 [n_chunks, k], index chunk ids, -1 where none), ``OUT/chunks.npy``
    (int64 [n_chunks, 3]: sequence, token start, token end in the store) and ``OUT/neighbours.json`` (last).
    A neighbour is from the same document when its document's token hash equals the query chunk's."""
    with disk_errors(request.out):  # a full disk: one line naming --out, from Python as from the command line
        return _neighbours(request)


def _neighbours(r: NeighboursRequest) -> dict[str, Any]:
    """:func:`retro_neighbours`'s work: the store's chunks embedded (or the index's own vectors), then searched
    block by block."""
    from cramkit.data.tokenstore import TokenStore

    path, store, k, block, progress = r.path, os.fspath(r.store), r.k, r.block, r.progress
    idx = Index(path, device=r.device, max_batch_tokens=r.max_batch_tokens)
    m = idx.manifest
    if m["mode"] != "retro":
        raise CramkitError(f"{path} is a {m['mode']} index; RETRO neighbours need one built with --mode retro")
    k = idx._check_k(k)
    ts = TokenStore(store)
    size = int((m.get("chunking") or {}).get("chunk_tokens") or RETRO_CHUNK)
    spans = store_text.store_chunk_spans(ts, size)
    if len(spans) == 0:
        raise CramkitError(f"token store {store} is empty; nothing to find neighbours for")
    q_hash, cand_hash = _document_hashes(idx, ts, spans, path)
    out = Path(r.out)
    check_out(out, inputs=[path, store], own=MANIFESTS, writes=WRITES, command="cramkit index neighbours")
    # resumable: rows are committed block by block (the memory map flushed, then the count recorded), so a
    # rerun after a kill continues after the last committed block of the same job
    job = {
        "index": str(Path(path).resolve()),
        "data": m["data"],
        "created": m.get("created"),
        "store": str(ts.prefix),
        "chunks": int(len(spans)),
        "k": k,
    }
    progress_file = out / ".neighbours.progress.json"
    with dir_lock(out, "--out"):
        out.mkdir(parents=True, exist_ok=True)
        if not progress_file.exists():  # the folder is this command's from here on: a kill leaves it resumable
            write_json_atomic(progress_file, {"job": job, "done": 0, "dropped": 0})
        (out / "neighbours.json").unlink(missing_ok=True)
        same_store = (
            len(idx) == len(spans)
            and np.array_equal(np.asarray(idx.chunks.table[:, 1:4]), spans)
            and np.array_equal(cand_hash, q_hash)
        )
        if same_store:  # the index was built from this very store: its vectors are the queries
            q = idx.vectors
        else:
            q = _embed_store_chunks(idx, ts, spans, out / ".embed", r.store_tokenizer, block=block, progress=progress)
        result, start, dropped = _resume(out, job, progress_file, len(spans), k)
        bounds = _store_shard_bounds(ts, spans)

        def commit(done: int, dropped: int) -> None:
            write_json_atomic(progress_file, {"job": job, "done": done, "dropped": dropped})

        t0 = time.perf_counter()
        dropped = _fill_neighbours(
            idx,
            q,
            result,
            q_hash,
            cand_hash,
            k=k,
            start=start,
            block=block,
            bounds=bounds,
            dropped=dropped,
            commit=commit,
        )
        result.flush()
        del result
        # the final names, each complete when it appears (a temporary name, then a rename), neighbours.json
        # last: a kill or a full disk at any point leaves a state a rerun finishes (see _resume)
        save_npy(out / "chunks.npy", spans)
        os.replace(out / ".neighbours.npy", out / "neighbours.npy")
        info = {
            "index": str(path),
            "store": str(ts.prefix),
            "chunks": int(len(spans)),
            "k": k,
            "chunk_tokens": size,
            "missing": int((np.load(out / "neighbours.npy", mmap_mode="r") < 0).sum()),
            "same_document_candidates_dropped": dropped,
            "search_seconds": round(time.perf_counter() - t0, 2),
            "chunks_per_s": round((len(spans) - start) / max(time.perf_counter() - t0, 1e-9), 1),
            "resumed_after": start,
            "store_shards": len(bounds) + 1,
            "peak_rss_mb": peak_rss_mb(),
            "index_on_disk": bool(m["plan"].get("on_disk")),
            "reused_index_vectors": bool(same_store),
        }
        write_json_atomic(out / "neighbours.json", info)
        progress_file.unlink(missing_ok=True)
        shutil.rmtree(out / ".embed", ignore_errors=True)
        return info


# what shows a folder `index neighbours`' own (cramkit.outdir.check_out): its record, its progress, the state of
# its store chunks' embedding; and what it writes there (a folder none of these claims holding one is refused)
MANIFESTS = {
    "neighbours.json": ("index", "store", "chunks", "k"),
    ".neighbours.progress.json": ("job", "done"),
    ".embed/state.json": STATE_FIELDS,
}
WRITES = ("neighbours.npy", "chunks.npy", ".embed/*.npy", ".embed/*.json")  # (.neighbours.npy: its work file, hidden)


def _document_hashes(idx: Index, ts: Any, spans: np.ndarray, path: Any) -> tuple[np.ndarray, np.ndarray]:
    """(the document hash of each store chunk, the document hash of each index chunk): equal hashes, same
    document."""
    seq_doc = store_text.store_documents(ts)
    q_hash = document_hashes(ts, seq_doc)[seq_doc[spans[:, 0]]]
    idx_hash = np.asarray(idx.chunks.doc_hash)
    if len(idx_hash) == 0:
        raise CramkitError(f"{path}: the index has no document hashes; rebuild it from a token store")
    chunk_doc = np.asarray(idx.chunks.table[:, 0])
    return q_hash, idx_hash[chunk_doc]


def _embed_store_chunks(
    idx: Index, ts: Any, spans: np.ndarray, work: Path, store_tokenizer: str | None, *, block: int, progress: bool | str
) -> np.ndarray:
    """The store's chunks embedded as the index's chunks were (its encoder, pooling, prompt and dimensions)
    into ``work`` (resumable); their vectors, memory-mapped."""
    m = idx.manifest
    pooling = m["encoder"]["pooling"]
    tok = store_text.store_tokenizer(ts, idx.engine().loaded.tokenizer, store_tokenizer)
    texts = list(store_text.decode_spans(ts, tok, spans))
    doc_prompt = idx.prompt("documents")  # store chunks are read as the index's chunks were
    key = texts_key(texts, m["encoder"]["fingerprint"], pooling, "normalized", doc_prompt, str(idx.dimensions))
    embed_to_memmap(
        texts,
        idx.engine(),
        work,
        key=key,
        pooling=pooling,
        normalize=True,
        block=block,
        progress=progress,
        desc="embedding store chunks",
        prompt=doc_prompt,
        dimensions=idx.dimensions,
    )
    return np.load(work / "embeddings.npy", mmap_mode="r", allow_pickle=False)


def _resume(out: Path, job: dict[str, Any], progress_file: Path, n: int, k: int) -> tuple[Any, int, int]:
    """(the result memory map ``.neighbours.npy``, the rows already committed, the candidates dropped so far):
    an earlier run of the same job is continued from wherever it was killed (every row committed included,
    and after ``.neighbours.npy`` was renamed to its final name), anything else started over."""
    fix = f"remove {progress_file} to compute the neighbours again from the start (or restore it)"
    before = read_json_object(progress_file, fix) if progress_file.is_file() else {}
    start = dropped = 0
    if before.get("job") == job:
        done = meta_int(before, "done", progress_file, fix, hi=n)
        dropped = meta_int(before, "dropped", progress_file, fix, default=0)
        work, final = out / ".neighbours.npy", out / "neighbours.npy"
        if done == n and not work.is_file() and final.is_file():  # killed after the rename, before the record
            os.replace(final, work)
        try:
            result = np.load(work, mmap_mode="r+", allow_pickle=False)
            if result.shape == (n, k) and result.dtype == np.int32:
                start = done
        except (OSError, ValueError):
            start = 0
    if start == 0:  # the job recorded from row 0 (never no record: it shows the folder this command's)
        write_json_atomic(progress_file, {"job": job, "done": 0, "dropped": 0})
        result = open_memmap(out / ".neighbours.npy", np.int32, (n, k))
    else:
        _log(f"resumed after {start} of {n} chunks")
    return result, start, dropped if start else 0


def _fill_neighbours(
    idx: Index,
    q: np.ndarray,
    result: Any,  # int32 [n, k], a writable memory map
    q_hash: np.ndarray,
    cand_hash: np.ndarray,
    *,
    k: int,
    start: int,
    block: int,
    bounds: list[int],
    dropped: int,
    commit: Callable[[int, int], None],
) -> int:
    """Search the query rows from ``start`` on, block by block (a block never spans two store shards), into
    ``result``; each block flushed, then ``commit(rows done, dropped)``. The candidates dropped (same document)."""
    n = len(result)
    if start >= n:  # every row committed already (a run killed before its final rename)
        return dropped
    step = max(1, int(block))
    starts = sorted({*range(start, n, step), *(b for b in bounds if start < b < n)})
    with Progress("neighbours", n, unit="chunks", initial=start) as bar:
        for a, stop in zip(starts, [*starts[1:], n], strict=True):
            rows, leaks = _neighbours_of(idx, np.ascontiguousarray(q[a:stop]), q_hash[a:stop], cand_hash, k)
            dropped += leaks
            result[a:stop] = rows
            result.flush()
            commit(stop, dropped)
            shard_no = int(np.searchsorted(bounds, stop - 1, side="right"))
            bar.to(stop, {"store_shard": f"{shard_no + 1}/{len(bounds) + 1}"} if bounds else None)
    return dropped


def _neighbours_of(
    idx: Index, qa: np.ndarray, qa_hash: np.ndarray, cand_hash: np.ndarray, k: int
) -> tuple[np.ndarray, int]:
    """(int32 [len(qa), k]: the ``k`` nearest index chunks of each query vector from other documents, -1 where
    none; the candidates dropped as the query's own document). Searched deeper while a row lacks some."""
    want = min(len(idx), k * 4 + 8)
    pending = np.arange(len(qa))
    rows = np.full((len(qa), k), -1, dtype=np.int32)
    leaks = 0
    while len(pending):
        _, ids = idx.search_vectors(qa[pending], want)
        retry = []
        for r, row in zip(pending, ids, strict=True):
            ok = row[(row >= 0)]
            same = cand_hash[ok] == qa_hash[r]
            leaks += int(same.sum())
            keep = ok[~same][:k]
            if len(keep) < k and want < len(idx):
                retry.append(r)
            rows[r, : len(keep)] = keep
        pending = np.asarray(retry, dtype=np.int64)
        want = min(len(idx), want * 4)
    return rows, leaks


def _store_shard_bounds(ts: Any, spans: np.ndarray) -> list[int]:
    """The first chunk row of each shard of a sharded store after the first (its shards in order); [] for one."""
    starts = getattr(ts.tokens, "starts", None)
    if starts is None or len(starts) <= 2:
        return []
    seq_shard = np.searchsorted(starts, np.asarray(ts.pointers) // ts.dtype.itemsize, side="right") - 1
    chunk_shard = seq_shard[spans[:, 0]]
    return [int(x) for x in np.flatnonzero(np.diff(chunk_shard)) + 1]
