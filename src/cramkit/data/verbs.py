"""The verbs of ``cramkit data``: :func:`data_build` (text -> a token store, :func:`cramkit.data.build.build_store`),
:func:`data_join` (shards -> one store) and :func:`data_inspect` (a store's figures and samples). Each takes its
request (:mod:`cramkit.data.request`) or the request's fields, and says what it did as the command line does."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cramkit.data.request import DataBuildRequest, DataInspectRequest, DataJoinRequest
from cramkit.request import verb


@verb(DataBuildRequest)
def data_build(request: DataBuildRequest) -> Path:
    """``cramkit data build``: the ``sources`` tokenised into the store ``out/NAME`` (refused where one is, unless
    ``force``; ``shard="i/N"``: shard i of the input files alone, nothing done when it is built already); a progress
    line on a terminal unless ``quiet``, the store's figures on stdout. Returns the store's prefix."""
    from cramkit.data.build import build_store, shard_name, shard_sources
    from cramkit.data.tokenstore import TokenStore

    r = request
    shard_bytes, shard = r.shards()
    name = r.name if shard is None else shard_name(r.name, shard[0])
    built = shard is not None and _finished_shard(Path(r.out) / f"{name}.json", shard, shard_sources(r.sources, shard))
    if shard is not None and built and not r.force:
        print(f"shard {shard[0]}/{shard[1]} is already built ({r.out}/{name}.*): nothing to do")
        return Path(r.out) / name
    r.check(name)
    t0 = time.time()
    last = [t0]

    def progress(docs: int, tokens: int) -> None:
        now = time.time()
        if not r.quiet and now - last[0] > 2.0 and sys.stderr.isatty():
            last[0] = now
            rate = tokens / (now - t0)
            print(
                f"\r  {docs:,} documents, {tokens:,} tokens, {rate:,.0f} tokens/s", end="", file=sys.stderr, flush=True
            )

    prefix = build_store(
        r.sources,
        r.tokenizer,
        r.out,
        name=r.name,
        workers=r.workers,
        quality_cutoff=r.quality_cutoff,
        dedup=r.dedup,
        progress=progress,
        shard_bytes=shard_bytes,
        shard=shard,
        **r.reading_options(),
    )
    if last[0] != t0:
        print(file=sys.stderr)
    store = TokenStore(prefix)
    c = store.meta.get("counts", {})
    dt = time.time() - t0
    files = f"{prefix}.bin/.idx" if len(store.shards) == 1 else f"{prefix}-*.bin/.idx ({len(store.shards)} shards)"
    print(
        f"store {files}: {len(store):,} documents, {store.num_tokens:,} tokens ({store.dtype.name}) "
        f"in {dt:.1f}s ({store.num_tokens / max(dt, 1e-9):,.0f} tokens/s)"
    )
    dropped = {k: c.get(k, 0) for k in ("duplicates_dropped", "quality_dropped", "empty_dropped") if c.get(k)}
    if dropped:
        print("dropped: " + ", ".join(f"{k.replace('_dropped', '')} {v:,}" for k, v in dropped.items()))
    if shard is not None:
        print(f"shard {shard[0]}/{shard[1]} done; once every shard is: cramkit data join {r.out} --name {r.name}")
    return prefix


def _finished_shard(meta_file: Path, shard: tuple[int, int], files: list[str]) -> bool:
    """Whether ``meta_file`` records a finished build of exactly this shard (same split, same files)."""
    from cramkit.io import read_json_object

    if not meta_file.is_file():
        return False
    info = read_json_object(meta_file, "remove it, or pass --force").get("shard") or {}
    return info.get("index") == shard[0] and info.get("count") == shard[1] and info.get("files") == files


@verb(DataJoinRequest)
def data_join(request: DataJoinRequest) -> Path:
    """``cramkit data join``: the shards in ``store`` joined into the store ``NAME`` (:func:`join_shards`), its
    figures on stdout. Returns its prefix."""
    from cramkit.data.build import join_shards
    from cramkit.data.tokenstore import TokenStore

    prefix = join_shards(request.store, request.name)
    store = TokenStore(prefix)
    n = len(store.meta.get("joined_from", []))
    print(
        f"joined {n} shards -> {prefix}.json: {len(store):,} documents, {store.num_tokens:,} tokens "
        f"({len(store.shards)} .bin/.idx pairs)"
    )
    return prefix


@verb(DataInspectRequest)
def data_inspect(request: DataInspectRequest) -> str:
    """``cramkit data inspect``: a store's files, counts, tokenizer, sources, a histogram of document lengths and
    ``samples`` documents decoded (with ``tokenizer``, else the store's copy of its own), as text."""
    import numpy as np

    from cramkit.data.tokenstore import TokenStore

    store = TokenStore(request.store, name=request.name)
    meta = store.meta
    shards = store.shards
    files = f"{store.prefix}-*.bin/.idx ({len(shards)} shards, {shards[0]} ... {shards[-1]})"
    lines = [
        f"store      {f'{store.prefix}.bin/.idx' if len(shards) == 1 else files} (dtype {store.dtype.name})",
        f"sequences  {len(store):,}   documents {store.num_documents:,}   tokens {store.num_tokens:,}",
    ]
    if meta:
        lines.append(
            f"tokenizer  hash {meta.get('tokenizer_hash')}  vocab {meta.get('vocab_size')}  "
            f"({meta.get('tokenizer_path') or meta.get('tokenizer_file')})"
        )
        lines.append(f"sources    {', '.join(meta.get('sources', []))}")
        extra = ", ".join(f"{k} {v:,}" for k, v in meta.get("counts", {}).items() if k.endswith("_dropped") and v)
        if extra:
            lines.append(f"dropped    {extra}")
    sizes = np.asarray(store.sizes)
    if len(sizes):
        lines.append(
            f"length     min {sizes.min()}  median {int(np.median(sizes))}  mean {sizes.mean():.1f}  max {sizes.max()}"
        )
        edges = [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 1 << 62]
        hist, _ = np.histogram(sizes, bins=edges)
        top = max(int(hist.max()), 1)
        lines.append("histogram  (tokens per document)")
        for lo, hi, n in zip(edges[:-1], edges[1:], hist, strict=True):
            if n:
                label = f"{lo}-{hi - 1}" if hi < (1 << 62) else f">={lo}"
                lines.append(f"  {label:>11} {int(n):>9,} {'#' * max(1, round(40 * n / top))}")
    tok = _decoder(store, request.tokenizer, lines)
    if request.samples > 0 and len(store):
        rng = np.random.default_rng(0)
        picks = sorted(rng.choice(len(store), size=min(request.samples, len(store)), replace=False).tolist())
        for i in picks:
            ids = store[i][:64].tolist()
            text = tok.decode(ids) if tok is not None else " ".join(map(str, ids))
            more = " ..." if store.sizes[i] > 64 else ""
            lines.append(f"--- document {i} ({store.sizes[i]} tokens)\n{text}{more}")
    if tok is None:
        lines.append("(no tokenizer found to decode with; pass --tokenizer DIR)")
    return "\n".join(lines)


def _decoder(store, given, lines: list[str]):
    """The tokenizer to decode ``store``'s samples with: ``given`` (checked against the store), else the store's
    copy of its own (or the path it records); a warning in ``lines`` when the store holds ids beyond it."""
    from cramkit.text.tokenizer import load_tokenizer

    path = given
    if path is None and store.meta.get("tokenizer_file"):
        copy = store.prefix.parent / store.meta["tokenizer_file"]
        path = str(copy) if copy.exists() else store.meta.get("tokenizer_path")
    if not path:
        return None
    tok = load_tokenizer(path)
    if given:
        store.check_tokenizer(tok)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if store.max_token_id() >= vocab:
        lines.append(
            f"warning: the store holds token id {store.max_token_id()}, beyond the {vocab:,} entries of the "
            "tokenizer (another tokenizer built it, or it is damaged); decoded text below is not reliable"
        )
    return tok
