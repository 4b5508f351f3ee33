"""An evaluation's output folder: checked before any work, then ``results.md``, ``scores.png`` and
``results.json`` (written last: its presence means the evaluation finished); the one line a command prints.
Every number is x100 (a correlation of 0.8 is 80.0; an nDCG of 0.5 is 50.0)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cramkit.errors import CramkitError

SCALE = "x100"


def check_results_out(out: Path, evaluation: str, inputs: Sequence[Any]) -> None:
    """``out`` may be written: the rule of every cramkit output; a results.json there must be this kind's."""
    from cramkit.io import check_out, read_json_object

    check_out(
        out,
        inputs=[i for i in inputs if i is not None],
        own={"results.json": ("evaluation", "metrics")},  # a results.json of cramkit's, not a file of that name
        writes=("results.md", "scores.png"),
        command=f"the {evaluation} evaluation",
    )
    before = read_json_object(out / "results.json", "choose another --out") if (out / "results.json").is_file() else {}
    if before and before.get("evaluation") != evaluation:
        raise CramkitError(
            f"--out {out} holds the results of another evaluation ({out / 'results.json'}); choose another --out"
        )


def write_outputs(out: Path, results: dict[str, Any], markdown: str, bars: dict[str, dict[str, float]], title: str):
    from cramkit.io import disk_errors, write_json_atomic, write_text_atomic

    with disk_errors(out):
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").unlink(missing_ok=True)  # written last: never an old one beside new files
        write_text_atomic(out / "results.md", markdown)
        write_chart(out / "scores.png", bars, title)
        write_json_atomic(out / "results.json", results)


def write_chart(path: Path, bars: dict[str, dict[str, float]], title: str) -> None:
    """A bar per metric (a group of bars per metric when ``bars`` has several series), x100."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(bars)
    names = list(next(iter(bars.values())))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.0 * len(names) * max(1, len(series) * 0.7) + 1.5), 3.6))
    colors = ["#4c72b0", "#dd8452", "#55a868"]
    for j, name in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(names))]
        values = [bars[name].get(m, float("nan")) for m in names]
        drawn = ax.bar(xs, values, width=width, color=colors[j % len(colors)], label=name)
        for bar, v in zip(drawn, values, strict=True):
            ax.annotate(
                f"{v:.1f}", (bar.get_x() + bar.get_width() / 2, max(v, 0)), ha="center", va="bottom", fontsize=8
            )
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_ylabel("score (x100)")
    low = min((v for b in bars.values() for v in b.values()), default=0.0)
    ax.set_ylim(min(0.0, low - 5), 108)
    if len(series) > 1:
        ax.legend(fontsize=8)
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


def short_source(source: Any) -> str:
    """A model's name cut to fit a chart's title."""
    s = str(source)
    return s if len(s) <= 48 else "..." + s[-45:]


def summary_line(results: dict[str, Any]) -> str:
    """The one line a command prints."""
    m = results["metrics"]
    where = f"; results in {results['out']}" if results.get("out") else ""
    if results["evaluation"] == "sts":
        c = results["counts"]
        return (
            f"STS {Path(results['data']).name}: Spearman {m['spearman']:.2f}, Pearson {m['pearson']:.2f} (x100, "
            f"{c['pairs']} pairs, {results['seconds']['total']:.1f}s){where}"
        )
    main = results["main_metric"]
    others = ", ".join(f"{k} {v:.2f}" for k, v in m.items() if k != main)
    how = "exact search"
    if results["search"]["kind"] == "index":
        exact = results["exact_on_index_vectors"][main]
        how = f"index {results['search']['index_kind']}; exact search on its vectors {main} {exact:.2f}"
    c = results["counts"]
    pr = results.get("prompts") or {}
    if any((pr.get(side) or {}).get("name") for side in ("queries", "documents")):
        named = {side: (pr.get(side) or {}).get("name") for side in ("queries", "documents")}
        how += f", prompts: queries {named['queries'] or 'none'}, documents {named['documents'] or 'none'}"
    return (
        f"retrieval {Path(results['data']).name}/{results['split']}: {main} {m[main]:.2f}, {others} (x100, "
        f"{c['queries_scored']} queries, {c['corpus']} documents, {how}, {results['seconds']['total']:.1f}s){where}"
    )
