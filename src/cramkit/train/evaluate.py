"""Evaluate an encoder on a suite (GLUE): fine-tune on every task present, then one table and one chart.

evaluate_suite("glue", "runs/tiny", "glue_data", "out/glue")
# -> out/glue/results.json, results.md (task by task + GLUE average), scores.png, TASK/results.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cramkit.errors import CramkitError
from cramkit.load import load
from cramkit.train.finetune import FinetuneConfig, finetune, write_json

PathLike = str | os.PathLike


def evaluate_suite(
    suite: str,
    source: PathLike,
    data_dir: PathLike | None,
    out_dir: PathLike,
    cfg: FinetuneConfig | None = None,
    *,
    skip_bad_rows: bool = False,
    progress: bool = True,
    tasks: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Fine-tune and score ``source`` on every task of ``suite`` whose data is in data_dir.

    Absent tasks are skipped with a note (in results.json and results.md). Writes results.json,
    results.md and scores.png to out_dir, and each task's own results and test predictions to
    out_dir/<task>/.
    """
    from cramkit.tasks.metrics import glue_average

    if suite != "glue":
        raise CramkitError(f"cramkit eval: unknown suite '{suite}'; known suites: glue")
    from cramkit.tasks.glue import GLUE_TASKS

    cfg = cfg or FinetuneConfig()
    from cramkit.tasks.glue import glue_tasks

    all_tasks = glue_tasks(data_dir, skip_bad_rows)
    wanted = None
    if tasks:
        wanted = {t if t.startswith("glue/") else f"glue/{t.lower()}" for t in tasks}
        unknown = sorted(w for w in wanted if w.removeprefix("glue/") not in GLUE_TASKS)
        if unknown:
            raise CramkitError(
                f"--tasks: unknown GLUE task(s) {', '.join(unknown)}; known: {', '.join(GLUE_TASKS)}"
            )
    present = {t.name for t in all_tasks}
    skipped = {f"glue/{k}": "no data in --data-dir" for k in GLUE_TASKS if f"glue/{k}" not in present}
    todo = []
    for task in all_tasks:
        if wanted is not None and task.name not in wanted:
            continue
        missing = [s for s in [task.train_split, *task.dev_splits] if not _split_present(task, s)]
        if missing:
            skipped[task.name] = f"no {', '.join(missing)} split in --data-dir"
            continue
        todo.append(task)
    if wanted is not None:
        skipped = {k: v for k, v in skipped.items() if k in wanted}
    if not todo:
        raise CramkitError(
            f"cramkit eval: no GLUE task to run in {data_dir} ({'; '.join(f'{k}: {v}' for k, v in skipped.items())})"
        )
    loaded = load(source)  # once for all tasks
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from cramkit.config import to_dict

    done_tasks: dict[str, Any] = {}
    entries: dict[str, dict[str, float]] = {}  # "glue/mnli:dev_matched" -> median metrics
    start = time.perf_counter()
    ran = 0
    for i, task in enumerate(todo, 1):
        task_dir = out / task.name.split("/")[-1]
        res = _finished(task_dir, loaded.source, to_dict(cfg))
        if res is not None:
            print(
                f"cramkit: [{i}/{len(todo)}] {task.name}: already done in {task_dir}, reused", file=sys.stderr
            )
        else:
            print(f"cramkit: [{i}/{len(todo)}] {task.name}: fine-tuning ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            also = _diagnostic(data_dir) if task.name == "glue/mnli" else []
            res = finetune(task, loaded, cfg, task_dir, progress=progress, predict_also=also)
            ran += 1
            took = time.perf_counter() - t0
            left = (time.perf_counter() - start) / ran * (len(todo) - i)
            print(
                f"cramkit: [{i}/{len(todo)}] {task.name}: {res['main_metric']} {res['score']:.2f} in {took:.0f}s"
                f"{f'; about {left / 60:.1f} min left' if i < len(todo) else ''}",
                file=sys.stderr,
                flush=True,
            )
        done_tasks[task.name] = {
            "score": res["score"],
            "main_metric": res["main_metric"],
            "median": res["median"],
            "seeds": [
                {"seed": r["seed"], "dev": r["dev"], "examples_per_s": r["examples_per_s"]}
                for r in res["seeds"]
            ],
            "train_examples": res["train_examples"],
        }
        for split, med in res["median"].items():
            key = task.name if len(res["median"]) == 1 else f"{task.name}:{split}"
            entries[key] = med["metrics"]
    tasks = done_tasks

    try:
        average = glue_average(entries)
    except CramkitError:
        average = None  # only WNLI present: nothing that enters the average
    results = {
        "suite": suite,
        "source": str(source),
        "data_dir": str(data_dir) if data_dir is not None else None,
        "config": to_dict(cfg),
        "tasks": tasks,
        "entries": entries,
        "glue_average": average,
        "glue_average_over": sorted(entries),
        "skipped": skipped,
        "complete": not skipped and len(entries) >= 9,
    }
    write_json(out / "results.json", results)
    _write_markdown(out / "results.md", results)
    _write_chart(out / "scores.png", results)
    return results


def _split_present(task: Any, split: str) -> bool:
    if split not in task.splits:
        return False
    try:
        src = task.source(split)
    except CramkitError:  # the loader says where its file should be, and that it is missing
        return False
    return src.startswith("hf:") or Path(src).is_file()


def _finished(task_dir: Path, source: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """The results of a task finished by an earlier (interrupted) run with the same model and settings."""
    try:
        res = json.loads((task_dir / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    same = isinstance(res, dict) and res.get("source") == source and res.get("config") == config
    return res if same and res.get("median") else None


def _diagnostic(data_dir: PathLike | None) -> list:
    """GLUE's diagnostic set (AX, test only), predicted by the MNLI model, when its file is present."""
    from cramkit.tasks.registry import get_task

    try:
        ax = get_task("glue/ax", data_dir=data_dir)
    except CramkitError:
        return []
    return [ax] if Path(ax.source("test")).is_file() else []  # local file only: no hub call mid-suite


def _write_markdown(path: Path, results: dict[str, Any]) -> None:
    from cramkit.io import write_text_atomic

    lines = [
        f"# {results['suite'].upper()} dev results: {results['source']}",
        "",
        "| task | split | metrics (median over seeds; x100: accuracy %, F1 %, MCC x100, Pearson/Spearman r x100) | score |",
        "|---|---|---|---:|",
    ]
    for name, res in results["tasks"].items():
        for split, med in res["median"].items():
            metrics = ", ".join(f"{m} {v:.2f}" for m, v in med["metrics"].items())
            lines.append(f"| {name} | {split} | {metrics} | {med['score']:.2f} |")
    avg = results["glue_average"]
    avg_text = f"{avg:.2f}" if avg is not None else "n/a"
    n = len([e for e in results["entries"] if not e.startswith("glue/wnli")])
    if n >= 9:
        lines.append(f"| **GLUE average** | | over all 9 entries (WNLI excluded) | **{avg_text}** |")
    else:
        lines.append(
            f"| GLUE average (partial) | | over {n} of 9 entries only: not comparable to published averages | {avg_text} |"
        )
    if results["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{k} ({v})" for k, v in results["skipped"].items())]
    lines += ["", "F1 is that of the positive class, label 1 (MRPC: paraphrase; QQP: duplicate)."]
    lines += [
        "",
        "GLUE average as in Cramming (Table 3): mean of MNLI-m/mm accuracy, SST-2 accuracy, STS-B Spearman, "
        "RTE and QNLI accuracy, QQP and MRPC F1, CoLA MCC. References: BERT-base 80.9, crammed BERT 78.6.",
    ]
    write_text_atomic(path, "\n".join(lines) + "\n")


def _write_chart(path: Path, results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, scores = [], []
    for name, res in results["tasks"].items():
        for split, med in res["median"].items():
            short = name.split("/")[-1]
            suffix = {"dev_matched": "m", "dev_mismatched": "mm"}.get(split, split)
            label = short if len(res["median"]) == 1 else f"{short}-{suffix}"
            names.append(f"{label}\n({res.get('main_metric') or 'score'})")
            scores.append(med["score"])
    if results["glue_average"] is not None:
        full = len([e for e in results["entries"] if not e.startswith("glue/wnli")]) >= 9
        names.append("GLUE avg" if full else "GLUE avg\n(partial)")
        scores.append(results["glue_average"])
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(names) + 1.5), 3.6))
    colors = ["#4c72b0"] * (len(names) - (results["glue_average"] is not None)) + ["#dd8452"] * (
        results["glue_average"] is not None
    )
    bars = ax.bar(names, scores, color=colors)
    for bar, s in zip(bars, scores, strict=True):
        ax.annotate(
            f"{s:.1f}", (bar.get_x() + bar.get_width() / 2, max(s, 0)), ha="center", va="bottom", fontsize=8
        )
    ax.set_ylabel("dev score (main metric)")
    ax.set_ylim(min(0.0, min(scores, default=0) - 5), 100)
    title = str(results["source"])
    title = title if len(title) <= 60 else "..." + title[-57:]
    ax.set_title(f"{results['suite'].upper()} dev scores (x100): {title}", fontsize=9)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
