"""Multi-task weighting (``--weighting``, ``--primary``) vs each task alone, from all-MiniLM-L6-v2.

MRPC (--small rows), CoLA and SST-2 (--large rows each), one recipe for all (lr 4e-5, batch 16, --epochs,
max_length 128), scored on the full official dev sets. For each seed: each task fine-tuned alone; the three
as one mixture drawn by rates (one task per step, proportional: the existing default); then every step one
batch of each task, combined by ``sum``, ``gradnorm`` and ``pcgrad``; then ``--primary glue/mrpc`` (sum, the
larger tasks auxiliary). Every arm sees the same training examples (so a weighted arm takes a third of the
steps, each on three batches). Prints each task's dev score per arm, and each arm's seconds per optimizer
step against ``sum``'s (the cost of taking each task's gradient apart). Runs one after another in this
process (one thread by default: a shared machine's load shows in the times, not the scores).

    python bench/bench_weighting.py --work bench/out/weighting --seeds 0
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from _shared_data import GLUE

REPO = Path(__file__).resolve().parents[1]
# ../shared/data beside the repository, or $CRAMKIT_SHARED_DATA (as the tests take it)
ARMS = ("rates", "sum", "gradnorm", "pcgrad", "primary")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mixture import minilm, subset  # noqa: E402  (the same model and the same first-N rows)


def load_avg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="bench/out/weighting")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--small", type=int, default=300, help="MRPC training examples")
    ap.add_argument("--large", type=int, default=600, help="CoLA and SST-2 training examples")
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--arms", default=",".join(("alone", *ARMS)), help="which arms to run (default: all)")
    ap.add_argument(
        "--cost",
        type=int,
        default=0,
        metavar="REPS",
        help="instead: time one step's forward and backward of each weighting on the same batches, interleaved "
        "REPS times (the minimum of each: a shared machine's load hits every weighting alike)",
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.cost:
        return step_cost(args)
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
        "max_length": args.max_length,
        "threads": args.threads,
        "model": "all-MiniLM-L6-v2",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    arms = args.arms.split(",")
    mix = Mixture("mrpc+cola+sst2", tuple(sizes), "proportional")
    for seed in [int(s) for s in args.seeds.split(",")]:
        cfg = FinetuneConfig(
            epochs=args.epochs,
            seeds=[seed],
            checkpoint_every="never",
            max_length=args.max_length,
            lr=4e-5,
            min_steps=0,
        )
        key = f"seed{seed}"
        entry = results.setdefault(key, {"alone": {}})
        for task in tasks if "alone" in arms else []:
            if task.name in entry["alone"]:
                continue
            t0 = time.perf_counter()
            res = finetune(task, loaded, cfg, None, progress=False)
            one = res["seeds"][0]
            entry["alone"][task.name] = {
                "score": res["score"],
                "metrics": res["median"]["dev"]["metrics"],
                "seconds_per_step": round(one["train_seconds"] / max(one["steps"], 1), 4),
                "seconds": round(time.perf_counter() - t0, 1),
                "load": load_avg(),
            }
            print(f"{key} alone {task.name}: {res['score']:.2f}", file=sys.stderr, flush=True)
            out_file.write_text(json.dumps(results, indent=1))
        for arm in [a for a in ARMS if a in arms and a not in entry]:
            weighting = {"rates": None, "primary": "sum"}.get(arm, arm)
            primary = "glue/mrpc" if arm == "primary" else None
            t0 = time.perf_counter()
            res = finetune_mixture(mix, tasks, loaded, cfg, None, progress=False, weighting=weighting, primary=primary)
            entry[arm] = {
                "tasks": {
                    n: {"score": e["score"], "metrics": e["dev"]["dev"]["metrics"]} for n, e in res["tasks"].items()
                },
                "steps": res["steps"],
                "seconds_per_step": res["seconds_per_step"],
                "train_seconds": res["train_seconds"],
                "seconds": round(time.perf_counter() - t0, 1),
                "load": load_avg(),
            }
            scores = ", ".join(f"{n.split('/')[-1]} {e['score']:.2f}" for n, e in res["tasks"].items())
            print(f"{key} {arm}: {scores}; {res['seconds_per_step']:.3f} s/step", file=sys.stderr, flush=True)
            out_file.write_text(json.dumps(results, indent=1))
    report(results, work)


def step_cost(args: argparse.Namespace) -> None:
    """Seconds of one optimizer step's forward and backward passes with each weighting, on the same batch of
    each task (batch 16, MiniLM), the weightings interleaved ``args.cost`` times; the minimum of each."""
    import numpy as np
    import torch

    import cramkit
    from cramkit.data.batching import BatchLoader
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.finetune_model import encode_task_examples
    from cramkit.recipes.multitask import MixtureObjective, build_multitask
    from cramkit.tasks import get_task

    loaded = cramkit.load(f"hf:{minilm()}")
    cfg = FinetuneConfig(max_length=args.max_length)
    tasks = [get_task(n, data_dir=GLUE) for n in ("glue/mrpc", "glue/cola", "glue/sst2")]
    model = build_multitask(loaded, [t.num_labels for t in tasks], cfg, [t.kind for t in tasks])
    parts = {}
    for i, t in enumerate(tasks):
        enc = encode_task_examples(t, loaded.tokenizer, t.examples("train")[:16], args.max_length)
        labels = {"labels": torch.from_numpy(np.asarray(enc.labels))}
        loader = BatchLoader(
            enc, 16, 16, 0, 1, seed=0, chunk=0, pad_id=loaded.pad_id, with_types=loaded.with_types, columns=labels
        )
        parts[i] = next(loader)
    arms = {"sum": ("sum", None), "gradnorm": ("gradnorm", None), "pcgrad": ("pcgrad", None), "primary": ("sum", 0)}
    times: dict[str, list[float]] = {a: [] for a in arms}
    objective = MixtureObjective(loaded, tasks, [], np.ones(3) / 3, cfg, 0, "cost", "")
    device = torch.device("cpu")
    for _ in range(args.cost):
        for arm, (weighting, primary) in arms.items():
            objective.weighting, objective.primary = weighting, primary
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            objective.loss(model, {"parts": parts, "batch": 0}, device).backward()
            times[arm].append(time.perf_counter() - t0)
            objective.step_metrics()
    base = min(times["sum"])
    print(f"one step (a batch of 16 of MRPC, CoLA and SST-2; max_length {args.max_length}; min of {args.cost}):")
    for arm, ts in times.items():
        print(f"  {arm}: {min(ts):.3f} s ({min(ts) / base:.2f}x sum; median {statistics.median(ts):.3f} s)")


def report(results: dict, work: Path) -> None:
    seeds = [k for k in results if k.startswith("seed")]
    names = list(results["setup"]["sizes"])
    arms = [a for a in ("alone", *ARMS) if all(a in results[s] and results[s][a] for s in seeds)]

    def score(s: str, arm: str, n: str) -> float:
        return results[s][arm][n]["score"] if arm == "alone" else results[s][arm]["tasks"][n]["score"]

    head = "| arm | " + " | ".join(f"{n.split('/')[-1]} ({results['setup']['sizes'][n]})" for n in names)
    lines = [head + " | mean | s/step | vs sum | load |", "|---|" + "---:|" * (len(names) + 4)]
    for arm in arms:
        per = [statistics.mean(score(s, arm, n) for s in seeds) for n in names]
        if arm == "alone":
            step = statistics.mean(
                statistics.mean(results[s]["alone"][n]["seconds_per_step"] for n in names) for s in seeds
            )
            loads = "/".join(results[s]["alone"][names[-1]]["load"] for s in seeds)
        else:
            step = statistics.mean(results[s][arm]["seconds_per_step"] for s in seeds)
            loads = "/".join(results[s][arm]["load"] for s in seeds)
        ratio = "-"
        if "sum" in arms and arm not in ("alone", "rates"):
            ratio = f"{step / statistics.mean(results[s]['sum']['seconds_per_step'] for s in seeds):.2f}x"
        cells = " | ".join(f"{v:.2f}" for v in per)
        lines.append(f"| {arm} | {cells} | {statistics.mean(per):.2f} | {step:.3f} | {ratio} | {loads} |")
    lines.append(
        f"\nseeds: {len(seeds)}; dev scores (MRPC F1, CoLA MCC, SST-2 accuracy, x100); s/step: training seconds per "
        "optimizer step (alone and rates: one batch of one task; sum/gradnorm/pcgrad/primary: one batch of each)"
    )
    text = "\n".join(lines)
    (work / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
