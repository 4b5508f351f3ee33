"""Text -> token store, in parallel and streaming.

The main process reads documents (`cramkit.text.sources.iter_documents`) and cuts them into batches of
about ``batch_chars`` characters, a rule that does not depend on the number of workers. Worker processes
encode batches with the tokenizer's ``encode_batch_fast`` (no special tokens; one thread each); the main
process writes the results in batch order as they come back, with at most ``2 * workers`` batches in
flight, so memory stays bounded and the store is byte-identical for any worker count.
Finalisation is atomic (see `TokenStoreWriter`).
"""

from __future__ import annotations

import errno
import itertools
import multiprocessing as mp
import os
import shutil
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from cramkit.data.tokenstore import TokenStoreWriter, store_dtype
from cramkit.errors import CramkitError
from cramkit.runtime import cpu_cores

BUILTIN_SOURCE = "builtin:stdlib-docstrings"
_TOK = None  # the tokenizer inside a worker


def _init_worker(tok_json: str) -> None:
    global _TOK
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    _TOK = Tokenizer.from_str(tok_json)


def encode_texts(tok, texts: list[str], dtype: np.dtype, quality_cutoff: float | None = None):
    """Encode texts -> (ids back to back, lengths, dropped_by_quality, dropped_empty)."""
    encs = tok.encode_batch_fast(texts, add_special_tokens=False)
    ids = [e.ids for e in encs]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    keep = lengths > 0
    dropped_empty = int((~keep).sum())
    dropped_quality = 0
    if quality_cutoff is not None:
        chars = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        bad = keep & (lengths > quality_cutoff * chars)
        dropped_quality = int(bad.sum())
        keep &= ~bad
    if not keep.all():
        ids = [x for x, k in zip(ids, keep, strict=True) if k]
        lengths = lengths[keep]
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
    return flat, lengths, dropped_quality, dropped_empty


def _encode_in_worker(texts: list[str], dtype: str, quality_cutoff: float | None):
    return encode_texts(_TOK, texts, np.dtype(dtype), quality_cutoff)


def _batches(docs: Iterable[str], batch_chars: int) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for doc in docs:
        batch.append(doc)
        size += len(doc)
        if size >= batch_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _run_pool(docs, workers, batch_chars, tok_json, dtype, quality_cutoff, write) -> None:
    """Encode batches in worker processes; results written in batch order, <= 2*workers in flight."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # fork: no re-import of the caller's __main__ (spawn would re-run an unguarded script)
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    ex = ProcessPoolExecutor(workers, mp_context=mp.get_context(method), initializer=_init_worker, initargs=(tok_json,))
    try:
        pending: deque = deque()
        for batch in _batches(docs, batch_chars):
            pending.append(ex.submit(_encode_in_worker, batch, dtype.name, quality_cutoff))
            while len(pending) >= 2 * workers:
                write(pending.popleft().result())
        while pending:
            write(pending.popleft().result())
    except BrokenProcessPool:
        raise CramkitError("a tokenizer worker process died (out of memory?); retry with fewer --workers") from None
    finally:
        for f in pending:
            f.cancel()
        ex.shutdown(wait=True, cancel_futures=True)


def build_store(
    sources: Sequence[str] | str | None,
    tokenizer,
    out_dir: str | os.PathLike,
    *,
    name: str = "train",
    workers: int | None = None,
    quality_cutoff: float | None = None,
    dedup: bool = False,
    batch_chars: int = 1 << 18,
    progress: Callable[[int, int], None] | None = None,
    shard_bytes: int | None = None,
    **source_kwargs,
) -> Path:
    """Tokenise ``sources`` into ``out_dir/NAME.{bin,idx,json}`` (+ ``NAME.tokenizer.json``); returns the prefix.

    tokenizer: a `tokenizers.Tokenizer` or a path `load_tokenizer` understands.
    workers: processes that encode (default: all cores); 1 encodes in this process.
    quality_cutoff: drop documents with more than this many tokens per character (Cramming's filter).
    dedup: drop exact duplicate documents. source_kwargs go to `iter_documents` (doc_split, encoding, ...).
    progress: called as progress(documents, tokens) after each batch is written.
    shard_bytes: split the store into shards of at most this many bytes of tokens (``NAME-00000.bin/.idx``,
    ... listed in NAME.json), which stage and open independently; None: one .bin/.idx pair.
    """
    from cramkit.text.sources import iter_documents
    from cramkit.text.tokenizer import load_tokenizer, special_ids, tokenizer_hash

    tok_path = None
    if not hasattr(tokenizer, "encode_batch"):
        tok_path = str(Path(tokenizer).resolve())
        tokenizer = load_tokenizer(tokenizer)
    special = special_ids(tokenizer)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = store_dtype(vocab_size)
    workers = cpu_cores() if workers is None else int(workers)
    if workers < 1:
        raise CramkitError(f"--workers {workers} must be at least 1")
    if quality_cutoff is not None and not quality_cutoff > 0:
        raise CramkitError(
            f"--quality-cutoff {quality_cutoff} must be a positive tokens-per-character ratio (e.g. 0.3)"
        )
    if not name or "/" in name or name.startswith("."):
        raise CramkitError(f"--name {name!r} must be a plain file name such as 'train'")
    if isinstance(sources, (str, os.PathLike)):
        sources = [str(sources)]
    sources = [str(s) for s in sources or []]
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CramkitError(f"--out {out} exists and is not a directory; give a directory for the store")

    stats: dict = {}
    docs = iter_documents(sources, dedup=dedup, stats=stats, **source_kwargs)
    counts = {"dropped_quality": 0, "dropped_empty": 0}
    tok_json = tokenizer.to_str()
    created = not out.exists()
    tmp_tok: Path | None = None
    writer = TokenStoreWriter(out / name, dtype, shard_bytes)

    def write(result) -> None:
        flat, lengths, dq, de = result
        writer.add_documents(flat, lengths)
        counts["dropped_quality"] += dq
        counts["dropped_empty"] += de
        if progress is not None:
            progress(writer.num_sequences, writer.num_tokens)

    try:
        saved = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker (and none forked busy)
        try:
            if workers == 1:
                for batch in _batches(docs, batch_chars):
                    write(encode_texts(tokenizer, batch, dtype, quality_cutoff))
            else:
                _run_pool(docs, workers, batch_chars, tok_json, dtype, quality_cutoff, write)
        finally:
            if saved is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = saved
        if stats.get("documents", 0) == 0:
            where = ", ".join(sources) if sources else "the built-in corpus"
            raise CramkitError(f"no documents found in {where}: the corpus is empty; give sources with text in them")
        if writer.num_sequences == 0:
            raise CramkitError(
                f"all {stats['documents']} documents were dropped (quality cutoff {quality_cutoff}: "
                f"{counts['dropped_quality']}, empty after tokenisation: {counts['dropped_empty']}); "
                "raise --quality-cutoff or check the tokenizer"
            )
        tok_copy = out / f"{name}.tokenizer.json"
        tmp_tok = out / f".{name}.tokenizer.json.tmp{os.getpid()}"
        tmp_tok.write_text(tok_json, encoding="utf-8")
        os.replace(tmp_tok, tok_copy)
        meta = {
            "tokenizer_hash": tokenizer_hash(tokenizer),
            "tokenizer_path": tok_path,
            "tokenizer_file": tok_copy.name,
            "vocab_size": vocab_size,
            "special_ids": {k: getattr(special, k) for k in ("pad", "unk", "cls", "sep", "mask")},
            "sources": sources or [BUILTIN_SOURCE],
            "source_options": {k: v for k, v in source_kwargs.items() if k != "stats"},
            "dedup": dedup,
            "quality_cutoff": quality_cutoff,
            "counts": {
                "files": stats.get("files", 0),
                "documents_read": stats.get("documents", 0),
                "duplicates_dropped": stats.get("duplicates", 0),
                "quality_dropped": counts["dropped_quality"],
                "empty_dropped": counts["dropped_empty"],
                "documents": writer.num_sequences,
                "tokens": writer.num_tokens,
            },
        }
        return writer.finalize(meta)
    except BaseException as exc:
        writer.abort()
        if tmp_tok is not None:
            tmp_tok.unlink(missing_ok=True)
        if created and out.is_dir():
            shutil.rmtree(out, ignore_errors=True)  # nothing of a failed build is left behind
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise CramkitError(
                f"--out {out}: the disk is full ({exc.strerror}) while writing the token store; nothing was "
                "kept (no partial store); free space there or give another --out"
            ) from None
        raise
