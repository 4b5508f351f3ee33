"""cramkit's CPU fast path against the loop a user would write on the same CTranslate2 files (issue 33, item 5).

Contestants, on one CTranslate2 int8 export of all-MiniLM-L6-v2 (``cramkit export --format ct2 --quantize
int8``, made in ``--work`` when absent):

- baseline, the plain loop: the HF ``tokenizers`` tokenizer from the export folder (truncation at the model's
  256 tokens), inputs sorted by token length, batches of 32, ``ctranslate2.Encoder.forward_batch`` on the
  export's files, mean pooling and L2 normalisation in numpy;
- ``cramkit.infer.Engine(DIR, threads=N).embed(texts)``.

Texts the other races have not used: ``short``, sentences of NLTK's ABC science news (one a line, 5 to 60
words); ``long``, passages of ABC rural news (consecutive lines joined to at least 180 words; cut at 256
tokens by both). Both contestants live in this process with the same threads; rounds are interleaved (the
order alternates each round) and the figure is the median of the per-round ratios (plain seconds / cramkit
seconds: above 1.0 cramkit is faster). Agreement: the cosine of each vector to the plain loop's.

    python bench/bench_fastpath.py [--work DIR] [--threads 1,2] [--texts short,long] [--rounds 5]
                                   [--short 1500] [--long 150] [--profile]

``--profile``: cProfile of ``Engine.embed`` (short texts, the first thread count), the top functions by
their own time, then exit.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from _shared_data import SHARED

REPO = Path(__file__).resolve().parents[1]
DATA = SHARED
ABC = DATA / "corpus" / "nltk-abc"


def short_texts(n: int) -> list[str]:
    lines = (ABC / "science.txt").read_text(encoding="utf-8", errors="replace").splitlines()
    return [s.strip() for s in lines if 5 <= len(s.split()) <= 60][:n]


def long_texts(n: int, min_words: int = 180) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    for line in (ABC / "rural.txt").read_text(encoding="utf-8", errors="replace").splitlines():
        if line.strip():
            cur.append(line.strip())
        if sum(len(s.split()) for s in cur) >= min_words:
            out.append(" ".join(cur))
            cur = []
            if len(out) == n:
                break
    return out


def plain_loop(folder: Path, threads: int, max_length: int) -> Any:
    """The loop a user would write on the export's files (see the module's docstring)."""
    import ctranslate2
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer" / "tokenizer.json"))
    tok.enable_truncation(max_length)
    tok.no_padding()
    encoder = ctranslate2.Encoder(str(folder), device="cpu", intra_threads=threads)

    def embed(texts: list[str], batch: int = 32) -> np.ndarray:
        ids = [e.ids for e in tok.encode_batch(texts)]
        order = np.argsort([len(x) for x in ids], kind="stable")
        out = np.zeros((len(texts), 384), np.float32)
        for i in range(0, len(texts), batch):
            idx = order[i : i + batch]
            rows = [ids[j] for j in idx]
            h = np.asarray(encoder.forward_batch(rows).last_hidden_state)
            n = np.asarray([len(r) for r in rows])
            mask = (np.arange(h.shape[1])[None, :] < n[:, None])[..., None]
            mean = (h * mask).sum(1) / n[:, None]
            out[idx] = mean / np.linalg.norm(mean, axis=1, keepdims=True)
        return out

    return embed


def uptime() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" at {datetime.datetime.now(datetime.UTC):%H:%M} UTC"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/bench-fastpath"))
    p.add_argument("--threads", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2])
    p.add_argument("--texts", type=lambda v: v.split(","), default=["short", "long"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--short", type=int, default=1500, help="how many short texts")
    p.add_argument("--long", type=int, default=150, help="how many long texts")
    p.add_argument("--profile", action="store_true")
    p.add_argument(
        "--budgets", default=None, help="comma-separated padded-token budgets: race Engine at each (and the plain loop)"
    )
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import ctranslate2

    import cramkit
    from cramkit.infer import Engine
    from cramkit.infer.export import export

    folder = args.work / "ct2-int8"
    if not (folder / "cramkit-ct2.json").is_file():
        sys.path.insert(0, str(REPO / "bench"))
        from bench_infer import minilm_dir

        export(cramkit.load(f"hf:{minilm_dir()}"), folder, format="ct2", quantize="int8", progress=False)
    sets = {"short": short_texts(args.short), "long": long_texts(args.long)}
    if args.profile:
        import cProfile
        import pstats

        engine = Engine(folder, threads=args.threads[0])
        data = sets[args.texts[0]]
        engine.embed(data[:64])
        prof = cProfile.Profile()
        prof.enable()
        engine.embed(data)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((x.split(":", 1)[1].strip() for x in info if x.startswith("model name")), "?")
    print(f"# {cpu}, {os.cpu_count()} cores; ctranslate2 {ctranslate2.__version__}; uptime {uptime()}")
    print(
        "| texts | threads | plain loop: texts/s | cramkit Engine.embed: texts/s | ratio per round | median ratio "
        "| cosine mean / min |"
    )
    print("|---|---:|---:|---:|---|---:|---:|")
    for kind in args.texts:
        data = sets[kind]
        for threads in args.threads:
            engine = Engine(folder, threads=threads)
            plain = plain_loop(folder, threads, engine.max_length)
            runs = {"plain": plain, "cramkit": engine.embed}
            for b in args.budgets.split(",") if args.budgets else []:
                runs[f"budget {b}"] = Engine(folder, threads=threads, max_batch_tokens=int(b)).embed
            for f in runs.values():
                f(data[:64])  # warm-up
            times: dict[str, list[float]] = {k: [] for k in runs}
            outs: dict[str, np.ndarray] = {}
            for r in range(args.rounds):
                for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                    t0 = time.perf_counter()
                    outs[name] = np.asarray(runs[name](data))
                    times[name].append(time.perf_counter() - t0)
                print(
                    f"{kind} {threads} thr round {r + 1}/{args.rounds}: "
                    + ", ".join(
                        f"{k} {len(data) / v[-1]:,.1f}/s ({times['plain'][-1] / v[-1]:.2f}x)" for k, v in times.items()
                    )
                    + f"; load {uptime()}",
                    file=sys.stderr,
                )
            ratios = [a / b for a, b in zip(times["plain"], times["cramkit"], strict=True)]
            a, b = outs["plain"], outs["cramkit"]
            cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
            for name in runs:
                if name.startswith("budget"):
                    rs = [a / b for a, b in zip(times["plain"], times[name], strict=True)]
                    print(f"| {kind} ({len(data)}) | {threads} | {name}: median ratio {statistics.median(rs):.2f}x |")
            print(
                f"| {kind} ({len(data)}) | {threads} | {len(data) / statistics.median(times['plain']):,.1f} | "
                f"{len(data) / statistics.median(times['cramkit']):,.1f} | {', '.join(f'{x:.2f}' for x in ratios)} | "
                f"**{statistics.median(ratios):.2f}x** | {cos.mean():.6f} / {cos.min():.6f} |",
                flush=True,
            )
    print(f"# uptime at end {uptime()}")


if __name__ == "__main__":
    main()
