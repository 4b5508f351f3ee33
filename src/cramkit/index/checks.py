"""What an index's files may make cramkit do: nothing Faiss's native code trusts is used before it is checked.

An index directory can be shared or downloaded, so its ``faiss.index`` and ``lists.ivfdata`` are untrusted
input to C++ that does no bounds checking: an inverted list's offset or size past the end of the list file, a
coarse quantizer with more centroids than lists, an HNSW neighbour on a level its node does not reach, or an
id past the vectors would read out of bounds (SIGSEGV) or index past the vectors. :func:`validate_faiss_index`
checks every such structure once, when the index is opened (vectorised: a fraction of the time to read it),
and :func:`check_ids` every id a search returns before it is used.

A file that is memory-mapped and then cut short in place (a running server's files truncated under it) kills
the process with SIGBUS on the next read of a page past the new end. The vectors are therefore never mapped:
:class:`Rows` reads the rows it needs with ``pread`` (a short read is an error, not a signal); the files Faiss
and the chunk table map are checked against their recorded sizes before each search (:class:`MappedFiles`), and
no thread reads them between searches (Faiss's prefetch threads are joined before a search returns).
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.errors import CramkitError

INVALID_OFFSET = (1 << 64) - 1  # Faiss's offset of an on-disk list never allocated


class DamagedIndex(CramkitError):
    """An index file that is damaged, crafted or changed under a running process; a server answers 500 for
    the requests it fails and keeps serving."""


def damaged(where: Any, what: str) -> DamagedIndex:
    return DamagedIndex(f"{where}: {what}; the index is damaged or crafted: rebuild it")


# ------------------------------------------------------------------------------------------ faiss structures


def validate_faiss_index(index: Any, where: Path, *, rows: int, dim: int) -> None:
    """Refuse (:class:`DamagedIndex`) an index Faiss would read out of bounds with: ``rows`` vectors of ``dim``
    dimensions; an IVF index's quantizer, codec and lists (on-disk list offsets and sizes within the list
    file), an HNSW graph's levels, offsets and neighbours, an ID map's ids."""
    import faiss

    if int(index.ntotal) != rows or int(index.d) != dim:
        raise damaged(where, f"holds {index.ntotal} vectors of {index.d} dimensions, the manifest {rows} of {dim}")
    top = faiss.downcast_index(index)
    if isinstance(top, (faiss.IndexIDMap2, faiss.IndexIDMap)):
        ids = faiss.vector_to_array(top.id_map)
        if len(ids) != rows or (rows and (int(ids.min()) < 0 or int(ids.max()) >= rows)):
            raise damaged(where, f"its id map is not {rows} ids below {rows}")
        top = faiss.downcast_index(top.index)
        if int(top.ntotal) != rows or int(top.d) != dim:
            raise damaged(where, "its inner index does not hold the vectors its id map lists")
    if isinstance(top, faiss.IndexHNSW):
        _check_hnsw(top, where, rows, dim)
        return
    try:
        ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    except RuntimeError:
        raise damaged(where, f"is a {type(top).__name__}, not an index cramkit builds") from None
    _check_ivf(faiss, ivf, where, rows, dim)


def _check_ivf(faiss: Any, ivf: Any, where: Path, rows: int, dim: int) -> None:
    nlist, cs = int(ivf.nlist), int(ivf.code_size)
    q = faiss.downcast_index(ivf.quantizer)
    if (
        not isinstance(q, faiss.IndexFlat)
        or int(q.ntotal) != nlist
        or int(q.d) != dim
        or int(q.code_size) != dim * 4
        or int(q.codes.size()) != nlist * dim * 4
    ):
        raise damaged(where, f"its coarse quantizer is not {nlist} centroids of {dim} dimensions")
    if isinstance(ivf, faiss.IndexIVFScalarQuantizer):
        sq = ivf.sq
        if (
            int(sq.qtype) != faiss.ScalarQuantizer.QT_8bit
            or int(sq.d) != dim
            or int(sq.code_size) != dim
            or cs != dim
            or int(sq.trained.size()) != 2 * dim
        ):
            raise damaged(where, "its scalar quantizer is not an 8-bit one of the index's dimensions")
    elif isinstance(ivf, (faiss.IndexIVFPQ, faiss.IndexIVFPQFastScan)):
        pq = ivf.pq
        m, nbits = int(pq.M), int(pq.nbits)
        if (
            nbits not in (4, 8)
            or m < 1
            or int(pq.d) != dim
            or int(pq.dsub) * m != dim
            or int(pq.ksub) != 1 << nbits
            or int(pq.centroids.size()) != dim * (1 << nbits)
            or int(pq.code_size) != (m * nbits + 7) // 8
        ):
            raise damaged(where, "its product quantizer does not match the index's dimensions")
        if isinstance(ivf, faiss.IndexIVFPQ) and cs != int(pq.code_size):
            raise damaged(where, "its code size is not its product quantizer's")
    else:
        raise damaged(where, f"is a {type(ivf).__name__}, not an index cramkit builds")
    il = faiss.downcast_InvertedLists(ivf.invlists)
    if int(il.nlist) != nlist:
        raise damaged(where, f"holds {il.nlist} inverted lists, its quantizer {nlist}")
    if isinstance(il, faiss.OnDiskInvertedLists):
        if int(il.code_size) != cs:
            raise damaged(where, "its inverted lists' code size is not the index's")
        sizes = _check_on_disk_lists(faiss, il, where, cs)
    elif isinstance(il, faiss.BlockInvertedLists):
        if int(il.n_per_block) != int(ivf.bbs) or int(il.block_size) != int(ivf.bbs) * int(ivf.M2) // 2:
            raise damaged(where, "its blocked inverted lists do not match its fast-scan layout")
        sizes = np.array([il.list_size(j) for j in range(nlist)], dtype=np.int64)
    elif isinstance(il, faiss.ArrayInvertedLists):
        if int(il.code_size) != cs:
            raise damaged(where, "its inverted lists' code size is not the index's")
        sizes = np.array([il.list_size(j) for j in range(nlist)], dtype=np.int64)
    else:
        raise damaged(where, f"keeps its lists in a {type(il).__name__}, not lists cramkit writes")
    if int(sizes.sum()) != rows:
        raise damaged(where, f"its inverted lists hold {int(sizes.sum())} entries, not its {rows} vectors")


def _check_on_disk_lists(faiss: Any, il: Any, where: Path, cs: int) -> np.ndarray:
    """Each list's (size, capacity, offset) inside the list file of ``il.totsize`` bytes; the sizes."""
    n = int(il.lists.size())
    if n != int(il.nlist):
        raise damaged(where, f"records {n} inverted lists, not {il.nlist}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    raw = faiss.rev_swig_ptr(faiss.cast_integer_to_idx_t_ptr(int(il.lists.data().this)), 3 * n)
    table = np.array(raw, copy=True).view(np.uint64).reshape(n, 3)  # OnDiskOneList: size, capacity, offset
    size, cap, off = table[:, 0], table[:, 1], table[:, 2]
    total, entry = int(il.totsize), cs + 8
    unused = (off == INVALID_OFFSET) & (cap == 0) & (size == 0)
    cap_ok = cap <= np.uint64(total // entry)  # bounded first: the products below cannot overflow
    off_ok = off <= np.uint64(total)
    end = np.where(cap_ok & off_ok, off, 0) + np.where(cap_ok & off_ok, cap, 0) * np.uint64(entry)
    ok = unused | ((size <= cap) & cap_ok & off_ok & (end <= np.uint64(total)))
    if not ok.all():
        j = int(np.flatnonzero(~ok)[0])
        raise damaged(
            where,
            f"inverted list {j} (offset {int(off[j])}, size {int(size[j])}, capacity {int(cap[j])}) does not lie "
            f"inside its {total}-byte list file",
        )
    return size.astype(np.int64)


def _check_hnsw(h: Any, where: Path, rows: int, dim: int) -> None:
    import faiss

    storage = faiss.downcast_index(h.storage)
    if (
        not isinstance(storage, faiss.IndexFlat)
        or int(storage.ntotal) != rows
        or int(storage.d) != dim
        or int(storage.code_size) != dim * 4
        or int(storage.codes.size()) != rows * dim * 4
    ):
        raise damaged(where, f"its HNSW storage is not {rows} vectors of {dim} dimensions")
    g = h.hnsw
    levels = faiss.vector_to_array(g.levels).astype(np.int64)
    offsets = faiss.vector_to_array(g.offsets).astype(np.uint64)
    cum = faiss.vector_to_array(g.cum_nneighbor_per_level).astype(np.int64)
    nb = faiss.vector_to_array(g.neighbors)  # int32
    top = int(g.max_level)
    bad = None
    if len(levels) != rows or len(offsets) != rows + 1:
        bad = "its levels or offsets are not one per vector"
    elif rows and (int(levels.min()) < 1 or int(levels.max()) > len(cum) - 1):
        bad = "a node's level is outside its neighbour table"
    elif len(cum) == 0 or cum[0] != 0 or bool(np.any(np.diff(cum) < 0)):
        bad = "its neighbours-per-level table is not cumulative"
    elif rows and not (0 <= int(g.entry_point) < rows and 0 <= top < int(levels[int(g.entry_point)])):
        bad = f"entry point {g.entry_point} at level {top} is not a node of that level"
    elif not rows and int(g.entry_point) != -1:
        bad = "an empty graph has an entry point"
    else:
        widths = cum[levels] if rows else np.zeros(0, dtype=np.int64)
        if int(offsets[0]) != 0 or not np.array_equal(np.diff(offsets).astype(np.int64), widths):
            bad = "its offsets do not follow its levels"
        elif int(offsets[-1]) != len(nb):
            bad = f"its offsets end at {int(offsets[-1])}, its neighbour table at {len(nb)}"
    if bad is None and len(nb):
        bad = _check_links(nb, levels, offsets.astype(np.int64), cum, rows)
    if bad is not None:
        raise damaged(where, f"HNSW graph: {bad}")


def _check_links(nb: np.ndarray, levels: np.ndarray, offsets: np.ndarray, cum: np.ndarray, rows: int) -> str | None:
    """Each neighbour a node (or -1), linked on a level it reaches; in blocks of nodes (bounded memory)."""
    if bool(np.any(nb < -1)) or bool(np.any(nb >= rows)):
        return f"a neighbour id is outside the {rows} vectors"
    for a in range(0, rows, 1 << 16):
        b = min(rows, a + (1 << 16))
        lo, hi = int(offsets[a]), int(offsets[b])
        start = np.repeat(offsets[a:b], cum[levels[a:b]])
        slot_level = np.searchsorted(cum, np.arange(lo, hi, dtype=np.int64) - start, side="right") - 1
        block = nb[lo:hi]
        real = block >= 0
        if bool(np.any(levels[block[real]] <= slot_level[real])):
            return "a neighbour is linked on a level its node does not reach"
    return None


def check_ids(ids: np.ndarray, rows: int, where: Any) -> np.ndarray:
    """``ids`` (a search's result) when each is -1 (none) or a row below ``rows``; else :class:`DamagedIndex`."""
    if ids.size and (int(ids.min()) < -1 or int(ids.max()) >= rows):
        raise damaged(where, f"a search returned id {int(ids.max())}, beyond its {rows} vectors")
    return ids


# ------------------------------------------------------------------------------------------ files


class Rows:
    """The float32 [n, d] rows of a ``.npy`` file, read with ``pread`` (never memory-mapped, so a file cut short
    under a running process is an error, not SIGBUS). Indexing: an int, a slice, or an integer array; the kernel
    is told not to read ahead (``POSIX_FADV_RANDOM``): re-scoring reads a query's few candidate rows only."""

    dtype = np.dtype(np.float32)
    ndim = 2

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                major, _ = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(f)
                self.offset = f.tell()
        except (OSError, ValueError) as exc:
            raise damaged(self.path, f"is not a readable .npy ({exc})") from None
        if np.dtype(dtype) != self.dtype or fortran or len(shape) != 2:
            raise damaged(self.path, f"is not a float32 [n, dim] array ({dtype}, shape {shape})")
        self.shape = (int(shape[0]), int(shape[1]))
        self.row_bytes = self.shape[1] * 4
        self.fd: int | None = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        # closed once, by close() or when the object goes (also at interpreter exit, before modules are torn
        # down: a __del__ at shutdown found os.close gone and printed "Exception ignored in Rows.__del__")
        self._closer = weakref.finalize(self, os.close, self.fd)
        if os.fstat(self.fd).st_size != self.offset + self.shape[0] * self.row_bytes:
            self.close()
            raise damaged(self.path, f"is {os.path.getsize(self.path)} bytes, not the size of its {self.shape} rows")
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)

    def __len__(self) -> int:
        return self.shape[0]

    def close(self) -> None:
        """Close the file, once: a descriptor closed twice closes whatever reused its number meanwhile (seen in
        CI: pytest's own capture file, closed by a refused file's Rows)."""
        self.fd = None
        closer = getattr(self, "_closer", None)
        if closer is not None:
            closer()

    def _read_into(self, out: np.ndarray, a: int) -> None:
        view, pos = out.data.cast("B"), self.offset + a * self.row_bytes
        fd = self.fd
        if fd is None:
            raise damaged(self.path, "was closed (its index was closed)")
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], pos + done)
            if got <= 0:
                raise damaged(self.path, f"was cut short under this process (row {a + done // self.row_bytes} gone)")
            done += got

    def __getitem__(self, key: Any) -> np.ndarray:
        n = self.shape[0]
        if isinstance(key, (int, np.integer)):
            i = int(key) + (n if int(key) < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"row {key} of {n}")
            return self[i : i + 1][0]
        if isinstance(key, slice):
            a, b, step = key.indices(n)
            if step != 1:
                return self[np.arange(a, b, step, dtype=np.int64)]
            out = np.empty((max(0, b - a), self.shape[1]), dtype=np.float32)
            if len(out):
                self._read_into(out, a)
            return out
        ids = np.asarray(key, dtype=np.int64).reshape(-1)
        if ids.size and (int(ids.min()) < -n or int(ids.max()) >= n):
            raise IndexError(f"a row beyond the {n} rows of {self.path}")
        ids = np.where(ids < 0, ids + n, ids)
        uniq, inv = np.unique(ids, return_inverse=True)
        got = np.empty((len(uniq), self.shape[1]), dtype=np.float32)
        breaks = np.flatnonzero(np.diff(uniq) != 1) + 1  # one read per run of consecutive rows
        for s, e in zip(np.r_[0, breaks], np.r_[breaks, len(uniq)], strict=True):
            self._read_into(got[s:e], int(uniq[s]))
        return got[inv.reshape(-1)].reshape(*np.shape(key), self.shape[1])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype, copy=False)


class MappedFiles:
    """Files other code memory-maps (Faiss's lists, the chunk table), each held open with the size it had when
    checked: :meth:`check` before each use refuses one cut short since (a SIGBUS otherwise), and keeps refusing."""

    def __init__(self, files: dict[Path, int]) -> None:
        self.files = [(p, os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)), size) for p, size in files.items()]
        self.broken: str | None = None
        self._closer = weakref.finalize(self, _close_all, [fd for _, fd, _ in self.files])  # once (see Rows.close)

    def check(self) -> None:
        if self.broken is None:
            for path, fd, size in self.files:
                now = os.fstat(fd).st_size
                if now < size:
                    self.broken = (
                        f"{path} was cut short while in use ({now} bytes, {size} when opened); the index is damaged: "
                        "rebuild it, then restart"
                    )
                    break
        if self.broken is not None:
            raise DamagedIndex(self.broken)

    def close(self) -> None:
        """Close the files, once; a check after this refuses (the index was closed)."""
        self.files, self.broken = [], self.broken or "the index was closed"
        self._closer()


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
