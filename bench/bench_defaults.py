"""Does the default fine-tuning recipe learn, at every model size? (issue 28, item 5)

For each model and task, fine-tune with the defaults (``lr: auto``) and with one fixed rate per ``--lr`` (e.g.
Cramming's 4e-5), 3+ seeds each, and report the task's metric (median, min-max over seeds) next to chance
(the majority class of the scored split). Tasks: a GLUE task with its first ``--rows`` training rows
(``max_train_examples``), scored on its dev split; a FewCLUE task on its own splits (``--fewshot-splits``,
scored on test_public), as ``cramkit eval fewclue`` does.

    python bench/bench_defaults.py --model runs/tiny-cpu --task glue/sst2 --data-dir ../shared/data/glue \\
        --rows 500 --lr 4e-5 --seeds 0,1,2
    python bench/bench_defaults.py --model runs/tiny-zh --task clue/eprstmt --task clue/iflytek \\
        --data-dir ../shared/data/fewclue --lr 4e-5 --fewshot-splits 0,1,2

Each result is appended to ``--out`` (JSON lines) as soon as it is known; a finished row is not run again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_infer import machine, results_so_far


def chance(task_name: str, data_dir: str, split: str) -> float:
    """What always answering the majority class scores: its share of ``split`` in percent for accuracy, 0 for
    a correlation (MCC, Pearson, Spearman)."""
    from cramkit.tasks.registry import get_task

    task = get_task(task_name, data_dir=data_dir)
    if task.main_metric not in ("accuracy", "acc"):
        return 0.0
    rows = task.examples(split)
    return 100.0 * Counter(r.label for r in rows).most_common(1)[0][1] / len(rows)


def _fewclue(task_name: str, data_dir: str) -> bool:
    from cramkit.tasks.clue import is_fewclue
    from cramkit.tasks.registry import get_task

    return is_fewclue(get_task(task_name, data_dir=data_dir))


def run_one(model: str, task_name: str, lr: str, args: argparse.Namespace) -> dict:
    import cramkit
    from cramkit.tasks.clue import is_fewclue
    from cramkit.tasks.registry import get_task

    task = get_task(task_name, data_dir=args.data_dir)
    settings = {"lr": lr if lr == "auto" else float(lr), "eval_every": "never", "checkpoint_every": "never"}
    t0 = time.time()
    if is_fewclue(task):
        splits = args.fewshot_splits.split(",")
        work = Path(args.work) / f"{Path(model).name}-{task.name.replace('/', '-')}-{lr}"
        name = task.name.split("/")[-1]
        res = cramkit.evaluate(
            model, args.data_dir, work, suite="fewclue", tasks=[name], fewshot_splits=splits, progress=False, **settings
        )
        one = next(iter(res["tasks"].values()))
        scores = [one["fewshot"]["per_split"][s]["score"] for s in splits]
        used = [one["fewshot"]["per_split"][s].get("lr") for s in splits]
        scored = "test_public"
    else:
        seeds = [int(s) for s in args.seeds.split(",")]
        res = cramkit.finetune(
            model,
            task=task_name,
            data_dir=args.data_dir,
            progress=False,
            seeds=seeds,
            max_train_examples=args.rows,
            **settings,
        )
        split = next(iter(res["median"]))  # the task's scored dev split
        scores = [s["dev"][split]["score"] for s in res["seeds"]]
        used = [s.get("lr") for s in res["seeds"]]
        scored = "dev"
    return {
        "model": model,
        "task": task_name,
        "lr": lr,
        "lr_used": used,
        "rows": None if is_fewclue(task) else args.rows,
        "scores": [round(s, 2) for s in scores],
        "median": round(statistics.median(scores), 2),
        "min": round(min(scores), 2),
        "max": round(max(scores), 2),
        "chance": round(chance(task_name, args.data_dir, scored), 2),
        "seconds": round(time.time() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--task", action="append", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--lr", action="append", default=[], help="fixed rates to compare with auto (repeatable)")
    ap.add_argument("--rows", type=int, default=500, help="GLUE tasks: the first N training rows")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--fewshot-splits", default="0,1,2")
    ap.add_argument("--work", default="runs/bench-defaults")
    ap.add_argument("--out", default="runs/bench-defaults.jsonl")
    args = ap.parse_args()
    out = Path(args.out)
    done = results_so_far(out)
    key = {(r["model"], r["task"], r["lr"], r["rows"]) for r in done}
    rows = list(done)
    for model in args.model:
        for task in args.task:
            for lr in ["auto", *args.lr]:
                if (model, task, lr, None if _fewclue(task, args.data_dir) else args.rows) in key:
                    continue
                row = run_one(model, task, lr, args)
                print(json.dumps(row), flush=True)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                rows.append(row)
    print(f"\n{machine()}; median (min-max) of the task's metric over seeds or splits, %; chance = majority class")
    print("| model | task | lr | rate used | median (min-max) | chance |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        used = sorted({u for u in r["lr_used"] if u is not None})
        rates = ", ".join(f"{u:g}" for u in used)
        spread = f"{r['median']:.1f} ({r['min']:.1f}-{r['max']:.1f})"
        print(f"| {Path(r['model']).name} | {r['task']} | {r['lr']} | {rates} | {spread} | {r['chance']:.1f} |")


if __name__ == "__main__":
    main()
