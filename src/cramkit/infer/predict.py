"""``cramkit.predict``: a model over the rows of a CSV / TSV / JSONL / text file, written to a file.

A classifier writes each row's label and probabilities (a regressor its score); a multiple-choice model
reads a context and its choices per row and writes the chosen choice's index, its text and every choice's
probability; with a label column in the input the metric is computed too. A masked-LM model (a pretraining
run) fills each ``[MASK]``.
"""

from __future__ import annotations

import csv
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from cramkit.errors import CramkitError
from cramkit.infer.requests import PredictRequest
from cramkit.request import verb
from cramkit.text.tables import PAIR_COLUMNS, TEXT_COLUMNS  # the usual column names

CHOICES_HINT = "Fix the row, or name the choice columns with --choices COL[,COL...]."


@dataclass
class Rows:
    """Texts read from a file, with the label column's values when it has one."""

    texts_a: list[str]
    texts_b: list[str] | None
    gold: list[str] | None
    columns: list[str] = field(default_factory=list)
    text_columns: tuple[str, str | None] = ("text", None)  # the columns texts_a, texts_b came from
    label_column: str | None = None  # the column gold came from
    choices: list[tuple[str, ...]] | None = None  # per row, its choices (multiple choice)


def read_rows(
    path: str | os.PathLike,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str | None = "label",
    *,
    choices: list[str] | None = None,
    encoding: str | None = None,
    errors: str = "strict",
) -> Rows:
    """Rows of a .csv / .tsv / .jsonl file (header / named fields) or a .txt file (one text per line),
    decoded with ``encoding`` (default UTF-8) and ``errors`` (strict, replace or ignore). choices: the
    choice columns of a multiple-choice model's rows (one field holding a list, or one column per choice)."""
    from cramkit.tasks.files import BadRow, read_choices
    from cramkit.text.sources import check_source_options
    from cramkit.text.tables import records, table_format

    check_source_options(encoding=encoding, errors=errors)
    path = Path(path)
    if not path.is_file():
        raise CramkitError(f"{path} does not exist (or is not a file); give a .csv, .tsv, .jsonl or .txt file")
    if path.suffix.lower() == ".txt":
        if choices is not None:
            raise CramkitError(f"{path}: a multiple-choice model needs rows with choices; give a .jsonl or .csv file")
        from cramkit.text.encoding import file_encoding

        enc, forced = file_encoding(path, encoding)
        try:
            lines = path.read_text(encoding=enc or "utf-8-sig", errors=forced or errors).splitlines()
        except UnicodeDecodeError as exc:
            raise CramkitError(
                f"{path} is not valid {encoding or 'UTF-8'} (byte {exc.start}); name its encoding "
                "(e.g. --encoding cp1252, or auto: each file UTF-8, else cp1252) or pass --errors replace"
            ) from None
        texts = [t for t in lines if t.strip()]
        if not texts:
            raise CramkitError(f"{path} holds no text; give one input per line")
        return Rows(texts, None, None, ["text"])
    fmt = table_format(path, None)
    a_col, b_col = text_a, text_b
    texts_a: list[str] = []
    texts_b: list[str] = []
    gold: list[str] = []
    row_choices: list[tuple[str, ...]] = []
    has_label = False
    columns: list[str] = []
    for lineno, rec, problem in records(path, fmt, None, encoding, errors):
        if rec is None:
            raise CramkitError(f"{path} line {lineno}: {problem}; fix the row (or remove it)")
        if "__header__" in rec:
            columns = rec["__header__"]
            continue
        if not columns:
            columns = list(rec)
        if a_col is None:
            a_col = next((c for c in TEXT_COLUMNS if c in rec), None)
            if a_col is None:
                raise CramkitError(f"{path}: no text column among {', '.join(columns)}; name it with --text-a COLUMN")
            if b_col is None:
                b_col = next((c for c in PAIR_COLUMNS if c in rec and c != a_col), None)
        if not texts_a:
            has_label = label is not None and label in rec
        if a_col not in rec or (b_col is not None and b_col not in rec):
            missing = a_col if a_col not in rec else b_col
            raise CramkitError(f"{path} line {lineno}: no column {missing!r}; its columns: {', '.join(map(str, rec))}")
        va, vb = rec[a_col], rec.get(b_col) if b_col else None
        if not isinstance(va, str) or (b_col and not isinstance(vb, str)):
            raise CramkitError(f"{path} line {lineno}: the text column holds {type(va).__name__}, not text")
        if choices is not None:
            try:
                row_choices.append(read_choices(rec, tuple(choices), f"{path} line {lineno}", CHOICES_HINT))
            except BadRow as exc:
                raise CramkitError(str(exc)) from None
        texts_a.append(va)
        if b_col:
            texts_b.append(cast(str, vb))  # checked above
        if has_label:
            gold.append(str(rec.get(label, "")).strip())
    if not texts_a:
        raise CramkitError(f"{path} has no rows to predict")
    return Rows(
        texts_a,
        texts_b if b_col else None,
        gold if has_label else None,
        columns,
        (cast(str, a_col), b_col),  # set by the first row
        label if has_label else None,
        row_choices if choices is not None else None,
    )


@verb(PredictRequest)
def predict(request: PredictRequest) -> dict[str, Any]:
    """Predict every row of ``input_file`` with ``model`` (anything ``cramkit.load`` opens, exports included,
    or an opened model); write them to ``out`` (.jsonl, .csv or .tsv; default: FILE.predictions.jsonl); return a
    summary (rows, examples/s, metrics, out). Takes a :class:`~cramkit.infer.requests.PredictRequest` or its
    fields. backend: auto (the model's own: an export's format, else torch), torch, or an export format (onnx,
    ct2, ...: a torch model is exported at startup).

    label: the gold label column, scored when the file has it ("auto": the column the model was trained
    on, else ``label``; None or "none": no scoring); its values are checked against the model's labels before
    any row is predicted. keep_text: copy each row's input text(s) into its prediction. task: the head of a model
    trained on a mixture (one head per task). choices: a multiple-choice model's choice columns (a list, or
    "A,B"; default: those it was trained on, else ``choices``); its context column defaults to the one it was
    trained on too. base: the base model of a deep-prompt directory (finetune --method ptuning).
    offload_experts, expert_cache: a mixture-of-experts model's experts brought in as its routers pick them
    (:class:`~cramkit.infer.Engine`)."""
    from cramkit.io import check_out_file, disk_errors

    r = request.resolved()  # a bad combination: one line before anything is read
    out = cast(Path, r.out)
    check_out_file(out, inputs=[r.model, r.input_file])
    engine = _open_engine(r)
    rows = _read_inputs(engine, r)
    inputs = rows.texts_a if rows.texts_b is None else list(zip(rows.texts_a, rows.texts_b, strict=True))
    start = time.perf_counter()
    summary: dict[str, Any] = {"model": engine.source, "kind": engine.kind, "rows": len(inputs)}
    records, found = _predict_rows(engine, rows, inputs, r.top_k)
    truncated = found.pop("truncated")
    if r.keep_text:
        _add_texts(records, rows)
    summary.update(found)
    elapsed = time.perf_counter() - start
    summary["seconds"] = round(elapsed, 3)
    summary["examples_per_s"] = round(len(inputs) / max(elapsed, 1e-9), 1)
    summary["truncated"] = truncated
    with disk_errors(out):  # a full disk: one line naming it
        summary["out"] = str(write_predictions(records, out))
    return summary


def _open_engine(r: PredictRequest) -> Any:
    """The engine over the request's model: a path loaded (a deep-prompt directory on ``base``), a mixture's
    model cut to the head of ``task``, run by ``backend``."""
    from cramkit.backends import ExportedModel
    from cramkit.infer import Engine
    from cramkit.loading import LoadedModel, for_task, load

    model = r.model if isinstance(r.model, (LoadedModel, ExportedModel)) else load(r.model, base=r.base)
    if isinstance(model, LoadedModel):
        model = for_task(model, r.task)
    return Engine(
        model,
        backend=r.backend,
        device=r.device,
        max_batch_tokens=r.max_batch_tokens,
        max_length=r.max_length,
        offload_experts=r.offload_experts,
        expert_cache=None if r.expert_cache is None else int(r.expert_cache),  # checked: a number
    )


def _read_inputs(engine: Any, r: PredictRequest) -> Rows:
    """The rows of the request's file, read by default through the columns the model was trained on (label
    "auto": its label column, else ``label``), their gold labels checked against the model's before any row
    is predicted."""
    input_file, text_a, label, choices = r.input_file, r.text_a, r.label, cast("list[str] | None", r.choices)
    given = label not in ("auto", None)
    trained = _trained_columns(engine)
    if label == "auto":
        label = trained.get("label") or "label"
    if engine.kind == "multiple_choice":
        choices = choices or trained.get("choices") or ["choices"]
        text_a = text_a or trained.get("text_a")
    elif choices is not None:
        raise CramkitError(f"--choices applies to a multiple-choice model; {engine.source} is a {engine.kind} model")
    rows = read_rows(input_file, text_a, r.text_b, label, choices=choices, encoding=r.encoding, errors=r.errors)
    if given and rows.label_column is None:
        raise CramkitError(
            f"{input_file} has no column {label!r} (--label; its columns: {', '.join(rows.columns)}); name the "
            "gold label column, or --label none to predict without scoring"
        )
    if rows.gold is not None and engine.kind in ("classifier", "regression", "multiple_choice"):
        rows.gold = _named_gold(engine, rows.gold)
        _check_gold(engine, rows.gold, f"{input_file} column {rows.label_column!r}", rows.choices)
    return rows


def _named_gold(engine: Any, gold: list[str]) -> list[str]:
    """Gold labels written as the training data's values (``0``/``1``) where the model answers the names it was
    given (``--set label_names=...``, recorded with the values in ``label_values``): mapped by position. A file
    that already spells the names, or a model without names, is read as it is."""
    values = engine.loaded.extra.get("label_values") if engine.kind == "classifier" else None
    labels = list(engine.labels or [])
    if not isinstance(values, list) or len(values) != len(labels) or values == labels:
        return gold
    if any(g in set(labels) for g in gold):
        return gold
    to_name = dict(zip(map(str, values), labels, strict=True))
    return [to_name.get(g, g) for g in gold]


def _predict_rows(
    engine: Any, rows: Rows, inputs: list[Any], top_k: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each row's prediction as a record, by the model's kind, and what the summary adds (the masks filled,
    the metrics against the gold labels; ``truncated``: how many rows were cut to the model's limit)."""
    if engine.kind == "mlm":
        return _fill_masks(engine, rows, top_k)
    if engine.kind == "multiple_choice":
        return _choose(engine, rows)
    if engine.kind == "encoder":
        raise CramkitError(
            f"{engine.source} is a bare encoder (no head): fine-tune it first (cramkit finetune ... --out DIR), "
            "or take embeddings with `cramkit embed`"
        )
    return _classify(engine, rows, inputs)


def _fill_masks(engine: Any, rows: Rows, top_k: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A masked-LM model: each row's [MASK]s, each with its ``top_k`` tokens and their probabilities."""
    enc = engine.tokenize(list(rows.texts_a))
    filled = engine.fill_mask_encoded(enc, top_k)
    records: list[dict[str, Any]] = []
    for i, masks in enumerate(filled):
        records.append(
            {
                "row": i,
                "masks": [[{"token": c["token"], "score": round(c["score"], 6)} for c in m] for m in masks],
            }
        )
    return records, {"masks": sum(len(m) for m in filled), "truncated": int(enc.truncated.sum())}


def _choose(engine: Any, rows: Rows) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A multiple-choice model: each row's chosen choice (index and text) and every choice's probability."""
    chosen = engine.choose(rows.texts_a, rows.choices or [])
    records: list[dict[str, Any]] = []
    for i, cs in enumerate(rows.choices or []):
        k = int(chosen.chosen[i])
        rec: dict[str, Any] = {
            "row": i,
            "label": k,
            "answer": cs[k],
            "probabilities": [round(float(p), 6) for p in chosen.probs[i]],
        }
        if chosen.truncated[i]:
            rec["truncated"] = True
        records.append(rec)
    found: dict[str, Any] = {}
    if rows.gold is not None:
        from cramkit.tasks.metrics import compute_metrics

        gold = np.asarray([int(g) for g in rows.gold])
        found["metrics"] = compute_metrics(["accuracy"], chosen.chosen, gold)
    return records, {**found, "truncated": int(chosen.truncated.sum())}


def _classify(engine: Any, rows: Rows, inputs: list[Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A classifier (each row's label and probabilities) or a regressor (its score)."""
    res = engine.classify(inputs)
    records: list[dict[str, Any]] = []
    for i in range(len(inputs)):
        rec: dict[str, Any] = {"row": i}
        if res.scores is not None:
            rec["score"] = float(res.scores[i])
        else:
            assert res.labels is not None and res.probs is not None  # a classifier's (no scores)
            rec["label"] = res.labels[i]
            names = engine.labels or [str(j) for j in range(res.probs.shape[1])]
            rec["probabilities"] = {n: round(float(p), 6) for n, p in zip(names, res.probs[i], strict=True)}
        if res.truncated[i]:
            rec["truncated"] = True
        records.append(rec)
    found = {"metrics": _metrics(engine, res, rows.gold)} if rows.gold is not None else {}
    return records, {**found, "truncated": int(res.truncated.sum())}


def _trained_columns(engine: Any) -> dict[str, Any]:
    """The columns the engine's model was fine-tuned on (a model directory's extra, an export's manifest),
    the well-formed ones only: column names are strings, choices a list of them."""
    cols = engine.loaded.extra.get("columns")
    if not isinstance(cols, dict):
        return {}
    out: dict[str, Any] = {k: v for k, v in cols.items() if k != "choices" and isinstance(v, str)}
    choices = cols.get("choices")
    if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
        out["choices"] = choices
    return out


def _check_gold(loaded: Any, gold: list[str], where: str, choices: list[tuple[str, ...]] | None = None) -> None:
    """CramkitError (before any row is predicted) when the gold labels cannot be scored by the model."""
    hint = "give --label the right column, or --label none to predict without scoring"
    if loaded.kind == "multiple_choice":
        for i, (g, cs) in enumerate(zip(gold, choices or [], strict=True)):
            if not (g.isdigit() and int(g) < len(cs)):
                raise CramkitError(
                    f"{where} row {i}: label {g!r} is not the index of one of its {len(cs)} choices "
                    f"(0..{len(cs) - 1}); {hint}"
                )
        return
    if loaded.kind == "regression":
        bad = [g for g in gold if not _is_number(g)]
        if bad:
            raise CramkitError(f"{where} holds non-numbers ({bad[:3]}), but the model is a regressor; {hint}")
        return
    names = set(loaded.labels or [])
    unknown = sorted({g for g in gold if g not in names})
    if unknown:
        raise CramkitError(
            f"{where} holds {unknown[:5]}{' ...' if len(unknown) > 5 else ''}, which the model does not know "
            f"(its labels: {loaded.labels}); {hint}"
        )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _add_texts(records: list[dict[str, Any]], rows: Rows) -> None:
    """Each row's input text(s) into its record, under the input's column names (``input_`` in front of a
    name the record already uses)."""
    for col, texts in ((rows.text_columns[0], rows.texts_a), (rows.text_columns[1], rows.texts_b)):
        if texts is None:
            continue
        for rec, text in zip(records, texts, strict=True):
            rec[f"input_{col}" if col in rec else cast(str, col)] = text  # (a column with texts)
    for rec, cs in zip(records, rows.choices or [], strict=False):
        rec["choices"] = list(cs)


def _metrics(loaded: Any, res: Any, gold: list[str]) -> dict[str, float]:
    """The metrics of the predictions against ``gold`` (checked by `_check_gold` before predicting)."""
    from cramkit.tasks.metrics import compute_metrics

    if loaded.kind == "regression":
        y = np.asarray([float(g) for g in gold], dtype=np.float64)
        return compute_metrics(["pearson", "spearman"], res.scores, y)
    if loaded.kind == "multilabel":
        return {}
    names = loaded.labels or []
    index = {n: i for i, n in enumerate(names)}
    y = np.asarray([index[g] for g in gold])
    metrics = ["accuracy", "f1"] if len(names) == 2 else ["accuracy"]
    return compute_metrics(metrics, res.logits, y)


def write_predictions(records: list[dict[str, Any]], out: str | os.PathLike) -> Path:
    """``records`` as JSON Lines (default), CSV or TSV by ``out``'s extension, written atomically."""
    from cramkit.io import atomic_path

    out = Path(out)
    ext = out.suffix.lower()
    with atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        if ext in (".csv", ".tsv"):
            flat = [_flatten(r) for r in records]
            fields = list(dict.fromkeys(k for r in flat for k in r))
            writer = csv.DictWriter(f, fieldnames=fields, delimiter="\t" if ext == ".tsv" else ",")
            writer.writeheader()
            writer.writerows(flat)
        else:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return out


def _flatten(rec: dict[str, Any]) -> dict[str, Any]:
    flat = {k: v for k, v in rec.items() if k not in ("probabilities", "masks", "choices")}
    for j, text in enumerate(rec.get("choices") or []):
        flat[f"choice_{j}"] = text
    probs = rec.get("probabilities") or {}
    for name, p in probs.items() if isinstance(probs, dict) else enumerate(probs):  # a list: per choice
        flat[f"p_{name}"] = p
    for i, cands in enumerate(rec.get("masks") or []):
        flat[f"mask{i}"] = " ".join(c["token"] for c in cands)
    return flat
