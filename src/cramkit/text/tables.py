"""Tables and JSON Lines read by their columns: one reader for every verb that takes a user's rows (fine-tuning
and prediction files, embedding inputs, pretraining text), so that a CSV is read by its header everywhere.

The format follows the extension: ``.csv`` (comma, CSV quoting), ``.tsv`` / ``.tab`` (tab; quotes are plain
text, as in GLUE), ``.jsonl`` / ``.ndjson`` / ``.json`` (one JSON object per line); ``delimiter`` reads any
other text file as CSV with that delimiter. CSV and TSV files need a header row naming the columns.
"""

from __future__ import annotations

import codecs
import csv
import logging
from collections.abc import Iterator
from pathlib import Path

from cramkit.errors import CramkitError
from cramkit.io import BadJson, LoneSurrogate, json_row

log = logging.getLogger("cramkit.tasks")

# the csv module refuses a field over 131,072 characters by default; a long document is a fine field, so
# the limit is raised to 64 Mi characters (beyond that: one line naming the file and the row)
CSV_FIELD_LIMIT = 1 << 26
# the columns a row's text is usually in, most likely first (a pair's second text: PAIR_COLUMNS)
TEXT_COLUMNS = ("text", "sentence", "text_a", "sentence1", "question", "review", "content", "body", "document")
PAIR_COLUMNS = ("text_b", "sentence2")
CSV_EXT = {".csv"}
TSV_EXT = {".tsv", ".tab"}
JSONL_EXT = {".jsonl", ".ndjson", ".json"}


def table_format(path: Path, delimiter: str | None) -> str:
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


def records(
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
    from cramkit.text.encoding import file_encoding

    encoding, forced = file_encoding(path, encoding)
    errors = forced or errors
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
            fix = "name its encoding (e.g. --encoding cp1252, or auto: each file UTF-8, else cp1252) or pass "
            fix += "--errors replace"
        raise CramkitError(
            f"{path} is not valid {encoding or 'UTF-8'} (bad byte {exc.object[exc.start : exc.start + 1]!r}); {fix}"
        ) from None


def _records_of(
    path: Path, fmt: str, delimiter: str | None, encoding: str, errors: str, offers_errors: bool = False
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


def read_tsv_lines(path: Path, encoding: str = "utf-8-sig", errors: str = "strict"):
    """(line number, fields) for each non-blank line; tabs split fields, quotes are plain text.

    Lines end only at ``\\n`` (a stray ``\\r`` inside a sentence does not split a row); a byte-order mark
    at the start of the file is dropped.
    """
    with open(path, encoding=encoding, errors=errors, newline="\n") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if line.strip():
                yield lineno, line.split("\t")


def guess_text_columns(path: Path, delimiter: str | None = None) -> tuple[str | None, str | None, list[str]]:
    """(the text column, the pair's second text column or None, all columns) from ``path``'s header (a JSON
    Lines file: its first row's fields), by the usual names (TEXT_COLUMNS, PAIR_COLUMNS)."""
    columns: list[str] = []
    for _, rec, _ in records(path, table_format(path, delimiter), delimiter):
        if rec is not None:
            columns = list(rec.get("__header__", rec))
            break
    a = next((c for c in TEXT_COLUMNS if c in columns), None)
    b = next((c for c in PAIR_COLUMNS if c in columns and c != a), None) if a else None
    return a, b, columns
