"""Data-stage benchmark (issue 2): store build vs the bare tokenizer, and the MLM loader.

    python bench/bench_data.py [--novels 20] [--workers 1 2] [--batches 300]

1. Build: text -> token store throughput (tokens/s) against calling the same tokenizer's
   ``encode_batch`` (and ``encode_batch_fast``) alone on the same documents, already in memory, one
   thread, measured side by side in this run. Target: build per core >= 0.8 x encode_batch; near-linear
   in workers.
2. Loader: packed + masked batches (seq_len 128) from the memory-mapped store on one core.
   Target >= 5M tokens/s; resident memory must not grow with the store's size.

Corpora: ../shared/data (english-novels-100 subset, nltk-webtext, nltk-abc, wikitext-2).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from _shared_data import SHARED

os.environ["TOKENIZERS_PARALLELISM"] = "false"


from cramkit.data import DataConfig, PretrainData, TokenStore, build_store
from cramkit.data.build import _batches
from cramkit.text import iter_documents, special_ids, train_tokenizer

DATA = SHARED


def anon_mb() -> float:
    """Resident anonymous memory (heap; not the store's page cache, which the kernel can drop)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the build's workers)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def table(title: str, header: list[str], rows: list[list]) -> None:
    print(f"\n{title}")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--novels", type=int, default=20, help="how many novels to include")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--vocab-size", type=int, default=32768)
    args = ap.parse_args()
    if not DATA.exists():
        print(f"needs the shared data at {DATA}", file=sys.stderr)
        return 2
    novels = sorted((DATA / "corpus" / "english-novels-100").glob("*.txt"))[: args.novels]
    sources = [str(p) for p in novels] + [
        str(DATA / "corpus" / "nltk-webtext"),
        str(DATA / "corpus" / "nltk-abc"),
        str(DATA / "wikitext-2"),
    ]
    kw = dict(errors="replace")
    docs = list(iter_documents(sources, **kw))
    chars = sum(map(len, docs))
    print(
        f"corpus: {len(docs):,} documents, {chars / 1e6:.1f}M characters from {len(sources)} sources; "
        f"{os.cpu_count()} CPUs"
    )
    tok = train_tokenizer(docs[:: max(1, len(docs) // 2000)] + docs[:200], args.vocab_size)
    print(f"tokenizer: {tok.get_vocab_size()} WordPiece tokens")
    batches = list(_batches(docs, 1 << 18))

    # ---------------------------------------------------------------- baselines: the bare tokenizer
    base = {}
    for name in ("encode_batch", "encode_batch_fast"):
        fn = getattr(tok, name)
        t, c = time.perf_counter(), cpu_s()
        n = 0
        for b in batches:
            n += sum(len(e.ids) for e in fn(b, add_special_tokens=False))
        base[name] = (n, time.perf_counter() - t, cpu_s() - c)
    n_tokens = base["encode_batch"][0]
    ref_wall = n_tokens / base["encode_batch"][1]
    ref_cpu = n_tokens / base["encode_batch"][2]

    rows = [
        [
            name,
            f"{n / dt / 1e6:.2f}",
            f"{n / cpu / 1e6:.2f}",
            "1",
            f"{n / dt / ref_wall:.2f}",
            f"{n / cpu / ref_cpu:.2f}",
            "-",
        ]
        for name, (n, dt, cpu) in base.items()
    ]
    tmp = Path(tempfile.mkdtemp(prefix="bench_data_"))
    w1 = None
    for w in args.workers:
        t, c = time.perf_counter(), cpu_s()
        prefix = build_store(sources, tok, tmp / f"w{w}", workers=w, **kw)
        dt, cpu = time.perf_counter() - t, cpu_s() - c
        store = TokenStore(prefix)
        assert store.num_tokens == n_tokens, (store.num_tokens, n_tokens)
        tps = n_tokens / dt
        w1 = w1 or (tps if w == 1 else None)
        rows.append(
            [
                f"build_store workers={w}",
                f"{tps / 1e6:.2f}",
                f"{n_tokens / cpu / 1e6:.2f}",
                str(w),
                f"{tps / w / ref_wall:.2f}",
                f"{n_tokens / cpu / ref_cpu:.2f}",
                f"{tps / w1:.2f}" if w1 else "-",
            ]
        )
    table(
        f"Store build, {n_tokens / 1e6:.1f}M tokens (build includes reading, decoding, splitting, IPC, writing)",
        [
            "what",
            "Mtok/s wall",
            "Mtok/CPU-s",
            "workers",
            "wall/core vs encode_batch",
            "per CPU-s vs encode_batch",
            "wall vs workers=1",
        ],
        rows,
    )

    # ------------------------------------------------------------------------------------- loader
    import torch

    torch.set_num_threads(1)
    store = TokenStore(tmp / f"w{args.workers[0]}")
    special = special_ids(tok)
    rows = []
    for mb in (32, 64, 128, 256):
        data = PretrainData(store, DataConfig(seq_len=128), special, tok.get_vocab_size())
        loader = data.train_loader(mb)
        next(loader)
        t, c = time.perf_counter(), time.process_time()
        n = 0
        for _ in range(args.batches):
            n += next(loader)["input_ids"].numel()
        dt, cpu = time.perf_counter() - t, time.process_time() - c
        rows.append([f"micro_batch={mb}", f"{n / dt / 1e6:.2f}", f"{n / cpu / 1e6:.2f}", f"{n / dt / 5e6:.2f}"])
    table(
        "Loader: packed + masked batches, seq_len 128, one thread",
        ["what", "Mtok/s wall", "Mtok/CPU-s", "wall vs 5M target"],
        rows,
    )

    # memory against store size: a small and the full store, RSS growth over loader creation + 200 batches
    small = build_store([str(DATA / "wikitext-2")], tok, tmp / "small", workers=1, **kw)
    rows = []
    for label, path in (("wikitext-2", small), ("full corpus", tmp / f"w{args.workers[0]}")):
        st = TokenStore(path)
        before = anon_mb()
        data = PretrainData(st, DataConfig(seq_len=128), special, tok.get_vocab_size())
        loader = data.train_loader(128)
        for _ in range(200):
            next(loader)
        index_mb = sum(a.nbytes for a in (data.train.doc_start, data.train.doc_len, data.train.stream_off)) / 2**20
        rows.append(
            [
                label,
                f"{st.num_tokens / 1e6:.1f}M",
                f"{st.num_tokens * st.dtype.itemsize / 2**20:.0f}",
                f"{index_mb:.2f}",
                f"{anon_mb() - before:.1f}",
            ]
        )
        del data, loader, st
    table(
        "Loader memory vs store size (anonymous RSS growth over PretrainData + 200 batches of 128)",
        ["store", "tokens", "store MiB", "index MiB", "heap growth MiB"],
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
