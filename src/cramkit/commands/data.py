"""`cramkit tokenizer train` and `cramkit data build|inspect` (heavy imports inside the verbs)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from cramkit.commands.reading import add_reading_args, reading_kwargs
from cramkit.errors import CramkitError
from cramkit.text import MIN_FREQUENCY, VOCAB_SIZE, ZH_VOCAB_SIZE


def _source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help="text files, directories, globs, .jsonl/.json (JSON Lines)/.parquet, .gz/.zst, or "
        "hf:NAME:CONFIG:SPLIT (none: the built-in corpus, this Python's standard-library docstrings)",
    )
    add_reading_args(p, normalize=True)


def register(sub) -> None:
    tok = sub.add_parser("tokenizer", help="train a WordPiece tokenizer")
    tsub = tok.add_subparsers(dest="tokenizer_command", metavar="VERB")
    train = tsub.add_parser("train", help="train a BERT WordPiece tokenizer on text")
    _source_args(train)
    train.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help=f"tokens in the vocabulary (default {VOCAB_SIZE}; {ZH_VOCAB_SIZE} for Chinese, as bert-base-chinese)",
    )
    train.add_argument(
        "--lang",
        default="auto",
        choices=["auto", "zh", "generic"],
        help="zh: character-level WordPiece for Chinese (each CJK character a token, Latin words as pieces, "
        "accents kept); generic: BERT's; auto (default): zh when most letters of a sample are Chinese",
    )
    train.add_argument("--out", required=True, help="directory for tokenizer.json, vocab.txt, ...")
    train.add_argument("--force", action="store_true", help="replace a tokenizer already in --out")
    train.add_argument("--no-lowercase", action="store_true", help="keep case")
    train.add_argument("--keep-accents", action="store_true", help="do not strip accents")
    train.add_argument(
        "--min-frequency",
        type=int,
        default=MIN_FREQUENCY,
        help="times a piece must occur to enter the vocabulary (default %(default)s)",
    )
    train.set_defaults(func=cmd_tokenizer_train)
    tok.set_defaults(func=lambda a: _help(tok))

    data = sub.add_parser("data", help="build and inspect token stores")
    dsub = data.add_subparsers(dest="data_command", metavar="VERB")
    build = dsub.add_parser("build", help="tokenise text into a memory-mapped token store (Megatron .bin/.idx)")
    _source_args(build)
    build.add_argument("--tokenizer", required=True, help="directory with tokenizer.json or vocab.txt (or either file)")
    build.add_argument("--out", required=True, help="directory for NAME.bin, NAME.idx, NAME.json")
    build.add_argument("--name", default="train", help="store name inside --out (default: %(default)s)")
    build.add_argument("--force", action="store_true", help="replace a store of that --name already in --out")
    build.add_argument("--workers", type=int, default=None, help="encoding processes (default: all cores)")
    build.add_argument("--dedup", action="store_true", help="drop exact duplicate documents")
    build.add_argument(
        "--quality-cutoff",
        type=float,
        default=None,
        help="drop documents with more tokens per character than this (Cramming uses 0.3)",
    )
    build.add_argument(
        "--shard-size",
        default=None,
        metavar="SIZE",
        help="split the store into shards of at most SIZE (e.g. 1GB) of tokens, NAME-00000.bin/.idx, ..., listed "
        "in NAME.json; each stages and opens on its own (default: one .bin/.idx pair)",
    )
    build.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="tokenise only shard I of N (counted from 0) of the input files, into the store NAME-IIIII; run every "
        "shard with the same --out (on N machines), then `cramkit data join DIR`",
    )
    build.add_argument("--quiet", action="store_true", help="no progress line")
    build.set_defaults(func=cmd_data_build)
    join = dsub.add_parser("join", help="join the shards of `data build --shard i/N` into one store (NAME.json)")
    join.add_argument("store", metavar="DIR", help="the --out of the shards")
    join.add_argument("--name", default="train", help="store name inside DIR (default: %(default)s)")
    join.set_defaults(func=cmd_data_join)
    inspect = dsub.add_parser("inspect", help="counts, a length histogram and decoded samples of a store")
    inspect.add_argument("store", metavar="DIR", help="store directory (or NAME prefix / NAME.idx)")
    inspect.add_argument("--name", default=None, help="store name when DIR holds several")
    inspect.add_argument("--tokenizer", default=None, help="tokenizer to decode with (default: the store's copy)")
    inspect.add_argument("--samples", type=int, default=3, help="documents decoded and shown (default %(default)s)")
    inspect.set_defaults(func=cmd_data_inspect)
    data.set_defaults(func=lambda a: _help(data))


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _refuse_overwrite(out: str, names: list[str], force: bool) -> None:
    """CramkitError when ``out`` already holds one of ``names`` and ``force`` is not given."""
    found = [n for n in names if (Path(out) / n).exists()]
    if found and not force:
        raise CramkitError(
            f"--out {out} already holds {', '.join(found)}; choose another --out or pass --force to replace it"
        )


_LANG_NAMES = {"zh": "Chinese, one token per character", "generic": "generic WordPiece"}


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    from cramkit.text.sources import detect_language, iter_documents
    from cramkit.text.tokenizer import save_tokenizer, train_tokenizer

    _refuse_overwrite(args.out, ["tokenizer.json", "vocab.txt"], args.force)
    t0 = time.time()
    stats: dict = {}
    lang = args.lang
    if lang == "auto":
        guess = detect_language(iter_documents(args.sources, **reading_kwargs(args)))
        lang = guess.lang
        print(f"tokenizer: {guess.describe()}: {_LANG_NAMES[lang]} (--lang to choose)")
    vocab_size = args.vocab_size or (ZH_VOCAB_SIZE if lang == "zh" else VOCAB_SIZE)
    tok = train_tokenizer(
        lambda: iter_documents(args.sources, stats=stats, **reading_kwargs(args)),
        vocab_size,
        lowercase=not args.no_lowercase,
        strip_accents=not args.keep_accents,
        min_frequency=args.min_frequency,
        lang=lang,
    )
    out = save_tokenizer(tok, args.out)
    n = tok.get_vocab_size()
    print(
        f"tokenizer: {n} tokens from {stats.get('documents', 0)} documents ({_LANG_NAMES[lang]}) in "
        f"{time.time() - t0:.1f}s -> {out}"
    )
    if n < vocab_size:
        print(f"note: the corpus yields only {n} of the {vocab_size} tokens asked for (every word is whole)")
    return 0


def cmd_data_build(args: argparse.Namespace) -> int:
    from cramkit.data.build import build_store
    from cramkit.data.stage import parse_size
    from cramkit.data.tokenstore import TokenStore
    from cramkit.runtime import parse_shard

    shard_bytes = parse_size(args.shard_size, "--shard-size") if args.shard_size is not None else None
    shard = parse_shard(args.shard) if args.shard is not None else None
    name = args.name
    if shard is not None:
        from cramkit.data.build import shard_name, shard_sources

        name = shard_name(args.name, shard[0])
        done = _finished_shard(Path(args.out) / f"{name}.json", shard, shard_sources(args.sources, shard))
        if done and not args.force:
            print(f"shard {shard[0]}/{shard[1]} is already built ({args.out}/{name}.*): nothing to do")
            return 0
    _refuse_overwrite(args.out, [f"{name}{ext}" for ext in (".bin", ".idx", ".json")], args.force)
    t0 = time.time()
    last = [t0]

    def progress(docs: int, tokens: int) -> None:
        now = time.time()
        if not args.quiet and now - last[0] > 2.0 and sys.stderr.isatty():
            last[0] = now
            print(
                f"\r  {docs:,} documents, {tokens:,} tokens, {tokens / (now - t0):,.0f} tokens/s",
                end="",
                file=sys.stderr,
                flush=True,
            )

    prefix = build_store(
        args.sources,
        args.tokenizer,
        args.out,
        name=args.name,
        workers=args.workers,
        quality_cutoff=args.quality_cutoff,
        dedup=args.dedup,
        progress=progress,
        shard_bytes=shard_bytes,
        shard=shard,
        **reading_kwargs(args),
    )
    if not args.quiet and sys.stderr.isatty() and last[0] != t0:
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
        print(f"shard {shard[0]}/{shard[1]} done; once every shard is: cramkit data join {args.out} --name {args.name}")
    return 0


def _finished_shard(meta_file: Path, shard: tuple[int, int], files: list[str]) -> bool:
    """Whether ``meta_file`` records a finished build of exactly this shard (same split, same files)."""
    from cramkit.io import read_json_object

    if not meta_file.is_file():
        return False
    info = read_json_object(meta_file, "remove it, or pass --force").get("shard") or {}
    return info.get("index") == shard[0] and info.get("count") == shard[1] and info.get("files") == files


def cmd_data_join(args: argparse.Namespace) -> int:
    from cramkit.data.build import join_shards
    from cramkit.data.tokenstore import TokenStore

    prefix = join_shards(args.store, args.name)
    store = TokenStore(prefix)
    n = len(store.meta.get("joined_from", []))
    print(
        f"joined {n} shards -> {prefix}.json: {len(store):,} documents, {store.num_tokens:,} tokens "
        f"({len(store.shards)} .bin/.idx pairs)"
    )
    return 0


def cmd_data_inspect(args: argparse.Namespace) -> int:
    import numpy as np

    from cramkit.data.tokenstore import TokenStore
    from cramkit.text.tokenizer import load_tokenizer

    store = TokenStore(args.store, name=args.name)
    meta = store.meta
    files = (
        f"{store.prefix}.bin/.idx"
        if len(store.shards) == 1
        else f"{store.prefix}-*.bin/.idx ({len(store.shards)} shards, {store.shards[0]} ... {store.shards[-1]})"
    )
    print(f"store      {files} (dtype {store.dtype.name})")
    print(f"sequences  {len(store):,}   documents {store.num_documents:,}   tokens {store.num_tokens:,}")
    if meta:
        print(
            f"tokenizer  hash {meta.get('tokenizer_hash')}  vocab {meta.get('vocab_size')}  "
            f"({meta.get('tokenizer_path') or meta.get('tokenizer_file')})"
        )
        print(f"sources    {', '.join(meta.get('sources', []))}")
        c = meta.get("counts", {})
        extra = ", ".join(f"{k} {v:,}" for k, v in c.items() if k.endswith("_dropped") and v)
        if extra:
            print(f"dropped    {extra}")
    sizes = np.asarray(store.sizes)
    if len(sizes):
        print(
            f"length     min {sizes.min()}  median {int(np.median(sizes))}  mean {sizes.mean():.1f}  max {sizes.max()}"
        )
        edges = [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 1 << 62]
        hist, _ = np.histogram(sizes, bins=edges)
        width = 40
        top = max(int(hist.max()), 1)
        print("histogram  (tokens per document)")
        for lo, hi, n in zip(edges[:-1], edges[1:], hist, strict=True):
            if n:
                label = f"{lo}-{hi - 1}" if hi < (1 << 62) else f">={lo}"
                print(f"  {label:>11} {int(n):>9,} {'#' * max(1, round(width * n / top))}")
    tok = None
    tok_path = args.tokenizer
    if tok_path is None and meta.get("tokenizer_file"):
        cand = store.prefix.parent / meta["tokenizer_file"]
        tok_path = str(cand) if cand.exists() else meta.get("tokenizer_path")
    if tok_path:
        tok = load_tokenizer(tok_path)
        if args.tokenizer:
            store.check_tokenizer(tok)
        vocab = tok.get_vocab_size(with_added_tokens=True)
        if store.max_token_id() >= vocab:
            print(
                f"warning: the store holds token id {store.max_token_id()}, beyond the {vocab:,} entries of the "
                "tokenizer (another tokenizer built it, or it is damaged); decoded text below is not reliable"
            )
    if args.samples > 0 and len(store):
        rng = np.random.default_rng(0)
        picks = sorted(rng.choice(len(store), size=min(args.samples, len(store)), replace=False).tolist())
        for i in picks:
            ids = store[i][:64].tolist()
            text = tok.decode(ids) if tok is not None else " ".join(map(str, ids))
            more = " ..." if store.sizes[i] > 64 else ""
            print(f"--- document {i} ({store.sizes[i]} tokens)\n{text}{more}")
    if tok is None:
        print("(no tokenizer found to decode with; pass --tokenizer DIR)")
    return 0
