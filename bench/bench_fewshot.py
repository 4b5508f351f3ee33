"""K examples per class: standard fine-tuning vs prompt-based fine-tuning vs deep prompts (issue 28).

A FewCLUE task runs FewCLUE's own splits 0-4 (train_S: 16 per class for its 2-class tasks, dev_S, scored on
test_public); any other task LM-BFF's protocol (Gao et al. 2021): for each of ``--splits`` splits, K training
examples per class and a dev set of another K per class are drawn from the task's training data (``cramkit
finetune --few-shot K``); the model is trained for ``--steps`` optimizer steps of batch ``--batch`` and the
checkpoint with the best score on the sampled dev set is kept; it is scored on the task's own dev set (GLUE's
test labels are hidden; FewCLUE: test_public). A row is the mean ± standard deviation over the splits, each
split trained with the same seed by every method, so the methods differ only in how the task meets the encoder:

- ``head``: a fresh classifier on the pooled output (the default ``cramkit finetune``);
- ``prompt``: the task's built-in template and label words through the MLM head (PET / LM-BFF);
- ``ptuning``: the encoder frozen, ``--prefix-len`` trainable keys/values per layer and a head (P-tuning v2);
- ``setfit``: the encoder trained on pairs of the K-shot rows (same label or not), then a logistic regression
  (SetFit; one pass over 2 x 20 pairs per row, ``--steps`` does not apply); needs no MLM head;
- ``auto``: ``--method auto``, the method that 4-fold cross-validation on the K-shot training rows scores best
  (a quarter of each method's steps per fold), then trained on them as that method alone would be. Its own table
  sets it against the best single method in hindsight on each split, and gives what the cross-validation cost.

A task is a registered name or ``files:DIR`` (DIR/train.tsv and DIR/dev.tsv with ``text`` and ``label`` columns,
e.g. what ``bench/make_source_tasks.py`` writes).

    python bench/bench_fewshot.py --model runs/minilm-head --tasks glue/sst2,glue/mrpc --k 16 --splits 5
    python bench/bench_fewshot.py --model runs/tiny-zh --tasks clue/eprstmt,clue/csl --data-dir ../shared/data/fewclue
    python bench/bench_fewshot.py --model hf:MINILM --tasks files:tasks/abc,glue/sst2 --methods head,setfit
    python bench/bench_fewshot.py --model hf:MINILM --tasks glue/sst2 --methods head,setfit,ptuning,auto

Each result is appended to ``--out`` (JSON lines) as soon as it is known, and a finished (model, task, method)
is not trained again: a killed bench resumes. The table goes to stdout (and ``--table``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cramkit.tasks.registry import Task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_infer import machine

METHODS = ("head", "prompt", "ptuning", "setfit", "auto")


def bench_task(task_name: str, data_dir: str | None) -> Task:
    """A registered task, or ``files:DIR``: DIR/train.tsv and DIR/dev.tsv with ``text`` and ``label`` columns."""
    from cramkit.tasks.registry import get_task
    from cramkit.tasks.resolve import resolve_task

    if not task_name.startswith("files:"):
        return get_task(task_name, data_dir=data_dir)
    folder = Path(task_name.removeprefix("files:"))
    return resolve_task(
        train=folder / "train.tsv", dev=folder / "dev.tsv", text_a="text", label="label", name=folder.name
    )


def run_one(model: str, task_name: str, data_dir: str | None, method: str, args: argparse.Namespace) -> dict:
    """One (model, task, method): LM-BFF's splits (``--k``), or FewCLUE's own splits 0-4 for a FewCLUE task."""
    from cramkit.recipes.evaluate import fewshot_run
    from cramkit.recipes.finetune_config import config_from
    from cramkit.tasks.clue import is_fewclue

    prior, head_init = getattr(args, "prior", "auto"), getattr(args, "head_init", "auto")  # gpu_day's own args
    settings = {
        "method": method,
        "batch_size": args.batch,
        "min_steps": args.steps,
        "epochs": 1e-6,  # the steps are --steps, whatever the data's size
        "eval_every": f"{args.eval_every}steps",
        "keep": "best",
        "checkpoint_every": "never",
        "max_length": args.max_length,
        "prefix_len": args.prefix_len,
        "max_eval_examples": getattr(args, "max_eval_examples", 0),  # 0: every dev row
        "prior": prior,
        "head_init": head_init,
    }
    task = bench_task(task_name, data_dir)
    fewclue = is_fewclue(task)
    splits = [str(i) for i in range(args.splits)]
    tag = task_name.replace("/", "-").replace(":", "-")
    init = "" if (prior, head_init) == ("auto", "auto") else f"-{head_init}-{_slug(prior)}"
    work = Path(args.work) / f"{Path(model).name}-{tag}-{method}-k{args.k}-{args.steps}{init}"
    t0 = time.time()
    res = fewshot_run(task, model, config_from(settings), work, splits, k=None if fewclue else args.k, progress=False)
    few = res["fewshot"]
    return {
        "model": model,
        "task": task_name,
        "method": method,
        "k": args.k,
        "steps": args.steps,
        "protocol": few["protocol"],
        "scored": list(res["median"]),
        "scores": [round(few["per_split"][s]["score"], 2) for s in splits],
        "mean": round(few["mean"], 2),
        "sd": round(few["std"], 2),
        "trainable_parameters": res.get("trainable_parameters"),
        "seconds": round(time.time() - t0, 1),
        "prior": prior,
        "head_init": head_init,
        **zero_shot(few, splits),
        **({"auto": auto_splits(work, splits)} if method == "auto" else {}),
    }


def _slug(text: str) -> str:
    import hashlib

    return text if text.isalnum() else hashlib.sha256(text.encode()).hexdigest()[:8]


def auto_splits(work: Path, splits: list[str]) -> list[dict]:
    """``--method auto`` on each split: the method chosen, every candidate's CV mean, the seconds of the
    cross-validation and of the final training (from each split's results.json)."""
    rows = []
    for s in splits:
        auto = json.loads((work / f"split-{s}" / "results.json").read_text(encoding="utf-8"))["method_auto"]
        rows.append(
            {
                "chosen": auto["chosen"],
                "cv": {m: round(c["mean"], 2) for m, c in auto["cv"].items()},
                "lead": {m: [c["lead"], c["lead_se"]] for m, c in auto["cv"].items() if "lead" in c},
                "cv_seconds": auto["cv_seconds"],
                "final_seconds": auto["final_seconds"],
                "skipped": sorted(auto["skipped"]),
            }
        )
    return rows


def auto_table(rows: list[dict]) -> list[str]:
    """``--method auto`` against the best single method in hindsight on each split (the same splits and seed): its
    score, the method it chose, the best one and its score, and the cost of the cross-validation."""
    by = {(r["model"], r["task"], r["method"]): r for r in rows}
    lines = []
    for model, task in dict.fromkeys((r["model"], r["task"]) for r in rows):
        auto = by.get((model, task, "auto"))
        singles = {m: by[model, task, m] for m in METHODS if m != "auto" and (model, task, m) in by}
        if auto is None or not singles:
            continue
        lines += [
            "",
            f"{Path(model).name} {task}: --method auto against the best method in hindsight per split",
            "",
            "| split | auto | chose | best in hindsight | auto - best | CV s | final s | CV / final |",
            "|---|---|---|---|---|---|---|---|",
        ]
        gaps, ratios = [], []
        for i, (score, one) in enumerate(zip(auto["scores"], auto["auto"], strict=True)):
            best = max(singles, key=lambda m: singles[m]["scores"][i])
            top = singles[best]["scores"][i]
            ratio = one["cv_seconds"] / one["final_seconds"] if one["final_seconds"] else float("nan")
            gaps.append(score - top)
            ratios.append(ratio)
            lines.append(
                f"| {i} | {score:.1f} | {one['chosen']} | {best} {top:.1f} | {score - top:+.1f} | "
                f"{one['cv_seconds']:.0f} | {one['final_seconds']:.0f} | {ratio:.1f}x |"
            )
        hindsight = sum(max(s["scores"][i] for s in singles.values()) for i in range(len(gaps))) / len(gaps)
        lines.append(
            f"| mean | {auto['mean']:.1f} ± {auto['sd']:.1f} | | {hindsight:.1f} | {sum(gaps) / len(gaps):+.1f} | | | "
            f"{sum(ratios) / len(ratios):.1f}x |"
        )
        n = len(gaps)
        fixed = max(singles, key=lambda m: sum(singles[m]["scores"][:n]))
        best_mean = sum(singles[fixed]["scores"][:n]) / n
        lines.append(
            f"| best single method | | | {fixed} {best_mean:.1f} (the one method best over these {n} splits) | "
            f"{auto['mean'] - best_mean:+.1f} | | | |"
        )
    return lines


def zero_shot(few: dict, splits: list[str]) -> dict:
    """A prompt run's score before training (the same model and scored rows on every LM-BFF split; FewCLUE's
    splits share test_public too) and the most labels it predicted: 1 means a context-blind MLM head."""
    before = [few["per_split"][s]["zero_shot"] for s in splits if "zero_shot" in few["per_split"][s]]
    if not before:
        return {}
    return {
        "zero_shot": round(sum(b["score"] for b in before) / len(before), 2),
        "zero_shot_labels": max(b["labels_predicted"] for b in before),
    }


def table(rows: list[dict], methods: list[str]) -> list[str]:
    """Markdown rows: model, task, each method's mean ± sd, and the prompt before training."""
    lines = [
        "| model | task | " + " | ".join(methods) + " | prompt before training |",
        "|---|---|" + "---|" * (len(methods) + 1),
    ]
    by = {(r["model"], r["task"], r["method"]): r for r in rows}
    for model, task in dict.fromkeys((r["model"], r["task"]) for r in rows):
        cells = [
            f"{by[model, task, m]['mean']:.1f} ± {by[model, task, m]['sd']:.1f}" if (model, task, m) in by else "-"
            for m in methods
        ]
        p = by.get((model, task, "prompt"), {})
        zero = (
            f"{p['zero_shot']:.1f}" + (" (one label for all)" if p.get("zero_shot_labels") == 1 else "")
            if "zero_shot" in p
            else "-"
        )
        lines.append(f"| {Path(model).name} | {task} | " + " | ".join(cells) + f" | {zero} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="a model with an MLM head (repeatable)")
    ap.add_argument("--tasks", default="glue/sst2,glue/mrpc")
    ap.add_argument(
        "--data-dir",
        action="append",
        default=None,
        help="SUITE=DIR, e.g. glue=../shared/data/glue, or DIR for every suite (default: $CRAMKIT_GLUE_DIR, "
        "$CRAMKIT_CLUE_DIR)",
    )
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--prefix-len", type=int, default=16)
    ap.add_argument("--prior", default="auto", help="the prior setting: auto, none, LABEL=TEXT,... (descriptions)")
    ap.add_argument("--head-init", default="auto", choices=("auto", "random"), help="the head_init setting")
    ap.add_argument("--out", default="bench-fewshot.jsonl")
    ap.add_argument("--work", default="bench-fewshot-runs", help="where each split's run is kept")
    ap.add_argument("--table", default=None, help="also write the Markdown table here")
    args = ap.parse_args()
    dirs = {"glue": os.environ.get("CRAMKIT_GLUE_DIR"), "clue": os.environ.get("CRAMKIT_CLUE_DIR")}
    for item in args.data_dir or []:
        suite, eq, path = item.partition("=")
        if eq and suite in dirs:
            dirs[suite] = path
        else:  # a bare DIR (a path may hold "=" too): every suite's
            dirs = dict.fromkeys(dirs, item)
    out = Path(args.out)
    done = {}
    if out.is_file():
        for line in out.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            init = (row.get("prior", "auto"), row.get("head_init", "before head_init"))  # older rows: random heads
            done[(row["model"], row["task"], row["method"], row["k"], row["steps"], *init)] = row
    rows = []
    for model in args.model:
        for task in args.tasks.split(","):
            for method in args.methods.split(","):
                key = (model, task, method, args.k, args.steps, args.prior, args.head_init)
                if key not in done:
                    print(
                        f"{model} {task} {method}: {args.splits} splits of K={args.k} ...",
                        file=sys.stderr,
                        flush=True,
                    )
                    done[key] = run_one(model, task, dirs.get(task.split("/")[0]), method, args)
                    with out.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(done[key]) + "\n")
                rows.append(done[key])
    lines = [
        f"{machine()}; K={args.k} per class, {args.splits} splits, {args.steps} steps of batch {args.batch}, best "
        f"of every {args.eval_every} steps on the sampled dev; mean ± sd over splits "
        "(accuracy or the task's metric, %)",
        "",
        *table(rows, args.methods.split(",")),
        *auto_table(rows),
    ]
    text = "\n".join(lines)
    print(text)
    if args.table:
        Path(args.table).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
