"""Does task-adaptive pretraining pay with a few hundred labels? (issue 28, item 1)

For each task: continue ``--model`` on the task's own training text without labels (``cramkit pretrain TEXT
--from MODEL --budget B``, the continue preset: the user's command), then fine-tune the model directly and the
adapted one on the first N labelled rows, with each recipe:

- ``before``: the recipe before issue 28 (epochs only: ``min_steps=0``; first-token pooling through BERT's
  pooler; ``lr=4e-5``), except that the adapted model keeps its pooler (``pretrain --from`` used to drop it);
- ``after``: today's defaults (at least 500 steps, the model's own pooling, the pooler kept, lr auto).

Scores: the task's metric on its dev split, median (min-max) over ``--seeds``; drift: the mean cosine between
the model's and the adapted model's mean-pooled sentence vectors on the dev texts (1 = unchanged).

    python bench/bench_adapt.py --model hf:$MINILM --task glue/sst2 --task glue/cola --task glue/mrpc \\
        --data-dir ../shared/data/glue --labels 500 --labels 1000 --seeds 0,1,2 --budget 4m

Each result is appended to ``--out`` (JSON lines) when known; a finished row is not run again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_infer import machine  # noqa: E402

RECIPES = {
    "before": {"min_steps": 0, "pooling": "first", "lr": 4e-5},
    "after": {},
}


def adapt(model: str, task_name: str, args: argparse.Namespace) -> Path:
    """The task-adaptive run: MODEL continued on the task's training texts (no labels) for --budget."""
    from cramkit.tasks.registry import get_task

    work = Path(args.work)
    out = work / f"adapted-{task_name.replace('/', '-')}"
    if (out / "checkpoints" / "latest").exists():
        return out
    task = get_task(task_name, data_dir=args.data_dir)
    text = work / f"{task_name.replace('/', '-')}-train.txt"
    text.parent.mkdir(parents=True, exist_ok=True)
    rows = task.examples(task.train_split)
    text.write_text("\n\n".join(" ".join(t for t in (r.text_a, r.text_b) if t) for r in rows) + "\n")
    cmd = [
        sys.executable,
        "-m",
        "cramkit",
        "pretrain",
        str(text),
        "--from",
        model,
        "--budget",
        args.budget,
        "--out",
        str(out),
        "--no-progress",
        "--doc-split",
        "blank",
    ]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    return out


def drift(model: str, adapted: Path, task_name: str, args: argparse.Namespace) -> float:
    import numpy as np

    import cramkit
    from cramkit.infer import Engine
    from cramkit.tasks.registry import get_task

    task = get_task(task_name, data_dir=args.data_dir)
    texts = [r.text_a for r in task.examples(task.dev_splits[0])][:400]
    a = Engine(cramkit.load(model), device="cpu").embed(texts, pooling="mean", normalize=True)
    b = Engine(cramkit.load(str(adapted)), device="cpu").embed(texts, pooling="mean", normalize=True)
    return float(np.mean(np.sum(a * b, axis=1)))


def finetune(model: str, task_name: str, labels: int, recipe: str, args: argparse.Namespace) -> dict:
    import cramkit

    seeds = [int(s) for s in args.seeds.split(",")]
    t0 = time.time()
    res = cramkit.finetune(
        model,
        task=task_name,
        data_dir=args.data_dir,
        progress=False,
        seeds=seeds,
        max_train_examples=labels,
        eval_every="never",
        checkpoint_every="never",
        **RECIPES[recipe],
    )
    split = next(iter(res["median"]))
    scores = [s["dev"][split]["score"] for s in res["seeds"]]
    return {
        "scores": [round(x, 2) for x in scores],
        "median": round(statistics.median(scores), 2),
        "min": round(min(scores), 2),
        "max": round(max(scores), 2),
        "steps": res["seeds"][0]["steps"],
        "seconds": round(time.time() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--task", action="append", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--labels", action="append", type=int, default=[])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--budget", default="4m")
    ap.add_argument("--recipes", default="before,after", help="before,after; 'before' runs at the smallest N only")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", default="runs/bench-adapt")
    ap.add_argument("--out", default="runs/bench-adapt.jsonl")
    args = ap.parse_args()
    labels = sorted(args.labels or [500, 1000])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.is_file() else []
    done = {(r["task"], r["labels"], r["recipe"], r["model"]) for r in rows}

    def record(row: dict) -> None:
        print(json.dumps(row), flush=True)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)

    for task in args.task:
        adapted = adapt(args.model, task, args)
        if (task, None, "drift", "adapted") not in done:
            record(
                {
                    "task": task,
                    "labels": None,
                    "recipe": "drift",
                    "model": "adapted",
                    "cosine": round(drift(args.model, adapted, task, args), 4),
                }
            )
        for n in labels:
            for recipe in args.recipes.split(","):
                if recipe == "before" and n != labels[0]:
                    continue
                for which, model in (("direct", args.model), ("adapted", str(adapted))):
                    if (task, n, recipe, which) in done:
                        continue
                    record(
                        {
                            "task": task,
                            "labels": n,
                            "recipe": recipe,
                            "model": which,
                            **finetune(model, task, n, recipe, args),
                        }
                    )
    print(f"\n{machine()}; task metric on dev, median (min-max) over seeds {args.seeds}; adaptation {args.budget}")
    print("| task | labels | recipe | direct | adapted | drift (cosine) |")
    print("|---|---:|---|---|---|---:|")
    cos = {r["task"]: r["cosine"] for r in rows if r["recipe"] == "drift"}
    for task in args.task:
        for n in labels:
            for recipe in args.recipes.split(","):
                got = {r["model"]: r for r in rows if r["task"] == task and r["labels"] == n and r["recipe"] == recipe}
                if len(got) < 2:
                    continue
                cell = {k: f"{v['median']:.1f} ({v['min']:.1f}-{v['max']:.1f})" for k, v in got.items()}
                print(f"| {task} | {n} | {recipe} | {cell['direct']} | {cell['adapted']} | {cos.get(task, 0):.3f} |")


if __name__ == "__main__":
    main()
