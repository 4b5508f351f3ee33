"""What ``cramkit index build|query|info|add|neighbours|export`` and their functions (``cramkit.index.build_index``,
``query``, ``info``, ``add_to_index``, ``retro_neighbours``, ``export_index``) take, declared once
(:mod:`cramkit.request`): one request per sub-verb."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from pathlib import Path

from cramkit.embeddings import BLOCK
from cramkit.errors import CramkitError
from cramkit.index import OVERLAP, PASSAGE_TOKENS, RETRO_CHUNK
from cramkit.infer.options import Passes
from cramkit.model.pooling import POOLINGS
from cramkit.request import param
from cramkit.text.reading import Documents, Reading

IDX = "IDX"
TARGETS = ("parquet", "lancedb", "milvus")  # where `index export` writes
DB_INDEXES = ("auto", "flat", "hnsw")  # the vector indexes it asks a database for
PARTIAL = "__cramkit_partial"  # the end of the name a table or collection has while it is written
STORE_TOKENIZER = "the token store's tokenizer, when not the encoder's"
PROGRESS = "a progress bar: True, False or 'auto' (on a terminal)"


@dataclass
class BuildRequest(Reading, Documents, Passes):
    """A corpus chunked, embedded and indexed into a directory."""

    source: str | os.PathLike | None = param(
        positional=True,
        nargs="?",
        metavar="SOURCE_OR_STORE",
        help="text files, a directory, a glob, a token store, or a folder of Parquet embeddings (cramkit embed "
        "--format parquet: indexed as they are); none: the built-in corpus",
    )
    encoder: str | os.PathLike = param(required=True, metavar="MODEL", help="a run, model directory or hf:DIR")
    out: str | os.PathLike = param(required=True, metavar="IDX", help="the index directory to write")
    _: KW_ONLY
    mode: str = param(
        "passages",
        choices=("passages", "retro"),
        help="passages (search) or retro (64-token chunks of a token store)",
    )
    chunk_tokens: int | None = param(
        None, help=f"tokens per chunk (default: {PASSAGE_TOKENS} for passages, {RETRO_CHUNK} for retro)"
    )
    overlap: int | None = param(None, help=f"tokens shared by consecutive passages (default {OVERLAP})")
    memory: str | int = param("4GB", help="RAM budget for the index")
    target_recall: float = param(0.95, help="recall@10 against exact search to tune for")
    kind: str = param(
        "auto",
        choices=("auto", "flat", "hnsw", "ivfsq8", "ivfpq"),
        help="index type (default: chosen from the count and --memory)",
    )
    pooling: str | None = param(None, choices=POOLINGS, help="default: the encoder's")
    dimensions: int | None = param(
        None,
        metavar="N",
        help="index each vector's first N dimensions, renormalised: one of a Matryoshka encoder's (smaller index, "
        "faster search); queries are cut the same way. Recorded in index.json",
    )
    prompt_name: str | None = param(
        None,
        metavar="NAME",
        help="the encoder's named prompt the chunks get (default: its prompt named document, passage or corpus, "
        "else its default prompt); queries get its prompt named query (else the default). Recorded in index.json",
    )
    on_disk: bool | None = param(None, help="True: the IVF lists kept on disk; None: when the RAM index would not fit")
    workers: int = param(1, metavar="N", help="on disk: processes filling the parts at once")
    shard: str | None = param(
        None,
        metavar="i/N",
        help="on disk: fill only shard i of N's parts (runs on several machines sharing --out); the last to "
        "finish merges them",
    )
    store_tokenizer: str | None = param(None, help=STORE_TOKENIZER)
    overwrite: bool = param(False, help="replace an index already at --out")
    block: int = param(BLOCK, help="chunks embedded between progress commits")
    progress: bool | str = param("auto", command_line=False, help=PROGRESS)

    def check(self) -> tuple[int, tuple[int, int]]:
        """One line for an option out of range or options that do not go together, before any work; (the memory
        budget in bytes, (shard i, of N))."""
        from cramkit.index import ann
        from cramkit.runtime import parse_shard

        if not 0.0 < self.target_recall <= 1.0:
            raise CramkitError(f"--target-recall must be in (0, 1], got {self.target_recall}")
        budget = ann.parse_memory(self.memory)
        if self.kind not in ann.KINDS:
            raise CramkitError(f"unknown --kind {self.kind!r}; use one of {', '.join(ann.KINDS)}")
        if not isinstance(self.workers, int) or self.workers < 1:
            raise CramkitError(f"--workers must be a positive integer, got {self.workers!r}")
        shard_of = parse_shard(self.shard)
        if self.on_disk and self.kind in ("flat", "hnsw"):
            ann.plan_index(1, 1, budget, self.kind, on_disk=True)  # its one-line refusal, before any work
        if self.on_disk is not None and not self.on_disk and (self.shard is not None or self.workers > 1):
            raise CramkitError("--shard and --workers fill the parts of an on-disk index; drop them or build --on-disk")
        return budget, shard_of


@dataclass
class QueryRequest:
    """Texts searched in an index."""

    path: str | os.PathLike = param(positional=True, metavar=IDX, help="the index directory")
    texts: list[str] = param(positional=True, nargs="+", metavar="TEXT", help="the queries")
    _: KW_ONLY
    k: int = param(10, flags=("-k",), help="results per query")
    encoder: str | None = param(None, help="the encoder (default: the index's own copy); must match")
    device: str = param("cpu", help="cpu (default), cuda, cuda:N or auto")


@dataclass
class InfoRequest:
    """An index described."""

    path: str | os.PathLike = param(positional=True, metavar=IDX, help="the index directory")


@dataclass
class AddRequest(Reading, Passes):
    """More text (or another token store) chunked, embedded and added to an index."""

    path: str | os.PathLike = param(positional=True, metavar=IDX, help="the index directory")
    source: str | os.PathLike | None = param(
        positional=True, metavar="SOURCE_OR_STORE", help="text files, a directory, a glob or a token store"
    )
    _: KW_ONLY
    store_tokenizer: str | None = param(None, help=STORE_TOKENIZER)
    block: int = param(BLOCK, help="chunks embedded between progress commits")
    progress: bool | str = param("auto", command_line=False, help=PROGRESS)


@dataclass
class NeighboursRequest(Passes):
    """RETRO neighbours of every chunk of a token store, from a retro index."""

    path: str | os.PathLike = param(positional=True, metavar=IDX, help="the index directory")
    store: str | os.PathLike = param(required=True, help="the token store whose 64-token chunks get neighbours")
    out: str | os.PathLike = param(required=True, metavar="DIR", help="directory for neighbours.npy")
    _: KW_ONLY
    k: int = param(2, flags=("-k",), help="neighbours per chunk")
    store_tokenizer: str | None = param(None, help=STORE_TOKENIZER)
    # also the chunks searched between commits (a rerun resumes after the last)
    block: int = param(BLOCK, help="chunks embedded between progress commits")
    progress: bool | str = param("auto", command_line=False, help=PROGRESS)


@dataclass
class ExportRequest:
    """An index's chunks copied into Parquet, LanceDB or Milvus."""

    index: str | os.PathLike = param(positional=True, metavar=IDX, help="the index directory")
    to: str = param(required=True, metavar="TARGET", help="parquet, lancedb or milvus")
    uri: str = param(
        required=True,
        help="parquet: FILE.parquet or a directory; lancedb: a directory or s3://BUCKET/PATH; milvus: "
        "http://HOST:19530 or a Milvus Lite file NAME.db",
    )
    _: KW_ONLY
    name: str | None = param(None, help="the table or collection (default: the index directory's name)")
    overwrite: bool = param(False, help="replace a file, table or collection already there")
    db_index: str = param(
        "auto", help="the database's vector index: flat (exact), hnsw; auto: flat for an exact index, else hnsw"
    )
    rows_per_batch: int | None = param(
        None,
        flags=("--batch-rows",),
        metavar="N",
        help="rows per insert / record batch / Parquet row group (default: sized by bytes per system)",
    )
    log: Callable[[str], None] | None = param(None, command_line=False, help="where progress lines go")

    def check(self) -> None:
        """One line for a target, a URI, a batch size or a vector index cramkit does not take, before any work."""
        if self.to not in TARGETS:
            raise CramkitError(f"--to {self.to!r} is not a target cramkit exports to; use one of {', '.join(TARGETS)}")
        if not self.uri:
            raise CramkitError("--uri is empty; give where to write (a file, a directory, or the database's URI)")
        if self.rows_per_batch is not None and self.rows_per_batch < 1:
            raise CramkitError(f"--batch-rows must be a positive integer, got {self.rows_per_batch}")
        if self.db_index not in DB_INDEXES:
            raise CramkitError(f"--db-index {self.db_index!r}: use one of {', '.join(DB_INDEXES)}")

    def table(self) -> str:
        """The table or collection written: ``name``, checked, or one made from the index directory's name
        (letters, digits and underscores, starting with a letter or underscore: what Milvus and LanceDB take)."""
        if not self.name:
            base = re.sub(r"[^A-Za-z0-9_]", "_", Path(self.index).resolve().name) or "index"
            return base if re.match(r"[A-Za-z_]", base) else f"idx_{base}"
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,254}", self.name) or self.name.endswith(PARTIAL):
            raise CramkitError(
                f"--name {self.name!r}: use letters, digits and underscores, starting with a letter or underscore "
                f"(and not ending in {PARTIAL})"
            )
        return self.name
