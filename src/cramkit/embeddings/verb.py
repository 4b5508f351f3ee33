"""``cramkit embed``'s verb, ``cramkit.embed(...)``: the rows of a file, or the sequences (or chunks) of a token
store, to a memory map (``cramkit.embeddings.memmap``) or to Parquet parts (``cramkit.embeddings.parquet``)."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.embeddings.encoder import encoder_fingerprint, load_encoder
from cramkit.embeddings.memmap import (
    DONE_FILE,
    RECORD_FIELDS,
    STATE_FIELDS,
    dist_info,
    embed_to_memmap,
    finished,
    texts_key,
)
from cramkit.embeddings.request import EmbedRequest
from cramkit.errors import CramkitError
from cramkit.io import check_out, dir_lock, disk_errors
from cramkit.request import verb


def read_inputs(request: EmbedRequest, loaded: Any) -> tuple[list[str], np.ndarray, np.ndarray, dict[str, Any]]:
    """(texts, row ids, document ids, what they are) of the request's source; a file is read as the request says
    (its encoding, errors and text field). A file's row is its own document; a store's chunk belongs to its
    sequence's document."""
    from cramkit.data.tokenstore import is_store

    source, chunk_tokens = request.source, request.chunk_tokens
    if is_store(source):
        from cramkit.data.tokenstore import TokenStore
        from cramkit.embeddings.store_text import decode_spans, store_chunk_spans, store_documents
        from cramkit.embeddings.store_text import store_tokenizer as pick

        ts = TokenStore(source)
        tok = pick(ts, loaded.tokenizer, request.store_tokenizer)
        if chunk_tokens:
            spans = store_chunk_spans(ts, chunk_tokens)
        else:
            sizes = np.asarray(ts.sizes, dtype=np.int64)
            spans = np.stack([np.arange(len(sizes)), np.zeros(len(sizes), np.int64), sizes], axis=1)
        texts = list(decode_spans(ts, tok, spans))
        ids = np.arange(len(spans), dtype=np.int64)
        return (
            texts,
            ids,
            store_documents(ts)[spans[:, 0]] if len(spans) else ids,
            {
                "kind": "store",
                "rows": "chunks" if chunk_tokens else "sequences",
                "chunk_tokens": chunk_tokens,
            },
        )
    if chunk_tokens:
        raise CramkitError("--chunk-tokens applies to a token store; a file is embedded row by row")
    from cramkit.infer.predict import read_rows

    rows = read_rows(source, text_a=request.text_field, label=None, encoding=request.encoding, errors=request.errors)
    if rows.texts_b is not None:
        texts = [f"{a} {b}" for a, b in zip(rows.texts_a, rows.texts_b, strict=True)]
    else:
        texts = rows.texts_a
    ids = np.arange(len(texts), dtype=np.int64)
    return texts, ids, ids, {"kind": "file"}


@verb(EmbedRequest)
def embed_source(request: EmbedRequest) -> dict[str, Any] | None:
    """Embed ``source`` into ``out`` (resuming an unfinished run of the same job); the ``embed.json`` record.
    Takes an :class:`~cramkit.embeddings.request.EmbedRequest` or its fields.

    format: ``npy`` (one memory map, ``embeddings.npy`` + ``ids.npy``) or ``parquet`` (one Parquet file per
    part: ``cramkit.embeddings.parquet``). shard: ``"i/N"`` or (i, N), Parquet only: this process embeds shard i of
    N (every shard given the same ``out``); the record then says which parts are still ``waiting``.
    text_field: a table's text column (default: the first of the usual ones). prompt_name: one of the model's
    named prompts put before each text (default: its default prompt, if any). dimensions: the vectors cut to that
    many leading dimensions, renormalised (one of a Matryoshka model's, as ``Engine.embed``). offload_experts,
    expert_cache: a mixture-of-experts model's experts brought in as its routers pick them
    (:class:`~cramkit.infer.Engine`)."""
    r = request
    part_of = r.check()
    out = Path(r.out)
    # a full disk is one line; a second process on the same --out would truncate this one's memory map (SIGBUS)
    with disk_errors(out):
        check_out(out, inputs=[r.source, r.model], own=MANIFESTS, writes=WRITES, command="cramkit embed")
        with _out_lock(out, r.format):
            return _embed(r, out, part_of)


def _embed(r: EmbedRequest, out: Path, part_of: tuple[int, int]) -> dict[str, Any] | None:
    """The model opened, the texts read, and the job done (or found done) into ``out``."""
    how = _open_model(r)
    texts, ids, docs, what = read_inputs(r, how.loaded)
    if not texts:
        raise CramkitError(f"{r.source}: nothing to embed (0 rows)")
    fingerprint = encoder_fingerprint(how.loaded)
    key = _job_key(texts, fingerprint, how)
    done = finished(out, key)
    if done is not None and done.get("format", "npy") == r.format:
        return done | {"resumed_rows": done["rows"], "seconds": 0.0, "examples_per_s": None}
    meta = _record_meta(r, what, how)
    if what.get("rows"):  # what a store's rows are ("sequences", "chunks"): "rows" is their count
        meta["rows_kind"] = meta.pop("rows")
    if r.format == "parquet":
        from cramkit.embeddings.parquet import embed_parts

        return embed_parts(
            texts,
            ids,
            docs,
            how.engine,
            out,
            key=key,
            fingerprint=fingerprint,
            pooling=how.pooling,
            normalize=bool(how.normalize),
            shard=part_of,
            overwrite=r.overwrite,
            block=r.block,
            meta=meta,
            prompt=how.prompt,
            dimensions=how.dims,
        )
    _clear_other_embeddings(out, r.overwrite)
    return embed_to_memmap(
        texts,
        how.engine,
        out,
        key=key,
        pooling=how.pooling,
        normalize=bool(how.normalize),
        ids=ids,
        block=r.block,
        desc="embedding",
        meta=meta,
        prompt=how.prompt,
        dimensions=how.dims,
    )


def _out_lock(out: Path, fmt: str) -> Any:
    """The lock on ``out`` this process holds while it embeds: none for Parquet (its parts are claimed one by
    one: concurrent shards share --out) nor on torchrun ranks other than 0."""
    if fmt == "parquet":
        return contextlib.nullcontext()
    return dir_lock(out, "--out") if dist_info()[0] == 0 else contextlib.nullcontext()


@dataclass
class _Embedding:
    """How the texts are embedded: the model, its engine, and what else decides the vectors."""

    loaded: Any
    engine: Any
    pooling: str
    normalize: bool
    prompt: str  # put before each text ('' for none)
    dims: int | None  # the vectors cut to their leading dims (None: the whole vector)


def _open_model(request: EmbedRequest) -> _Embedding:
    """The model loaded into an engine, its pooling and normalisation (default: the model's), its prompt and
    the dimensions kept checked (an unknown prompt name or size: one line, before any reading)."""
    from cramkit.infer import Engine

    r = request
    loaded = load_encoder(str(r.model))
    pooling = r.pooling or loaded.pooling
    normalize = loaded.normalize if r.normalize is None else r.normalize
    engine = Engine(
        loaded,
        device=r.device,
        max_batch_tokens=r.max_batch_tokens,
        offload_experts=r.offload_experts,
        expert_cache=None if r.expert_cache is None else int(r.expert_cache),  # checked: a number
    )
    prompt = engine.prompt_text(r.prompt_name)
    dims = engine.check_dimensions(r.dimensions)
    return _Embedding(loaded, engine, pooling, normalize, prompt, dims)


def _job_key(texts: list[str], fingerprint: str, how: _Embedding) -> str:
    """The key of the job: the inputs, the encoder and everything else that decides the vectors."""
    return texts_key(
        texts,
        fingerprint,
        how.pooling,
        str(bool(how.normalize)),
        *([f"prompt:{how.prompt}"] if how.prompt else []),
        *([f"dimensions:{how.dims}"] if how.dims else []),
    )


def _record_meta(request: EmbedRequest, what: dict[str, Any], how: _Embedding) -> dict[str, Any]:
    """What the record says of the job beside its rows: the source, the model, the prompt, the dimensions."""
    meta = {"source": str(request.source), "model": str(request.model), **what}
    if how.prompt:
        meta |= {"prompt_name": request.prompt_name or how.engine.default_prompt_name, "prompt": how.prompt}
    if how.dims:
        meta["dimensions"] = how.dims
    return meta


# what `cramkit embed` writes in --out (besides embed.json): .npy and its progress, or Parquet parts
OWN_FILES = ("embeddings.npy", "ids.npy", "state.json", "progress-*.json", "part-[0-9]*-of-[0-9]*.parquet")
# ... and under .work (the Parquet parts' progress)
WORK_FILES = (".work/part-*-of-*.json", ".work/part-*-of-*/*.npy", ".work/part-*-of-*/*.json")
WRITES = (DONE_FILE, *OWN_FILES, *WORK_FILES)


def _is_part(path: Path) -> bool:
    """Whether ``path`` is a Parquet part `cramkit embed` wrote (its cramkit metadata; damaged numbers too)."""
    from cramkit.embeddings.parquet import part_meta

    try:
        return part_meta(path) is not None
    except CramkitError:
        return True


# what shows a folder `cramkit embed`'s own (cramkit.outdir.check_out): its record, an unfinished job's state,
# a Parquet part's record or state, a part with its metadata; a file that only bears one of these names does not
MANIFESTS = {
    DONE_FILE: RECORD_FIELDS,
    "state.json": STATE_FIELDS,
    ".work/part-*-of-*.json": ("file", "rows", "key"),
    ".work/part-*-of-*/state.json": STATE_FIELDS,
    "part-[0-9]*-of-[0-9]*.parquet": _is_part,
}


def _clear_other_embeddings(out: Path, overwrite: bool) -> None:
    """Finished embeddings of other inputs or another model in ``out``: one line, or removed with ``overwrite``
    (by rank 0; the lock stays: this process holds it)."""
    if finished(out) is None:
        return
    if not overwrite:
        raise CramkitError(
            f"{out} holds finished embeddings of other inputs or another model; pick another --out or pass --overwrite"
        )
    if dist_info()[0] == 0:  # only what `cramkit embed` writes: never the inputs or other files in ``out``
        (out / DONE_FILE).unlink(missing_ok=True)
        for name in OWN_FILES:
            for p in out.glob(name):
                p.unlink(missing_ok=True)
        shutil.rmtree(out / ".work", ignore_errors=True)  # the Parquet parts' progress
