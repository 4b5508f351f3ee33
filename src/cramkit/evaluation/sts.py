"""STS: how well the cosine similarity of a model's embeddings of two texts follows their gold similarity
(Spearman, the main figure, and Pearson correlation, x100), over a TSV, CSV or JSON Lines file of pairs."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.errors import CramkitError
from cramkit.evaluation import results_dir
from cramkit.evaluation.embedding import check_model, embed_texts, model_info, open_engine
from cramkit.evaluation.metrics import cosine_rows, sts_metrics
from cramkit.evaluation.results import SCALE, check_results_out, short_source, write_outputs
from cramkit.evaluation.rows import BadRows, parse_number


@dataclass
class StsData:
    """Sentence pairs with their gold similarity."""

    path: Path
    texts_a: list[str]
    texts_b: list[str]
    scores: list[float]
    columns: tuple[str, str, str]
    skipped: int = 0


STS_LABELS = ("score", "label", "similarity", "relatedness_score", "gold")


def read_sts(
    path: str | os.PathLike,
    *,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str | None = None,
    skip_bad_rows: bool = False,
) -> StsData:
    """The pairs of a TSV (GLUE's STS-B: sentence1, sentence2, score), CSV or JSON Lines file, by its columns
    (default sentence1, sentence2, score; else the usual names); a row with an empty text or a score that is
    not a number is refused, or skipped and counted with ``skip_bad_rows``."""
    from cramkit.text.tables import PAIR_COLUMNS, TEXT_COLUMNS, records, table_format

    path = Path(path)
    if not path.is_file():
        raise CramkitError(
            f"--data {path}: no such file; give a TSV, CSV or JSON Lines file of sentence pairs with a gold score "
            "(GLUE STS-B's dev.tsv: columns sentence1, sentence2, score)"
        )
    fmt = table_format(path, None)
    bad = BadRows(path, skip_bad_rows)
    cols: tuple[str, str, str] | None = None
    a_texts: list[str] = []
    b_texts: list[str] = []
    scores: list[float] = []
    for lineno, rec, problem in records(path, fmt, None):
        if rec is None:
            bad.add(lineno, problem)
            continue
        if cols is None:
            names = list(rec.get("__header__", rec)) if "__header__" in rec else list(rec)
            cols = _sts_columns(path, names, text_a, text_b, label, TEXT_COLUMNS, PAIR_COLUMNS)
            if "__header__" in rec:
                continue
        ca, cb, cl = cols
        missing = [c for c in cols if c not in rec]
        if missing:
            bad.add(lineno, f"no field {missing[0]!r}")
            continue
        a, b, score = rec[ca], rec[cb], parse_number(rec[cl])
        if not isinstance(a, str) or not isinstance(b, str) or not a.strip() or not b.strip():
            bad.add(lineno, f"{ca!r} or {cb!r} is empty or not text")
            continue
        if score is None:
            bad.add(lineno, f"the score ({cl!r}) {str(rec[cl])[:40]!r} is not a number")
            continue
        a_texts.append(a)
        b_texts.append(b)
        scores.append(score)
    if cols is None:
        raise CramkitError(
            f"{path} is empty; it needs a header row naming the columns (sentence1, sentence2, score), then rows"
        )
    skipped = bad.check()
    if len(scores) < 2:
        raise CramkitError(f"{path}: {len(scores)} scored pair(s); a correlation needs at least 2")
    if len(set(scores)) < 2:
        raise CramkitError(
            f"{path}: every gold score is {scores[0]:g}, so no correlation can be measured; check the "
            f"--label column ({cols[2]})"
        )
    return StsData(path, a_texts, b_texts, scores, cols, skipped)


def _sts_columns(
    path: Path,
    names: list[str],
    text_a: str | None,
    text_b: str | None,
    label: str | None,
    text_cols: Sequence[str],
    pair_cols: Sequence[str],
) -> tuple[str, str, str]:
    a = text_a or ("sentence1" if "sentence1" in names else next((c for c in text_cols if c in names), None))
    b = text_b or ("sentence2" if "sentence2" in names else next((c for c in pair_cols if c in names), None))
    lab = label or next((c for c in STS_LABELS if c in names), None)
    for value, flag, what in ((a, "--text-a", "first text"), (b, "--text-b", "second text"), (lab, "--label", "score")):
        if value is None or value not in names:
            found = ", ".join(names[:12]) or "none"
            given = f"no column {value!r}" if value else f"no column for the {what}"
            raise CramkitError(f"{path}: {given} (columns: {found}); name it with {flag} COLUMN")
    assert a is not None and b is not None and lab is not None
    return a, b, lab


def evaluate_sts(
    model: Any,
    data: str | os.PathLike,
    out: str | os.PathLike | None = results_dir("sts"),
    *,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str | None = None,
    skip_bad_rows: bool = False,
    device: str = "auto",
    max_batch_tokens: int | None = None,
    progress: bool = True,
    dimensions: int | None = None,
) -> dict[str, Any]:
    """Spearman (main) and Pearson correlation, x100, of the cosine similarity of each pair's embeddings with
    its gold score; results written to ``out`` (None: nothing written). ``dimensions``: the vectors cut to
    that many leading dimensions (a Matryoshka model's). Returns the results."""
    check_model(model)
    t0 = time.perf_counter()
    out_dir = Path(out) if out is not None else None
    if out_dir is not None:
        check_results_out(out_dir, "sts", [model, data])
    pairs = read_sts(data, text_a=text_a, text_b=text_b, label=label, skip_bad_rows=skip_bad_rows)
    engine = open_engine(model, device, max_batch_tokens)
    dimensions = engine.check_dimensions(dimensions)
    t1 = time.perf_counter()
    # each distinct text once (STS files repeat sentences)
    unique = list(dict.fromkeys([*pairs.texts_a, *pairs.texts_b]))
    where = {t: i for i, t in enumerate(unique)}
    vec, truncated = embed_texts(engine, unique, progress=progress, desc="embedding sentences", dimensions=dimensions)
    embed_seconds = time.perf_counter() - t1
    ia = np.fromiter((where[t] for t in pairs.texts_a), dtype=np.int64, count=len(pairs.texts_a))
    ib = np.fromiter((where[t] for t in pairs.texts_b), dtype=np.int64, count=len(pairs.texts_b))
    sims = cosine_rows(vec[ia], vec[ib])
    metrics = sts_metrics(sims, pairs.scores)
    results: dict[str, Any] = {
        "evaluation": "sts",
        "scale": f"{SCALE}: correlations times 100 (Spearman 85.0 = rho 0.85)",
        "main_metric": "spearman",
        "score": metrics["spearman"],
        "metrics": metrics,
        "similarity": "cosine of the two texts' embeddings (the model's own pooling)",
        "model": model_info(engine),
        "dimensions": dimensions or engine.hidden_size,
        "data": str(pairs.path),
        "columns": dict(zip(("text_a", "text_b", "label"), pairs.columns, strict=True)),
        "counts": {"pairs": len(pairs.scores), "texts_embedded": len(unique), "truncated_texts": truncated},
        "skipped_rows": pairs.skipped,
        "seconds": {"embed": round(embed_seconds, 3), "total": round(time.perf_counter() - t0, 3)},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if out_dir is not None:
        md = [
            f"# STS: {engine.source}",
            "",
            f"data: {pairs.path} ({len(pairs.scores)} pairs; columns {', '.join(pairs.columns)})"
            + (f"; {pairs.skipped} bad rows skipped" if pairs.skipped else ""),
            "",
            "| metric (x100) | value |",
            "|---|---:|",
            *(f"| {m} | {v:.2f} |" for m, v in metrics.items()),
            "",
            "Correlation of the cosine similarity of the two texts' embeddings with the gold score, times 100; "
            "Spearman (rank correlation) is the main figure.",
            "",
        ]
        title = f"STS (x100): {short_source(engine.source)}"
        write_outputs(out_dir, results, "\n".join(md), {"cosine": metrics}, title)
        results["out"] = str(out_dir)
    return results
