"""A strong teacher, a small model served (issue 63, item 3): each few-shot split's self-trained teacher (a
``bench_selftrain.py`` run, e.g. all-mpnet-base-v2) distilled on the same unlabelled text into a pretrained small
student (``--student hf:DIR``, e.g. all-MiniLM-L6-v2), both scored on the task's dev set; beside it, for each backbone,
the logistic regression on its frozen embeddings of the split's labelled rows (the yardstick ``cramkit finetune
--few-shot`` prints).

    python bench/bench_selftrain.py --model hf:$MPNET --tasks glue/sst2 --data-dir $GLUE --unlabelled 8000 \\
        --tag mpnet --work runs/st
    python bench/bench_teacher_student.py --teacher-work runs/st/mpnet-glue-sst2-k16-200-u8000-mpnet \\
        --backbone hf:$MPNET --student hf:$MINILM --tasks glue/sst2 --data-dir $GLUE --unlabelled 8000

The unlabelled rows are ``bench_selftrain.py``'s (``--unlabelled`` rows from ``--from-row``), the splits LM-BFF's
(``cramkit finetune --few-shot K``). Each split's result is appended to ``--out`` (JSON lines) as it finishes; a
split already there is skipped (a killed bench continues).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fewshot import bench_task
from bench_infer import machine
from bench_selftrain import unlabelled_texts


def kept_model(split_dir: Path) -> Path:
    """The model a self-trained split kept (its student, or its teacher where the student lost): the split
    directory itself holds it."""
    return split_dir


def dev_score(model: str, view) -> float:
    """``model``'s main metric on the split's scored rows (the task's dev set: what the recipes are read on)."""
    from cramkit.infer import Engine
    from cramkit.loading import load_torch

    loaded = load_torch(model, purpose="scoring")
    engine = Engine(loaded)
    scores = []
    for split in view.scored_splits:
        rows = view.examples(split)
        names = engine.classify([e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in rows]).labels
        predicted = [view.labels.index(str(n)) for n in names]
        labels = [int(e.label) for e in rows]
        scores.append(view.score(view.compute_metrics(predicted, labels, rows)))
    return round(statistics.fmean(scores), 2)


def frozen(model: str, view, split: str) -> float:
    from cramkit.loading import load_torch
    from cramkit.recipes.frozen_baseline import frozen_baseline

    base = frozen_baseline(load_torch(model, purpose="a baseline"), [(split, view)])
    assert base is not None
    return round(base["mean"], 2)


def run_split(args: argparse.Namespace, task, split: str, texts: list[str]) -> dict:
    from cramkit.distillation.config import config_from
    from cramkit.distillation.core import distill
    from cramkit.tasks.fewshot import few_shot_task

    view = few_shot_task(task, args.k, int(split))
    teacher = kept_model(Path(args.teacher_work) / f"split-{split}")
    out = Path(args.work) / f"split-{split}"
    settings = {"init": args.student, "epochs": args.epochs, "baseline_epochs": args.epochs, "seed": int(split)}
    t0 = time.time()
    report = distill(str(teacher), view, "encoder", config_from(settings), out, unlabelled=texts, progress=False)
    seconds = time.time() - t0
    return {
        "split": split,
        "teacher_model": str(teacher),
        "teacher": dev_score(str(teacher), view),
        "student": dev_score(str(out), view),
        "frozen_backbone": frozen(args.backbone, view, split),
        "frozen_student": frozen(args.student, view, split),
        "student_parameters": report["parameters"]["student"]["total"],
        "speedup": report.get("speedup"),
        "speedup_1_thread": report.get("speedup_1_thread"),
        "distill_seconds": round(seconds, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher-work", required=True, help="bench_selftrain.py's --work folder of the teacher's run")
    ap.add_argument("--backbone", required=True, help="the teacher's backbone (its frozen-embeddings baseline)")
    ap.add_argument("--student", required=True, help="the pretrained small student, hf:DIR")
    ap.add_argument("--tasks", default="glue/sst2")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--unlabelled", type=int, default=8000)
    ap.add_argument("--from-row", type=int, default=20000)
    ap.add_argument("--epochs", type=float, default=3.0, help="the student's epochs over the transfer set")
    ap.add_argument("--out", default="bench-teacher-student.jsonl")
    ap.add_argument("--work", default="bench-teacher-student-runs")
    args = ap.parse_args()
    task = bench_task(args.tasks, args.data_dir)
    texts = [a if b is None else f"{a} {b}" for a, b in unlabelled_texts(task, args.unlabelled, args.from_row)]
    done = set()
    if Path(args.out).is_file():
        done = {json.loads(line)["split"] for line in Path(args.out).read_text().splitlines() if line.strip()}
    rows = []
    for split in (str(i) for i in range(args.splits)):
        if split in done:
            continue
        if not (Path(args.teacher_work) / f"split-{split}" / "cramkit-model.json").is_file():
            print(f"split {split}: its teacher is not finished yet; run the bench again later", flush=True)
            continue
        row = {"task": args.tasks, "machine": machine(), **run_split(args, task, split, texts)}
        rows.append(row)
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    if not Path(args.out).is_file():
        return
    every = [json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]
    for key in ("teacher", "student", "frozen_backbone", "frozen_student"):
        values = [r[key] for r in every]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{key}: {statistics.fmean(values):.2f} ± {sd:.2f} over {len(values)} splits")


if __name__ == "__main__":
    main()
