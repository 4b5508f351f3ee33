"""``cramkit embed``: the rows of a file, or the sequences (or chunks) of a token store, to a memory map
or to Parquet parts (``cramkit.index.shards``)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.errors import CramkitError
from cramkit.index.embedding import (
    DONE_FILE,
    dist_info,
    embed_to_memmap,
    encoder_fingerprint,
    finished,
    texts_key,
)
from cramkit.io import check_out, dir_lock, writes_to


def read_inputs(
    source: str,
    loaded: Any,
    *,
    text_col: str | None,
    chunk_tokens: int | None,
    store_tokenizer: str | None,
    encoding: str | None = None,
    errors: str = "strict",
) -> tuple[list[str], np.ndarray, np.ndarray, dict[str, Any]]:
    """(texts, row ids, document ids, what they are) of ``source``; a file is decoded with ``encoding`` and
    ``errors``. A file's row is its own document; a store's chunk belongs to its sequence's document."""
    from cramkit.data.tokenstore import is_store

    if is_store(source):
        from cramkit.data.tokenstore import TokenStore
        from cramkit.index.chunking import decode_spans, store_chunk_spans, store_documents
        from cramkit.index.chunking import store_tokenizer as pick

        ts = TokenStore(source)
        tok = pick(ts, loaded.tokenizer, store_tokenizer)
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

    rows = read_rows(source, text_a=text_col, label=None, encoding=encoding, errors=errors)
    if rows.texts_b is not None:
        texts = [f"{a} {b}" for a, b in zip(rows.texts_a, rows.texts_b, strict=True)]
    else:
        texts = rows.texts_a
    ids = np.arange(len(texts), dtype=np.int64)
    return texts, ids, ids, {"kind": "file"}


@writes_to("out")
def embed_source(
    source: str,
    model: str,
    out: str | os.PathLike,
    *,
    text_col: str | None = None,
    encoding: str | None = None,
    errors: str = "strict",
    pooling: str | None = None,
    normalize: bool | None = None,
    chunk_tokens: int | None = None,
    store_tokenizer: str | None = None,
    overwrite: bool = False,
    device: str = "auto",
    max_batch_tokens: int | None = None,
    block: int = 1024,
    format: str = "npy",  # noqa: A002 (the flag's name)
    shard: str | tuple[int, int] | None = None,
    prompt_name: str | None = None,
    dimensions: int | None = None,
    offload_experts: bool = False,
    expert_cache: int | None = None,
) -> dict[str, Any] | None:
    """Embed ``source`` into ``out`` (resuming an unfinished run of the same job); the ``embed.json`` record.

    format: ``npy`` (one memory map, ``embeddings.npy`` + ``ids.npy``) or ``parquet`` (one Parquet file per
    part: ``cramkit.index.shards``). shard: ``"i/N"`` or (i, N), Parquet only: this process embeds shard i of
    N (every shard given the same ``out``); the record then says which parts are still ``waiting``.
    prompt_name: one of the model's named prompts put before each text (default: its default prompt, if any).
    dimensions: the vectors cut to that many leading dimensions, renormalised (one of a Matryoshka model's, as
    ``Engine.embed``; any other size is one line naming them). offload_experts, expert_cache: a mixture-of-experts
    model's experts brought in as its routers pick them (:class:`~cramkit.infer.Engine`)."""
    from cramkit.index.core import load_encoder
    from cramkit.infer import Engine
    from cramkit.infer.offload import check_expert_cache
    from cramkit.load import check_source

    check_source(str(model))
    check_expert_cache(expert_cache, offload_experts)
    if format not in ("npy", "parquet"):
        raise CramkitError(f"--format {format!r}: use npy or parquet")
    if shard is not None and format != "parquet":
        raise CramkitError("--shard needs --format parquet (each shard writes its own Parquet files)")
    part_of = (0, 1)
    if format == "parquet":
        from cramkit.index.shards import parse_shard

        part_of = parse_shard(shard if not isinstance(shard, tuple) else f"{shard[0]}/{shard[1]}")
    out = Path(out)
    check_out(out, inputs=[source, model], own=[DONE_FILE, "state.json", ".work"])
    if format == "parquet":  # the parts are claimed one by one (concurrent shards share --out)
        lock: Any = contextlib.nullcontext()
    else:
        lock = dir_lock(out, "--out") if dist_info()[0] == 0 else contextlib.nullcontext()
    with lock:  # a second process on the same --out would truncate this one's memory map (SIGBUS)
        loaded = load_encoder(model)
        pooling = pooling or loaded.pooling
        normalize = loaded.normalize if normalize is None else normalize
        engine = Engine(
            loaded,
            device=device,
            max_batch_tokens=max_batch_tokens,
            offload_experts=offload_experts,
            expert_cache=expert_cache,
        )
        prompt = engine.prompt_text(prompt_name)  # an unknown name: one line, before any reading
        dims = engine.check_dimensions(dimensions)  # None: the whole vector
        texts, ids, docs, what = read_inputs(
            source,
            loaded,
            text_col=text_col,
            chunk_tokens=chunk_tokens,
            store_tokenizer=store_tokenizer,
            encoding=encoding,
            errors=errors,
        )
        if not texts:
            raise CramkitError(f"{source}: nothing to embed (0 rows)")
        fingerprint = encoder_fingerprint(loaded)
        key = texts_key(
            texts,
            fingerprint,
            pooling,
            str(bool(normalize)),
            *([f"prompt:{prompt}"] if prompt else []),
            *([f"dimensions:{dims}"] if dims else []),
        )
        done = finished(out, key)
        if done is not None and done.get("format", "npy") == format:
            return done | {"resumed_rows": done["rows"], "seconds": 0.0, "examples_per_s": None}
        meta = {"source": str(source), "model": str(model), **what}
        if prompt:
            meta |= {"prompt_name": prompt_name or engine.default_prompt_name, "prompt": prompt}
        if dims:
            meta["dimensions"] = dims
        if format == "parquet":
            from cramkit.index.shards import embed_parts

            if what.get("rows"):
                meta["rows_kind"] = meta.pop("rows")
            return embed_parts(
                texts,
                ids,
                docs,
                engine,
                out,
                key=key,
                fingerprint=fingerprint,
                pooling=pooling,
                normalize=bool(normalize),
                shard=part_of,
                overwrite=overwrite,
                block=block,
                meta=meta,
                prompt=prompt,
                dimensions=dims,
            )
        if finished(out) is not None:
            if not overwrite:
                raise CramkitError(
                    f"{out} holds finished embeddings of other inputs or another model; pick another --out or "
                    "pass --overwrite"
                )
            if dist_info()[0] == 0:
                (out / DONE_FILE).unlink(missing_ok=True)
                for p in out.iterdir():
                    if p.is_dir():
                        shutil.rmtree(p)
                    elif p.name != ".lock":  # the lock stays: this process holds it
                        p.unlink()
        return embed_to_memmap(
            texts,
            engine,
            out,
            key=key,
            pooling=pooling,
            normalize=bool(normalize),
            ids=ids,
            block=block,
            desc="embedding",
            meta=meta,
            prompt=prompt,
            dimensions=dims,
        )
