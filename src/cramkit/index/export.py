"""Out of a cramkit index into the systems users keep vectors in: Parquet files, LanceDB, Milvus.

Every target receives the same rows, one per chunk::

    id      int64                       the chunk id (what ``cramkit index query`` reports as ``chunk``)
    vector  fixed_size_list<float32>[d] the stored float32 vector (L2-normalised), never a compressed code
    text    string                      the chunk's text
    doc     int64                       the document id
    source  string                      the file (or token store) the document came from

The vectors are the originals the index keeps in ``vectors.npy`` beside its Faiss file: an IVF-PQ index's
codes are lossy, but cramkit re-scores its candidates from these vectors and so always keeps them; an
export therefore never carries quantisation error. The metric is the index's own: inner product on
normalised vectors (cosine), written into the target as ``IP`` (Milvus), ``dot`` (LanceDB) or the
``cramkit`` metadata of the Parquet schema.

``--overwrite`` replaces only an earlier export of this command's, never a user's own data: a Parquet file (or a
directory of ``part-NNNNN.parquet`` files) whose schema carries the ``cramkit`` metadata, a LanceDB table whose
schema carries it, a Milvus collection of exactly these fields; anything else of the name is one line, kept.

Nothing half-written ever looks finished:

- Parquet: written under a temporary sibling name and renamed onto ``URI`` once complete.
- LanceDB: the table is created with all its rows in one commit (``create_table`` from a stream of record
  batches); a killed export commits nothing. LanceDB OSS cannot rename a table, so ``--overwrite`` writes
  the new rows as a new version of the same table, also in one commit.
- Milvus: rows go into ``NAME__cramkit_partial``; only when all are in, flushed and indexed is it renamed
  ``NAME`` (with ``--overwrite`` the old ``NAME`` is dropped just before). A killed export leaves that
  partial collection, which the next export to ``NAME`` drops first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.embeddings.parquet import COLUMNS  # the columns of `cramkit embed --format parquet`
from cramkit.errors import CramkitError
from cramkit.index import ann
from cramkit.index.request import PARTIAL, ExportRequest
from cramkit.index.search import Index
from cramkit.io import atomic_path, disk_errors, disk_problem
from cramkit.request import verb

# Milvus: one insert call is capped at 64 MiB by its gRPC limit; its maintainers advise batches of 20-40 MB
MILVUS_BATCH_BYTES = 32 << 20
MILVUS_VARCHAR_MAX = 65_535
# Parquet row groups of about 64 MiB; files of at most 1M rows in a directory export (Milvus's bulk import
# and LanceDB/DuckDB read a directory of such files)
PARQUET_GROUP_BYTES = 64 << 20
PARQUET_FILE_ROWS = 1 << 20
# LanceDB: record batches of about 32 MiB streamed into one create_table commit
LANCE_BATCH_BYTES = 32 << 20

Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _need(module: str, install: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise CramkitError(
            f"--to needs the Python package {module}, which is not installed: pip install {install}"
        ) from None


def row_bytes(idx: Index) -> float:
    """The mean bytes of one exported row: vector, text, ids and source."""
    n = max(len(idx), 1)
    text = float(idx.chunks.offsets[-1]) / n if len(idx) else 0.0
    return idx.manifest["dim"] * 4 + text + 16 + 32


def batch_rows(idx: Index, target_bytes: int, most: int = 1 << 20) -> int:
    return int(max(1, min(most, target_bytes // max(row_bytes(idx), 1.0))))


def arrow_schema(dim: int, metadata: dict[str, Any] | None = None) -> Any:
    """The Arrow schema of an export: ``id, vector, text, doc, source`` (issue #31's columns for embeddings)."""
    import pyarrow as pa

    fields = [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("vector", pa.list_(pa.float32(), dim), nullable=False),
        pa.field("text", pa.string()),
        pa.field("doc", pa.int64()),
        pa.field("source", pa.string()),
    ]
    meta = {b"cramkit": json.dumps(metadata).encode()} if metadata else None
    return pa.schema(fields, metadata=meta)


def describe(idx: Index) -> dict[str, Any]:
    """What a target records beside the rows: the metric, the encoder, the source index."""
    m = idx.manifest
    return {
        "metric": "ip",  # every cramkit index: inner product of L2-normalised vectors (= cosine)
        "normalized": True,
        "dim": int(m["dim"]),
        "count": int(m["count"]),
        "encoder": str(m["encoder"].get("source")),
        "encoder_fingerprint": m["encoder"].get("fingerprint"),
        "pooling": m["encoder"].get("pooling"),
        # how a query must be embedded to match the rows: cut to these leading dimensions, after this prompt
        "dimensions_cut": m["encoder"].get("dimensions"),
        "query_prompt": idx.prompt("queries"),
        "index_kind": m["plan"]["kind"],
        "mode": m["mode"],
    }


def iter_batches(idx: Index, rows: int, start: int = 0, stop: int | None = None) -> Iterator[Any]:
    """Arrow record batches of ``rows`` rows of the index (ids ``start:stop``), read from its memory maps."""
    import pyarrow as pa

    from cramkit.index.chunking import COLUMNS as CHUNK_COLUMNS

    stop = len(idx) if stop is None else stop
    dim = int(idx.manifest["dim"])
    schema = arrow_schema(dim)
    sources = np.asarray([str(s) for s in (idx.manifest.get("sources") or [])] + [""], dtype=object)
    doc_col, src_col = CHUNK_COLUMNS.index("doc"), CHUNK_COLUMNS.index("source")
    for a in range(start, stop, rows):
        b = min(a + rows, stop)
        vec = np.ascontiguousarray(idx.vectors[a:b], dtype=np.float32)
        off = np.asarray(idx.chunks.offsets[a : b + 1], dtype=np.int64)
        data = bytes(idx.chunks.texts[int(off[0]) : int(off[-1])]) if off[-1] > off[0] else b""
        if len(data) >= 1 << 31:
            raise CramkitError(f"{idx.path}: chunks {a}-{b} hold over 2 GiB of text; export with fewer --batch-rows")
        text = pa.StringArray.from_buffers(b - a, pa.py_buffer((off - off[0]).astype(np.int32)), pa.py_buffer(data))
        try:
            text.validate(full=True)
        except pa.ArrowInvalid:  # not UTF-8 (a damaged texts.bin): the same replacement a search hit uses
            text = pa.array([idx.chunks.text(i) for i in range(a, b)], pa.string())
        table = np.asarray(idx.chunks.table[a:b], dtype=np.int64)
        src = table[:, src_col]
        src = np.where((src >= 0) & (src < len(sources) - 1), src, len(sources) - 1)
        yield pa.record_batch(
            [
                pa.array(np.arange(a, b, dtype=np.int64)),
                pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), dim),
                text,
                pa.array(table[:, doc_col]),
                pa.array(sources[src].tolist(), pa.string()),
            ],
            schema=schema,
        )


def _db_index(idx: Index, db_index: str) -> str:
    if db_index != "auto":
        return db_index
    return "flat" if idx.plan["kind"] == "flat" else "hnsw"


@verb(ExportRequest)
def export_index(request: ExportRequest) -> dict[str, Any]:
    """Export the index at ``index`` to ``to`` (parquet, lancedb, milvus) at ``uri`` (a file or directory;
    a LanceDB directory or ``s3://...``; a Milvus ``http://host:19530`` or a Milvus Lite file ``x.db``),
    as table/collection ``name`` (default: from the index directory's name). Returns what was done:
    ``{to, uri, name, rows, dim, metric, seconds, vectors_per_s, batches, db_index}``. Takes an
    :class:`~cramkit.index.request.ExportRequest` or its fields."""
    request.check()
    with disk_errors(request.uri):  # a full disk: one line naming --uri, from Python as from the command line
        return _export(request)


def _export(r: ExportRequest) -> dict[str, Any]:
    """:func:`export_index`'s work, the request checked."""
    log = r.log or _log
    idx = Index(r.index)
    if len(idx) == 0:
        raise CramkitError(f"{r.index}: the index holds no chunks; nothing to export")
    if idx.plan["kind"] in ann.IVF_KINDS:
        log(
            f"{r.index}: the {idx.plan['kind']} index's codes are lossy; exporting the float32 vectors it keeps "
            "beside them (vectors.npy)"
        )
    t0 = time.perf_counter()
    if r.to == "parquet":
        _need("pyarrow", "'cramkit[parquet]'")
        info = _to_parquet(idx, r.uri, overwrite=r.overwrite, rows=r.rows_per_batch, log=log)
    else:
        to_db = _to_lancedb if r.to == "lancedb" else _to_milvus
        kind = _db_index(idx, r.db_index)
        info = to_db(idx, r.uri, r.table(), overwrite=r.overwrite, rows=r.rows_per_batch, kind=kind, log=log)
    dt = time.perf_counter() - t0
    return {
        "to": r.to,
        "uri": r.uri,
        "rows": len(idx),
        "dim": int(idx.manifest["dim"]),
        "metric": "ip",
        "seconds": round(dt, 3),
        "vectors_per_s": round(len(idx) / dt, 1) if dt > 0 else None,
        **info,
    }


# -------------------------------------------------------------------------------------------- Parquet


def _to_parquet(idx: Index, uri: str, *, overwrite: bool, rows: int | None, log: Log) -> dict[str, Any]:
    import pyarrow.parquet as pq

    if "://" in uri and not uri.startswith("file://"):
        raise CramkitError(
            f"--uri {uri}: Parquet is written to a local path (a file NAME.parquet or a directory); copy it to "
            "object storage afterwards, or export to LanceDB, which writes s3:// itself"
        )
    out = Path(uri.removeprefix("file://")).expanduser()
    if out.resolve() == idx.path.resolve() or idx.path.resolve() in out.resolve().parents:
        raise CramkitError(f"--uri {uri} lies inside the index {idx.path}; write the export elsewhere")
    if out.resolve() == Path.cwd().resolve() or out.resolve() in Path.cwd().resolve().parents or not out.name:
        raise CramkitError(
            f"--uri {uri} is the current directory or holds it; give a new file NAME.parquet or a new directory"
        )
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise CramkitError(f"--uri {uri} exists; pass --overwrite to replace it, or choose another --uri")
        _check_parquet_target(out, uri)
    group = rows or batch_rows(idx, PARQUET_GROUP_BYTES)
    schema = arrow_schema(int(idx.manifest["dim"]), describe(idx))
    single = out.suffix == ".parquet"
    files: list[str] = []
    with atomic_path(out) as tmp:
        if not single:
            tmp.mkdir(parents=True)
        for part, a in enumerate(range(0, len(idx), len(idx) if single else PARQUET_FILE_ROWS)):
            b = len(idx) if single else min(a + PARQUET_FILE_ROWS, len(idx))
            path = tmp if single else tmp / f"part-{part:05d}.parquet"
            with pq.ParquetWriter(str(path), schema, compression="zstd") as w:
                for batch in iter_batches(idx, group, a, b):
                    w.write_batch(batch, row_group_size=group)
            files.append(out.name if single else f"{out.name}/{path.name}")
    log(f"wrote {len(idx)} rows in {len(files)} Parquet file(s), row groups of {group} rows")
    return {"name": str(out), "files": files, "row_group_rows": group, "db_index": None}


def _exported_here(path: Path) -> bool:
    """Whether ``path`` is a Parquet file this command wrote: its schema carries cramkit's metadata."""
    import pyarrow.parquet as pq

    if path.is_symlink() or not path.is_file():
        return False
    try:
        meta = pq.read_schema(str(path)).metadata or {}
    except Exception:  # not Parquet, damaged, unreadable: not an export of cramkit's
        return False
    return b"cramkit" in meta


def _check_parquet_target(out: Path, uri: str) -> None:
    """``--overwrite`` replaces only an earlier export: a file NAME.parquet, or a directory of its part files,
    that this command wrote (:func:`_exported_here`); anything else is one line naming it, and kept."""
    if out.is_dir() and out.suffix == ".parquet":
        raise CramkitError(f"--uri {uri} is a directory; give a new file name (it is kept)")
    if not out.is_dir() and out.suffix != ".parquet":
        raise CramkitError(f"--uri {uri} is a file; a directory export needs a new name (the file is kept)")
    if not out.is_dir():
        if not _exported_here(out):
            raise CramkitError(
                f"--uri {uri} is a file `cramkit index export` did not write (no cramkit metadata in a Parquet "
                "schema); --overwrite replaces only an earlier export: choose another --uri (the file is kept)"
            )
        return
    for n, p in enumerate(sorted(out.iterdir())):
        if n >= 10_000 or not (re.fullmatch(r"part-\d{5,}\.parquet", p.name) and _exported_here(p)):
            raise CramkitError(
                f"--uri {uri} holds {p.name}, which `cramkit index export` did not write (it writes "
                "part-NNNNN.parquet files with cramkit metadata); --overwrite replaces only an earlier export: "
                "choose another --uri (nothing was changed)"
            )


# -------------------------------------------------------------------------------------------- LanceDB


def _lance_connect(uri: str) -> Any:
    lancedb = _need("lancedb", "'cramkit[lancedb]' (lancedb)")
    try:
        db = lancedb.connect(uri)
        _lance_tables(db)
    except Exception as exc:  # the object store or the directory refused: one line naming the fix
        raise CramkitError(f"--uri {uri}: LanceDB cannot open it ({_first_line(exc)}); {_lance_hint(uri)}") from None
    return db


def _lance_tables(db: Any) -> list[str]:
    import warnings

    with warnings.catch_warnings():  # table_names() is deprecated for list_tables(), whose answer is paged
        warnings.simplefilter("ignore", DeprecationWarning)
        return list(db.table_names(limit=2**31 - 1))


def _lance_hint(uri: str) -> str:
    if "://" in uri:
        return (
            "check the bucket, its endpoint and credentials (AWS_ENDPOINT, AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY, AWS_REGION) and that the store is reachable"
        )
    return "give a directory LanceDB can create or open"


def _first_line(exc: BaseException) -> str:
    message = getattr(exc, "message", None)  # pymilvus' exceptions: the server's own words
    text = (message if isinstance(message, str) and message.strip() else str(exc)).strip() or type(exc).__name__
    text = text.splitlines()[0]
    return text if len(text) <= 300 else text[:297] + "..."


def _to_lancedb(
    idx: Index, uri: str, name: str, *, overwrite: bool, rows: int | None, kind: str, log: Log
) -> dict[str, Any]:
    import pyarrow as pa

    if "://" not in uri:
        p = Path(uri).expanduser()
        if p.exists() and not p.is_dir():
            raise CramkitError(f"--uri {uri} is a file; LanceDB needs a directory (the file is kept)")
        if p.resolve() == idx.path.resolve() or idx.path.resolve() in p.resolve().parents:
            raise CramkitError(f"--uri {uri} lies inside the index {idx.path}; write the export elsewhere")
    db = _lance_connect(uri)
    exists = name in _lance_tables(db)
    if exists:
        try:
            old = db.open_table(name)
        except Exception:  # files without a committed version: what a killed or failed export leaves
            log(f"dropping LanceDB table {name!r}: files of an interrupted export, no committed version")
            db.drop_table(name)
            exists = False
    if exists and not overwrite:
        raise CramkitError(
            f"LanceDB table {name!r} exists at {uri}; pass --overwrite to replace it, or choose another --name"
        )
    if exists and b"cramkit" not in (old.schema.metadata or {}):
        raise CramkitError(
            f"LanceDB table {name!r} at {uri} is not an export of `cramkit index export` (no cramkit metadata in its "
            "schema); --overwrite replaces only an earlier export: choose another --name (the table is kept)"
        )
    n = batch_rows(idx, LANCE_BATCH_BYTES) if rows is None else rows
    schema = arrow_schema(int(idx.manifest["dim"]), describe(idx))
    failed: list[BaseException] = []

    def stream() -> Iterator[Any]:
        try:
            yield from iter_batches(idx, n)
        except BaseException as exc:  # seen by LanceDB's writer as a C-interface error: keep the original
            failed.append(exc)
            raise

    reader = pa.RecordBatchReader.from_batches(schema, stream())
    try:
        # one commit for every row: a killed export leaves no table version behind
        table = db.create_table(name, data=reader, schema=schema, mode="overwrite" if exists else "create")
    except Exception as exc:
        if failed and not isinstance(failed[0], (CramkitError, Exception)):
            raise failed[0] from None  # Ctrl-C
        why = str(failed[0]) if failed and isinstance(failed[0], CramkitError) else _first_line(exc)
        raise CramkitError(
            f"LanceDB table {name!r} at {uri} was not written ({why}); nothing was committed, and the next "
            "export drops the files written so far"
        ) from None
    built = None
    if kind == "hnsw":
        built = _lance_index(table, idx, log)
    log(f"LanceDB table {name!r}: {table.count_rows()} rows (version {table.version}), vector index {built or 'none'}")
    return {"name": name, "db_index": built or "flat (no vector index: exact search)", "batch_rows": n}


def _lance_index(table: Any, idx: Index, log: Log) -> str | None:
    n = len(idx)
    if n < 256:  # LanceDB trains its quantiser on a sample; too few rows to train
        log(f"LanceDB: {n} rows are too few for a vector index; searches are exact")
        return None
    parts = max(1, round(n / 1_000_000))  # one HNSW graph per ~1M rows
    t0 = time.perf_counter()
    table.create_index(
        metric="dot",
        vector_column_name="vector",
        index_type="IVF_HNSW_SQ",
        num_partitions=parts,
        m=ann.HNSW_M,
        ef_construction=200,
    )
    log(f"LanceDB: IVF_HNSW_SQ index ({parts} partition(s)) built in {time.perf_counter() - t0:.1f}s")
    return f"IVF_HNSW_SQ (dot, {parts} partitions)"


# --------------------------------------------------------------------------------------------- Milvus


# the loggers of the Milvus client and of Milvus Lite (which runs in this process): what they log while cramkit
# exports (a traceback for a file that is not a database, for a full disk) is kept from the terminal and read
# for the one line cramkit prints (:func:`_why`)
MILVUS_LOGGERS = ("pymilvus", "milvus_lite")


@contextlib.contextmanager
def _library_logs(*roots: str) -> Iterator[list[logging.LogRecord]]:
    """The records the loggers ``roots`` (and those under them with handlers of their own: pymilvus configures
    ``pymilvus.milvus_client``) emit while the block runs, collected instead of printed. Import the libraries
    first: pymilvus sets its loggers up when it is imported."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(logging.WARNING)
    below = tuple(r + "." for r in roots)
    names = [*roots, *(n for n in list(logging.Logger.manager.loggerDict) if n.startswith(below))]
    loggers = [logging.getLogger(n) for n in names]
    saved = [(logger, logger.handlers[:], logger.propagate) for logger in loggers]
    for logger in loggers:
        if logger.name in roots or logger.handlers:
            logger.handlers, logger.propagate = [keep], False
    try:
        yield records
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate


def _full(exc: BaseException, records: list[logging.LogRecord]) -> str | None:
    """A full disk (or quota, or read-only file system) behind a Milvus failure: in ``exc`` or in an exception
    the library logged (Milvus Lite's own, which pymilvus reports only as a message); None for any other."""
    logged = [r.exc_info[1] for r in records if r.exc_info and r.exc_info[1] is not None]
    return next((p for p in map(disk_problem, (exc, *logged)) if p is not None), None)


def _why(exc: BaseException, records: list[logging.LogRecord]) -> str:
    """Why a Milvus call failed, in a few words: a full disk when that is the cause, else the first line of
    the first exception Milvus Lite logged (the cause; pymilvus' own is a summary), else of ``exc``."""
    logged = [r.exc_info[1] for r in records if r.exc_info and r.exc_info[1] is not None]
    return _full(exc, records) or _first_line(logged[0] if logged else exc)


def _milvus_client(uri: str, records: list[logging.LogRecord]) -> Any:
    _need("pymilvus", "'cramkit[milvus]' (pymilvus; for a local file also milvus-lite)")
    from pymilvus import MilvusClient

    local = "://" not in uri
    if local:
        if not uri.endswith(".db"):
            raise CramkitError(
                f"--uri {uri}: a Milvus URI is http://HOST:19530 (a server or cluster) or a Milvus Lite file NAME.db"
            )
        _need("milvus_lite", "'pymilvus[milvus-lite]'")
        Path(uri).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
        uri = str(Path(uri).expanduser().resolve())
    token = os.environ.get("MILVUS_TOKEN", "")
    try:
        return MilvusClient(uri=uri, token=token, timeout=30)
    except Exception as exc:
        why = _why(exc, records)
        if _full(exc, records):
            raise CramkitError(
                f"--uri {uri}: Milvus cannot write there ({why}); free space there (or choose another --uri) and "
                "export again"
            ) from None
        if local and why != _first_line(exc):  # Milvus Lite logged why it cannot open the path
            raise CramkitError(
                f"--uri {uri}: Milvus Lite cannot open it as a database ({why}); give a Milvus Lite database or a "
                "new NAME.db (what is there is kept)"
            ) from None
        start = "check the file and that no other process holds it" if local else "start Milvus there"
        raise CramkitError(
            f"--uri {uri}: cannot connect to Milvus ({why}); {start}, or give the right URI "
            "(and MILVUS_TOKEN for a server that needs one)"
        ) from None


def _exported_collection(client: Any, name: str) -> bool:
    """Whether the Milvus collection ``name`` has the shape this command writes: the columns of
    :data:`COLUMNS`, in order (Milvus Lite keeps no collection description to carry cramkit's metadata)."""
    try:
        fields = [f.get("name") for f in client.describe_collection(name).get("fields") or []]
    except Exception:  # (pymilvus' errors, a reply of another shape): not one to replace
        return False
    return fields == list(COLUMNS)


def _to_milvus(
    idx: Index, uri: str, name: str, *, overwrite: bool, rows: int | None, kind: str, log: Log
) -> dict[str, Any]:
    _need("pymilvus", "'cramkit[milvus]' (pymilvus; for a local file also milvus-lite)")
    import pymilvus  # noqa: F401  (first: it configures its loggers when imported)

    with _library_logs(*MILVUS_LOGGERS) as records:
        return _to_milvus_quietly(idx, uri, name, records, overwrite=overwrite, rows=rows, kind=kind, log=log)


def _to_milvus_quietly(
    idx: Index,
    uri: str,
    name: str,
    records: list[logging.LogRecord],
    *,
    overwrite: bool,
    rows: int | None,
    kind: str,
    log: Log,
) -> dict[str, Any]:
    client = _milvus_client(uri, records)
    from pymilvus import DataType

    try:
        existing = set(client.list_collections())
        if name in existing and not overwrite:
            raise CramkitError(
                f"Milvus collection {name!r} exists at {uri}; pass --overwrite to replace it, or choose another --name"
            )
        if name in existing and not _exported_collection(client, name):
            raise CramkitError(
                f"Milvus collection {name!r} at {uri} is not an export of `cramkit index export` (its fields are "
                f"not {', '.join(COLUMNS)}); --overwrite replaces only an earlier export: choose another --name "
                "(the collection is kept)"
            )
        tmp = name + PARTIAL
        if tmp in existing:
            log(f"dropping {tmp!r}, left by an interrupted export")
            client.drop_collection(tmp)
        lengths = np.diff(np.asarray(idx.chunks.offsets, dtype=np.int64))
        longest = int(lengths.max()) if len(lengths) else 1
        if longest > MILVUS_VARCHAR_MAX:
            raise CramkitError(
                f"{idx.path}: chunk {int(lengths.argmax())} holds {longest} bytes of text, over Milvus's VARCHAR "
                f"limit of {MILVUS_VARCHAR_MAX}; rebuild the index with a smaller --chunk-tokens"
            )
        sources = [str(s) for s in (idx.manifest.get("sources") or [])] or [""]
        dim = int(idx.manifest["dim"])
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False, description=json.dumps(describe(idx)))
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        schema.add_field("text", DataType.VARCHAR, max_length=max(1, longest))
        schema.add_field("doc", DataType.INT64)
        schema.add_field("source", DataType.VARCHAR, max_length=max(1, *(len(s.encode()) for s in sources)))
        client.create_collection(tmp, schema=schema)
        n = batch_rows(idx, MILVUS_BATCH_BYTES, most=50_000) if rows is None else rows
        batches = 0
        for batch in iter_batches(idx, n):
            vec = batch.column(1).flatten().to_numpy().reshape(-1, dim)  # no Python float per number
            ids, text, doc, src = (batch.column(c).to_pylist() for c in ("id", "text", "doc", "source"))
            client.insert(
                tmp,
                [
                    {"id": i, "vector": v, "text": t, "doc": d, "source": s}
                    for i, v, t, d, s in zip(ids, vec, text, doc, src, strict=True)
                ],
            )
            batches += 1
        client.flush(tmp)
        params = client.prepare_index_params()
        if kind == "hnsw":
            params.add_index(
                field_name="vector",
                index_type="HNSW",
                metric_type="IP",
                params={"M": ann.HNSW_M, "efConstruction": 200},
            )
            built = f"HNSW (IP, M={ann.HNSW_M}, efConstruction=200)"
        else:
            params.add_index(field_name="vector", index_type="FLAT", metric_type="IP")
            built = "FLAT (IP, exact search)"
        client.create_index(tmp, params)
        got = int(client.get_collection_stats(tmp).get("row_count", -1))
        if got != len(idx):
            raise CramkitError(
                f"Milvus reports {got} rows in {tmp!r} after inserting {len(idx)}; the export is left as {tmp!r} "
                "(not renamed); rerun the export"
            )
        if name in existing:
            client.drop_collection(name)
        client.rename_collection(tmp, name)
        client.load_collection(name)
        log(f"Milvus collection {name!r}: {got} rows in {batches} insert(s) of <= {n} rows, index {built}, loaded")
        return {"name": name, "db_index": built, "batch_rows": n, "batches": batches}
    except CramkitError:
        raise
    except Exception as exc:
        if not type(exc).__module__.startswith("pymilvus") and disk_problem(exc) is None:
            raise
        why = _why(exc, records)
        if _full(exc, records):  # a full disk: what this export wrote is dropped at once, to give the space back
            with contextlib.suppress(Exception):
                client.drop_collection(name + PARTIAL)
            raise CramkitError(
                f"Milvus at {uri} could not store the export of {name!r}: {why}; free space there and export "
                f"again (what this export wrote, {name + PARTIAL!r}, is dropped now or by the next export)"
            ) from None
        raise CramkitError(
            f"Milvus at {uri} refused the export of {name!r}: {why}; what was written is left "
            f"in the collection {name + PARTIAL!r}, which the next export drops"
        ) from None
    finally:
        client.close()
