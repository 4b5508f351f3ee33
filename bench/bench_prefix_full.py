"""Deep prompts (P-tuning v2) against full fine-tuning with every label, across model sizes (issue 28).

For each ``--model NAME=SOURCE`` and each seed, ``cramkit finetune --task TASK`` runs once fully (``--method
head``: every weight trained, the default recipe's rate) and once with ``--method ptuning`` (the encoder frozen,
``--prefix-len`` keys and values per layer and the head trained), on the task's whole training split for
``--epochs`` epochs (the same steps for both; ``eval_every=never``, the last model scored on the dev split). Each
run is its own process, so its peak resident memory is its own (``os.wait4``); its training seconds, trainable
parameters and bytes stored come from its results.json.

    python bench/bench_prefix_full.py --model minilm=hf:$MINILM --model tiny=runs/tiny-wt \\
        --task glue/sst2 --data-dir ../shared/data/glue --epochs 1 --seeds 0,1,2

Each run is appended to ``--out`` (JSON lines) when it ends; a finished one is not run again. The table (mean ±
sd over the seeds, the gap of deep prompts to full fine-tuning) goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_infer import machine, results_so_far


def run(name: str, source: str, method: str, seed: int, args: argparse.Namespace) -> dict:
    """One fine-tuning in its own process: score, seconds, peak RSS, parameters trained and bytes stored."""
    out = Path(args.work) / f"{name}-{method}-{seed}"
    cmd = [sys.executable, "-m", "cramkit", "finetune", "--from", source, "--task", args.task]
    cmd += ["--data-dir", args.data_dir, "--seeds", str(seed), "--method", method, "--out", str(out), "--no-progress"]
    settings = [f"epochs={args.epochs}", "min_steps=0", "eval_every=never", "checkpoint_every=never"]
    settings += [f"batch_size={args.batch}", *args.set]
    if method == "ptuning":
        cmd += ["--prefix-len", str(args.prefix_len)]
        settings += [f"prefix_lr={args.prefix_lr}"]
    for s in settings:
        cmd += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.Popen(cmd, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with {os.waitstatus_to_exitcode(status)}")
    res = json.loads((out / "results.json").read_text())
    one = res["seeds"][0]
    split = next(iter(one["dev"]))
    return {
        "model": name,
        "source": source,
        "method": method,
        "seed": seed,
        "epochs": args.epochs,
        "score": round(one["dev"][split]["score"], 2),
        "steps": one["steps"],
        "train_seconds": one["train_seconds"],
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "trainable_parameters": res["trainable_parameters"],
        "stored_bytes": res["stored_bytes"],
    }


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| model | method | score mean ± sd | per seed | gap to full | trained | stored | train s | peak RSS MiB |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["method"]), []).append(r)
    for (model, method), rs in groups.items():
        scores = [r["score"] for r in rs]
        mean = statistics.mean(scores)
        sd = statistics.stdev(scores) if len(scores) > 1 else 0.0
        full = groups.get((model, "head"))
        gap = "-" if method == "head" or not full else f"{mean - statistics.mean(r['score'] for r in full):+.2f}"
        lines.append(
            f"| {model} | {method} | {mean:.2f} ± {sd:.2f} | {' / '.join(f'{s:.2f}' for s in scores)} | {gap} "
            f"| {rs[0]['trainable_parameters']:,} | {rs[0]['stored_bytes'] / 2**20:.2f} MiB "
            f"| {statistics.median(r['train_seconds'] for r in rs):.0f} "
            f"| {statistics.median(r['peak_rss_mib'] for r in rs):.0f} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, metavar="NAME=SOURCE")
    ap.add_argument("--task", default="glue/sst2")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--methods", default="head,ptuning")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--prefix-len", type=int, default=16)
    ap.add_argument("--prefix-lr", type=float, default=2e-2)
    ap.add_argument("--set", action="append", default=[], help="another fine-tuning setting for every run")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", default="runs/bench-prefix-full")
    ap.add_argument("--out", default="runs/bench-prefix-full.jsonl")
    args = ap.parse_args()
    out = Path(args.out)
    rows = results_so_far(out)
    done = {(r["model"], r["method"], r["seed"], r["epochs"]) for r in rows}
    for seed in (int(s) for s in args.seeds.split(",")):  # seed-major: a stopped bench has every model's first seeds
        for spec in args.model:
            name, source = spec.split("=", 1)
            for method in args.methods.split(","):
                if (name, method, seed, args.epochs) in done:
                    continue
                row = run(name, source, method, seed, args)
                print(json.dumps(row), flush=True)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                rows.append(row)
    print(f"\n{machine()}; {args.task}, {args.epochs:g} epoch(s) of batch {args.batch}, dev split, the last model")
    print("\n".join(table([r for r in rows if r["epochs"] == args.epochs])))


if __name__ == "__main__":
    main()
