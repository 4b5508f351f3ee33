"""The token store: Megatron-LM's indexed-dataset format (``NAME.bin`` + ``NAME.idx``) plus ``NAME.json``.

``NAME.bin``: token ids back to back (uint16 when the vocabulary has fewer than 65500 entries, else int32).
``NAME.idx``, little-endian: ``MMIDIDX\\x00\\x00``, version ``<Q`` = 1, dtype code ``<B``, sequence
count ``<Q``, document-index count ``<Q``, then int32 sequence lengths, int64 byte pointers into .bin,
int64 document indices (0, then the running sequence count at each document end).
``NAME.json``: tokenizer hash, vocabulary size, special ids, sources and counts (cramkit's own).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

from cramkit.errors import CramkitError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document-index count
DTYPE_CODES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
CODE_OF = {np.dtype(v): k for k, v in DTYPE_CODES.items()}


def _with(prefix: Path, suffix: str) -> Path:
    return prefix.parent / (prefix.name + suffix)


def store_dtype(vocab_size: int) -> np.dtype:
    """uint16 for vocabularies under 65500 entries (Megatron's rule), else int32."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def resolve_prefix(path: str | os.PathLike, name: str | None = None) -> Path:
    """PREFIX (or PREFIX.bin/.idx/.json, or a directory holding one store) -> PREFIX without suffix."""
    p = Path(path)
    if p.is_dir():
        if name is not None:
            return p / name
        idx = sorted(p.glob("*.idx"))
        if len(idx) == 1:
            return p / idx[0].name[: -len(".idx")]
        if not idx:
            raise CramkitError(
                f"{path} holds no token store (NAME.idx + NAME.bin); build one with `cramkit data build`"
            )
        if (p / "train.idx").exists():
            return p / "train"
        names = ", ".join(i.name[:-4] for i in idx)
        raise CramkitError(f"{path} holds several stores ({names}); name one, e.g. {p / idx[0].name[:-4]}")
    if p.suffix in (".bin", ".idx", ".json") and not p.is_dir():
        p = p.with_suffix("")
    return p


class TokenStore:
    """A memory-mapped token store; ``store[i]`` is sequence i (one per document when cramkit built it)."""

    def __init__(self, path: str | os.PathLike, *, name: str | None = None):
        self.prefix = resolve_prefix(path, name)
        idx_path, bin_path = _with(self.prefix, ".idx"), _with(self.prefix, ".bin")
        for f in (idx_path, bin_path):
            if not f.is_file():
                raise CramkitError(
                    f"token store file {f} is missing; build the store with `cramkit data build`"
                )
        idx_size = idx_path.stat().st_size
        with open(idx_path, "rb") as fh:
            head = fh.read(HEADER.size)
        if len(head) < HEADER.size or head[:9] != MAGIC:
            raise CramkitError(
                f"{idx_path} is not a Megatron token index (bad or truncated header); rebuild the store"
            )
        _, version, code, n_seq, n_doc = HEADER.unpack(head)
        if version != VERSION or code not in DTYPE_CODES:
            raise CramkitError(
                f"{idx_path}: unsupported version {version} or dtype code {code}; rebuild the store"
            )
        expected = HEADER.size + n_seq * 4 + n_seq * 8 + n_doc * 8
        if idx_size != expected:
            raise CramkitError(
                f"{idx_path} is {'truncated' if idx_size < expected else 'too long'}: {idx_size} bytes, the "
                f"header promises {expected}; the build was interrupted or the file damaged, rebuild the store"
            )
        self.dtype = np.dtype(DTYPE_CODES[code])
        self._idx = np.memmap(idx_path, dtype=np.uint8, mode="r") if idx_size else None
        off = HEADER.size
        self.sizes = np.frombuffer(self._idx, dtype="<i4", count=n_seq, offset=off)
        off += n_seq * 4
        self.pointers = np.frombuffer(self._idx, dtype="<i8", count=n_seq, offset=off)
        off += n_seq * 8
        self.doc_idx = np.frombuffer(self._idx, dtype="<i8", count=n_doc, offset=off)
        self.num_tokens = int(self.sizes.sum(dtype=np.int64))
        bin_size = bin_path.stat().st_size
        need = self.num_tokens * self.dtype.itemsize
        if bin_size != need:
            raise CramkitError(
                f"{bin_path} is {'truncated' if bin_size < need else 'longer than its index'}: {bin_size} bytes, "
                f"the index promises {need}; the build was interrupted or the file damaged, rebuild the store"
            )
        if n_seq and (
            self.pointers[0] != 0
            or (
                n_seq > 1
                and np.any(np.diff(self.pointers) != self.sizes[:-1].astype(np.int64) * self.dtype.itemsize)
            )
        ):
            raise CramkitError(f"{idx_path}: pointers do not match the sequence lengths; rebuild the store")
        if n_doc and (self.doc_idx[0] != 0 or self.doc_idx[-1] != n_seq or np.any(np.diff(self.doc_idx) < 0)):
            raise CramkitError(f"{idx_path}: document indices are inconsistent; rebuild the store")
        if need:
            self.tokens = np.memmap(bin_path, dtype=self.dtype.newbyteorder("<"), mode="r")
        else:
            self.tokens = np.zeros(0, dtype=self.dtype)
        self._max_id: int | None = None
        meta_path = _with(self.prefix, ".json")
        self.meta: dict = {}
        if meta_path.is_file():
            try:
                self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
            except (ValueError, OSError) as exc:
                raise CramkitError(f"{meta_path} is not valid JSON ({exc}); rebuild the store") from None
            if not isinstance(self.meta, dict):
                raise CramkitError(f"{meta_path} does not hold a JSON object; rebuild the store")

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def num_documents(self) -> int:
        return max(len(self.doc_idx) - 1, 0)

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self.sizes)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sequence {i} out of range (store has {n})")
        start = int(self.pointers[i]) // self.dtype.itemsize
        return self.tokens[start : start + int(self.sizes[i])]

    def check_tokenizer(self, tok, *, explicit: bool = True) -> None:
        """CramkitError when the store was built with a different tokenizer than ``tok``.

        A store without its manifest (NAME.json: an interrupted build, or a store from another tool) records
        no tokenizer: it is refused unless the tokenizer was named by the user (``explicit``), and then
        used with a warning (its ids are still checked against the vocabulary by `check_ids`).
        """
        from cramkit.text.tokenizer import tokenizer_hash

        want = self.meta.get("tokenizer_hash")
        if want is None:
            manifest = _with(self.prefix, ".json")
            what = (
                f"has no manifest {manifest.name}"
                if not self.meta
                else f"{manifest.name} records no tokenizer"
            )
            if not explicit:
                raise CramkitError(
                    f"token store {self.prefix} {what}, so nothing says which tokenizer built it (an "
                    "interrupted build, or a store from another tool); rebuild it with `cramkit data build`, or "
                    "name the tokenizer it was built with: --tokenizer DIR"
                )
            print(
                f"cramkit: warning: token store {self.prefix} {what}; trusting the tokenizer you named "
                "(a different one would train on garbage)",
                file=sys.stderr,
            )
            return
        have = tokenizer_hash(tok)
        if have != want:
            raise CramkitError(
                f"token store {self.prefix} was built with another tokenizer (hash {want}, given {have}); "
                f"use the tokenizer it was built with ({self.meta.get('tokenizer_path', 'see its .json')}) "
                "or rebuild the store with `cramkit data build ... --tokenizer YOURS`"
            )

    def max_token_id(self) -> int:
        """The largest token id in the store (read in chunks; -1 when empty). Cached."""
        if self._max_id is None:
            top, low, chunk = -1, 0, 1 << 26
            for lo in range(0, len(self.tokens), chunk):
                part = self.tokens[lo : lo + chunk]
                top = max(top, int(part.max()))
                if self.dtype.kind == "i":
                    low = min(low, int(part.min()))
            if low < 0:
                raise CramkitError(
                    f"token store {self.prefix} holds a negative token id ({low}); the store is damaged, "
                    "rebuild it with `cramkit data build`"
                )
            self._max_id = top
        return self._max_id

    def check_ids(self, vocab_size: int, tokenizer_name: str = "the tokenizer") -> None:
        """CramkitError when a token id is outside ``range(vocab_size)`` (another tokenizer, or damage)."""
        top = self.max_token_id()
        if top >= vocab_size:
            raise CramkitError(
                f"token store {self.prefix} holds token id {top}, beyond the {vocab_size:,} entries of "
                f"{tokenizer_name}; it was built with a larger vocabulary: use the tokenizer it was built with, "
                "or rebuild the store with `cramkit data build ... --tokenizer YOURS`"
            )

    def __repr__(self) -> str:
        return f"TokenStore({str(self.prefix)!r}, sequences={len(self)}, documents={self.num_documents}, tokens={self.num_tokens})"


class TokenStoreWriter:
    """Streaming writer of one store: ``add_document(ids)`` ..., then ``finalize(meta)``.

    Writes ``PREFIX.bin``/``.idx``/``.json`` under temporary names beside the target and renames them at
    finalisation (the old .json first removed, so a half-replaced store never looks finished);
    ``abort()`` (or an exception inside ``with``) removes the temporary files.
    """

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype | type = np.uint16):
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_OF:
            raise ValueError(f"unsupported token dtype {self.dtype}")
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.prefix.parent / f".{self.prefix.name}.tmp{os.getpid()}"
        self._bin = open(_with(self._tmp, ".bin"), "wb")  # noqa: SIM115 (closed in finalize/abort)
        self._sizes: list[np.ndarray] = []
        self._doc_ends: list[np.ndarray] = []  # running sequence counts at document ends
        self.num_sequences = 0
        self.num_tokens = 0

    def add_document(self, ids) -> None:
        """One document as one sequence."""
        self.add_documents(np.asarray(ids, dtype=self.dtype), np.array([len(ids)], dtype=np.int64))

    def add_documents(self, flat_ids: np.ndarray, lengths: np.ndarray) -> None:
        """Many documents at once: their ids back to back and their lengths (one sequence each)."""
        flat = np.ascontiguousarray(flat_ids, dtype=self.dtype.newbyteorder("<"))
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != len(flat):
            raise ValueError("lengths do not add up to the number of ids")
        if len(lengths) and lengths.max() > np.iinfo(np.int32).max:
            raise CramkitError("a document has more than 2**31 tokens; split it into smaller documents")
        self._bin.write(flat.tobytes())
        self._sizes.append(lengths.astype(np.int32))
        self._doc_ends.append(self.num_sequences + np.arange(1, len(lengths) + 1, dtype=np.int64))
        self.num_sequences += len(lengths)
        self.num_tokens += len(flat)

    def finalize(self, meta: dict | None = None) -> Path:
        self._bin.close()
        sizes = np.concatenate(self._sizes) if self._sizes else np.zeros(0, np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            np.cumsum(sizes[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        doc_idx = np.concatenate([np.zeros(1, np.int64), *self._doc_ends])
        with open(_with(self._tmp, ".idx"), "wb") as fh:
            fh.write(HEADER.pack(MAGIC, VERSION, CODE_OF[self.dtype], len(sizes), len(doc_idx)))
            fh.write(sizes.astype("<i4").tobytes())
            fh.write(pointers.astype("<i8").tobytes())
            fh.write(doc_idx.astype("<i8").tobytes())
        meta = dict(meta or {})
        meta.update(
            format="megatron-mmididx-v1",
            dtype=self.dtype.name,
            num_sequences=int(len(sizes)),
            num_documents=int(len(doc_idx) - 1),
            num_tokens=int(self.num_tokens),
        )
        _with(self._tmp, ".json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        final_json = _with(self.prefix, ".json")
        if final_json.exists():
            final_json.unlink()  # the old store stops looking finished before its files are replaced
        os.replace(_with(self._tmp, ".bin"), _with(self.prefix, ".bin"))
        os.replace(_with(self._tmp, ".idx"), _with(self.prefix, ".idx"))
        os.replace(_with(self._tmp, ".json"), final_json)
        return self.prefix

    def abort(self) -> None:
        self._bin.close()
        for suffix in (".bin", ".idx", ".json"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_with(self._tmp, suffix))

    def __enter__(self) -> TokenStoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
