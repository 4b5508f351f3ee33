"""Documents from text sources: files, directories, globs, JSON Lines, Parquet, HF datasets, built-in.

A ``.json`` file is read as JSON Lines when its first line is one JSON object (CLUE ships its data so);
any other ``.json`` file is refused (and skipped inside a directory). ``text_field`` names the field of
JSON Lines / the column of Parquet; naming another than ``text`` for a plain-text file is an error.

`iter_documents` yields one ``str`` per document; `detect_language` tells Chinese text from a sample. Reading
streams in bounded chunks, so memory stays bounded whatever the file size: a document longer than
``max_doc_chars`` (a single line of hundreds of megabytes, say) is cut at whitespace into consecutive documents
of at most that size.

Line ends are unified (CRLF, bare CR, U+0085, U+2028 -> ``\\n``; U+2029 -> blank line) and a UTF-8
byte-order mark is dropped. Invalid UTF-8 raises a `CramkitError` naming the file and the byte offset;
``encoding="latin-1"`` or ``errors="replace"`` are the ways out.
"""

from __future__ import annotations

import ast
import codecs
import errno
import glob
import gzip
import hashlib
import json
import logging
import os
import re
import stat
import sys
import sysconfig
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from cramkit.errors import CramkitError
from cramkit.io import BadJson, LoneSurrogate, json_loads, json_row
from cramkit.text import DOC_SPLITS
from cramkit.text.encoding import open_binary

log = logging.getLogger("cramkit.text")

TEXT_SUFFIXES = {".txt", ".text", ".tokens", ".raw"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}
JSON_SUFFIXES = {".json"}  # JSON Lines (as CLUE ships it) or one JSON document: told apart by content
PARQUET_SUFFIXES = {".parquet"}
TABLE_SUFFIXES = {".csv", ".tsv", ".tab"}  # read by their header: --text-field names the column
COMPRESSED_SUFFIXES = {".gz", ".zst"}
CHUNK_BYTES = 1 << 20
MAX_DOC_CHARS = 1 << 18  # longer documents are cut at whitespace into pieces of at most this size

# WikiText article heading: " = Title = " (one '=' each side; " = = Section = = " is not an article)
_WIKI_TITLE = re.compile(r"^ ?= [^=].* = ?$")
_LINE_BREAKS = re.compile("\r\n|[\r\x85\u2028]")


def iter_documents(
    sources: Sequence[str] | str | None = None,
    *,
    doc_split: str = "auto",
    text_field: str = "text",
    encoding: str | None = None,
    errors: str = "strict",
    normalize: str | None = "NFC",
    dedup: bool = False,
    max_doc_chars: int = MAX_DOC_CHARS,
    stats: dict | None = None,
) -> Iterator[str]:
    """Yield documents (non-empty, stripped strings) from ``sources`` in a deterministic order.

    sources: paths, directories (recursive; text/jsonl/parquet files, .json files holding JSON Lines,
      optionally .gz/.zst), globs, or
      ``hf:name[:config[:split]]``; None or [] means the built-in corpus (stdlib docstrings).
    doc_split: "file" (a file is a document), "blank" (blank-line separated), "wikitext"
      (" = Title = " headings) or "auto" (wikitext for *.tokens and files with such headings, else blank).
    normalize: a Unicode normal form ("NFC", "NFKC", ...) or None.
    dedup: drop exact duplicates (after normalisation).
    stats: if given, filled with counts ("documents", "duplicates", "files").
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [str(sources)]
    check_source_options(doc_split=doc_split, errors=errors, encoding=encoding, text_field=text_field)
    if normalize is not None and normalize not in ("NFC", "NFD", "NFKC", "NFKD"):
        raise CramkitError(f"unknown Unicode normal form {normalize!r}; use NFC, NFKC, NFD, NFKD or none")
    form = cast(Literal["NFC", "NFD", "NFKC", "NFKD"], normalize)  # checked above (when given)
    stats = stats if stats is not None else {}
    stats.update(documents=0, duplicates=0, files=0)
    seen: set[bytes] = set()
    opts = dict(doc_split=doc_split, text_field=text_field, encoding=encoding, errors=errors)
    for raw in _raw_documents(list(sources or []), opts, stats):
        doc = raw.strip()
        if not doc:
            continue
        if normalize and not unicodedata.is_normalized(form, doc):
            doc = unicodedata.normalize(form, doc)
        for piece in _cut(doc, max_doc_chars):
            if dedup:
                key = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=16).digest()
                if key in seen:
                    stats["duplicates"] += 1
                    continue
                seen.add(key)
            stats["documents"] += 1
            yield piece


def check_source_options(
    *, doc_split: str = "auto", errors: str = "strict", encoding: str | None = None, text_field: str = "text"
) -> None:
    """CramkitError naming the option when a reading option is not one cramkit knows."""
    if doc_split not in DOC_SPLITS:
        raise CramkitError(f"unknown document split {doc_split!r} (--doc-split); use one of {', '.join(DOC_SPLITS)}")
    if errors not in ("strict", "replace", "ignore"):
        raise CramkitError(f"unknown --errors {errors!r}; use strict, replace or ignore")
    if encoding is not None and encoding != "auto":
        try:
            codecs.lookup(encoding)
        except LookupError:
            raise CramkitError(
                f"unknown encoding {encoding!r} (--encoding); use e.g. utf-8, latin-1, cp1252 or auto (each file "
                "UTF-8, else cp1252)"
            ) from None
    if not isinstance(text_field, str) or not text_field:
        raise CramkitError(f"--text-field {text_field!r} must name a field, e.g. --text-field text")


def _not_a_file(src: str) -> str | None:
    """Why ``src`` (which exists or is a link) is not a readable regular file or directory, else None."""
    if os.path.islink(src) and not os.path.exists(src):
        try:
            os.stat(src)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return "is a symbolic link loop (it points back at itself)"
        return f"is a broken symbolic link (its target {os.readlink(src)!r} is missing)"
    try:
        mode = os.stat(src).st_mode
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISFIFO(mode):
        return "is a named pipe (FIFO), which can be read only once; save the text to a file first"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a text file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a text file"
    return None


def expand_sources(sources: Sequence[str]) -> list[str]:
    """Resolve paths, directories and globs to a sorted list of files (``hf:`` entries kept as-is)."""
    out: list[str] = []
    for src in sources:
        src = str(src)
        if src.startswith("hf:"):
            out.append(src)
        elif os.path.isdir(src):
            found = sorted(
                str(p)
                for p in Path(src).rglob("*")
                if p.is_file()
                and not any(part.startswith(".") for part in p.relative_to(src).parts)
                and _kind(str(p)) is not None
                and (_kind(str(p)) != "json" or _json_problem(str(p)) is None)
            )
            if not found:
                raise CramkitError(
                    f"directory {src} holds no text files (.txt, .tokens, .jsonl, .csv, .tsv, .parquet, optionally "
                    ".gz/.zst); point at the files themselves or put the corpus there"
                )
            out.extend(found)
        elif os.path.isfile(src):
            out.append(src)
        elif os.path.lexists(src) and (why := _not_a_file(src)):
            raise CramkitError(f"source {src} {why}; give a text file, a directory or a glob")
        elif glob.has_magic(src):
            found = sorted(p for p in glob.glob(src, recursive=True) if os.path.isfile(p))
            if not found:
                raise CramkitError(f"pattern {src!r} matches no files; check the pattern and quote it")
            out.extend(found)
        else:
            raise CramkitError(f"source {src!r} does not exist; give an existing file, directory or glob")
    return out


def _kind(path: str) -> str | None:
    name = path.lower()
    for ext in COMPRESSED_SUFFIXES:
        if name.endswith(ext):
            name = name[: -len(ext)]
    suffix = os.path.splitext(name)[1]
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in JSON_SUFFIXES:
        return "json"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix in TABLE_SUFFIXES:
        return "table"
    if suffix in TEXT_SUFFIXES:
        return "text"
    return None


def _raw_documents(sources: list[str], opts: dict, stats: dict) -> Iterator[str]:
    if not sources:
        stats["files"] += 1
        yield from builtin_documents()
        return
    for src in expand_sources(sources):
        stats["files"] += 1
        if src.startswith("hf:"):
            yield from _hf_documents(src, opts)
            continue
        kind = _kind(src) or "text"  # a file named explicitly is text unless its suffix says otherwise
        if kind == "json" and (problem := _json_problem(src)):
            raise CramkitError(f"{src} {problem}")
        if kind == "parquet":
            yield from _parquet_documents(src, opts["text_field"])
        elif kind == "table":
            yield from _table_documents(src, opts)
        elif kind in ("jsonl", "json"):
            yield from _jsonl_documents(src, opts)
        else:
            if opts["text_field"] != "text":
                raise CramkitError(
                    f"--text-field {opts['text_field']} given, but {src} is plain text, which has no fields; "
                    "drop --text-field, or give CSV/TSV, JSON Lines (.jsonl, .json) or Parquet files"
                )
            lines = _read_lines(src, opts["encoding"], opts["errors"])
            yield from _split(lines, opts["doc_split"], src)


# ------------------------------------------------------------------------------------ language detection

ZH_SHARE = 0.5  # Chinese when CJK ideographs are at least half of the letters sampled
SAMPLE_CHARS = 200_000


@dataclass(frozen=True)
class LanguageGuess:
    lang: str  # "zh" or "generic" (the modes of cramkit.text.tokenizer)
    cjk_share: float  # CJK ideographs / letters in the sample
    documents: int  # documents sampled
    chars: int  # characters sampled

    def describe(self) -> str:
        return (
            f"{self.cjk_share:.0%} of the letters in a sample of the text ({self.documents:,} documents, "
            f"{self.chars:,} characters) are Chinese characters"
        )


def detect_language(documents: Iterable[str], sample_chars: int = SAMPLE_CHARS) -> LanguageGuess:
    """Chinese ("zh") when CJK ideographs are most of the letters of the first ``sample_chars`` characters
    of ``documents``, else "generic"."""
    from cramkit.text.tokenizer import is_cjk_char

    letters = cjk = chars = docs = 0
    for doc in documents:
        docs += 1
        for c in doc[: sample_chars - chars]:
            if c.isalpha():
                letters += 1
                cjk += is_cjk_char(c)
        chars += min(len(doc), sample_chars - chars)
        if chars >= sample_chars:
            break
    share = cjk / letters if letters else 0.0
    return LanguageGuess("zh" if share >= ZH_SHARE else "generic", share, docs, chars)


# ---------------------------------------------------------------------------------------------- reading


def _read_text_chunks(path: str, encoding: str | None, errors: str) -> Iterator[str]:
    """Decode ``path`` in bounded chunks; line ends unified to ``\\n``; a leading BOM dropped."""
    from cramkit.text.encoding import file_encoding

    encoding, forced = file_encoding(path, encoding)
    errors = forced or errors
    enc = encoding or "utf-8"
    if codecs.lookup(enc).name == "utf-8":
        enc = "utf-8-sig"
    decoder = codecs.getincrementaldecoder(enc)(errors)
    offset = 0  # bytes consumed before the current chunk
    carry_cr = False
    with open_binary(path) as fh:
        while True:
            try:
                chunk = fh.read(CHUNK_BYTES)
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                raise CramkitError(f"cannot read {path}: {exc}; is the file complete and not corrupt?") from None
            except Exception as exc:  # zstandard.ZstdError and the like
                raise CramkitError(f"cannot decompress {path}: {exc}; is the file complete?") from None
            final = not chunk
            if b"\x00" in chunk and "utf-16" not in enc and "utf-32" not in enc:
                at = offset + chunk.index(b"\x00")
                raise CramkitError(
                    f"{path} looks like a binary file (NUL byte at byte offset {at}); give text files "
                    "only (or name its encoding with --encoding if it is UTF-16/32 text)"
                )
            try:
                pending = len(decoder.getstate()[0])
                text = decoder.decode(chunk, final=final)
            except UnicodeDecodeError as exc:
                at = offset - pending + exc.start
                raise CramkitError(
                    f"{path} is not valid {encoding or 'UTF-8'}: bad byte {exc.object[exc.start : exc.start + 1]!r} "
                    f"at byte offset {at}; name the file's encoding (e.g. --encoding cp1252, or auto: each file "
                    "UTF-8, else cp1252) or pass --errors replace"
                ) from None
            offset += len(chunk)
            if carry_cr:
                text = "\r" + text
            carry_cr = not final and text.endswith("\r")
            if carry_cr:
                text = text[:-1]
            if "\r" in text or "\x85" in text or "\u2028" in text:
                text = _LINE_BREAKS.sub("\n", text)
            if "\u2029" in text:
                text = text.replace("\u2029", "\n\n")
            if text:
                yield text
            if final:
                return


def _read_lines(path: str, encoding: str | None, errors: str) -> Iterator[str]:
    """Lines without their ``\\n``; a line longer than MAX_DOC_CHARS comes in several pieces."""
    rest = ""
    for text in _read_text_chunks(path, encoding, errors):
        text = rest + text
        lines = text.split("\n")
        rest = lines.pop()
        yield from lines
        while len(rest) > MAX_DOC_CHARS:  # a huge line: hand it on in bounded pieces
            yield rest[:MAX_DOC_CHARS] + "\x00"  # "\x00" marks "line continues"
            rest = rest[MAX_DOC_CHARS:]
    if rest:
        yield rest


def _json_problem(path: str) -> str | None:
    """None when the ``.json`` file ``path`` is JSON Lines (its first line one JSON object), else why not."""
    try:
        head = next(_read_text_chunks(path, None, "replace"), "")
    except CramkitError:
        return "is not a text file; give JSON Lines (one JSON object per line)"
    first = next((line for line in head.split("\n") if line.strip()), "")
    try:
        if isinstance(json_loads(first), dict):
            return None
    except ValueError:
        pass
    if first.lstrip().startswith("["):
        return "holds a JSON array, not JSON Lines (one JSON object per line); rewrite it, e.g. jq -c '.[]' FILE"
    return "is not JSON Lines (one JSON object per line, as CLUE ships .json files); write one object per line"


# ------------------------------------------------------------------------------------- document splits


def _split(lines: Iterator[str], doc_split: str, path: str) -> Iterator[str]:
    if doc_split == "auto":
        doc_split = "blank"
        if path.lower().endswith((".tokens", ".tokens.gz", ".tokens.zst")):
            doc_split = "wikitext"
        else:
            head: list[str] = []
            size = 0
            for line in lines:  # sniff the first 200 lines / 64K characters for " = Title = " headings
                head.append(line)
                size += len(line)
                if len(head) >= 200 or size >= 1 << 16:
                    break
            if any(_WIKI_TITLE.match(line) for line in head):
                doc_split = "wikitext"
            lines = _chain(head, lines)
    if doc_split == "file":
        yield from _join_groups(lines, lambda line: False, path)
    elif doc_split == "blank":
        yield from _join_groups(lines, lambda line: not line.strip(), path)
    else:
        yield from _join_groups(lines, None, path)


def _chain(head: list[str], rest: Iterator[str]) -> Iterator[str]:
    yield from head
    yield from rest


def _join_groups(lines: Iterable[str], is_break, path: str) -> Iterator[str]:
    """Group lines into documents; is_break(line) ends a document (None: WikiText headings start one)."""
    buf: list[str] = []
    size = 0
    prefix = ""  # the unfinished tail of an over-long line
    for line in lines:
        if prefix:
            line, prefix = prefix + line, ""
        if line.endswith("\x00"):  # a piece of an over-long line: emit it, cut at whitespace
            line = line[:-1]
            cut = line.rfind(" ")
            if cut <= 0:
                cut = len(line)
            if buf:
                yield "\n".join(buf)
                buf, size = [], 0
            yield line[:cut]
            prefix = line[cut:]
            continue
        if is_break is None:
            if _WIKI_TITLE.match(line):
                if buf:
                    yield "\n".join(buf)
                buf, size = [line.strip(" =").strip()], len(line)
                continue
        elif is_break(line):
            if buf:
                yield "\n".join(buf)
            buf, size = [], 0
            continue
        if buf and line.strip() == "" and buf[-1] == "":
            continue
        buf.append(line)
        size += len(line) + 1
        if size > MAX_DOC_CHARS:  # a single document of many lines: flush it in pieces
            yield "\n".join(buf)
            buf, size = [], 0
    if prefix:
        buf.append(prefix)
    if buf:
        yield "\n".join(buf)


def _cut(doc: str, limit: int) -> Iterator[str]:
    """Cut a document longer than ``limit`` characters at whitespace into consecutive pieces."""
    while len(doc) > limit:
        cut = doc.rfind(" ", 0, limit)
        if cut <= limit // 2:
            cut = limit
        piece, doc = doc[:cut].strip(), doc[cut:].strip()
        if piece:
            yield piece
    if doc:
        yield doc


# ----------------------------------------------------------------------------------- structured formats


def _jsonl_documents(path: str, opts: dict) -> Iterator[str]:
    field = opts["text_field"]
    buf = ""
    lineno = replaced = 0

    def parse(line: str) -> str | None:
        nonlocal replaced
        if not line.strip():
            return None
        try:
            obj, fixed = json_row(line, opts["errors"])
        except LoneSurrogate as exc:
            raise CramkitError(
                f"{path} line {lineno}: {exc}; fix the text, or pass --errors replace to replace such escapes "
                "with U+FFFD (or --errors ignore to drop them)"
            ) from None
        except BadJson as exc:
            raise CramkitError(f"{path} line {lineno}: {exc}; each line must be one JSON object") from None
        replaced += fixed
        if not isinstance(obj, dict) or field not in obj:
            keys = ", ".join(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
            raise CramkitError(
                f"{path} line {lineno}: no field {field!r} (has: {keys}); name the text field with --text-field"
            )
        value = obj[field]
        if value is None:
            return None
        if not isinstance(value, str):
            raise CramkitError(
                f"{path} line {lineno}: field {field!r} is {type(value).__name__}, not text; pick another --text-field"
            )
        return value

    for text in _read_text_chunks(path, opts["encoding"], opts["errors"]):
        parts = (buf + text).split("\n")
        buf = parts.pop()
        for line in parts:
            lineno += 1
            doc = parse(line)
            if doc is not None:
                yield doc
    if buf:
        lineno += 1
        doc = parse(buf)
        if doc is not None:
            yield doc
    if replaced:
        what = "replaced with U+FFFD" if opts["errors"] == "replace" else "dropped"
        log.warning("%s: lone surrogate escapes in %d rows were %s (--errors %s)", path, replaced, what, opts["errors"])


def _table_documents(path: str, opts: dict) -> Iterator[str]:
    """One document per row: the cell of the ``--text-field`` column. The header and every other column (labels
    included) are never read as text."""
    from cramkit.text.tables import TEXT_COLUMNS, records, table_format

    if any(path.lower().endswith(ext) for ext in COMPRESSED_SUFFIXES):
        raise CramkitError(f"{path} is a compressed table; decompress it first (tables are read by their header)")
    field, col_names = opts["text_field"], []
    for lineno, rec, problem in records(
        Path(path), table_format(Path(path), None), None, opts["encoding"], opts["errors"]
    ):
        if rec is None:
            raise CramkitError(f"{path} line {lineno}: {problem}; fix the row (or remove it)")
        if "__header__" in rec:
            col_names = rec["__header__"]
            if field not in col_names:
                guess = next((c for c in TEXT_COLUMNS if c in col_names), col_names[0] if col_names else "TEXT")
                raise CramkitError(
                    f"{path} is a table with the columns {', '.join(col_names)} and no {field!r}: pretraining reads "
                    f"one column's text and nothing else (never the header or the labels); name it with "
                    f"--text-field {guess}"
                )
            continue
        value = rec.get(field)
        if isinstance(value, str) and value.strip():
            yield value


def _parquet_documents(path: str, field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise CramkitError(f"{path} is Parquet; pip install pyarrow to read it") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:
        raise CramkitError(f"cannot read Parquet file {path}: {exc}; is it complete?") from None
    names = pf.schema_arrow.names
    if field not in names:
        raise CramkitError(f"{path} has no column {field!r} (columns: {', '.join(names)}); name it with --text-field")
    import pyarrow as pa

    kind = pf.schema_arrow.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        text_cols = [f.name for f in pf.schema_arrow if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
        hint = f" (text columns: {', '.join(text_cols)})" if text_cols else " (it has no text column)"
        raise CramkitError(
            f"{path}: column {field!r} holds {kind}, not text; name the text column with --text-field{hint}"
        )
    for batch in pf.iter_batches(columns=[field], batch_size=4096):
        for value in batch.column(0).to_pylist():
            if isinstance(value, str):
                yield value


def _hf_documents(spec: str, opts: dict) -> Iterator[str]:
    parts = spec[3:].split(":")
    if not parts[0] or len(parts) > 3:
        raise CramkitError(
            f"bad dataset source {spec!r}; write hf:NAME[:CONFIG[:SPLIT]], e.g. hf:wikitext:wikitext-103-raw-v1:train"
        )
    name, config, split = (
        parts[0],
        (parts[1] if len(parts) > 1 and parts[1] else None),
        (parts[2] if len(parts) > 2 and parts[2] else "train"),
    )
    try:
        import datasets
    except ImportError:
        raise CramkitError(
            f"{spec} needs the Hugging Face datasets library; pip install 'cramkit[hf]' (or datasets)"
        ) from None
    try:
        ds = datasets.load_dataset(name, config, split=split, streaming=True)
        it = iter(ds)
        first = next(it, None)
    except Exception as exc:
        raise CramkitError(
            f"cannot open dataset {spec}: {exc}; check the name/config/split and that you are online "
            "(or unset HF_DATASETS_OFFLINE), or download the text and give the files"
        ) from None
    if first is None:
        return
    field = opts["text_field"]
    if field not in first:
        raise CramkitError(
            f"dataset {spec} has no field {field!r} (has: {', '.join(first)}); name it with --text-field"
        )

    def records():
        yield first
        yield from it

    doc_split = opts["doc_split"]
    if doc_split == "wikitext" or (doc_split == "auto" and "wikitext" in name):
        # wikitext-style datasets hold one line per record
        yield from _join_groups((str(r[field]).rstrip("\n") for r in records()), None, spec)
    else:
        for r in records():
            if isinstance(r[field], str):
                yield r[field]


# ---------------------------------------------------------------------------------- built-in corpus

_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idle_test",
    "__pycache__",
    "turtledemo",
    "ensurepip",
}


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if any(part in _SKIP_DIRS or part.startswith((".", "config-")) for part in rel.parts):
            continue
        files.append(p)
    return files


def _module_docs(path: Path) -> str:
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError, OSError):
        return ""
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) >= 40:
                docs.append(doc)
    return "\n\n".join(docs)


def builtin_documents() -> Iterator[str]:
    """The built-in corpus: docstrings of this interpreter's standard library, one document per module.

    Read with ``ast`` from the stdlib sources (nothing is imported), in sorted path order; about 1.6 MB
    on CPython 3.11. The gathered text is cached under ~/.cache/cramkit (CRAMKIT_CACHE) keyed by the
    interpreter version and the files' sizes and times, so later runs start at once.
    """
    files = _stdlib_files()
    if not files:
        raise CramkitError(
            f"found no standard-library sources under {sysconfig.get_paths()['stdlib']} for the built-in "
            "corpus; give text files as SOURCE instead"
        )
    key = hashlib.sha256(sys.version.encode())
    for p in files:
        st = p.stat()
        key.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    cache_dir = Path(os.environ.get("CRAMKIT_CACHE", Path.home() / ".cache" / "cramkit"))
    cache = cache_dir / f"stdlib-docs-{key.hexdigest()[:16]}.jsonl"
    if cache.is_file():
        try:
            with open(cache, encoding="utf-8") as fh:
                docs = [json_loads(line) for line in fh]
            yield from docs
            return
        except (OSError, ValueError):
            pass
    docs = [d for d in (_module_docs(p) for p in files) if d]
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as fh:
            for d in docs:
                fh.write(json.dumps(d) + "\n")
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home: no cache, same documents
    yield from docs
