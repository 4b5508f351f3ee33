"""Self-training with the task's unlabelled text against the same fine-tuning without it (issue 49).

LM-BFF's few-shot protocol (``cramkit finetune --few-shot K --splits S``, as bench/bench_fewshot.py runs it: ``--steps``
optimizer steps of batch ``--batch``, the best of every ``--eval-every`` steps on the sampled dev kept, scored on the
task's dev set), each split self-trained (``--unlabelled``): the head fine-tuned on the split's 2K rows is the teacher
(the row "without": the same split, seed and steps as ``bench_fewshot.py --methods head``), it labels ``--unlabelled``
training sentences of the task (their labels dropped; rows ``--from-row`` on, away from no draw in particular: any
labelled or dev row of the split is dropped from them), and the student (the same backbone) learns from the labels
and the confident pseudo-labels. A row: mean ± sd over the splits of the teacher and of the student, the rows kept
and the wall time per split (teacher, labelling, student).

    python bench/bench_selftrain.py --model hf:MINILM --tasks glue/sst2 --unlabelled 4000
    python bench/bench_selftrain.py --model hf:MINILM --tasks files:tasks/abc --unlabelled 2000 --text-column text
    python bench/bench_selftrain.py --model hf:MINILM --tasks glue/sst2 --unlabelled 8000 --min-words 8 --rounds 2

A row records each split's own student (``student``) and the model the run kept (``result``: the student, or the
teacher where the student scored below it on the drawn dev rows; ``teacher_kept`` names those splits); with
``--trace`` also what each way of picking the teacher's and the student's checkpoint would have scored
(``picks``, bench/_trace_dev.py).

Each result is appended to ``--out`` (JSON lines) when known, and the split runs resume (a killed bench continues).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trace_dev import install, picks
from bench_fewshot import bench_task
from bench_infer import machine


def unlabelled_texts(task, n: int, start: int, min_words: int = 0) -> list[tuple[str, str | None]]:
    """``n`` of the task's training rows from row ``start`` on (wrapping), their labels dropped; with ``min_words``
    only rows whose first text has that many words (SST-2's training rows are mostly phrases of its sentences, the
    text it is scored on whole sentences: unlabelled text of the kind a user scores)."""
    rows = task.examples(task.train_split)
    order = [rows[(start + i) % len(rows)] for i in range(len(rows))]
    picked = [e for e in order if len(e.text_a.split()) >= min_words][:n]
    return [(e.text_a, e.text_b) for e in picked]


def run_one(model: str, task_name: str, data_dir: str | None, args: argparse.Namespace) -> dict:
    from cramkit.api import _fewshot
    from cramkit.recipes.finetune_config import config_from

    settings = {
        "method": "head",
        "batch_size": args.batch,
        "min_steps": args.steps,
        "epochs": 1e-6,  # the teacher: --steps steps; the student: self_train_epochs, at least --steps
        "eval_every": f"{args.eval_every}steps",
        "keep": "best",
        "checkpoint_every": "10m",
        "max_length": args.max_length,
        "self_train_epochs": args.student_epochs,
        "self_train_fraction": args.fraction,
        "self_train_balance": args.balance,
        "self_train_mask": args.mask,
        "self_train_soft": args.soft == "on",
        "self_train_rounds": args.rounds,
        "self_train_teachers": args.teachers,
        "self_train_neighbours": args.neighbours == "on",
        "prior": args.prior,
        "head_init": args.head_init,
    }
    task = bench_task(task_name, data_dir)
    rows = unlabelled_texts(task, args.unlabelled, args.from_row, args.min_words)
    splits = [str(i) for i in range(args.splits)]
    tag = task_name.replace("/", "-").replace(":", "-")
    work = Path(args.work) / f"{Path(model).name}-{tag}-k{args.k}-{args.steps}-u{args.unlabelled}-{args.tag}"
    t0 = time.time()
    # cramkit.finetune(few_shot=K, unlabelled=...)'s own path, with the task object the bench built
    res = _fewshot(task, model, config_from(settings), work, args.k, args.splits, None, rows, False)
    st = res["self_training"]
    per = res["fewshot"]["per_split"]
    return {
        "model": model,
        "task": task_name,
        "k": args.k,
        "steps": args.steps,
        "unlabelled": len(rows),
        "tag": args.tag,
        "min_words": args.min_words,
        "settings": {k: v for k, v in settings.items() if k.startswith(("self_train", "prior", "head_init"))},
        "teacher": [round(x, 2) for x in st["teacher"]["scores"]],
        # each split's own student (the teacher's score where it collapsed), and the model the run kept
        "student": [
            round((per[s]["self_training"]["student"] or per[s]["self_training"]["teacher"])["score"], 2)
            for s in splits
        ],
        "result": [round(x, 2) for x in st["student"]["scores"]],
        "teacher_mean": round(st["teacher"]["mean"], 2),
        "teacher_sd": round(st["teacher"]["std"], 2),
        "student_mean": round(st["student"]["mean"], 2),
        "student_sd": round(st["student"]["std"], 2),
        "collapsed": st["collapsed"],
        "teacher_kept": st.get("teacher_kept", []),
        "kept": [per[s]["self_training"]["kept_rows"] for s in splits],
        # the neighbours' labels' accuracy on each split's drawn dev rows (None where left out)
        "neighbours_dev": [(per[s]["self_training"].get("neighbours") or {}).get("dev_accuracy") for s in splits],
        "seconds_per_split": [per[s]["self_training"]["seconds"] for s in splits],
        "labelling_seconds": [per[s]["self_training"]["rounds"][0]["labelling_seconds"] for s in splits],
        "seconds": round(time.time() - t0, 1),
        # --trace: what each way of picking the teacher's and the student's checkpoint scored (bench/_trace_dev.py)
        "picks": {s: {who: picks(work / f"split-{s}" / who) for who in ("teacher", "student")} for s in splits}
        if args.trace
        else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks", default="glue/sst2")
    ap.add_argument("--data-dir", default=None, help="the suite's folder (default $CRAMKIT_GLUE_DIR)")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--unlabelled", type=int, default=4000, help="unlabelled training rows given to every split")
    ap.add_argument("--from-row", type=int, default=20000, help="the first training row taken as unlabelled")
    ap.add_argument("--min-words", type=int, default=0, help="unlabelled rows of at least this many words only")
    ap.add_argument("--student-epochs", type=float, default=2.0)
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--balance", choices=("equal", "predicted"), default="equal", help="self_train_balance")
    ap.add_argument("--mask", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--teachers", type=int, default=1)
    ap.add_argument("--neighbours", choices=("on", "off"), default="on", help="self_train_neighbours")
    ap.add_argument(
        "--soft", choices=("on", "off"), default="on", help="self_train_soft: off, the student learns hard labels"
    )
    ap.add_argument("--prior", default="auto", help="the prior setting: auto, none, similarity, LABEL=TEXT,...")
    ap.add_argument("--head-init", default="auto", choices=("auto", "random"), help="the head_init setting")
    ap.add_argument(
        "--trace", action="store_true", help="score every dev evaluation on the scored split too (_trace_dev.py)"
    )
    ap.add_argument("--tag", default="default", help="names this configuration in --out and --work")
    ap.add_argument("--out", default="bench-selftrain.jsonl")
    ap.add_argument("--work", default="bench-selftrain-runs")
    args = ap.parse_args()
    if args.trace:
        install()
    out = Path(args.out)
    done = {}
    if out.is_file():
        for line in out.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            done[(row["model"], row["task"], row["k"], row["steps"], row["unlabelled"], row["tag"])] = row
    rows = []
    for task in args.tasks.split(","):
        key = (args.model, task, args.k, args.steps, args.unlabelled, args.tag)
        if key not in done:
            print(f"{task}: {args.splits} splits of K={args.k}, {args.unlabelled} unlabelled ...", file=sys.stderr)
            done[key] = run_one(args.model, task, args.data_dir, args)
            with out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(done[key]) + "\n")
        rows.append(done[key])
    print(f"{machine()}; K={args.k} per class, {args.splits} splits, teacher {args.steps} steps of batch {args.batch}")
    print("| task | unlabelled | head (teacher) | self-trained (the model kept) | kept rows | s per split (median) |")
    print("|---|---:|---|---|---:|---:|")
    for r in rows:
        print(
            f"| {r['task']} | {r['unlabelled']:,} | {r['teacher_mean']:.1f} ± {r['teacher_sd']:.1f} | "
            f"{r['student_mean']:.1f} ± {r['student_sd']:.1f} | {statistics.median(r['kept']):,.0f} | "
            f"{statistics.median(r['seconds_per_split']):.0f} |"
        )


if __name__ == "__main__":
    main()
