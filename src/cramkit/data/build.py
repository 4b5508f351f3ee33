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
from cramkit.runtime import cpu_cores, die_with_parent

BUILTIN_SOURCE = "builtin:stdlib-docstrings"
_TOK = None  # the tokenizer inside a worker


def _init_worker(tok_json: str, parent: int) -> None:
    global _TOK
    die_with_parent(parent)
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
    context, parent = mp.get_context(method), os.getpid()
    ex = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(tok_json, parent))
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
    shard: tuple[int, int] | None = None,
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
    shard: (i, N): tokenise only the i-th of N contiguous runs of the input files (``shard_sources``) into the
    store ``NAME-IIIII`` (its NAME-IIIII.json records the shard); `join_shards` then writes NAME.json, which
    opens the N of them as one store, equal to a build of every file by one process (``dedup`` works within
    a shard only).
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
    _check_build_options(workers, quality_cutoff, name)
    sources, shard_info, name = _sources_of(sources, shard, name)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CramkitError(f"--out {out} exists and is not a directory; give a directory for the store")

    stats: dict = {}
    docs = iter_documents(sources, dedup=dedup, stats=stats, **source_kwargs)
    counts = {"dropped_quality": 0, "dropped_empty": 0}
    tok_json = tokenizer.to_str()
    created = not out.exists()
    writer = TokenStoreWriter(out / name, dtype, shard_bytes)

    def write(result) -> None:
        flat, lengths, dq, de = result
        writer.add_documents(flat, lengths)
        counts["dropped_quality"] += dq
        counts["dropped_empty"] += de
        if progress is not None:
            progress(writer.num_sequences, writer.num_tokens)

    try:
        _encode_documents(docs, tokenizer, tok_json, workers, batch_chars, dtype, quality_cutoff, write)
        _check_kept(stats, writer, sources, quality_cutoff, counts)
        tok_copy = _copy_tokenizer(tok_json, out / f"{name}.tokenizer.json")
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
            **({"shard": shard_info} if shard_info else {}),
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
        if created and out.is_dir():
            shutil.rmtree(out, ignore_errors=True)  # nothing of a failed build is left behind
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise CramkitError(
                f"--out {out}: the disk is full ({exc.strerror}) while writing the token store; nothing was "
                "kept (no partial store); free space there or give another --out"
            ) from None
        raise


def _check_build_options(workers: int, quality_cutoff: float | None, name: str) -> None:
    """One CramkitError for a worker count, quality cutoff or store name that cannot work."""
    if workers < 1:
        raise CramkitError(f"--workers {workers} must be at least 1")
    if quality_cutoff is not None and not quality_cutoff > 0:
        raise CramkitError(
            f"--quality-cutoff {quality_cutoff} must be a positive tokens-per-character ratio (e.g. 0.3)"
        )
    if not name or "/" in name or name.startswith("."):
        raise CramkitError(f"--name {name!r} must be a plain file name such as 'train'")


def _sources_of(
    sources: Sequence[str] | str | None, shard: tuple[int, int] | None, name: str
) -> tuple[list[str], dict | None, str]:
    """The sources as a list of strings, and with ``shard`` (i, N) those of shard i, what the store records of
    the shard, and the shard store's name (``shard_name``); without it, no record and ``name`` itself."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [str(sources)]
    sources = [str(s) for s in sources or []]
    if shard is None:
        return sources, None, name
    sources = shard_sources(sources, shard)
    return sources, {"index": shard[0], "count": shard[1], "name": name, "files": sources}, shard_name(name, shard[0])


def _encode_documents(
    docs: Iterable[str],
    tokenizer,
    tok_json: str,
    workers: int,
    batch_chars: int,
    dtype: np.dtype,
    quality_cutoff: float | None,
    write: Callable[[tuple], None],
) -> None:
    """Encode ``docs`` in batches (in this process with one worker, else in ``workers`` processes), each
    batch's result passed to ``write`` in batch order; the tokenizers library's own threads off meanwhile."""
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


def _check_kept(
    stats: dict, writer: TokenStoreWriter, sources: list[str], quality_cutoff: float | None, counts: dict[str, int]
) -> None:
    """One CramkitError when the sources held no document, or when every document was dropped."""
    if stats.get("documents", 0) == 0:
        where = ", ".join(sources) if sources else "the built-in corpus"
        raise CramkitError(f"no documents found in {where}: the corpus is empty; give sources with text in them")
    if writer.num_sequences == 0:
        raise CramkitError(
            f"all {stats['documents']} documents were dropped (quality cutoff {quality_cutoff}: "
            f"{counts['dropped_quality']}, empty after tokenisation: {counts['dropped_empty']}); "
            "raise --quality-cutoff or check the tokenizer"
        )


def _copy_tokenizer(tok_json: str, path: Path) -> Path:
    """The tokenizer written to ``path`` beside the store (atomically: a temporary file renamed into place)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(tok_json, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# ------------------------------------------------------------------------------------------ shards


def shard_name(name: str, i: int) -> str:
    """The store of shard ``i`` of the store ``name``: ``NAME-IIIII`` (a name `TokenStore` lists as a shard)."""
    return f"{name}-{i:05d}"


def shard_sources(sources: Sequence[str], shard: tuple[int, int]) -> list[str]:
    """The input files of shard ``i`` of ``N``: the i-th of N contiguous runs of the files that ``sources``
    name (in the order a build reads them), whole files each; a CramkitError when there are fewer files than
    shards."""
    from cramkit.text.sources import expand_sources

    i, n = shard
    if not sources:
        raise CramkitError(f"--shard {i}/{n} splits input files between shards; give the sources (files, folders)")
    files = expand_sources(list(sources))
    if len(files) < n:
        raise CramkitError(
            f"--shard {i}/{n}: the sources hold {len(files)} file(s), fewer than the {n} shards (a shard takes whole "
            f"files); use N <= {len(files)} or split the corpus into more files"
        )
    return files[len(files) * i // n : len(files) * (i + 1) // n]


def _shard_record(p: Path, meta: dict, name: str, index: int) -> dict:
    """``meta`` (the record ``p`` of shard ``index`` of the store ``name``) with every field the join reads typed
    and bounded (cramkit.meta), before any of it sizes a list; one CramkitError naming the file and field."""
    from cramkit.meta import MAX_PARTS, meta_dict, meta_int, meta_str, meta_strings

    fix = "the record is damaged or crafted: rebuild that shard with `cramkit data build ... --shard i/N`"
    info = meta.get("shard")
    if not isinstance(info, dict) or info.get("name") != name or info.get("index") != index:
        raise CramkitError(f"{p} is not the record of a shard of {name} (cramkit data build --shard i/N); move it away")
    where = f"{p} (shard)"
    count = meta_int(info, "count", where, fix, lo=1, hi=MAX_PARTS)
    if index >= count:
        raise CramkitError(f"{p} is shard {index} of {count}: no such shard; {fix}")
    meta_strings(info, "files", where, fix, default=[])
    for key in ("num_sequences", "num_documents"):
        meta_int(meta, key, p, fix, hi=1 << 40)
    meta_int(meta, "num_tokens", p, fix, hi=1 << 56)
    meta_int(meta, "max_token_id", p, fix, lo=-1, hi=(1 << 32) - 1)
    meta_str(meta, "dtype", p, fix)
    for key, value in meta_dict(meta, "counts", p, fix, default={}).items():
        meta_int({key: value}, key, f"{p} (counts)", fix, hi=1 << 56)
    sums = meta_dict(meta, "checksums", p, fix, default={})
    if not all(isinstance(v, str) for v in sums.values()):
        raise CramkitError(f"{p}: field 'checksums' must map file names to strings; {fix}")
    return meta


def join_shards(out_dir: str | os.PathLike, name: str = "train") -> Path:
    """Write ``out_dir/NAME.json`` (and ``NAME.tokenizer.json``), the manifest that opens the stores
    ``NAME-00000`` ... ``NAME-{N-1}`` built by ``cramkit data build --shard i/N`` as one sharded store;
    returns the prefix. A missing shard, one from another split or another tokenizer, or a file tokenised by
    two shards is one CramkitError naming it; nothing is written then."""
    import re

    from cramkit.data.tokenstore import TokenStore
    from cramkit.io import read_json_object, write_json_atomic, write_text_atomic

    out = Path(out_dir)
    if not out.is_dir():
        raise CramkitError(f"{out}: no such directory; give the --out of `cramkit data build --shard i/N`")
    if not name or "/" in name or name.startswith("."):
        raise CramkitError(f"--name {name!r} must be a plain file name such as 'train'")
    pattern = re.compile(rf"{re.escape(name)}-(\d{{5}})\.json\Z")
    found: dict[int, tuple[Path, dict]] = {}
    for p in sorted(out.iterdir()):
        m = pattern.fullmatch(p.name)
        if not m:
            continue
        meta = read_json_object(p, "rebuild that shard with `cramkit data build ... --shard i/N`")
        found[int(m.group(1))] = (p, _shard_record(p, meta, name, int(m.group(1))))
    final = out / f"{name}.json"
    if not found:
        raise CramkitError(f"{out} holds no shards of {name} ({name}-00000.json ...); build them with --shard i/N")
    if final.is_file() and "joined_from" not in read_json_object(final, "remove it"):
        raise CramkitError(
            f"{final} is a store of its own, not a join of shards; choose another --name or move it away"
        )
    first_path, first = found[min(found)]
    count = first["shard"]["count"]
    for p, meta in found.values():
        if meta["shard"].get("count") != count:
            raise CramkitError(
                f"{p} is shard {meta['shard']['index']}/{meta['shard'].get('count')}, {first_path.name} of "
                f"{count} shards: one split per store; move the other split's files away"
            )
        if meta.get("tokenizer_hash") != first.get("tokenizer_hash") or meta.get("dtype") != first.get("dtype"):
            raise CramkitError(
                f"{p} was built with another tokenizer (hash {meta.get('tokenizer_hash')}, {first_path.name}: "
                f"{first.get('tokenizer_hash')}); rebuild it with the same --tokenizer"
            )
    missing = [i for i in range(count) if i not in found]
    if missing:
        names = ", ".join(f"--shard {i}/{count}" for i in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise CramkitError(
            f"{out}: {len(missing)} of {count} shards of {name} missing ({shard_name(name, missing[0])}.json ...); "
            f"run `cramkit data build ... {names} --out {out}`, then join again"
        )
    seen: dict[str, int] = {}
    for i in range(count):
        for f in found[i][1]["shard"].get("files", []):
            if f in seen:
                raise CramkitError(
                    f"{f} was tokenised by shards {seen[f]}/{count} and {i}/{count} (built from different source "
                    "lists?): rebuild the shards from the same sources"
                )
            seen[f] = i
    pairs: list[str] = []
    checksums: dict[str, str] = {}
    counts: dict[str, int] = {}
    for i in range(count):
        store = TokenStore(out / shard_name(name, i))  # checks its files: headers, sizes, names inside out
        meta = found[i][1]
        if (meta["num_sequences"], meta["num_tokens"]) != (len(store), store.num_tokens):
            raise CramkitError(
                f"{found[i][0]} records {meta['num_sequences']} sequences and {meta['num_tokens']} tokens, its "
                f"store holds {len(store)} and {store.num_tokens}; rebuild that shard with --shard {i}/{count}"
            )
        pairs += store.shards
        checksums.update(meta.get("checksums") or {})
        for k, v in (meta.get("counts") or {}).items():
            counts[k] = counts.get(k, 0) + int(v)
    joined = {
        k: first[k]
        for k in ("tokenizer_hash", "tokenizer_path", "vocab_size", "special_ids", "source_options", "dedup")
        if k in first
    }
    joined.update(
        tokenizer_file=f"{name}.tokenizer.json",
        sources=[f for i in range(count) for f in found[i][1]["shard"].get("files", [])],
        quality_cutoff=first.get("quality_cutoff"),
        counts=counts,
        format="megatron-mmididx-v1",
        dtype=first["dtype"],
        num_sequences=sum(int(found[i][1]["num_sequences"]) for i in range(count)),
        num_documents=sum(int(found[i][1]["num_documents"]) for i in range(count)),
        num_tokens=sum(int(found[i][1]["num_tokens"]) for i in range(count)),
        max_token_id=max(int(found[i][1]["max_token_id"]) for i in range(count)),
        checksums=checksums,
        shards=pairs,
        joined_from=[shard_name(name, i) for i in range(count)],
    )
    tok_file = out / f"{shard_name(name, min(found))}.tokenizer.json"
    if tok_file.is_file():
        write_text_atomic(out / f"{name}.tokenizer.json", tok_file.read_text(encoding="utf-8"))
    write_json_atomic(final, joined)
    return out / name
