"""Chunks of a corpus and their metadata, kept in memory-mapped arrays so search results come back as text.

Three sources:

* raw text (``cramkit.text.sources``): each document is tokenised with the encoder's tokenizer and cut into
  passages of ``chunk_tokens`` word pieces, consecutive passages sharing ``overlap`` of them; a passage's text
  is the document's characters from its first to its last piece.
* a token store (``cramkit.data.tokenstore``): each sequence is cut into chunks of ``chunk_tokens`` store
  tokens (RETRO: 64, no overlap, the last chunk of a sequence shorter), decoded to text with the store's
  tokenizer. In RETRO mode a chunk's continuation is the next chunk of the same sequence.
* Parquet embeddings (``cramkit embed --format parquet``): each row is a chunk of its own, with its vector.

On disk (a directory, all ``.npy`` written with ``np.lib.format.open_memmap`` and read with
``np.load(mmap_mode="r")``, never pickled):

``chunks.npy``        int64 [n, 7]: document, sequence, token start, token end, source, char start, char end
``text_offsets.npy``  int64 [n + 1]: byte offsets of each chunk's UTF-8 text in ``texts.bin``
``texts.bin``         the chunk texts back to back
``doc_hash.npy``      uint64 [documents]: a hash of each document's tokens (RETRO leak checks), token stores only
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.data.tokenstore import is_store
from cramkit.embeddings.parquet import iter_parts, part_vectors, read_manifest
from cramkit.embeddings.store_text import decode_spans, store_chunk_spans, store_documents, store_tokenizer
from cramkit.errors import CramkitError
from cramkit.index import OVERLAP, PASSAGE_TOKENS, RETRO_CHUNK
from cramkit.index.manifest import MODES
from cramkit.io import atomic_path, open_memmap
from cramkit.text.tokenizer import encode_batch

COLUMNS = ("doc", "seq", "tok_start", "tok_end", "source", "char_start", "char_end")


@dataclass
class Chunks:
    """Chunks in memory, before they are written: texts plus one ``COLUMNS`` row each."""

    texts: list[str] = field(default_factory=list)
    rows: list[tuple[int, ...]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    doc_hash: list[int] = field(default_factory=list)
    num_docs: int = 0
    truncated_docs: int = 0

    def __len__(self) -> int:
        return len(self.texts)


def _check_sizes(chunk_tokens: int, overlap: int, max_tokens: int | None) -> None:
    if chunk_tokens < 1:
        raise CramkitError(f"--chunk-tokens must be positive, got {chunk_tokens}")
    if not 0 <= overlap < chunk_tokens:
        raise CramkitError(f"--overlap must be in [0, --chunk-tokens), got {overlap} with {chunk_tokens}")
    if max_tokens is not None and chunk_tokens > max_tokens:
        raise CramkitError(
            f"--chunk-tokens {chunk_tokens} exceeds the encoder's limit of {max_tokens} word pieces per input "
            f"({max_tokens + 2} with [CLS]/[SEP]); use --chunk-tokens {max_tokens} or less"
        )


def _windows(n: int, size: int, overlap: int) -> Iterator[tuple[int, int]]:
    step = size - overlap
    start = 0
    while True:
        end = min(start + size, n)
        yield start, end
        if end >= n:
            return
        start += step


def chunk_text_sources(
    sources: Sequence[str] | None,
    tokenizer: Any,
    *,
    chunk_tokens: int = PASSAGE_TOKENS,
    overlap: int = OVERLAP,
    max_tokens: int | None = None,
    **reading: Any,
) -> Chunks:
    """Passages of ``chunk_tokens`` word pieces (``overlap`` shared) from files, directories or globs
    (None: the built-in corpus); the source of each passage is the file it came from. ``reading``: how the
    files are read (doc_split, encoding, errors, text_field: see ``cramkit.text.iter_documents``)."""
    from cramkit.text.sources import expand_sources, iter_documents

    _check_sizes(chunk_tokens, overlap, max_tokens)
    out = Chunks()
    files = expand_sources(list(sources)) if sources else [None]
    for src_id, file in enumerate(files):
        out.sources.append(file if file is not None else "builtin")
        batch: list[str] = []
        docs = iter_documents([file] if file is not None else None, **reading)
        for doc in docs:
            batch.append(doc)
            if len(batch) >= 256:
                _add_passages(out, batch, src_id, tokenizer, chunk_tokens, overlap)
                batch = []
        if batch:
            _add_passages(out, batch, src_id, tokenizer, chunk_tokens, overlap)
    return out


def _add_passages(out: Chunks, docs: list[str], src_id: int, tokenizer: Any, size: int, overlap: int) -> None:
    for doc, enc in zip(docs, encode_batch(tokenizer, docs, add_special_tokens=False), strict=True):
        offsets = enc.offsets
        if not offsets:
            continue
        d = out.num_docs
        out.num_docs += 1
        for s, e in _windows(len(offsets), size, overlap):
            c0, c1 = offsets[s][0], offsets[e - 1][1]
            out.texts.append(doc[c0:c1])
            out.rows.append((d, d, s, e, src_id, c0, c1))


def document_hashes(store: Any, seq_doc: np.ndarray) -> np.ndarray:
    """uint64 per document: a hash of its token ids (same document in two stores -> same hash)."""
    n_docs = int(seq_doc.max()) + 1 if len(seq_doc) else 0
    hashers = [hashlib.blake2b(digest_size=8) for _ in range(n_docs)]
    for s in range(len(store)):
        hashers[seq_doc[s]].update(np.ascontiguousarray(store[s], dtype="<i4").tobytes())
    return np.array([int.from_bytes(h.digest(), "little") for h in hashers], dtype=np.uint64)


def chunk_store(store: Any, tokenizer: Any, *, chunk_tokens: int = RETRO_CHUNK) -> Chunks:
    """Chunks of ``chunk_tokens`` store tokens (no overlap) decoded to text, with document hashes."""
    _check_sizes(chunk_tokens, 0, None)
    spans = store_chunk_spans(store, chunk_tokens)
    seq_doc = store_documents(store)
    out = Chunks(sources=[str(store.prefix)])
    out.num_docs = int(seq_doc.max()) + 1 if len(seq_doc) else 0
    out.doc_hash = document_hashes(store, seq_doc).tolist()
    out.texts = list(decode_spans(store, tokenizer, spans))
    out.rows = [(int(seq_doc[s]), int(s), int(a), int(b), 0, -1, -1) for s, a, b in spans]
    return out


def chunks_from_parquet(
    folder: str | os.PathLike, fingerprint: str, vectors_path: Path
) -> tuple[Chunks, dict[str, Any]]:
    """The rows of a Parquet embedding folder as index chunks (one document per ``doc``, ``source`` kept), and
    their vectors, L2-normalised, written to ``vectors_path`` (a new ``.npy``); (chunks, the manifest).
    The folder must have been embedded by the encoder of ``fingerprint``."""
    folder = Path(folder)
    m = read_manifest(folder)
    if m["encoder"]["fingerprint"] != fingerprint:
        raise CramkitError(
            f"{folder} was embedded by another encoder (fingerprint {m['encoder']['fingerprint']}, --encoder's "
            f"{fingerprint}); index it with the encoder that embedded it ({m['encoder'].get('source')}): queries are "
            "embedded with the index's encoder"
        )
    vectors_path.parent.mkdir(parents=True, exist_ok=True)
    mm = open_memmap(vectors_path, np.float32, (int(m["rows"]), int(m["dim"])))
    chunks = Chunks()
    source_ids: dict[str, int] = {}
    docs: set[int] = set()
    at = 0
    for path, t in iter_parts(folder):  # (read_manifest checked each part's rows and columns)
        n = t.num_rows
        if at + n > len(mm):
            raise CramkitError(f"{folder}: the parts hold more rows than its manifest's {len(mm)}; join it again")
        vec = part_vectors(path, t, int(m["dim"]))
        norm = np.linalg.norm(vec, axis=1, keepdims=True)
        mm[at : at + n] = vec / np.maximum(norm, 1e-12)
        texts = [x if x is not None else "" for x in t.column("text").to_pylist()]
        for text, doc, src in zip(texts, t.column("doc").to_pylist(), t.column("source").to_pylist(), strict=True):
            s = source_ids.setdefault(str(src), len(source_ids))
            d = int(doc) if doc is not None else at
            docs.add(d)
            chunks.rows.append((d, d, 0, 0, s, 0, len(text)))
        chunks.texts += texts
        at += n
    mm.flush()
    del mm
    if at != int(m["rows"]):
        raise CramkitError(f"{folder}: the parts hold {at} rows, its manifest {m['rows']}; join it again")
    chunks.sources = list(source_ids)
    chunks.num_docs = len(docs)
    return chunks, m


def make_chunks(
    source: str | None,
    loaded: Any,
    *,
    mode: str,
    chunk_tokens: int | None,
    overlap: int | None,
    reading: dict[str, Any] | None = None,
    tokenizer: str | None = None,
    reserve: int = 0,
) -> tuple[Chunks, dict[str, Any]]:
    """The chunks of ``source`` (text files or a token store) and the parameters used; ``reading``: how
    text files are read (keyword arguments of ``cramkit.text.iter_documents``: doc_split, encoding, ...);
    ``reserve``: tokens of the length limit kept for a prompt put before each chunk."""
    if mode not in MODES:
        raise CramkitError(f"unknown --mode {mode!r}; use passages or retro")
    limit = int(loaded.max_length) - 2 - reserve
    if source is not None and is_store(source):
        from cramkit.data.tokenstore import TokenStore

        if overlap:
            raise CramkitError("--overlap applies to text sources; a token store is cut without overlap")
        store = TokenStore(source)
        size = chunk_tokens or RETRO_CHUNK
        chunks = chunk_store(store, store_tokenizer(store, loaded.tokenizer, tokenizer), chunk_tokens=size)
        params = {"chunk_tokens": size, "overlap": 0, "store": True}
    else:
        if mode == "retro":
            raise CramkitError(
                f"--mode retro needs a token store (cramkit data build), not text files: {source or 'builtin'}"
            )
        size = chunk_tokens or min(PASSAGE_TOKENS, limit)
        ov = OVERLAP if overlap is None else overlap
        ov = min(ov, size - 1) if overlap is None else ov
        chunks = chunk_text_sources(
            [source] if source else None,
            loaded.tokenizer,
            chunk_tokens=size,
            overlap=ov,
            max_tokens=limit,
            **(reading or {}),
        )
        doc_split = (reading or {}).get("doc_split", "auto")
        params = {"chunk_tokens": size, "overlap": ov, "doc_split": doc_split, "store": False}
    if len(chunks) == 0:
        raise CramkitError(f"{source or 'the built-in corpus'}: no text to index (0 chunks); check the source")
    return chunks, params


def prompt_tokens(tokenizer: Any, prompt: str) -> int:
    """How many tokens ``prompt`` takes before a text (the room a chunk leaves it under the length limit)."""
    return len(tokenizer.encode(prompt, add_special_tokens=False).ids) if prompt else 0


# ------------------------------------------------------------------------------------------ on disk


def save_npy(path: str | os.PathLike, array: np.ndarray) -> None:
    """``array`` saved as ``path`` (.npy), complete whenever that name exists (a temporary name, then a rename):
    a kill or a full disk never leaves a truncated file under it. A full disk is an OSError naming itself (numpy
    writing to a file says only "N requested and M written")."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(array), allow_pickle=False)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(buf.getbuffer())
        fh.flush()
        os.fsync(fh.fileno())


def write_chunks(directory: str | os.PathLike, chunks: Chunks) -> None:
    """Write ``chunks`` into ``directory`` (see the module docstring for the files)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    n = len(chunks)
    table = open_memmap(d / "chunks.npy", np.int64, (n, len(COLUMNS)))
    if n:
        table[:] = np.asarray(chunks.rows, dtype=np.int64)
    table.flush()
    del table
    offsets = np.zeros(n + 1, dtype=np.int64)
    with open(d / "texts.bin", "wb") as fh:
        pos = 0
        for i, t in enumerate(chunks.texts):
            b = t.encode("utf-8", "surrogatepass")
            fh.write(b)
            pos += len(b)
            offsets[i + 1] = pos
    save_npy(d / "text_offsets.npy", offsets)
    save_npy(d / "doc_hash.npy", np.asarray(chunks.doc_hash, dtype=np.uint64))


def append_chunks(
    directory: str | os.PathLike, old: ChunkTable, chunks: Chunks, doc_base: int, source_base: int
) -> None:
    """Write ``old`` followed by ``chunks`` (documents and sources renumbered after the old ones)."""
    rows = []
    for d, s, a, b, src, c0, c1 in chunks.rows:
        rows.append((d + doc_base, s + doc_base if c0 >= 0 else s, a, b, src + source_base, c0, c1))
    new = Chunks(
        texts=[old.text(i) for i in range(len(old))] + chunks.texts,
        rows=[tuple(r) for r in np.asarray(old.table).tolist()] + rows,
        doc_hash=np.asarray(old.doc_hash).tolist() + list(chunks.doc_hash),
    )
    write_chunks(directory, new)


class ChunkTable:
    """The chunk files of an index, memory-mapped; ``text(i)`` and ``row(i)`` read one chunk."""

    def __init__(self, directory: str | os.PathLike) -> None:
        d = Path(directory)
        try:
            self.table = np.load(d / "chunks.npy", mmap_mode="r", allow_pickle=False)
            self.offsets = np.load(d / "text_offsets.npy", mmap_mode="r", allow_pickle=False)
            self.doc_hash = np.load(d / "doc_hash.npy", mmap_mode="r", allow_pickle=False)
            size = (d / "texts.bin").stat().st_size
        except (OSError, ValueError, EOFError) as exc:
            raise CramkitError(f"{d}: the chunk files are missing or damaged ({exc}); rebuild the index") from None
        n = len(self.table)
        if (
            self.table.ndim != 2
            or self.table.shape[1] != len(COLUMNS)
            or self.offsets.shape != (n + 1,)
            or (n and int(self.offsets[-1]) != size)
            or (n and (int(self.offsets[0]) != 0 or bool(np.any(np.diff(self.offsets) < 0))))
        ):
            raise CramkitError(f"{d}: the chunk files do not agree with each other; rebuild the index")
        self.texts = np.memmap(d / "texts.bin", dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self.table)

    def text(self, i: int) -> str:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return bytes(self.texts[a:b]).decode("utf-8", "replace")

    def row(self, i: int) -> dict[str, int]:
        return dict(zip(COLUMNS, (int(x) for x in self.table[i]), strict=True))
