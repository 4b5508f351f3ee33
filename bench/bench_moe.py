"""Mixture of experts against dense at equal compute per token (issue 32, item 1).

One token store, one tiny shape, one step budget. Rows:

- ``dense``: the shape as it is;
- ``moe E=4 k=1``: every ``--every``-th block's MLP becomes 4 experts of its shape, each token going to one
  (the same matrix multiplies per token, plus the router and the capacity's padding; 4x the MLP parameters);
- ``dense half + upcycled half``: the dense run's first half (``--budget`` halved), then ``--from`` it
  ``--upcycle`` for the second half; beside it ``dense half + dense half`` (``--from`` it, no upcycle).

Each row: held-out MLM loss (the run's final validation: the same held-out batches in every row), the mean
training tokens/s of the steps after the first 10%, the parameter count and the dropped fraction at the end.

    OMP_NUM_THREADS=1 nice -n 5 python bench/bench_moe.py --steps 300 --out /tmp/bench-moe
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from _shared_data import SHARED

SHAPE = [
    "model.hidden=128",
    "model.layers=4",
    "model.heads=4",
    "model.intermediate=512",
    "data.seq_len=128",
    "data.validation_fraction=0.02",
    "train.micro_batch=32",
    "train.batch_size=32",
    "train.batch_ramp=0",
    "train.lr=2e-3",
    "train.eval_batches=16",
    "train.eval_every=never",
    "train.checkpoint_every=never",
    "train.log_every=10",
    "train.progress=false",
    "train.threads=1",
]


def _row(name: str, run: Path, seconds: float) -> dict[str, Any]:
    import cramkit
    from cramkit.model.encoder import count_parameters
    from cramkit.train.metrics import read_metrics

    records = read_metrics(run)
    train = [r for r in records if "loss" in r]
    steady = train[max(1, len(train) // 10) :]
    val = [r["val_loss"] for r in records if "val_loss" in r]
    params = count_parameters(cramkit.load(run).model)
    return {
        "name": name,
        "val_loss": val[-1],
        "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in steady),
        "params": params,
        "dropped": train[-1].get("moe_dropped"),
        "load": train[-1].get("moe_load"),
        "wall_s": seconds,
    }


def speed(experts: int, every: int, rounds: int) -> list[tuple[str, float]]:
    """Training tokens/s of the dense and the MoE model of SHAPE on one random batch (32 x 128, 25% predicted),
    interleaved round by round on this process (so that a shared machine's load falls on both alike): the
    median over ``rounds`` of 3 forward-backward passes each."""
    import torch

    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import MaskedLM

    torch.set_num_threads(1)
    base = ModelConfig(vocab_size=8192, hidden=128, layers=4, heads=4, intermediate=512)
    models = {
        "dense": MaskedLM(base),
        f"moe E={experts} k=1": MaskedLM(base.replace(moe_experts=experts, moe_top_k=1, moe_every=every)),
    }
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 8192, (32, 128), generator=g)
    labels = torch.where(torch.rand(32, 128, generator=g) < 0.25, ids, -100)
    times: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(rounds):
        for name, model in models.items():
            t0 = time.perf_counter()
            for _ in range(3):
                model(ids, labels).loss.backward()
            times[name].append(3 * ids.numel() / (time.perf_counter() - t0))
    return [(name, statistics.median(v)) for name, v in times.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=2, help="model.moe_every of the MoE rows")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--text", nargs="+", default=None, help="default: WikiText-2's test and valid splits")
    ap.add_argument("--out", default="/tmp/bench-moe")
    ap.add_argument("--skip-upcycle", action="store_true")
    ap.add_argument("--speed-rounds", type=int, default=10, help="rounds of the interleaved tokens/s measurement")
    args = ap.parse_args()

    from cramkit.recipes.pretrain import pretrain

    shared = SHARED
    text = args.text or [
        str(shared / "wikitext-2" / "wiki.test.tokens"),
        str(shared / "wikitext-2" / "wiki.valid.tokens"),
    ]
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = os.getloadavg()[0]
    # one token store (and tokenizer) for every row: the data run builds it
    first = pretrain(text, budget="1steps", out=out / "data", overrides=[*SHAPE, "tokenizer.vocab_size=8192"])
    store = str(first / "data" / "train")
    moe = [f"model.moe_experts={args.experts}", "model.moe_top_k=1", f"model.moe_every={args.every}"]
    budget, half = f"{args.steps}steps", f"{args.steps // 2}steps"
    rows = []

    def timed(name: str, **kw: Any) -> Path:
        t0 = time.perf_counter()
        run = pretrain(store, out=out / name.replace(" ", "_"), **kw)
        rows.append(_row(name, run, time.perf_counter() - t0))
        print(rows[-1], flush=True)
        return run

    timed("dense", budget=budget, overrides=SHAPE)
    timed(f"moe E={args.experts} k=1", budget=budget, overrides=[*SHAPE, *moe])
    if not args.skip_upcycle:
        base = timed("dense half", budget=half, overrides=SHAPE)
        cont = [s for s in SHAPE if not s.startswith("model.")] + ["train.schedule=budget-triangle"]
        timed("dense half + dense half", init=str(base), budget=half, overrides=cont)
        timed(
            "dense half + upcycled half",
            init=str(base),
            upcycle=True,
            budget=half,
            overrides=[*cont, *moe],
        )
    fast = speed(args.experts, args.every, args.speed_rounds)
    print()
    print(f"{started}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {load_before:.1f}")
    print(f"{args.steps} steps x 32 x 128 tokens; MoE: {' '.join(moe)}")
    print()
    print("| run | held-out MLM loss | tokens/s | parameters | dropped (last step) | load max/mean |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        dropped = f"{r['dropped']:.3f}" if r["dropped"] is not None else "-"
        load = f"{r['load']:.2f}" if r["load"] is not None else "-"
        print(
            f"| {r['name']} | {r['val_loss']:.4f} | {r['tokens_per_s']:,.0f} | {r['params']:,} | {dropped} | {load} |"
        )
    print()
    print(f"interleaved forward-backward, one process, median of {args.speed_rounds} rounds:")
    for name, tps in fast:
        print(f"- {name}: {tps:,.0f} tokens/s ({tps / fast[0][1]:.2f}x dense)")


if __name__ == "__main__":
    main()
