"""The token store: Megatron-LM's indexed-dataset format (``NAME.bin`` + ``NAME.idx``) plus ``NAME.json``.

``NAME.bin``: token ids back to back (uint16 when the vocabulary has fewer than 65500 entries, else int32).
``NAME.idx``, little-endian: ``MMIDIDX\\x00\\x00``, version ``<Q`` = 1, dtype code ``<B``, sequence
count ``<Q``, document-index count ``<Q``, then int32 sequence lengths, int64 byte pointers into .bin,
int64 document indices (0, then the running sequence count at each document end).
``NAME.json``: tokenizer hash, vocabulary size, special ids, sources and counts, the sha256 of each file
and the largest token id (cramkit's own).

A sharded store (``cramkit data build --shard-size``) is ``NAME-00000.bin/.idx``, ``NAME-00001.bin/.idx``,
... (each pair a Megatron store of whole documents) and ``NAME.json`` listing them under ``shards``; it
opens as one store. ``mmap=False`` reads the .bin files with ``os.pread`` instead of memory maps.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import struct
import sys
import threading
from pathlib import Path

import numpy as np

from cramkit.errors import CramkitError
from cramkit.io import read_json_object

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
_SHARD = re.compile(r"(.+)-\d{5}\Z")  # NAME-00000: a shard of the store NAME
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")  # a file name, no folder, not hidden
_NOTED: set[Path] = set()  # folders whose files could not be memory-mapped (said once)


def _with(prefix: Path, suffix: str) -> Path:
    return prefix.parent / (prefix.name + suffix)


# files that make a directory a folder of text to read, not a token store, when both are there
TEXT_SUFFIXES = (".txt", ".jsonl", ".tokens", ".parquet", ".csv", ".tsv")


def is_store(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a token store, as every verb that takes one decides it: PREFIX or
    PREFIX.bin/.idx/.json of a store, a sharded store's PREFIX (NAME.json beside NAME-00000.bin/.idx, as
    ``data build --shard-size`` and ``data join`` write it), or a directory holding a store and no text."""
    p = Path(path)
    if p.is_dir():
        return any(p.glob("*.idx")) and not any(f.suffix in TEXT_SUFFIXES for f in p.iterdir())
    base = p.with_suffix("") if p.suffix in (".bin", ".idx", ".json") else p
    if _with(base, ".idx").is_file() and _with(base, ".bin").is_file():
        return True
    shards = base.parent.glob(glob.escape(base.name) + "-[0-9][0-9][0-9][0-9][0-9].idx")
    return _with(base, ".json").is_file() and any(shards)


def store_dtype(vocab_size: int) -> np.dtype:
    """uint16 for vocabularies under 65500 entries (Megatron's rule), else int32."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def resolve_prefix(path: str | os.PathLike, name: str | None = None) -> Path:
    """PREFIX (or PREFIX.bin/.idx/.json, or a directory holding one store) -> PREFIX without suffix."""
    p = Path(path)
    if p.is_dir():
        if name is not None:
            return p / name
        names = set()
        for idx in p.glob("*.idx"):
            stem = idx.name[: -len(".idx")]
            shard = _SHARD.match(stem)
            names.add(shard.group(1) if shard and (p / f"{shard.group(1)}.json").is_file() else stem)
        if len(names) == 1:
            return p / names.pop()
        if not names:
            raise CramkitError(
                f"{path} holds no token store (NAME.idx + NAME.bin); build one with `cramkit data build`"
            )
        if "train" in names:
            return p / "train"
        listed = ", ".join(sorted(names))
        raise CramkitError(f"{path} holds several stores ({listed}); name one, e.g. {p / min(names)}")
    if p.suffix in (".bin", ".idx", ".json") and not p.is_dir():
        p = p.with_suffix("")
    return p


def shard_names(prefix: Path, meta: dict) -> list[str]:
    """The prefixes (file names in the store's folder) of the store's .bin/.idx pairs, checked.

    A manifest may only name plain files beside it: a name with a folder, ``..`` or an absolute path is
    refused before anything is opened.
    """
    shards = meta.get("shards")
    if shards is None:
        return [prefix.name]
    manifest = _with(prefix, ".json")
    if not isinstance(shards, list) or not shards:
        raise CramkitError(f"{manifest}: 'shards' must be a non-empty list of shard names; rebuild the store")
    for s in shards:
        if not isinstance(s, str) or not _PLAIN_NAME.match(s) or ".." in s:
            raise CramkitError(
                f"{manifest} names shard {s!r}, which is not a plain file name in {prefix.parent}; a manifest "
                "may only list shards beside it (damaged or crafted): rebuild the store with `cramkit data build`"
            )
    return list(shards)


class PreadTokens:
    """A .bin file's token ids read with ``os.pread`` (no memory map): ``t[a:b]`` and ``t[index array]``.

    An index array is served by a few large reads: its sorted distinct positions are grouped into runs
    (gaps up to ``GAP`` tokens are read through) and each run is read into one buffer, reused per thread
    and pinned when ``pin_memory`` (CUDA present).
    """

    GAP = 2048  # tokens: about a page or two, read through rather than asked for twice

    def __init__(self, path: Path, dtype: np.dtype, length: int, pin_memory: bool = False):
        self.path, self.dtype, self.shape, self.ndim = path, dtype, (length,), 1
        self.pin_memory = pin_memory
        self._fd = os.open(path, os.O_RDONLY)
        self._local = threading.local()

    def __len__(self) -> int:
        return self.shape[0]

    def __del__(self) -> None:
        with contextlib.suppress(AttributeError, OSError):
            os.close(self._fd)

    def _buffer(self, n: int) -> np.ndarray:
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < n:
            size = max(n, 2 * len(buf) if buf is not None else 0)
            if self.pin_memory:
                import torch

                self._local.pinned = torch.empty(size * self.dtype.itemsize, dtype=torch.uint8, pin_memory=True)
                buf = self._local.pinned.numpy().view(self.dtype)
            else:
                buf = np.empty(size, dtype=self.dtype)
            self._local.buf = buf
        return buf[:n]

    def _read_into(self, out: np.ndarray, lo: int) -> None:
        view = memoryview(out).cast("B")  # type: ignore[arg-type]  # numpy's stubs: __buffer__ on Python 3.12+ only
        done, at = 0, lo * self.dtype.itemsize
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], at + done)
            if got == 0:
                raise CramkitError(f"{self.path} ended early: it was truncated while in use; rebuild the store")
            done += got

    def __getitem__(self, key):
        n = len(self)
        if isinstance(key, slice):
            lo, hi, step = key.indices(n)
            out = np.empty(max(hi - lo, 0), dtype=self.dtype)
            if len(out):
                self._read_into(out, lo)
            return out[::step] if step != 1 else out
        if isinstance(key, (int, np.integer)):
            i = int(key) + (n if key < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"index {key} is out of bounds for {n} tokens")
            return self[i : i + 1][0]
        k = np.asarray(key, dtype=np.int64)
        flat = k.ravel()
        if not len(flat):
            return np.empty(k.shape, dtype=self.dtype)
        u = np.unique(flat)
        if u[0] < 0 or u[-1] >= n:
            raise IndexError(f"index {int(u[0] if u[0] < 0 else u[-1])} is out of bounds for {n} tokens")
        cut = np.flatnonzero(np.diff(u) > self.GAP) + 1
        starts, ends = u[np.r_[0, cut]], u[np.r_[cut - 1, len(u) - 1]] + 1
        base = np.zeros(len(starts), dtype=np.int64)
        np.cumsum(ends[:-1] - starts[:-1], out=base[1:])
        buf = self._buffer(int(base[-1] + ends[-1] - starts[-1]))
        for s, e, b in zip(starts.tolist(), ends.tolist(), base.tolist(), strict=True):
            self._read_into(buf[b : b + e - s], s)
        run = np.searchsorted(starts, flat, side="right") - 1
        return buf[base[run] + flat - starts[run]].reshape(k.shape)


class ShardedTokens:
    """The token ids of several .bin files as one sequence: ``t[a:b]`` and ``t[index array]``."""

    def __init__(self, parts: list):
        self.parts = parts
        self.starts = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=self.starts[1:])
        self.dtype, self.shape, self.ndim = parts[0].dtype, (int(self.starts[-1]),), 1

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        n = len(self)
        if isinstance(key, slice):
            lo, hi, step = key.indices(n)
            if hi <= lo:
                return np.empty(0, dtype=self.dtype)
            first, last = np.searchsorted(self.starts, [lo, hi - 1], side="right") - 1
            pieces = [
                np.asarray(self.parts[j][max(lo - self.starts[j], 0) : min(hi, self.starts[j + 1]) - self.starts[j]])
                for j in range(first, last + 1)
            ]
            out = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
            return out[::step] if step != 1 else out
        if isinstance(key, (int, np.integer)):
            i = int(key) + (n if key < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"index {key} is out of bounds for {n} tokens")
            j = int(np.searchsorted(self.starts, i, side="right") - 1)
            return self.parts[j][i - self.starts[j]]
        k = np.asarray(key, dtype=np.int64)
        if k.size and (k.min() < 0 or k.max() >= n):
            raise IndexError(f"index out of bounds for {n} tokens")
        which = np.searchsorted(self.starts, k, side="right") - 1
        out = np.empty(k.shape, dtype=self.dtype)
        for j in np.unique(which).tolist():
            sel = which == j
            out[sel] = self.parts[j][k[sel] - self.starts[j]]
        return out


def _open_pair(prefix: Path, mmap: bool, pin_memory: bool):
    """One .bin/.idx pair, checked: (dtype, sizes, pointers, doc_idx, tokens)."""
    idx_path, bin_path = _with(prefix, ".idx"), _with(prefix, ".bin")
    for f in (idx_path, bin_path):
        if not f.is_file():
            raise CramkitError(f"token store file {f} is missing; build the store with `cramkit data build`")
    idx_size = idx_path.stat().st_size
    with open(idx_path, "rb") as fh:
        head = fh.read(HEADER.size)
    if len(head) < HEADER.size or head[:9] != MAGIC:
        raise CramkitError(f"{idx_path} is not a Megatron token index (bad or truncated header); rebuild the store")
    _, version, code, n_seq, n_doc = HEADER.unpack(head)
    if version != VERSION or code not in DTYPE_CODES:
        raise CramkitError(f"{idx_path}: unsupported version {version} or dtype code {code}; rebuild the store")
    expected = HEADER.size + n_seq * 4 + n_seq * 8 + n_doc * 8
    if idx_size != expected:
        raise CramkitError(
            f"{idx_path} is {'truncated' if idx_size < expected else 'too long'}: {idx_size} bytes, the "
            f"header promises {expected}; the build was interrupted or the file damaged, rebuild the store"
        )
    dtype = np.dtype(DTYPE_CODES[code])
    idx: np.ndarray
    try:
        idx = np.memmap(idx_path, dtype=np.uint8, mode="r")
    except OSError:  # a file system that cannot memory-map (a FUSE mount with direct_io): read it whole
        idx = np.fromfile(idx_path, dtype=np.uint8)
    off = HEADER.size
    sizes = np.frombuffer(idx, dtype="<i4", count=n_seq, offset=off)
    off += n_seq * 4
    pointers = np.frombuffer(idx, dtype="<i8", count=n_seq, offset=off)
    off += n_seq * 8
    doc_idx = np.frombuffer(idx, dtype="<i8", count=n_doc, offset=off)
    num_tokens = int(sizes.sum(dtype=np.int64))
    bin_size = bin_path.stat().st_size
    need = num_tokens * dtype.itemsize
    if bin_size != need:
        raise CramkitError(
            f"{bin_path} is {'truncated' if bin_size < need else 'longer than its index'}: {bin_size} bytes, "
            f"the index promises {need}; the build was interrupted or the file damaged, rebuild the store"
        )
    if n_seq and (
        pointers[0] != 0 or (n_seq > 1 and np.any(np.diff(pointers) != sizes[:-1].astype(np.int64) * dtype.itemsize))
    ):
        raise CramkitError(f"{idx_path}: pointers do not match the sequence lengths; rebuild the store")
    if n_doc and (doc_idx[0] != 0 or doc_idx[-1] != n_seq or np.any(np.diff(doc_idx) < 0)):
        raise CramkitError(f"{idx_path}: document indices are inconsistent; rebuild the store")
    le = dtype.newbyteorder("<")
    tokens: np.ndarray | PreadTokens | None
    if not need:
        tokens = np.zeros(0, dtype=dtype)
    else:
        tokens = None
        if mmap:
            try:
                tokens = np.memmap(bin_path, dtype=le, mode="r")
            except OSError as exc:
                if bin_path.parent not in _NOTED:  # once per folder (a sharded store has many files)
                    _NOTED.add(bin_path.parent)
                    print(
                        f"cramkit: note: {bin_path} cannot be memory-mapped on its file system ({exc.strerror}); "
                        "reading it with pread instead (data.mmap=false)",
                        file=sys.stderr,
                    )
        if tokens is None:
            tokens = PreadTokens(bin_path, le, num_tokens, pin_memory)
    return dtype, sizes, pointers, doc_idx, tokens


def _read_meta(prefix: Path) -> dict:
    return read_json_object(_with(prefix, ".json"), "rebuild the store")


class TokenStore:
    """A token store; ``store[i]`` is sequence i (one per document when cramkit built it).

    mmap: memory-map the .bin files (default), or read them with ``os.pread`` (``data.mmap=false``; into
    pinned buffers when ``pin_memory``). A sharded store opens as one: ``sizes``, ``pointers`` and
    ``doc_idx`` cover all shards in order (pointers into their concatenation), ``tokens`` reads across them.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        name: str | None = None,
        mmap: bool = True,
        pin_memory: bool = False,
    ):
        self.prefix = resolve_prefix(path, name)
        self.mmap = mmap
        self.meta = _read_meta(self.prefix)
        self.shards = shard_names(self.prefix, self.meta)
        pairs = [_open_pair(self.prefix.parent / s, mmap, pin_memory) for s in self.shards]
        dtypes = {p[0] for p in pairs}
        if len(dtypes) > 1:
            raise CramkitError(f"{self.prefix}: its shards hold different token types; rebuild the store")
        self.dtype = pairs[0][0]
        if len(pairs) == 1:
            _, self.sizes, self.pointers, self.doc_idx, self.tokens = pairs[0]
        else:
            self.sizes = np.concatenate([p[1] for p in pairs])
            tok_base = np.cumsum([0] + [len(p[4]) for p in pairs]) * self.dtype.itemsize
            self.pointers = np.concatenate([p[2] + b for p, b in zip(pairs, tok_base, strict=False)])
            seq_base = np.cumsum([0] + [len(p[1]) for p in pairs])
            self.doc_idx = np.concatenate(
                [pairs[0][3][:1]] + [p[3][1:] + b for p, b in zip(pairs, seq_base, strict=False)]
            )
            self.tokens = ShardedTokens([np.asarray(p[4]) if isinstance(p[4], np.ndarray) else p[4] for p in pairs])
        self.num_tokens = len(self.tokens)
        # the memory-mapped files and their sizes: a file truncated under a running job would end it with
        # SIGBUS at the next read of a lost page, so readers that run long call ``check_intact`` first
        self._mapped = [
            (f, f.stat().st_size)
            for s in (self.shards if mmap else [])
            for f in (_with(self.prefix.parent / s, ".idx"), _with(self.prefix.parent / s, ".bin"))
        ]
        self._max_id: int | None = None
        self.verified = False  # True once every file was checked against its recorded sha256 (staging)
        self.staged = False  # True for a node-local copy made by `cramkit.data.stage` (caches go beside it)

    def check_intact(self) -> None:
        """CramkitError naming the file when a memory-mapped file of this store changed size since it was
        opened (truncated or rewritten under the job): reading it would kill the process with SIGBUS."""
        for f, size in self._mapped:
            try:
                now = os.stat(f).st_size
            except OSError:
                now = -1
            if now != size:
                what = "is gone" if now < 0 else f"is now {now:,} bytes, {size:,} when this job opened it"
                raise CramkitError(
                    f"token store file {f} changed under this job ({what}); restore it (or rebuild the store "
                    "and start a new run), then resume the run from its last checkpoint (cramkit pretrain --resume RUN)"
                )

    def files(self) -> list[str]:
        """The store's files (names in its folder): the .bin/.idx pairs, then NAME.json when present."""
        names = [f"{s}{ext}" for s in self.shards for ext in (".idx", ".bin")]
        return names + ([f"{self.prefix.name}.json"] if _with(self.prefix, ".json").is_file() else [])

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
            what = f"has no manifest {manifest.name}" if not self.meta else f"{manifest.name} records no tokenizer"
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
        """The largest token id in the store (-1 when empty). Cached.

        Taken from NAME.json when the files were verified against their recorded checksums (a staged
        copy), else read from the .bin files in chunks.
        """
        recorded = self.meta.get("max_token_id")
        if self._max_id is None and self.verified and isinstance(recorded, int):
            self._max_id = recorded
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
        return (
            f"TokenStore({str(self.prefix)!r}, sequences={len(self)}, documents={self.num_documents}, "
            f"tokens={self.num_tokens})"
        )


class _PairWriter:
    """One .bin/.idx pair under a temporary name, hashed and measured as it is written."""

    def __init__(self, tmp: Path, final: Path, dtype: np.dtype):
        self.tmp, self.final, self.dtype = tmp, final, dtype
        self.bin = open(_with(tmp, ".bin"), "wb")  # noqa: SIM115 (closed in finish/abort)
        self.sha = hashlib.sha256()
        self.sizes: list[np.ndarray] = []
        self.doc_ends: list[np.ndarray] = []  # running sequence counts at document ends
        self.num_sequences = self.num_tokens = 0
        self.max_id = -1

    def add(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        data = flat.tobytes()
        self.bin.write(data)
        self.sha.update(data)
        if len(flat):
            self.max_id = max(self.max_id, int(flat.max()))
        self.sizes.append(lengths.astype(np.int32))
        self.doc_ends.append(self.num_sequences + np.arange(1, len(lengths) + 1, dtype=np.int64))
        self.num_sequences += len(lengths)
        self.num_tokens += len(flat)

    def finish(self) -> dict[str, str]:
        """Close the .bin, write the .idx; the sha256 of both under their final names."""
        self.bin.close()
        sizes = np.concatenate(self.sizes) if self.sizes else np.zeros(0, np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            np.cumsum(sizes[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        doc_idx = np.concatenate([np.zeros(1, np.int64), *self.doc_ends])
        idx = b"".join(
            [
                HEADER.pack(MAGIC, VERSION, CODE_OF[self.dtype], len(sizes), len(doc_idx)),
                sizes.astype("<i4").tobytes(),
                pointers.astype("<i8").tobytes(),
                doc_idx.astype("<i8").tobytes(),
            ]
        )
        _with(self.tmp, ".idx").write_bytes(idx)
        return {
            f"{self.final.name}.bin": "sha256:" + self.sha.hexdigest(),
            f"{self.final.name}.idx": "sha256:" + hashlib.sha256(idx).hexdigest(),
        }

    def install(self) -> None:
        os.replace(_with(self.tmp, ".bin"), _with(self.final, ".bin"))
        os.replace(_with(self.tmp, ".idx"), _with(self.final, ".idx"))

    def abort(self) -> None:
        self.bin.close()
        for suffix in (".bin", ".idx"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_with(self.tmp, suffix))


class TokenStoreWriter:
    """Streaming writer of one store: ``add_document(ids)`` ..., then ``finalize(meta)``.

    Writes ``PREFIX.bin``/``.idx``/``.json`` under temporary names beside the target and renames them at
    finalisation (the old .json first removed, so a half-replaced store never looks finished);
    ``abort()`` (or an exception inside ``with``) removes the temporary files. With ``shard_bytes`` the
    tokens go to ``PREFIX-00000.bin/.idx``, ... of at most that many bytes each (whole documents; a longer
    document gets a shard of its own), listed in ``PREFIX.json``.
    """

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype | type = np.uint16, shard_bytes: int | None = None):
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_OF:
            raise ValueError(f"unsupported token dtype {self.dtype}")
        if shard_bytes is not None and shard_bytes < self.dtype.itemsize:
            raise CramkitError(f"--shard-size {shard_bytes} bytes is too small for one token")
        self.shard_bytes = shard_bytes
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        self._pairs: list[_PairWriter] = []
        self._next_pair()
        self.num_sequences = 0
        self.num_tokens = 0

    def _next_pair(self) -> _PairWriter:
        name = self.prefix.name if self.shard_bytes is None else f"{self.prefix.name}-{len(self._pairs):05d}"
        tmp = self.prefix.parent / f".{name}.tmp{os.getpid()}"
        self._pairs.append(_PairWriter(tmp, self.prefix.parent / name, self.dtype))
        return self._pairs[-1]

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
        self.num_sequences += len(lengths)
        self.num_tokens += len(flat)
        if self.shard_bytes is None:
            self._pairs[-1].add(flat, lengths)
            return
        room_tokens = self.shard_bytes // self.dtype.itemsize
        ends = np.cumsum(lengths)
        doc = tok = 0
        while doc < len(lengths):
            pair = self._pairs[-1]
            fit = int(np.searchsorted(ends, tok + room_tokens - pair.num_tokens, side="right")) - doc
            if fit == 0 and pair.num_tokens:
                self._next_pair()
                continue
            fit = max(fit, 1)  # a document longer than a shard: a shard of its own
            n = int(ends[doc + fit - 1]) - tok
            pair.add(flat[tok : tok + n], lengths[doc : doc + fit])
            doc, tok = doc + fit, tok + n

    def finalize(self, meta: dict | None = None) -> Path:
        checksums: dict[str, str] = {}
        for pair in self._pairs:
            checksums.update(pair.finish())
        meta = dict(meta or {})
        meta.update(
            format="megatron-mmididx-v1",
            dtype=self.dtype.name,
            num_sequences=int(self.num_sequences),
            num_documents=int(self.num_sequences),
            num_tokens=int(self.num_tokens),
            max_token_id=max(p.max_id for p in self._pairs),
            checksums=checksums,
        )
        if self.shard_bytes is not None:
            meta["shards"] = [p.final.name for p in self._pairs]
        tmp_json = self.prefix.parent / f".{self.prefix.name}.tmp{os.getpid()}.json"
        tmp_json.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        final_json = _with(self.prefix, ".json")
        if final_json.exists():
            final_json.unlink()  # the old store stops looking finished before its files are replaced
        keep = {p.final.name for p in self._pairs}
        for old in [
            self.prefix,
            *(self.prefix.parent.glob(f"{self.prefix.name}-[0-9][0-9][0-9][0-9][0-9].idx")),
        ]:
            stem = old.name[: -len(".idx")] if old.name.endswith(".idx") else old.name
            if stem not in keep:  # the files of a replaced store's other layout (sharded or not)
                for suffix in (".bin", ".idx"):
                    _with(old.parent / stem, suffix).unlink(missing_ok=True)
        for pair in self._pairs:
            pair.install()
        os.replace(tmp_json, final_json)
        return self.prefix

    def abort(self) -> None:
        for pair in self._pairs:
            pair.abort()

    def __enter__(self) -> TokenStoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
