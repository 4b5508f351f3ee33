"""The torch backend's pass budget on a CPU: ``Engine.embed`` with all-MiniLM-L6-v2 at several padded-token
budgets per forward pass, on the texts of bench_fastpath.py (short: ABC science sentences; long: ABC rural
passages of 180+ words). One Engine per budget in this process, rounds interleaved (the order reversed every
other round); the figure is each budget's speed against the first's, the median of per-round ratios (the
first's seconds / its seconds: below 1.0 it is slower). It chose the default of ``cramkit embed``,
``predict`` and ``index build`` (the runtime's own: 2,048 on a CPU) over the 16,384 they had passed before.

    python bench/bench_budget.py [--budgets 2048,16384] [--threads 1] [--rounds 4] [--short 600] [--long 120]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fastpath import long_texts, short_texts, uptime
from bench_mixture import minilm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", type=lambda v: [int(x) for x in v.split(",")], default=[2048, 16384])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--short", type=int, default=600)
    p.add_argument("--long", type=int, default=120)
    args = p.parse_args()
    import torch

    import cramkit
    from cramkit.infer import Engine

    torch.set_num_threads(args.threads)
    model = cramkit.load(f"hf:{minilm()}")
    engines = {b: Engine(model, max_batch_tokens=b) for b in args.budgets}
    print(f"load {uptime()}; torch {torch.__version__}, {args.threads} thread(s)")
    print("| texts | budget (padded tokens) | seconds (median) | texts/s | ratio per round | median ratio |")
    print("|---|---:|---:|---:|---|---:|")
    for name, texts in (("short", short_texts(args.short)), ("long", long_texts(args.long))):
        for e in engines.values():
            e.embed(texts[:32])  # warm-up
        secs: dict[int, list[float]] = {b: [] for b in args.budgets}
        for r in range(args.rounds):
            for b in args.budgets if r % 2 == 0 else args.budgets[::-1]:
                t0 = time.perf_counter()
                engines[b].embed(texts)
                secs[b].append(time.perf_counter() - t0)
        first = args.budgets[0]
        for b in args.budgets:
            ratios = [f / s for f, s in zip(secs[first], secs[b], strict=True)]
            med = statistics.median(secs[b])
            print(
                f"| {name} ({len(texts)}) | {b:,} | {med:.2f} | {len(texts) / med:.1f} | "
                f"{', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f}x |"
            )
    print(f"load {uptime()}")


if __name__ == "__main__":
    main()
