"""Build an index: chunk a corpus (or take Parquet embeddings as they are), embed the chunks (resuming an
interrupted build), choose, build and tune the Faiss index, and publish the index directory
(:mod:`cramkit.index.manifest`). An on-disk build fills its parts in several processes or on several machines
(``--shard``) and merges them (:mod:`cramkit.index.ondisk`)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.embeddings.encoder import encoder_fingerprint, load_encoder, retrieval_prompts
from cramkit.embeddings.memmap import dist_info, embed_to_memmap, texts_key
from cramkit.embeddings.parquet import is_parquet_embeddings
from cramkit.errors import CramkitError
from cramkit.index import ann, ondisk
from cramkit.index.chunking import Chunks, chunks_from_parquet, make_chunks, prompt_tokens, write_chunks
from cramkit.index.manifest import FORMAT, MANIFEST, file_sizes
from cramkit.index.ondisk import peak_rss_mb
from cramkit.index.request import BuildRequest
from cramkit.io import atomic_path, check_out, dir_lock, disk_errors, json_loads, json_text, write_json_atomic
from cramkit.meta import meta_int
from cramkit.model.pooling import read_pooling
from cramkit.request import verb


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@verb(BuildRequest)
def build_index(request: BuildRequest) -> dict[str, Any] | None:
    """Chunk ``source``, embed the chunks with ``encoder`` (resuming an interrupted build), build and tune
    the Faiss index, write ``out``; the manifest (None on torchrun ranks other than 0, and for a ``shard``
    whose parts are done while others are not). Takes a :class:`~cramkit.index.request.BuildRequest` or its
    fields; encoding, errors, text_field, doc_split: how text files are read (``cramkit.text.iter_documents``).

    prompt_name: the encoder's named prompt the chunks get (default: its prompt named document, passage or
    corpus, else its default prompt, else none); queries get its prompt named query (else its default). The
    manifest records both (``prompts``).

    dimensions: the index holds each vector's first ``dimensions``, renormalised (one of a Matryoshka
    encoder's, as ``Engine.embed``); its queries are cut the same way. The manifest records it.

    on_disk: True keeps the IVF lists on disk (:mod:`cramkit.index.ondisk`); None: when the in-RAM index
    would not fit ``memory``. An on-disk build fills its parts with ``workers`` processes; ``shard`` "i/N"
    fills only shard i's parts (several machines sharing ``out``), and the run that finds every part done
    merges them."""
    with disk_errors(request.out):  # a full disk: one line naming --out, from Python as from the command line
        return _build(request)


def _build(r: BuildRequest) -> dict[str, Any] | None:
    """:func:`build_index`'s work: the build prepared (or found prepared), then filled in RAM or on disk."""
    budget, (shard_i, shard_n) = r.check()
    out = Path(r.out)
    rank, _ = dist_info()
    _check_out_dir(out, r.source, r.encoder, overwrite=r.overwrite)
    work = out / ".build"
    odw = work / "ondisk"
    settings = {
        "source": str(r.source),
        "encoder": str(r.encoder),
        "mode": r.mode,
        "chunk_tokens": r.chunk_tokens,
        "overlap": r.overlap,
        "reading": r.reading_options(),
        "memory": budget,
        "kind": r.kind,
        "on_disk": r.on_disk,
        "target_recall": r.target_recall,
        "pooling": r.pooling,
        "prompt_name": r.prompt_name,
        "dimensions": r.dimensions,
    }
    with _out_lock(out, r.shard, rank):
        prep = ondisk.read_prepared(odw, settings, overwrite=r.overwrite) if rank == 0 else None
        if prep is None and r.shard is not None and (out / MANIFEST).is_file():
            _log(f"{out}: the index is finished already (another shard merged it)")
            return None
        if prep is None:
            t_start = time.perf_counter()
            how = _open_encoder(r)
            emb = _chunks_and_vectors(r, how, work, t_start, rank=rank)
            if emb is None:  # a torchrun rank other than 0: its share is embedded
                return None
            t_embed = time.perf_counter()
            data = _write_chunk_data(work / "data", emb.chunks)
            vectors_path = work / "embed" / "embeddings.npy"
            plan, n = _plan(vectors_path, budget, r.kind, r.on_disk)
            fields = _manifest_fields(r.mode, str(r.encoder), how, emb, plan)
            timing = {
                "chunk_seconds": round(emb.chunk_seconds, 2),
                "embed_seconds": emb.record["seconds"],
                "resumed_rows": emb.record.get("resumed_rows", 0),
                "memory_budget": budget,
            }
            _copy_encoder(out, how.loaded, how.fingerprint)
            if not plan.get("on_disk"):
                if r.shard is not None or r.workers > 1:
                    raise CramkitError(
                        "--shard and --workers fill the parts of an on-disk index, and this one fits --memory in "
                        "RAM; add --on-disk, or drop them"
                    )
                return _build_in_ram(out, data, vectors_path, plan, fields, timing, r.target_recall, t_start, t_embed)
            parts = ondisk.part_count(n, r.workers, shard_n)
            prep = _prepare_on_disk(vectors_path, plan, odw, parts, settings, fields, timing, t_start)
        if r.shard is None:
            parts = _prep_parts(odw, prep)
            ondisk.fill_parts(
                odw, work / "embed" / "embeddings.npy", list(range(parts)), parts, workers=r.workers, log=_log
            )
            return _finish_on_disk(out, prep, r.target_recall)
    return _fill_shard(out, prep, shard_i, shard_n, workers=r.workers, target=r.target_recall)


def _check_out_dir(out: Path, source: str | os.PathLike | None, encoder: str | os.PathLike, *, overwrite: bool) -> None:
    """``out`` may be written: it holds no index (unless ``overwrite``), and follows the rule of every output."""
    if (out / MANIFEST).is_file() and not overwrite:
        raise CramkitError(
            f"{out} already holds an index; grow it with `cramkit index add`, pick another --out or pass --overwrite"
        )
    check_out(out, inputs=[source, encoder], own=[MANIFEST, ".build"])


def _out_lock(out: Path, shard: str | None, rank: int) -> contextlib.AbstractContextManager[None]:
    """The lock on ``out`` while the build prepares it (a second process on the same --out would truncate this
    one's memory map: SIGBUS). Several shard runs share --out: each waits its turn for the shared steps."""
    if shard is not None:
        return ondisk.waiting_lock(out / ".lock", f"--out {out}")
    return dir_lock(out, "--out") if rank == 0 else contextlib.nullcontext()


@dataclass
class _Encoding:
    """How the chunks are embedded: the encoder, its engine, and what else decides the vectors."""

    loaded: Any
    engine: Any
    pooling: str
    fingerprint: str
    prompts: dict[str, dict[str, str | None]]  # documents' and queries' (retrieval_prompts)
    dims: int | None  # the vectors cut to their leading dims (None: the whole vector)

    @property
    def doc_prompt(self) -> str:
        return str(self.prompts["documents"]["text"] or "")


def _open_encoder(request: BuildRequest) -> _Encoding:
    """The encoder loaded into an engine, its pooling (default: the encoder's), fingerprint, retrieval prompts
    and the dimensions kept, checked."""
    from cramkit.infer import Engine

    loaded = load_encoder(str(request.encoder))
    pooling = read_pooling(request.pooling or loaded.pooling, "--pooling")
    fp = encoder_fingerprint(loaded)
    engine = Engine(loaded, device=request.device, max_batch_tokens=request.max_batch_tokens)
    prompts = retrieval_prompts(engine, request.prompt_name)
    dims = engine.check_dimensions(request.dimensions)  # None: the whole vector
    return _Encoding(loaded, engine, pooling, fp, prompts, dims)


@dataclass
class _Embedded:
    """The chunks of the corpus, whose vectors are in ``.build/embed/embeddings.npy``."""

    chunks: Chunks
    chunking: dict[str, Any]  # the chunking parameters (the manifest's "chunking")
    record: dict[str, Any]  # the embedding's record (dim, seconds, resumed_rows)
    pooling: str
    chunk_seconds: float


def _chunks_and_vectors(r: BuildRequest, how: _Encoding, work: Path, t_start: float, *, rank: int) -> _Embedded | None:
    """The chunks of the source with their vectors: Parquet embeddings (cramkit embed --format parquet) taken
    as they are, else the source chunked and the chunks embedded (resuming). None on torchrun ranks other than
    0, once their share is embedded."""
    source = None if r.source is None else os.fspath(r.source)
    if is_parquet_embeddings(source):  # embedded already (cramkit embed --format parquet): index those
        if rank != 0:
            return None
        emb = _read_parquet_embeddings(str(source), how, work, r)
        emb.chunk_seconds = time.perf_counter() - t_start
        _log(f"{len(emb.chunks)} embedded rows from {source} ({emb.chunk_seconds:.1f}s)")
        return emb
    chunks, cparams = make_chunks(
        source,
        how.loaded,
        mode=r.mode,
        chunk_tokens=r.chunk_tokens,
        overlap=r.overlap,
        reading=r.reading_options(),
        tokenizer=r.store_tokenizer,
        reserve=prompt_tokens(how.loaded.tokenizer, how.doc_prompt),
    )
    t_chunk = time.perf_counter() - t_start
    if rank == 0:
        _log(f"{len(chunks)} chunks from {chunks.num_docs} documents ({t_chunk:.1f}s)")
    rec = _embed_chunks(chunks, how, work / "embed", block=r.block, progress=r.progress)
    if rank != 0:
        return None
    return _Embedded(chunks, cparams, rec, how.pooling, t_chunk)


def _read_parquet_embeddings(source: str, how: _Encoding, work: Path, r: BuildRequest) -> _Embedded:
    """The rows of a folder of Parquet embeddings as chunks, their vectors written to the build's
    ``embeddings.npy``; they must be the encoder's, of the index's dimensions, with the documents' prompt."""
    if r.mode != "passages" or r.chunk_tokens is not None or r.overlap is not None:
        raise CramkitError(
            f"{source} holds finished Parquet embeddings: they are indexed as they are (--mode passages, "
            "no --chunk-tokens or --overlap)"
        )
    chunks, emb = chunks_from_parquet(source, how.fingerprint, work / "embed" / "embeddings.npy")
    if int(emb["dim"]) != (how.dims or how.engine.hidden_size):
        raise CramkitError(
            f"{source} holds vectors of {emb['dim']} dimensions, not {how.dims or how.engine.hidden_size}; embed "
            "it again with --dimensions, or give its size to --dimensions here"
        )
    if emb.get("prompt", "") != how.doc_prompt:
        raise CramkitError(
            f"{source} was embedded with the prompt {emb.get('prompt', '')!r}, not {how.doc_prompt!r} (the "
            "documents' prompt); embed it again with --prompt-name, or give the same --prompt-name here"
        )
    cparams = {"embeddings": str(source), "parts": len(emb["parts"])}
    rec = {"dim": emb["dim"], "seconds": 0.0, "resumed_rows": 0}
    return _Embedded(chunks, cparams, rec, emb.get("pooling") or how.pooling, 0.0)


def _embed_chunks(chunks: Chunks, how: _Encoding, work: Path, *, block: int, progress: bool | str) -> dict[str, Any]:
    """Embed the chunks into ``work`` (L2-normalised; resuming a matching unfinished job); the record."""
    key = texts_key(
        chunks.texts,
        how.fingerprint,
        how.pooling,
        "normalized",
        *([f"prompt:{how.doc_prompt}"] if how.doc_prompt else []),
        *([f"dimensions:{how.dims}"] if how.dims else []),
    )
    return embed_to_memmap(
        chunks.texts,
        how.engine,
        work,
        key=key,
        pooling=how.pooling,
        normalize=True,
        block=block,
        progress=progress,
        desc="embedding chunks",
        prompt=how.doc_prompt,
        dimensions=how.dims,
    )


def _write_chunk_data(data: Path, chunks: Chunks) -> Path:
    """A fresh data folder holding the chunks' files (the vectors move in when the index is built)."""
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    write_chunks(data, chunks)
    return data


def _plan(vectors_path: Path, budget: int, kind: str, on_disk: bool | None) -> tuple[dict[str, Any], int]:
    """The index for the embedded vectors: (its plan, chosen from their count and the memory budget, said in a
    line; their count)."""
    vectors = np.load(vectors_path, mmap_mode="r", allow_pickle=False)
    _check_finite(vectors)
    plan = ann.plan_index(len(vectors), vectors.shape[1], budget, kind, on_disk)
    _log(f"index: {plan['kind']}{' on disk' if plan.get('on_disk') else ''} ({plan['why']})")
    return plan, len(vectors)


def _check_finite(vectors: np.ndarray, block: int = 65536) -> None:
    """One CramkitError when a vector the encoder made holds NaN or infinity (an index of them reports a perfect
    recall and answers nothing); read block by block."""
    for a in range(0, len(vectors), block):
        bad = ~np.isfinite(vectors[a : a + block]).all(axis=1)
        if bad.any():
            r = a + int(np.argmax(bad))
            raise CramkitError(
                f"the encoder's vector of chunk {r} holds NaN or infinite values (its outputs overflow or its weights "
                "are damaged); check the encoder (`cramkit embed` a few lines with it), then build again"
            )


def _manifest_fields(mode: str, encoder: str, how: _Encoding, emb: _Embedded, plan: dict[str, Any]) -> dict[str, Any]:
    """What the manifest says of the index before it is built: the chunks, the encoder, the prompts, the plan."""
    return {
        "format": FORMAT,
        "mode": mode,
        "count": len(emb.chunks),
        "dim": int(emb.record["dim"]),
        "documents": emb.chunks.num_docs,
        "sources": emb.chunks.sources,
        "chunking": emb.chunking,
        "encoder": {
            "dir": "encoder",
            "source": str(encoder),
            "fingerprint": how.fingerprint,
            "pooling": emb.pooling,
            "normalize": True,
            "max_length": int(how.loaded.max_length),
            "dimensions": how.dims,  # the vectors cut to their leading dimensions (None: whole)
        },
        "prompts": how.prompts,
        "plan": plan,
    }


def _build_in_ram(
    out: Path,
    data: Path,
    vectors_path: Path,
    plan: dict[str, Any],
    fields: dict[str, Any],
    timing: dict[str, Any],
    target_recall: float,
    t_start: float,
    t_embed: float,
) -> dict[str, Any]:
    """Build and tune the in-RAM index over the embedded vectors, move them in beside it, publish the index."""
    vectors = np.load(vectors_path, mmap_mode="r", allow_pickle=False)
    index, params, recall = ann.build_and_tune(vectors, plan, target=target_recall, log=_log)
    if index is not None:
        ann.write(index, data / "faiss.index")
    del index, vectors
    t_index = time.perf_counter() - t_embed
    os.replace(vectors_path, data / "vectors.npy")
    seconds = time.perf_counter() - t_start
    build = {"seconds": round(seconds, 2), **timing, "index_seconds": round(t_index, 2)}
    build["chunks_per_s"] = round(fields["count"] / seconds, 2)
    build["peak_rss_mb"] = peak_rss_mb()
    return _publish(out, data, {**fields, "params": params, "recall": recall, "build": build})


def _prepare_on_disk(
    vectors_path: Path,
    plan: dict[str, Any],
    odw: Path,
    parts: int,
    settings: dict[str, Any],
    fields: dict[str, Any],
    timing: dict[str, Any],
    t_start: float,
) -> dict[str, Any]:
    """Train the on-disk index and lay out its ``parts``; the prepared state, recorded for the runs that fill the
    parts (every shard's) and for a rerun."""
    ondisk.prepare(vectors_path, plan, odw, parts=parts, log=_log)
    timing["prepare_seconds"] = round(time.perf_counter() - t_start, 2)
    prep = {"settings": settings, "parts": parts, "manifest": fields, "build": timing}
    write_json_atomic(odw / ondisk.PREPARED, prep)
    return prep


def _fill_shard(
    out: Path, prep: dict[str, Any], shard_i: int, shard_n: int, *, workers: int, target: float
) -> dict[str, Any] | None:
    """Fill shard i's parts of an on-disk build; the shard that finds every part done merges them and publishes
    the index (its manifest), the others say which shards are still to come (None)."""
    odw = out / ".build" / "ondisk"
    parts = _prep_parts(odw, prep)
    mine = [p for p in range(parts) if p % shard_n == shard_i]
    ondisk.fill_parts(odw, out / ".build" / "embed" / "embeddings.npy", mine, parts, workers=workers, log=_log)
    left = ondisk.missing_parts(odw, parts)
    if left:
        who = sorted({p % shard_n for p in left})
        _log(
            f"shard {shard_i}/{shard_n}: its parts are built; {len(left)} part(s) of other shards are not yet "
            f"({', '.join(f'--shard {i}/{shard_n}' for i in who)}); the last shard to finish merges them"
        )
        return None
    with ondisk.waiting_lock(out / ".lock", f"--out {out}"):
        if not (odw / ondisk.PREPARED).is_file():
            _log(f"{out}: the index is finished already (another shard merged it)")
            return None
        return _finish_on_disk(out, prep, target)


def _prep_parts(odw: Path, prep: dict[str, Any]) -> int:
    """The number of parts the prepared state of an on-disk build records, checked before a list is sized
    from it (a damaged or crafted state file is one line)."""
    fix = "remove it (or pass --overwrite) to prepare the on-disk index again"
    return meta_int(prep, "parts", odw / ondisk.PREPARED, fix, lo=1, hi=1 << 20)


def _copy_encoder(out: Path, loaded: Any, fp: str) -> None:
    """A copy of the encoder in ``out/encoder`` (kept when it is this one already): queries use exactly it."""
    if not ((out / "encoder").is_dir() and _dir_fingerprint(out / "encoder") == fp):
        with atomic_path(out / "encoder") as tmp:
            loaded.save(tmp)


def _finish_on_disk(out: Path, prep: dict[str, Any], target: float) -> dict[str, Any]:
    """Merge the parts of an on-disk build, tune it, publish the index."""
    work = out / ".build"
    data, vectors_path = work / "data", work / "embed" / "embeddings.npy"
    t0 = time.perf_counter()
    base = prep["manifest"]
    if not vectors_path.is_file() and (data / "vectors.npy").is_file():  # killed after the move below
        os.replace(data / "vectors.npy", vectors_path)
    params, recall, obuild = ondisk.merge(
        work / "ondisk",
        vectors_path,
        base["plan"],
        data,
        target=target,
        parts=_prep_parts(work / "ondisk", prep),
        log=_log,
    )
    os.replace(vectors_path, data / "vectors.npy")
    build = {**prep["build"], **obuild}
    fill_seconds = sum(s or 0 for s in obuild["part_seconds"])  # summed over parts: the work, not the wall time
    prepare_seconds = float(prep["build"].get("prepare_seconds", 0))
    build["seconds"] = round(prepare_seconds + fill_seconds + time.perf_counter() - t0, 2)
    build["chunks_per_s"] = round(base["count"] / max(build["seconds"], 1e-9), 2)
    build["peak_rss_mb"] = max(x for x in [peak_rss_mb() or 0.0, *(r or 0.0 for r in obuild["part_peak_rss_mb"])])
    return _publish(out, data, {**base, "params": params, "recall": recall, "build": build})


def _publish(out: Path, data: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Move the finished ``data`` folder in under a free ``data-NNN`` name, write the manifest (the switch: a
    reader sees the old index or the new one), then remove the data folder the old manifest named and the work.
    Nothing else in ``out`` is touched (a user's ``data-2024/`` stays)."""
    old = _current_data(out)
    number = 0
    while (out / f"data-{number:03d}").exists():
        number += 1
    gen = out / f"data-{number:03d}"
    os.replace(data, gen)
    manifest = {
        **{k: v for k, v in fields.items() if k not in ("params", "recall", "build")},
        "data": gen.name,
        "params": fields["params"],
        "recall": fields["recall"],
        "files": file_sizes(gen),
        "build": fields["build"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json_atomic(out / MANIFEST, manifest)
    if old is not None and old != gen:
        shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(out / ".build", ignore_errors=True)
    return manifest


def _current_data(out: Path) -> Path | None:
    """The data folder the index in ``out`` names now (None: no readable manifest, or a name that is not one
    cramkit gives: ``data-NNN`` directly inside ``out``)."""
    try:
        name = json_loads(json_text(out / MANIFEST)).get("data")
    except (OSError, ValueError, AttributeError):
        return None
    if not (isinstance(name, str) and re.fullmatch(r"data-\d{3,6}", name) and (out / name).is_dir()):
        return None
    return out / name


def _dir_fingerprint(d: Path) -> str | None:
    """The fingerprint of the encoder in ``d`` (None: none there, or not one that loads)."""
    try:
        return encoder_fingerprint(load_encoder(str(d)))
    except CramkitError:
        return None
