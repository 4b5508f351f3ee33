"""What a distillation reports: the dev scores of teacher, student and baseline, their examples/s on the CPU
measured in the same run, and ``report.md``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from cramkit.loading import LoadedModel


def dev_logits(loaded: LoadedModel, a: list[str], b: list[str | None], max_length: int, device: str = "auto"):
    from cramkit.infer.engine import Engine

    eng = Engine(loaded, device=device, max_length=max_length)
    out = eng.logits([x if y is None else (x, y) for x, y in zip(a, b, strict=True)])
    loaded.model.to("cpu")
    return out


def score(task: Any, kind: str, logits: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    preds = logits[:, 0] if kind == "regression" else logits
    metrics = task.compute_metrics(preds, labels)
    return {"metrics": metrics, "score": task.score(metrics)}


def dev_scores(
    task: Any, kind: str, dev_rows: list[Any], models: dict[str, LoadedModel], max_length: int, device: str
) -> dict[str, Any]:
    """Each model's score on the dev rows, under its report key (``models``: key -> model, scored in order)."""
    da = [r.text_a for r in dev_rows]
    db = [r.text_b for r in dev_rows]
    y_dev = np.asarray([r.label for r in dev_rows], dtype=np.float32 if kind == "regression" else np.int64)
    return {name: score(task, kind, dev_logits(m, da, db, max_length, device), y_dev) for name, m in models.items()}


def cpu_speed(loaded: LoadedModel, inputs: list[Any], max_length: int, min_seconds: float, threads: int) -> float:
    """Examples per second of ``loaded`` through the Engine on the CPU with ``threads`` torch threads (one
    warm-up pass first)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _speed(loaded, inputs, max_length, min_seconds)
    finally:
        torch.set_num_threads(before)


def _speed(loaded: LoadedModel, inputs: list[Any], max_length: int, min_seconds: float) -> float:
    from cramkit.infer.engine import Engine

    eng = Engine(loaded, device="cpu", max_length=max_length)
    eng.logits(inputs[:64])
    n, t0 = 0, time.perf_counter()
    while True:
        eng.logits(inputs)
        n += len(inputs)
        el = time.perf_counter() - t0
        if el >= min_seconds:
            return n / el


def cpu_speeds(
    teacher: LoadedModel, student: LoadedModel, dev_rows: list[Any], max_length: int, examples: int, min_seconds: float
) -> dict[str, Any]:
    """The report's speed figures: examples/s of teacher and student on the dev inputs (the first ``examples``; 0:
    all) with this process's torch threads and with one, and the student/teacher ratios."""
    import torch

    inputs = [r.text_a if r.text_b is None else (r.text_a, r.text_b) for r in dev_rows]
    if examples:
        inputs = inputs[:examples]
    threads = torch.get_num_threads()
    speed: dict[str, float] = {}
    speed1: dict[str, float] = {}
    for name, m in (("teacher", teacher), ("student", student)):
        speed[name] = cpu_speed(m, inputs, max_length, min_seconds, threads)
        speed1[name] = cpu_speed(m, inputs, max_length, min_seconds, 1) if threads > 1 else speed[name]
    return {
        "cpu_examples_per_s": {k: round(v, 1) for k, v in speed.items()},
        "speedup": round(speed["student"] / speed["teacher"], 2),
        "cpu_examples_per_s_1_thread": {k: round(v, 1) for k, v in speed1.items()},
        "speedup_1_thread": round(speed1["student"] / speed1["teacher"], 2),
        "cpu_threads": threads,
    }


def report_md(r: dict[str, Any]) -> str:
    s = r["scores"]
    m = r["main_metric"]
    p = r["parameters"]
    sp = r["cpu_examples_per_s"]

    def row(name: str, key: str, params: dict | None, speed: float | None) -> str:
        if key not in s:
            return ""
        ps = (
            f"{params['total'] / 1e6:.2f}M ({params['without_embeddings'] / 1e6:.2f}M w/o embeddings)" if params else ""
        )
        return f"| {name} | {s[key]['score']:.2f} | {ps} | {f'{speed:,.0f}' if speed else ''} |\n"

    ts = r["transfer_set"]
    lines = [
        f"# Distillation: {r['task']} -> {r['student']}\n\n",
        f"Teacher `{r['teacher']}`; student `{r['out']}`. Dev split `{r['dev_split']}` ({r['dev_examples']} examples), "
        f"{m} x100. Examples/s: `cramkit.infer.Engine` on the CPU ({r['cpu_threads']} threads), same run.\n\n",
        f"| model | dev {m} | parameters | CPU examples/s |\n|---|---:|---:|---:|\n",
        row("teacher", "teacher", p["teacher"], sp["teacher"]),
        row(f"{r['student']} student (distilled)", "student", p["student"], sp["student"]),
        row(f"{r['student']} on labels only", "labels_only", p["student"], None),
        f"\nStudent/teacher speed: **{r['speedup']}x** with {r['cpu_threads']} threads "
        f"({r['cpu_examples_per_s_1_thread']['teacher']:,.0f} vs {r['cpu_examples_per_s_1_thread']['student']:,.0f} "
        f"examples/s with 1 thread: {r['speedup_1_thread']}x); student score "
        f"{s['student']['score'] - s['teacher']['score']:+.2f} vs the teacher",
    ]
    if "labels_only" in s:
        lines.append(f", {s['student']['score'] - s['labels_only']['score']:+.2f} vs labels only")
    lines.append(
        f".\n\nTransfer set: {ts['rows']:,} examples ({ts['originals']:,} originals, {ts.get('copies', 0):,} "
        f"augmented copies, {ts.get('unlabelled', 0):,} unlabelled)"
    )
    if ts.get("examples_per_s"):
        workers = ts.get("workers")
        procs = f"{workers} process" + ("" if workers == 1 else "es")
        lines.append(f"; augmentation {ts['examples_per_s']:,.0f} examples/s on {procs}")
        spent = ts.get("seconds_tagging", 0) + ts.get("seconds_augmenting", 0)
        if ts.get("cached"):
            lines.append(" (built by an earlier run, reused)")
        elif r["seconds_total"] > 0:
            lines.append(f", {spent:.0f} s = {100 * spent / r['seconds_total']:.1f}% of the total time")
    lines.append(f". Total time {r['seconds_total']:.0f} s.\n")
    return "".join(lines)
