"""Embeddings as Parquet parts: ``cramkit embed --format parquet [--shard i/N]``, one file per part, joined
by a manifest.

The rows are cut into ``P = N x W`` contiguous parts (``--shard i/N`` of N shards, each run by W torchrun
processes); process ``r`` of shard ``i`` writes part ``k = i * W + r``, ``OUT/part-KKKKK-of-PPPPP.parquet``.
Two processes under torchrun and ``--shard 0/2`` + ``--shard 1/2`` thus write the same two files.

A part is embedded into a memory map under ``OUT/.work/`` (``embed_to_memmap``: resumable block by block
after a kill), then written to Parquet under a temporary name and renamed; its row count, size and SHA-256
go to ``OUT/.work/part-....json``. A part whose file is there (with this job's key in its metadata) is never
computed again. Each part is claimed with a lock (``OUT/.work/part-....lock``, ``flock``: it dies with its
process), so a second process on the same part stops with one line.

The process that finishes the last part writes ``OUT/embed.json``, the manifest: every part with its rows,
bytes and SHA-256, the encoder's fingerprint (a hash of its tokenizer and weights) and the dimension;
``cramkit embed --join OUT`` writes it (or says which part is missing) at any time.

Each part's schema: ``id`` int64, ``vector`` fixed_size_list<float32>[dim], ``text`` string, ``doc`` int64,
``source`` string; the schema metadata ``cramkit`` (JSON) names the job, the encoder and the part.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.embeddings import BLOCK
from cramkit.embeddings.memmap import DONE_FILE, barrier, dist_info, embed_to_memmap, finished
from cramkit.errors import CramkitError
from cramkit.io import file_lock, inside, json_loads, read_json_object, sha256_file, write_json_atomic
from cramkit.meta import MAX_DIM, MAX_PARTS, MAX_ROWS, meta_dict, meta_int, meta_str
from cramkit.model.pooling import POOLINGS

__all__ = ["embed_parts", "iter_parts", "join", "read_manifest", "read_vectors"]

PART_FORMAT = "cramkit-embeddings-parquet-1"
META_KEY = b"cramkit"
WORK = ".work"
COLUMNS = ("id", "vector", "text", "doc", "source")
ROW_GROUP = 16384
_PART = re.compile(r"part-(\d{5})-of-(\d{5})\.parquet\Z")


def part_name(k: int, parts: int) -> str:
    return f"part-{k:05d}-of-{parts:05d}.parquet"


def _pyarrow() -> tuple[Any, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


def schema(dim: int, meta: dict[str, Any] | None = None) -> Any:
    """The Arrow schema of a part (``meta``: the ``cramkit`` metadata)."""
    pa, _ = _pyarrow()
    fields = [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("vector", pa.list_(pa.float32(), dim), nullable=False),
        pa.field("text", pa.string()),
        pa.field("doc", pa.int64()),
        pa.field("source", pa.string()),
    ]
    return pa.schema(fields, metadata={META_KEY: json.dumps(meta).encode()} if meta else None)


def part_meta(path: Path) -> dict[str, Any] | None:
    """The ``cramkit`` metadata of a Parquet file (None: none, or not a readable Parquet file), its numbers
    checked (:func:`check_part_meta`)."""
    _, pq = _pyarrow()
    try:
        md = pq.read_schema(path).metadata or {}
        meta = json_loads(md[META_KEY]) if META_KEY in md else None
    except Exception:  # not Parquet, truncated (a killed copy), unreadable: the caller names the file
        return None
    if not (isinstance(meta, dict) and meta.get("format") == PART_FORMAT):
        return None
    return check_part_meta(path, meta)


def check_part_meta(path: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta``, the ``cramkit`` metadata of the part ``path``, when every field that sizes or selects anything
    has its type and range (a part of ``parts`` in a file named for it, rows start..end of rows_total); else one
    CramkitError naming the file and the field. Nothing is sized from a number before it is checked here."""
    where = f"{path} (its cramkit schema metadata)"
    fix = "the part is damaged or crafted: move it away, or embed its shard again"
    meta_str(meta, "key", where, fix)
    meta_str(meta, "encoder_fingerprint", where, fix)
    meta_int(meta, "dim", where, fix, lo=1, hi=MAX_DIM)
    parts = meta_int(meta, "parts", where, fix, lo=1, hi=MAX_PARTS)
    k = meta_int(meta, "part", where, fix, hi=parts - 1)
    rows = meta_int(meta, "rows_total", where, fix, hi=MAX_ROWS)
    start = meta_int(meta, "start", where, fix, hi=rows)
    meta_int(meta, "end", where, fix, lo=start, hi=rows)
    meta_int(meta, "shards", where, fix, lo=1, hi=parts, default=parts)
    meta_int(meta, "world_size", where, fix, lo=1, hi=parts, default=1)
    for name in ("pooling", "prompt", "prompt_name", "model", "source"):
        if meta.get(name) is not None:
            meta_str(meta, name, where, fix)
    named = _PART.fullmatch(path.name)
    if named and (int(named.group(1)), int(named.group(2))) != (k, parts):
        raise CramkitError(f"{where} says part {k} of {parts}, its name another; {fix}")
    return meta


def check_part_file(path: Path, rows: int, dim: int) -> None:
    """One CramkitError naming ``path`` unless it is a readable Parquet file of ``rows`` rows whose columns are
    those of a part (``id`` int64, ``vector`` a fixed-size list of ``dim`` float32, ``text`` string, ``doc``
    int64, ``source`` string): checked from its footer, before any row is read."""
    pa, pq = _pyarrow()
    fix = "the part is damaged or crafted: embed its shard again, then `cramkit embed --join`"
    try:
        f = pq.ParquetFile(path)
        sch, n = f.schema_arrow, f.metadata.num_rows
    except Exception as exc:  # not Parquet (a file of zeros), truncated, unreadable
        raise CramkitError(f"{path} is not a readable Parquet file ({str(exc)[:120]}); {fix}") from None
    want = {"id": pa.int64(), "text": pa.string(), "doc": pa.int64(), "source": pa.string()}
    for name in COLUMNS:
        got = sch.field(name).type if name in sch.names else None
        if name == "vector":
            ok = (
                got is not None
                and pa.types.is_fixed_size_list(got)
                and got.list_size == dim
                and got.value_type == pa.float32()
            )
            what = f"a fixed-size list of {dim} float32"
        else:
            ok = got is not None and (got == want[name] or (want[name] == pa.string() and got == pa.large_string()))
            what = str(want[name])
        if not ok:
            has = "missing" if got is None else f"of type {got}"
            raise CramkitError(f"{path}: column {name!r} is {has}, not {what}; {fix}")
    if n != rows:
        raise CramkitError(f"{path} holds {n} rows, its record {rows}; {fix}")


def _utf8(texts: Sequence[str]) -> Any:
    pa, _ = _pyarrow()
    try:
        return pa.array(texts, pa.string())
    except (UnicodeEncodeError, pa.ArrowException):  # a lone surrogate (a damaged file read leniently)
        return pa.array([t.encode("utf-8", "replace").decode("utf-8") for t in texts], pa.string())


def write_part(
    path: Path,
    vectors: np.ndarray,
    ids: np.ndarray,
    texts: Sequence[str],
    docs: np.ndarray,
    source: str,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """Write one part to ``path`` atomically (a temporary name, then a rename), row group by row group
    (memory stays bounded for a memory-mapped ``vectors``); its rows, bytes and SHA-256."""
    pa, pq = _pyarrow()
    n, dim = vectors.shape
    sch = schema(dim, meta)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with pq.ParquetWriter(
            tmp, sch, compression="zstd", use_dictionary=["source"], write_statistics=["id", "doc"]
        ) as w:
            for a in range(0, n, ROW_GROUP):
                b = min(a + ROW_GROUP, n)
                flat = np.ascontiguousarray(vectors[a:b], dtype=np.float32).reshape(-1)
                cols = [
                    pa.array(np.asarray(ids[a:b], np.int64)),
                    pa.FixedSizeListArray.from_arrays(pa.array(flat), dim),
                    _utf8(texts[a:b]),
                    pa.array(np.asarray(docs[a:b], np.int64)),
                    pa.DictionaryArray.from_arrays(pa.array(np.zeros(b - a, np.int32)), pa.array([source])).cast(
                        pa.string()
                    ),
                ]
                w.write_table(pa.Table.from_arrays(cols, schema=sch))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return {"file": path.name, "rows": n, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def claim(lock_path: Path, what: str) -> contextlib.AbstractContextManager[None]:
    """An exclusive lock on ``lock_path`` while the body runs (:func:`cramkit.io.file_lock`); one CramkitError
    when another process holds it. The lock dies with its process (kill -9 included)."""
    return file_lock(
        lock_path,
        lambda pid: (
            f"{what} is being embedded by another process (pid {pid}, lock {lock_path}); each shard runs "
            "once at a time: wait for it, or stop it and run this again (it resumes)"
        ),
    )


@dataclass
class Job:
    """What every part of one embedding shares."""

    key: str  # inputs, encoder, pooling, normalisation (memmap.texts_key)
    fingerprint: str  # the encoder's (encoder.encoder_fingerprint)
    dim: int
    rows: int
    parts: int
    world: int  # processes per shard (torchrun)
    shards: int

    def meta(self, k: int, start: int, end: int, extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "format": PART_FORMAT,
            "key": self.key,
            "encoder_fingerprint": self.fingerprint,
            "dim": self.dim,
            "rows_total": self.rows,
            "part": k,
            "parts": self.parts,
            "shards": self.shards,
            "world_size": self.world,
            "start": start,
            "end": end,
            **extra,
        }


def _foreign(path: Path, meta: dict[str, Any] | None, key: str, fingerprint: str, dim: int, parts: int) -> str | None:
    """Why the Parquet file ``path`` does not belong to the job (key, fingerprint, dim, parts); None if it does."""
    if meta is None:
        return "is not a part written by `cramkit embed --format parquet` (no cramkit metadata)"
    if meta.get("encoder_fingerprint") != fingerprint:
        return (
            f"was embedded by another encoder (fingerprint {meta.get('encoder_fingerprint')}, this one {fingerprint})"
        )
    if meta.get("dim") != dim:
        return f"holds vectors of dimension {meta.get('dim')}, not {dim}"
    if meta.get("key") != key:
        return "holds embeddings of other inputs (or another pooling)"
    if meta.get("parts") != parts or not _PART.fullmatch(path.name):
        return (
            f"belongs to a split into {meta.get('parts')} parts, this one into {parts}; give every shard the "
            "same --shard N and the same number of processes"
        )
    return None


def check_folder(out: Path, key: str, fingerprint: str, dim: int, parts: int, *, overwrite: bool) -> None:
    """Every Parquet file in ``out`` belongs to this job; a foreign part (``part-K-of-P.parquet``) is removed
    with ``overwrite``; anything else is one CramkitError naming it (never a user's own file removed)."""
    for p in sorted(out.glob("*.parquet")):
        meta = part_meta(p)
        why = _foreign(p, meta, key, fingerprint, dim, parts)
        if why is None:
            continue
        if overwrite and meta is not None and _PART.fullmatch(p.name):  # another embedding's: --overwrite replaces it
            p.unlink(missing_ok=True)
            continue
        if overwrite:
            raise CramkitError(
                f"{p} {why}, and it is no part of `cramkit embed` (part-KKKKK-of-PPPPP.parquet): --overwrite "
                "replaces only what cramkit embed wrote; move it away or choose another --out"
            )
        raise CramkitError(
            f"{p} {why}; --out {out} may hold the parts of one embedding only: move it away, choose another "
            "--out, or pass --overwrite to replace what is not this embedding's"
        )


def _done_file(out: Path, k: int, parts: int) -> Path:
    return out / WORK / (part_name(k, parts)[: -len(".parquet")] + ".json")


def _part_record(out: Path, k: int, parts: int, key: str) -> dict[str, Any] | None:
    """The record of part ``k`` when its file is there, complete and this job's (hashed again when the
    record was lost: a kill between the rename and the record)."""
    path = out / part_name(k, parts)
    if not path.is_file():
        return None
    meta = part_meta(path)
    if meta is None or meta.get("key") != key:
        return None
    done = _done_file(out, k, parts)
    rec = None
    with contextlib.suppress(CramkitError):
        rec = read_json_object(done, "") if done.is_file() else None
    if not _record_ok(rec, path, key, meta["end"] - meta["start"]):
        rec = {"file": path.name, "rows": meta["end"] - meta["start"], "bytes": path.stat().st_size, "key": key}
        rec |= {"sha256": sha256_file(path), "seconds": 0.0, "resumed_rows": 0, "truncated": 0}
        write_json_atomic(done, rec)
    return rec


def _record_ok(rec: dict[str, Any] | None, path: Path, key: str, rows: int) -> bool:
    """Whether ``rec`` (a part's record in ``.work``) is this file's, complete and of the right types; else it
    is made again from the file (a kill between the rename and the record, or a damaged record)."""
    if rec is None or rec.get("bytes") != path.stat().st_size or rec.get("key") != key or rec.get("rows") != rows:
        return False
    counts = [rec.get(name, 0) for name in ("resumed_rows", "truncated")]
    seconds = rec.get("seconds", 0.0)
    return (
        isinstance(rec.get("sha256"), str)
        and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= rows for c in counts)
        and isinstance(seconds, (int, float))
        and not isinstance(seconds, bool)
        and 0 <= seconds < float("inf")
    )


def embed_parts(
    texts: Sequence[str],
    ids: np.ndarray,
    docs: np.ndarray,
    engine: Any,
    out: str | os.PathLike,
    *,
    key: str,
    fingerprint: str,
    pooling: str,
    normalize: bool,
    shard: tuple[int, int] = (0, 1),
    overwrite: bool = False,
    block: int = BLOCK,
    progress: bool | str = "auto",
    meta: dict[str, Any] | None = None,
    prompt: str = "",
    dimensions: int | None = None,
) -> dict[str, Any]:
    """Embed this process's part of ``texts`` (shard ``i`` of ``N``, torchrun rank ``r`` of ``W``) into
    ``out/part-K-of-P.parquet``; the manifest when this process finished the last part (every torchrun
    process gets it), else a record of the part with ``"waiting"``: the parts not yet there."""
    out = Path(out)
    rank, world = dist_info()
    i, n_shards = shard
    parts = n_shards * world
    k = i * world + rank
    n = len(texts)
    dim = int(dimensions or engine.hidden_size or 0)
    job = Job(key, fingerprint, dim, n, parts, world, n_shards)
    meta = dict(meta or {})
    (out / WORK).mkdir(parents=True, exist_ok=True)
    if rank == 0:
        old = finished(out)
        if old is not None and (old.get("key") != key or old.get("format") != "parquet"):
            if not overwrite:
                what = "other inputs or another model" if old.get("key") != key else "these inputs as .npy"
                raise CramkitError(f"{out} holds finished embeddings of {what}; pick another --out or pass --overwrite")
            (out / DONE_FILE).unlink(missing_ok=True)
            for f in ("embeddings.npy", "ids.npy", "state.json"):
                (out / f).unlink(missing_ok=True)
    barrier(world)
    check_folder(out, key, fingerprint, dim, parts, overwrite=overwrite)
    start, end = n * k // parts, n * (k + 1) // parts
    path = out / part_name(k, parts)
    where = f"shard {i}/{n_shards}" + (f" (process {rank} of {world})" if world > 1 else "")
    with claim(out / WORK / (path.stem + ".lock"), f"part {path.name} of {out} ({where})"):
        rec = _part_record(out, k, parts, key)
        if rec is not None:
            rec = rec | {"resumed_rows": rec["rows"], "seconds": 0.0, "already": True}
        else:
            work = out / WORK / path.stem
            t0 = time.perf_counter()
            r = embed_to_memmap(
                texts[start:end],
                engine,
                work,
                key=f"{key}:{k}/{parts}",
                pooling=pooling,
                normalize=normalize,
                ids=ids[start:end],
                block=block,
                progress=progress,
                desc=f"embedding part {k + 1}/{parts}",
                alone=True,
                prompt=prompt,
                dimensions=dimensions,
            )
            vecs = np.load(work / "embeddings.npy", mmap_mode="r", allow_pickle=False)
            t1 = time.perf_counter()
            rec = write_part(
                path,
                vecs,
                ids[start:end],
                texts[start:end],
                docs[start:end],
                str(meta.get("source", "")),
                job.meta(k, start, end, {"pooling": pooling, "normalize": bool(normalize), **meta}),
            )
            del vecs
            rec |= {
                "key": key,
                "seconds": round(time.perf_counter() - t0, 3),
                "embed_seconds": r["seconds"],
                "parquet_seconds": round(time.perf_counter() - t1, 3),
                "resumed_rows": r.get("resumed_rows", 0),
                "truncated": r.get("truncated", 0),
            }
            write_json_atomic(_done_file(out, k, parts), rec)
            shutil.rmtree(work, ignore_errors=True)
    barrier(world)
    try:
        manifest = join(out, quiet_missing=True)
    except CramkitError:
        if rank == 0:
            raise
        manifest = None
    barrier(world)
    if manifest is None:
        missing = [part_name(j, parts) for j in range(parts) if _part_record_quick(out, j, parts) is None]
        return rec | {"part": k, "parts": parts, "dim": dim, "waiting": missing}
    return manifest | {"part_record": rec}


def _part_record_quick(out: Path, k: int, parts: int) -> dict[str, Any] | None:
    done = _done_file(out, k, parts)
    if not (out / part_name(k, parts)).is_file() or not done.is_file():
        return None
    with contextlib.suppress(CramkitError):
        return read_json_object(done, "")
    return None


def join(out: str | os.PathLike, *, quiet_missing: bool = False) -> dict[str, Any] | None:
    """Check the parts in ``out`` and write the manifest ``out/embed.json``; returns it. A missing part is one
    CramkitError naming it (None with ``quiet_missing``: the other shards are still running); a foreign or
    damaged Parquet file is one CramkitError naming it."""
    out = Path(out)
    if not out.is_dir():
        raise CramkitError(f"--join {out}: no such directory; give the --out of `cramkit embed --format parquet`")
    files = sorted(out.glob("*.parquet"))
    if not files:
        raise CramkitError(
            f"--join {out}: no Parquet parts there; embed with `cramkit embed ... --format parquet --out {out}`"
        )
    metas = {p: part_meta(p) for p in files}
    named = [m for p, m in metas.items() if m is not None and _PART.fullmatch(p.name)]
    keys = Counter(m["key"] for m in named)  # the parts' job: the one most of the parts belong to
    first = next((m for m in named if m["key"] == keys.most_common(1)[0][0]), None) if named else None
    if first is None:
        raise CramkitError(f"{files[0]} is not a part written by `cramkit embed --format parquet`; move it away")
    parts = int(first["parts"])
    for p, m in metas.items():
        why = _foreign(p, m, first["key"], first["encoder_fingerprint"], first["dim"], parts)
        if why is not None:
            raise CramkitError(f"{p} {why}; {out} may hold the parts of one embedding only: move it away")
    have = {int(m["part"]): p for p, m in metas.items() if m is not None}
    missing = [k for k in range(parts) if k not in have]
    if missing:
        if quiet_missing:
            return None
        world = int(first.get("world_size", 1))
        n_shards = int(first.get("shards", parts))
        names = ", ".join(part_name(k, parts) for k in missing[:3]) + (" ..." if len(missing) > 3 else "")
        shards = sorted({k // world for k in missing})
        hint = ", ".join(f"--shard {s}/{n_shards}" for s in shards[:3]) + (" ..." if len(shards) > 3 else "")
        raise CramkitError(
            f"{out}: {len(missing)} of {parts} parts missing ({names}); run `cramkit embed` with {hint} and "
            f"--out {out} again, then --join"
        )
    _agree(out, {k: (have[k], metas[have[k]]) for k in range(parts)}, first)
    records = []
    for k in range(parts):
        m = metas[have[k]]
        if m is not None:
            check_part_file(have[k], m["end"] - m["start"], m["dim"])
        rec = _part_record(out, k, parts, first["key"])
        if rec is None or m is None or rec["rows"] != m["end"] - m["start"]:
            raise CramkitError(f"{have[k]}: its record does not match the file; run its shard again")
        records.append(rec)
    rows = sum(r["rows"] for r in records)
    if rows != first["rows_total"]:
        raise CramkitError(f"{out}: the parts hold {rows} rows, the embedding {first['rows_total']}; run again")
    seconds = sum(float(r.get("seconds", 0.0)) for r in records)
    new = rows - sum(int(r.get("resumed_rows", 0)) for r in records)
    manifest: dict[str, Any] = {
        "format": "parquet",
        "schema": PART_FORMAT,
        "columns": list(COLUMNS),
        "key": first["key"],
        "rows": rows,
        "dim": first["dim"],
        "pooling": first.get("pooling"),
        "normalize": first.get("normalize"),
        "encoder": {"source": first.get("model"), "fingerprint": first["encoder_fingerprint"]},
        "shards": first.get("shards"),
        "world_size": first.get("world_size"),
        "parts": [{k: r[k] for k in ("file", "rows", "bytes", "sha256")} for r in records],
        "seconds": round(seconds, 3),
        "examples_per_s": round(new / seconds, 2) if seconds > 0 and new > 0 else None,
        "resumed_rows": rows - new,
        "truncated": sum(int(r.get("truncated", 0)) for r in records),
        **{
            k: first[k]
            for k in ("source", "model", "kind", "rows_kind", "chunk_tokens", "prompt_name", "prompt", "dimensions")
            if k in first
        },
    }
    check_manifest(manifest, out / DONE_FILE, out)  # what a reader refuses is refused before anything is written
    old = finished(out)
    if old is None or {k: v for k, v in old.items() if k != "joined"} != manifest:
        write_json_atomic(out / DONE_FILE, manifest | {"joined": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return read_manifest(out)


# what every part of one embedding says alike (the manifest takes them from the first part)
_SHARED = ("rows_total", "shards", "world_size", "pooling", "normalize", "prompt", "prompt_name", "dimensions") + (
    "model",
    "source",
    "kind",
    "rows_kind",
    "chunk_tokens",
)


def _agree(out: Path, parts: dict[int, tuple[Path, dict[str, Any] | None]], first: dict[str, Any]) -> None:
    """One CramkitError naming the part when the parts do not make one embedding: a field of :data:`_SHARED`
    that differs from the first part's, rows that do not follow on from the part before, a pooling no reader
    takes. Checked before anything is written (a refused --join leaves the folder as it was)."""
    fix = f"{out} may hold the parts of one embedding only: embed that shard again (or move it away)"
    if first.get("pooling") not in (None, *POOLINGS):
        raise CramkitError(f"{out}: the parts' pooling {str(first['pooling'])[:40]!r} is not mean or cls; {fix}")
    end = 0
    for _, (path, meta) in sorted(parts.items()):
        meta = meta or {}
        differs = next((f for f in _SHARED if meta.get(f) != first.get(f)), None)
        if differs is not None:
            said = f"{json.dumps(meta.get(differs))[:40]}, the first part's {json.dumps(first.get(differs))[:40]}"
            raise CramkitError(f"{path} says {differs} {said}; {fix}")
        if meta.get("start") != end:
            raise CramkitError(f"{path} holds rows from {meta.get('start')}, the part before it ends at {end}; {fix}")
        end = int(meta["end"])
    if end != first["rows_total"]:
        raise CramkitError(f"{out}: the parts end at row {end}, the embedding holds {first['rows_total']}; {fix}")


# ------------------------------------------------------------------------------------------- reading


def read_manifest(out: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a Parquet embedding folder, checked before anything is sized from it: its numbers typed
    and bounded, every part named there a plain file inside the folder, present, of the size recorded, a
    Parquet file of the rows and columns recorded (its footer), the parts' rows adding up to ``rows``."""
    out = Path(out)
    file = out / DONE_FILE
    if not file.is_file():
        raise CramkitError(f"{out} holds no {DONE_FILE}: the embedding is unfinished; run `cramkit embed --join {out}`")
    m = read_json_object(file, f"it is damaged or crafted: run `cramkit embed --join {out}` again")
    return check_manifest(m, file, out)


def check_manifest(m: dict[str, Any], file: Path, out: Path) -> dict[str, Any]:
    """``m``, the manifest ``file`` of the folder ``out`` (read back, or about to be written by --join), when a
    reader can take it (see :func:`read_manifest`); else one CramkitError naming what is wrong."""
    fix = f"it is damaged or crafted: run `cramkit embed --join {out}` again"
    if m.get("format") != "parquet" or not isinstance(m.get("parts"), list) or not m["parts"]:
        raise CramkitError(f"{file} is not the manifest of Parquet embeddings (cramkit embed --format parquet)")
    rows = meta_int(m, "rows", file, fix, hi=MAX_ROWS)
    dim = meta_int(m, "dim", file, fix, lo=1, hi=MAX_DIM)
    meta_str(meta_dict(m, "encoder", file, fix), "fingerprint", f"{file} (encoder)", fix)
    if m.get("pooling") not in (None, *POOLINGS):
        raise CramkitError(f"{file}: field 'pooling' must be mean or cls, got {str(m['pooling'])[:40]!r}; {fix}")
    meta_str(m, "prompt", file, fix, default="")
    if len(m["parts"]) > MAX_PARTS:
        raise CramkitError(f"{file} lists {len(m['parts'])} parts, more than {MAX_PARTS}; {fix}")
    total = 0
    for part in m["parts"]:
        name = part.get("file") if isinstance(part, dict) else None
        try:
            if not isinstance(name, str) or not name:
                raise ValueError
            path = inside(out, name)
        except ValueError:
            raise CramkitError(
                f"{file} names part {name!r}, which is not a file inside {out}; a manifest may only "
                f"list files beside it (damaged or crafted): run `cramkit embed --join {out}` again"
            ) from None
        n = meta_int(part, "rows", f"{file} (part {name})", fix, hi=MAX_ROWS)
        if not path.is_file() or path.stat().st_size != part.get("bytes"):
            raise CramkitError(
                f"{path} is missing or changed since {file} was written; run its shard again, then "
                f"`cramkit embed --join {out}`"
            )
        check_part_file(path, n, dim)
        total += n
    if total != rows:
        raise CramkitError(f"{file} records {rows} rows, its parts {total}; {fix}")
    return m


def iter_parts(out: str | os.PathLike) -> Iterator[tuple[Path, Any]]:
    """The parts of a Parquet embedding folder as (file, Arrow table), in row order (the manifest and each
    part's footer checked; a part whose pages do not read is one CramkitError naming it)."""
    _, pq = _pyarrow()
    out = Path(out)
    m = read_manifest(out)
    for part in m["parts"]:
        path = out / part["file"]
        try:
            table = pq.read_table(path, columns=list(COLUMNS))
        except Exception as exc:  # damaged pages behind a readable footer
            raise CramkitError(
                f"{path} does not read as Parquet ({str(exc)[:120]}); the part is damaged: embed its shard "
                f"again, then `cramkit embed --join {out}`"
            ) from None
        yield path, table


def part_vectors(path: Path, table: Any, dim: int, first_row: int = 0) -> np.ndarray:
    """The ``vector`` column of a part's table as float32 [rows, dim], every value finite; else one
    CramkitError naming the part and the first bad row: a null, NaN or infinite vector is found by no query (an
    index of them reports a perfect recall and answers nothing)."""
    col = table.column("vector").combine_chunks()
    n = table.num_rows
    if col.null_count:
        r = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
        raise CramkitError(f"{path}: row {first_row + r} has no vector (null); embed that shard again")
    vectors = col.values.to_numpy(zero_copy_only=False)[col.offset * dim : (col.offset + n) * dim].reshape(n, dim)
    bad = ~np.isfinite(vectors).all(axis=1)
    if bad.any():
        r = int(np.argmax(bad))
        raise CramkitError(
            f"{path}: row {first_row + r} (id {table.column('id')[r]}) holds NaN or infinite values "
            f"({int(bad.sum())} such rows); such vectors cannot be searched: embed that shard again (and check "
            "the model: its outputs overflow)"
        )
    return vectors


def read_vectors(out: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(vectors float32 [rows, dim], ids int64 [rows]) of a Parquet embedding folder, in row order."""
    m = read_manifest(out)
    vecs = np.empty((m["rows"], m["dim"]), np.float32)
    ids = np.empty(m["rows"], np.int64)
    at = 0
    for path, t in iter_parts(out):
        n = t.num_rows
        vecs[at : at + n] = part_vectors(path, t, m["dim"])
        ids[at : at + n] = t.column("id").to_numpy()
        at += n
    if at != m["rows"]:
        print(f"cramkit: warning: {out} holds {at} rows, its manifest {m['rows']}", file=sys.stderr)
    return vecs, ids


def is_parquet_embeddings(source: str | os.PathLike | None) -> bool:
    """Whether ``source`` is a folder of Parquet embeddings (``cramkit embed --format parquet``, joined)."""
    if source is None:
        return False
    p = Path(source)
    if not p.is_dir() or not (p / DONE_FILE).is_file():
        return False
    with contextlib.suppress(CramkitError):
        return read_json_object(p / DONE_FILE, "").get("format") == "parquet"
    return False
