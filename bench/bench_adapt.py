"""Does task-adaptive pretraining pay with few labels, and what keeps it from costing? (issue 28, item 1)

For each task: continue ``--model`` on the task's own text without labels (``cramkit pretrain TEXT --from MODEL
--budget B``, the continue preset: the user's command; a GLUE task's training sentences, a FewCLUE task's
unlabelled file), once plainly and once per ``--anchor NAME:SETTING[,SETTING]`` (e.g. ``keep:train.keep_vectors=1``,
``l2sp:train.l2sp=1``); then fine-tune the model directly and every adapted one with today's defaults:

- a GLUE task on its first N labelled rows (``--labels N``), one score per ``--seeds`` seed, on its dev split;
- a FewCLUE task on its own few-shot splits (``--fewshot-splits``: train_S), scored on test_public;
- ``files:DIR`` (DIR/train.tsv and DIR/dev.tsv, ``text`` and ``label`` columns; bench/make_source_tasks.py) like
  a GLUE task.

Scores: mean ± sd and median (min-max) over seeds or splits; drift: the mean cosine between the model's and the
adapted model's mean-pooled sentence vectors of 400 dev texts (1 = unchanged).

    python bench/bench_adapt.py --model hf:$MINILM --task glue/sst2 --data-dir ../shared/data/glue \\
        --labels 1000 --seeds 0,1,2,3,4 --budget 60steps --anchor keep:train.keep_vectors=1
    python bench/bench_adapt.py --model hf:$MINILM --task clue/eprstmt --data-dir ../shared/data/fewclue \\
        --fewshot-splits 0,1,2,3,4 --budget 60steps --anchor keep:train.keep_vectors=1

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
from bench_fewshot import bench_task
from bench_infer import machine, results_so_far


def is_fewclue(task_name: str, data_dir: str | None) -> bool:
    from cramkit.tasks.clue import is_fewclue as check

    return check(bench_task(task_name, data_dir))


def task_files(task_name: str) -> dict:
    """cramkit.finetune's keywords for the task: a registered name, or ``files:DIR``'s train.tsv and dev.tsv."""
    if not task_name.startswith("files:"):
        return {"task": task_name}
    folder = Path(task_name.removeprefix("files:"))
    return {"train": folder / "train.tsv", "dev": folder / "dev.tsv", "text_a": "text", "label": "label"}


def slug(task_name: str) -> str:
    return task_name.replace("/", "-").replace(":", "-")


def task_text(task_name: str, args: argparse.Namespace) -> tuple[str, list[str]]:
    """The text a task-adaptive run reads: (path, extra pretrain arguments)."""
    task = bench_task(task_name, args.data_dir)
    if is_fewclue(task_name, args.data_dir):  # FewCLUE ships its task's unlabelled text
        name = task_name.split("/")[-1]
        path = Path(args.data_dir) / name / "unlabeled.json"
        field = json.loads(path.open(encoding="utf-8").readline())
        key = next(k for k in ("sentence", "content", "text", "sentence1") if k in field)
        return str(path), ["--text-field", key]
    text = Path(args.work) / f"{slug(task_name)}-train.txt"
    if not text.is_file():
        text.parent.mkdir(parents=True, exist_ok=True)
        rows = task.examples(task.train_split)
        text.write_text("\n\n".join(" ".join(t for t in (r.text_a, r.text_b) if t) for r in rows) + "\n")
    return str(text), ["--doc-split", "blank"]


def adapt(model: str, task_name: str, anchor: str, settings: list[str], args: argparse.Namespace) -> Path:
    """The task-adaptive run: MODEL continued on the task's text (no labels) for --budget, with ``settings``."""
    out = Path(args.work) / f"adapted-{slug(task_name)}-{anchor}"
    if (out / "checkpoints" / "latest").exists():
        return out
    text, extra = task_text(task_name, args)
    cmd = [sys.executable, "-m", "cramkit", "pretrain", text, *extra, "--from", model, "--budget", args.budget]
    cmd += ["--out", str(out), "--no-progress"]
    for s in settings:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    return out


def drift(model: str, adapted: Path, task_name: str, args: argparse.Namespace) -> float:
    import numpy as np

    import cramkit
    from cramkit.infer import Engine

    task = bench_task(task_name, args.data_dir)
    texts = [r.text_a for r in task.examples(task.dev_splits[0])][:400]
    a = Engine(cramkit.load(model), device="cpu").embed(texts, pooling="mean", normalize=True)
    b = Engine(cramkit.load(str(adapted)), device="cpu").embed(texts, pooling="mean", normalize=True)
    return float(np.mean(np.sum(a * b, axis=1)))


def finetune(model: str, which: str, task_name: str, labels: int | None, args: argparse.Namespace) -> dict:
    import cramkit

    settings = {"eval_every": "never", "checkpoint_every": "never"}
    t0 = time.time()
    if labels is None:  # FewCLUE: one score per split
        splits = args.fewshot_splits.split(",")
        work = Path(args.work) / f"eval-{slug(task_name)}-{which}"
        res = cramkit.evaluate(
            model,
            args.data_dir,
            work,
            suite="fewclue",
            tasks=[task_name.split("/")[-1]],
            fewshot_splits=splits,
            progress=False,
            **settings,
        )
        one = next(iter(res["tasks"].values()))
        scores = [one["fewshot"]["per_split"][s]["score"] for s in splits]
    else:
        res = cramkit.finetune(
            model,
            **task_files(task_name),
            data_dir=args.data_dir,
            progress=False,
            seeds=[int(s) for s in args.seeds.split(",")],
            max_train_examples=labels,
            **settings,
        )
        split = next(iter(res["median"]))
        scores = [s["dev"][split]["score"] for s in res["seeds"]]
    return {
        "scores": [round(x, 2) for x in scores],
        "mean": round(statistics.mean(scores), 2),
        "sd": round(statistics.stdev(scores), 2) if len(scores) > 1 else 0.0,
        "median": round(statistics.median(scores), 2),
        "min": round(min(scores), 2),
        "max": round(max(scores), 2),
        "seconds": round(time.time() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--task", action="append", required=True)
    ap.add_argument("--data-dir", help="the suite's folder (a files:DIR task needs none)")
    ap.add_argument("--labels", action="append", type=int, default=[], help="GLUE: labelled rows (default 500)")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--fewshot-splits", default="0,1,2,3,4", help="FewCLUE: the splits scored")
    ap.add_argument("--budget", default="60steps", help="of each adaptation run")
    ap.add_argument("--anchor", action="append", default=[], metavar="NAME:SETTING[,SETTING]")
    ap.add_argument("--only", help="fine-tune only these models (comma-separated: direct, adapted-plain, adapted-NAME)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", default="runs/bench-adapt")
    ap.add_argument("--out", default="runs/bench-adapt.jsonl")
    args = ap.parse_args()
    anchors = {"plain": []} | {a.split(":", 1)[0]: a.split(":", 1)[1].split(",") for a in args.anchor}
    out = Path(args.out)
    rows = results_so_far(out)
    done = {(r["task"], r["labels"], r["model"]) for r in rows}

    def record(row: dict) -> None:
        print(json.dumps(row), flush=True)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)

    for task in args.task:
        counts: list[int | None] = [None] if is_fewclue(task, args.data_dir) else sorted(args.labels or [500])
        models = {"direct": args.model}
        wanted = set(args.only.split(",")) if args.only else None
        for name, settings in anchors.items():
            if wanted is not None and f"adapted-{name}" not in wanted:
                continue
            adapted = adapt(args.model, task, name, settings, args)
            models[f"adapted-{name}"] = str(adapted)
            if (task, "drift", f"adapted-{name}") not in done:
                cos = round(drift(args.model, adapted, task, args), 4)
                record({"task": task, "labels": "drift", "model": f"adapted-{name}", "cosine": cos})
        for n in counts:
            for which, model in models.items():
                if (task, n, which) not in done and (wanted is None or which in wanted):
                    record({"task": task, "labels": n, "model": which, **finetune(model, which, task, n, args)})
    print(f"\n{machine()}; task metric, mean ± sd and median (min-max); adaptation --budget {args.budget}")
    print("| task | labels | model | mean ± sd | median (min-max) | drift (cosine) |")
    print("|---|---:|---|---|---|---:|")
    cos = {(r["task"], r["model"]): r["cosine"] for r in rows if r["labels"] == "drift"}
    for r in rows:
        if r["labels"] != "drift":
            d = cos.get((r["task"], r["model"]))
            print(
                f"| {r['task']} | {r['labels'] or 'FewCLUE splits'} | {r['model']} | {r['mean']:.1f} ± {r['sd']:.1f} "
                f"| {r['median']:.1f} ({r['min']:.1f}-{r['max']:.1f}) | {'-' if d is None else f'{d:.3f}'} |"
            )


if __name__ == "__main__":
    main()
