"""User tasks from CSV, TSV or JSONL files, by naming the columns.

The format follows the extension: ``.csv`` (comma, CSV quoting), ``.tsv`` / ``.tab`` (tab; quotes are
plain text, as in GLUE), ``.jsonl`` / ``.ndjson`` / ``.json`` (one JSON object per line). ``delimiter``
reads any other text file as CSV with that delimiter (and CSV quoting, also for a TSV). CSV and TSV files
need a header row naming the columns. The label column may be absent from a test file (no labels).

A multiple-choice task names its choices: one JSONL field holding a list of texts, or several columns
(one choice each; empty cells at the end of a row are no choices, so rows may have fewer); the label is
the right choice's index from 0.

    task = task_from_file("reviews", "train.csv", "dev.csv", text_a="review", label="stars",
                          labels=["1", "2", "3", "4", "5"])
    get_task("user/reviews")  # registered
    task_from_file("copa", "train.jsonl", text_a="premise", choices=["choice1", "choice2"])
"""

from __future__ import annotations

import codecs
import csv
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from cramkit.errors import CramkitError
from cramkit.io import BadJson, LoneSurrogate, json_row
from cramkit.tasks.glue import SKIP_HINT, BadRow, parse_label, read_tsv_lines
from cramkit.tasks.registry import Example, PathLike, Task, register_task

# the csv module refuses a field over 131,072 characters by default; a long document is a fine field, so
# the limit is raised to 64 Mi characters (beyond that: one line naming the file and the row)
CSV_FIELD_LIMIT = 1 << 26
CSV_EXT = {".csv"}
TSV_EXT = {".tsv", ".tab"}
JSONL_EXT = {".jsonl", ".ndjson", ".json"}

log = logging.getLogger("cramkit.tasks")


def _format(path: Path, delimiter: str | None) -> str:
    ext = path.suffix.lower()
    if ext in JSONL_EXT:
        return "jsonl"
    if delimiter is not None:
        return "csv"
    if ext in CSV_EXT:
        return "csv"
    if ext in TSV_EXT:
        return "tsv"
    raise CramkitError(
        f"{path}: cannot tell the format from the extension '{ext}'; use .csv, .tsv or .jsonl, "
        "or give the delimiter (--delimiter)"
    )


def _records(
    path: Path, fmt: str, delimiter: str | None, encoding: str | None = None, errors: str | None = None
) -> Iterator[tuple[int, dict | None, str]]:
    """(line number, record or None when the row is malformed, problem) for each row after the header;
    a binary file or one not valid in ``encoding`` (default UTF-8) is one CramkitError naming it. A caller
    that passes ``errors`` offers its user --encoding and --errors, and the error names them."""
    with open(path, "rb") as f:
        if b"\0" in f.read(8192):
            raise CramkitError(f"{path} is a binary file, not {fmt.upper()} text; give a UTF-8 text file")
    if csv.field_size_limit() < CSV_FIELD_LIMIT:
        csv.field_size_limit(CSV_FIELD_LIMIT)
    enc = encoding or "utf-8"
    if codecs.lookup(enc).name == "utf-8":
        enc = "utf-8-sig"
    try:
        yield from _records_of(path, fmt, delimiter, enc, errors or "strict", errors is not None)
    except csv.Error as exc:
        raise CramkitError(
            f"{path}: {exc} (a field over {CSV_FIELD_LIMIT:,} characters, or an unclosed quote); split the text "
            "or fix the quoting"
        ) from None
    except UnicodeDecodeError as exc:
        fix = "convert it, e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8"
        if errors is not None:
            fix = "name its encoding (e.g. --encoding latin-1 or cp1252) or pass --errors replace"
        raise CramkitError(
            f"{path} is not valid {encoding or 'UTF-8'} (bad byte {exc.object[exc.start : exc.start + 1]!r}); {fix}"
        ) from None


def _records_of(
    path: Path, fmt: str, delimiter: str | None, encoding: str, errors: str, offers_errors: bool
) -> Iterator[tuple[int, dict | None, str]]:
    if fmt == "jsonl":
        replaced = 0
        with open(path, encoding=encoding, errors=errors) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if lineno == 1 and line.lstrip().startswith("["):
                    raise CramkitError(
                        f"{path} holds a JSON array; write one JSON object per line (JSON Lines) instead"
                    )
                try:
                    rec, fixed = json_row(line, errors)
                    replaced += fixed
                except LoneSurrogate as e:
                    fix = " (or pass --errors replace to replace them with U+FFFD)" if offers_errors else ""
                    yield lineno, None, f"{e}{fix}"
                    continue
                except BadJson as e:
                    yield lineno, None, str(e)
                    continue
                if not isinstance(rec, dict):
                    yield lineno, None, f"a JSON {type(rec).__name__}, not an object"
                    continue
                yield lineno, rec, ""
        if replaced:
            what = "replaced with U+FFFD" if errors == "replace" else "dropped"
            log.warning("%s: lone surrogate escapes in %d rows were %s (--errors %s)", path, replaced, what, errors)
        return
    if fmt == "tsv":
        lines = read_tsv_lines(path, encoding, errors)
    else:
        f = open(path, encoding=encoding, errors=errors, newline="")  # noqa: SIM115 (closed below)
        reader = csv.reader(f, delimiter=delimiter or ",")
        lines = ((reader.line_num, row) for row in reader if any(c.strip() for c in row))
    try:
        first = next(lines, None)
        if first is None:
            raise CramkitError(f"{path} is empty; it needs a header row naming the columns, then rows")
        header = [c.strip() for c in first[1]]
        yield 0, {"__header__": header}, ""
        for lineno, row in lines:
            if len(row) != len(header):
                yield lineno, None, f"expected {len(header)} columns (as the header), found {len(row)}"
            else:
                yield lineno, dict(zip(header, row, strict=True)), ""
    finally:
        if fmt == "csv":
            f.close()


class FileSplit:
    """Loader of one split of a user task (see :func:`task_from_file`)."""

    def __init__(
        self,
        task: str,
        path: Path,
        fmt: str,
        delimiter: str | None,
        columns: tuple[str, str | None, str | None, str | None],
        labels: list[str] | None,
        label_required: bool,
        skip_bad_rows: bool,
        choices: tuple[str, ...] | None = None,
    ):
        self.task, self.path, self.fmt, self.delimiter = task, path, fmt, delimiter
        self.columns, self.labels, self.label_required = columns, labels, label_required
        self.skip_bad_rows, self.choices = skip_bad_rows, choices
        self.source = str(path)
        self.skipped = 0

    def _check_header(self, header: list[str]) -> bool:
        """Whether the file has the label column; CramkitError if a needed column is absent."""
        text_a, text_b, label, idx = self.columns
        named = [("text_a", text_a), ("text_b", text_b), ("idx", idx)]
        for role, col in [*named, *(("a choice", c) for c in self.choices or ())]:
            if col is not None and col not in header:
                raise CramkitError(
                    f"{self.path}: no column '{col}' (given as {role}); its columns: {', '.join(header)}"
                )
        if label is not None and label not in header:
            if self.label_required:
                raise CramkitError(
                    f"{self.path}: no label column '{label}'; its columns: {', '.join(header)}. "
                    "Name the label column with --label"
                )
            return False
        return True

    def __call__(self) -> list[Example]:
        if not self.path.is_file():
            raise CramkitError(f"{self.task}: the split's file {self.path} does not exist")
        text_a, text_b, label_col, idx_col = self.columns
        has_label = label_col is not None
        out: list[Example] = []
        self.skipped = 0
        for lineno, rec, problem in _records(self.path, self.fmt, self.delimiter):
            if rec is not None and "__header__" in rec:
                has_label = self._check_header(rec["__header__"])
                continue
            where = f"{self.path}, line {lineno}"
            try:
                if rec is None:
                    raise BadRow(f"{where}: {problem}. {SKIP_HINT}")
                a = rec.get(text_a)
                b = rec.get(text_b) if text_b else None
                if a is None or (text_b and b is None):
                    missing = text_a if a is None else text_b
                    has = ", ".join(rec)
                    raise BadRow(f"{where}: no value for '{missing}' (the row has: {has}). {SKIP_HINT}")
                choices = read_choices(rec, self.choices, where) if self.choices else None
                label = None
                raw = rec.get(label_col) if label_col else None
                if has_label and (raw is not None or self.label_required):
                    if raw is None:
                        raise BadRow(f"{where}: no value for the label '{label_col}'. {SKIP_HINT}")
                    if choices is not None:
                        label = _choice_index(raw, len(choices), where)
                    else:
                        if isinstance(raw, bool):
                            raw = str(raw).lower()
                        label = parse_label(raw, self.labels, where)
                idx = len(out)
                if idx_col:
                    try:
                        idx = int(cast(Any, rec.get(idx_col)))  # None: the TypeError below
                    except (TypeError, ValueError):
                        raise BadRow(f"{where}: index '{rec.get(idx_col)}' is not an integer. {SKIP_HINT}") from None
            except BadRow as e:
                if self.skip_bad_rows:
                    self.skipped += 1
                    continue
                raise CramkitError(str(e)) from None
            out.append(Example(str(a).strip(), None if b is None else str(b).strip(), label, idx, choices))
        if not out:
            raise CramkitError(f"{self.path} holds no rows for {self.task}")
        return out


def read_choices(rec: dict, cols: tuple[str, ...], where: str, hint: str = SKIP_HINT) -> tuple[str, ...]:
    """A row's choices: one field's list, or one per choice column (empty cells at the end dropped); BadRow
    naming ``where`` (then ``hint``) for a missing column, a value that is not text, an empty choice, fewer
    than 2."""
    first = rec.get(cols[0])
    if len(cols) == 1 and isinstance(first, list):
        values = first
    else:
        missing = [c for c in cols if rec.get(c) is None]
        if missing:
            raise BadRow(f"{where}: no value for the choice column '{missing[0]}'. {hint}")
        values = [rec[c] for c in cols]
    if not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in values):
        raise BadRow(f"{where}: the choices must be texts, got {values!r:.80}. {hint}")
    texts = [str(v).strip() for v in values]
    while texts and not texts[-1]:
        texts.pop()
    if "" in texts:
        raise BadRow(f"{where}: choice {texts.index('')} is empty. {hint}")
    if len(texts) < 2:
        how = "name several choice columns (--choices A,B,...) or a field holding a list"
        raise BadRow(f"{where}: {len(texts)} choice(s); a multiple-choice row needs at least 2 ({how}). {hint}")
    return tuple(texts)


def _choice_index(raw: object, n: int, where: str) -> int:
    """A multiple-choice label: the right choice's index, 0..n-1; BadRow otherwise."""
    try:
        i = int(str(raw).strip()) if not isinstance(raw, (bool, float)) else None
    except ValueError:
        i = None
    if i is None:
        raise BadRow(f"{where}: label {raw!r} is not a choice index (0..{n - 1}). {SKIP_HINT}")
    if not 0 <= i < n:
        raise BadRow(f"{where}: label {i} is outside the row's {n} choices (0..{n - 1}). {SKIP_HINT}")
    return i


def _infer_labels(split: FileSplit) -> list[str]:
    """The label values seen in the train file, sorted (numerically when all are integers)."""
    seen: set[str] = set()
    label_col = split.columns[2]
    for lineno, rec, problem in _records(split.path, split.fmt, split.delimiter):
        if rec is not None and "__header__" in rec:
            split._check_header(rec["__header__"])
            continue
        # a malformed row is named here, where the labels are gathered (it may hold the only other label)
        if rec is None or rec.get(label_col) is None:
            if split.skip_bad_rows:
                continue
            why = problem if rec is None else f"no value for the label '{label_col}'"
            raise CramkitError(f"{split.path}, line {lineno}: {why}. {SKIP_HINT}")
        v = rec.get(label_col)
        if str(v).strip() != "":
            seen.add(str(v).lower() if isinstance(v, bool) else str(v).strip())
    if not seen:
        raise CramkitError(f"{split.path}: no labels found in column '{label_col}'")
    if all(s.lstrip("-").isdigit() for s in seen):
        return sorted(seen, key=int)
    return sorted(seen)


def task_from_file(
    name: str,
    train: PathLike,
    dev: PathLike | None = None,
    test: PathLike | None = None,
    *,
    text_a: str,
    text_b: str | None = None,
    label: str = "label",
    labels: list[str] | None = None,
    regression: bool = False,
    metrics: list[str] | None = None,
    delimiter: str | None = None,
    idx: str | None = None,
    choices: list[str] | None = None,
    skip_bad_rows: bool = False,
    register: bool = True,
) -> Task:
    """A task from CSV / TSV / JSONL files, registered as "user/NAME" (or NAME when it has a "/").

    labels: the label values in id order; inferred from the train file when omitted (sorted). For
    regression the label column holds numbers. metrics default to accuracy (+ F1 of label id 1 for two
    labels), or Pearson and Spearman for regression. idx names an integer id column (else row numbers).
    choices: a multiple-choice task: one field holding a list of texts, or several columns, one choice each;
    text_a is the context, the label the right choice's index from 0 (metric: accuracy).
    """
    full = name if "/" in name else f"user/{name}"
    if regression and labels is not None:
        raise CramkitError(f"task {full}: give labels or regression=True, not both")
    if choices is not None:
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise CramkitError(f"task {full}: name the choice column(s), e.g. choices=['choice1', 'choice2']")
        if regression or labels is not None or text_b is not None:
            raise CramkitError(
                f"task {full}: a multiple-choice task (choices) has one context column (text_a) and a choice "
                "index for a label: no text_b, labels or regression"
            )
    paths = {"train": train, "dev": dev, "test": test}
    splits: dict[str, FileSplit] = {}
    for split, p in paths.items():
        if p is None:
            continue
        path = Path(p).expanduser()
        if not path.is_file():
            raise CramkitError(f"task {full}: the {split} file {path} does not exist")
        splits[split] = FileSplit(
            full,
            path,
            _format(path, delimiter),
            delimiter,
            (text_a, text_b, label, idx),
            None,
            label_required=split != "test",
            skip_bad_rows=skip_bad_rows,
            choices=tuple(choices) if choices is not None else None,
        )
    if choices is None and not regression:
        labels = [str(x) for x in labels] if labels is not None else _infer_labels(splits["train"])
        if len(labels) < 2:
            where = f" in {splits['train'].path} (column '{label}')" if "train" in splits else ""
            raise CramkitError(
                f"task {full}: a classification task needs at least two labels, found only {labels}{where}; "
                "give rows of every class (or --regression for numeric targets)"
            )
    for s in splits.values():
        s.labels = labels
    if metrics is None:
        if choices is not None:
            metrics = ["accuracy"]
        elif regression:
            metrics = ["pearson", "spearman"]
        else:
            assert labels is not None  # a classification task's, set above
            metrics = ["accuracy", "f1"] if len(labels) == 2 else ["accuracy"]
    task = Task(
        name=full,
        splits=dict(splits),
        labels=labels,
        metrics=list(metrics),
        dev_splits=["dev"] if "dev" in splits else [],
        test_splits=["test"] if "test" in splits else [],
        description=f"user task from {Path(train)}",
        kind="multiple_choice" if choices is not None else "",
    )
    if register:
        register_task(task)
    return task
