"""Evaluate an encoder on a suite (GLUE): fine-tune on every task present, then one table and one chart.

evaluate_suite("glue", "runs/tiny", "glue_data", "out/glue")
# -> out/glue/results.json, results.md (task by task + GLUE average), scores.png, TASK/results.json
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cramkit.errors import CramkitError
from cramkit.load import load
from cramkit.tasks.finetune import FinetuneConfig, finetune, write_json

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
) -> dict[str, Any]:
    """Fine-tune and score ``source`` on every task of ``suite`` whose data is in data_dir.

    Absent tasks are skipped with a note (in results.json and results.md). Writes results.json,
    results.md and scores.png to out_dir, and each task's own results and test predictions to
    out_dir/<task>/.
    """
    from cramkit.tasks.metrics import glue_average
    from cramkit.tasks.registry import get_mixture

    if suite != "glue":
        raise CramkitError(f"cramkit eval: unknown suite '{suite}'; known suites: glue")
    from cramkit.tasks.glue import GLUE_TASKS

    cfg = cfg or FinetuneConfig()
    mixture = get_mixture(suite, data_dir, skip_bad_rows=skip_bad_rows)
    present = {t.name for t in mixture.tasks}
    skipped = [f"glue/{k}" for k in GLUE_TASKS if f"glue/{k}" not in present]
    loaded = load(source)  # once for all tasks
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tasks: dict[str, Any] = {}
    entries: dict[str, dict[str, float]] = {}  # "glue/mnli:dev_matched" -> median metrics
    for task in mixture.tasks:
        also = _diagnostic(data_dir) if task.name == "glue/mnli" else []
        res = finetune(
            task, loaded, cfg, out / task.name.split("/")[-1], progress=progress, predict_also=also
        )
        tasks[task.name] = {
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

    try:
        average = glue_average(entries)
    except CramkitError:
        average = None  # only WNLI present: nothing that enters the average
    results = {
        "suite": suite,
        "source": str(source),
        "data_dir": str(data_dir) if data_dir is not None else None,
        "config": res["config"] if tasks else None,
        "tasks": tasks,
        "entries": entries,
        "glue_average": average,
        "glue_average_over": sorted(entries),
        "skipped": {name: "no data in data_dir" for name in skipped},
    }
    write_json(out / "results.json", results)
    _write_markdown(out / "results.md", results)
    _write_chart(out / "scores.png", results)
    return results


def _diagnostic(data_dir: PathLike | None) -> list:
    """GLUE's diagnostic set (AX, test only), predicted by the MNLI model, when its file is present."""
    from cramkit.tasks.registry import get_task

    try:
        ax = get_task("glue/ax", data_dir=data_dir)
    except CramkitError:
        return []
    return [ax] if Path(ax.source("test")).is_file() else []  # local file only: no hub call mid-suite


def _write_markdown(path: Path, results: dict[str, Any]) -> None:
    from cramkit.tasks.finetune import _atomic_text

    lines = [
        f"# {results['suite'].upper()} dev results: {results['source']}",
        "",
        "| task | split | metrics (median over seeds) | score |",
        "|---|---|---|---:|",
    ]
    for name, res in results["tasks"].items():
        for split, med in res["median"].items():
            metrics = ", ".join(f"{m} {v:.2f}" for m, v in med["metrics"].items())
            lines.append(f"| {name} | {split} | {metrics} | {med['score']:.2f} |")
    avg = results["glue_average"]
    avg_text = f"{avg:.2f}" if avg is not None else "n/a"
    n = len([e for e in results["entries"] if not e.startswith("glue/wnli")])
    lines.append(f"| **GLUE average** | | over {n} of 9 entries (WNLI excluded) | **{avg_text}** |")
    if results["skipped"]:
        lines += ["", "Skipped (no data): " + ", ".join(results["skipped"])]
    lines += [
        "",
        "GLUE average as in Cramming (Table 3): mean of MNLI-m/mm accuracy, SST-2 accuracy, STS-B Spearman, "
        "RTE and QNLI accuracy, QQP and MRPC F1, CoLA MCC. References: BERT-base 80.9, crammed BERT 78.6.",
    ]
    _atomic_text(path, "\n".join(lines) + "\n")


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
        names.append("GLUE avg")
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
    ax.set_title(f"{results['suite'].upper()}: {Path(results['source']).name}", fontsize=10)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
