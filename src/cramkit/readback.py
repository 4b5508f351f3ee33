"""Files cramkit wrote for itself and reads back (caches, progress records): as untrusted as any input.

Every such file is checked before it is used: a ``.npy`` array's header (format version, dtype, byte order,
C order, rank, the rows and width the caller expects) against the file's exact size before anything is mapped
or allocated, then its values (finite, within the range the caller gives); a progress record's size, depth,
type and range (``0 <= done <= rows``, an integer). A bad one is a :class:`BadCache` naming the file and what is
wrong: a cache is cramkit's own scratch, so its reader says so in one line (:func:`rebuilding`) and computes it
again. Nothing here loads a pickle.
"""

from __future__ import annotations

import math
import os
import stat
import sys
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.io import BadJson, json_loads, json_text

PROGRESS_BYTES = 1 << 16  # a progress record is a few numbers
CHUNK_ROWS = 1 << 16  # rows checked at once (a memory-mapped cache is never read whole)


class BadCache(ValueError):
    """A cache or progress file that cannot be used as it is; the message names the file and why."""


def rebuilding(path: str | os.PathLike, why: str, what: str = "cache") -> None:
    """The one stderr line of a bad cache computed again."""
    why = why.removeprefix(str(path)).lstrip(": ")  # the reason names the file already
    print(f"cramkit: the {what} {path} is damaged ({why[:200]}); computing it again", file=sys.stderr)


def npy_header(path: str | os.PathLike) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of the ``.npy`` file ``path``, read from its header alone and checked
    against the file's size (the data must fill it exactly); a :class:`BadCache` otherwise."""
    path = Path(path)
    fmt = np.lib.format
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise BadCache(f"{path} is not a regular file")
        with open(path, "rb") as fh:
            version = fmt.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, fortran, dtype = fmt.read_array_header_2_0(fh)
            else:
                raise BadCache(f"{path} is a .npy file of version {version}, not 1.0 or 2.0")
            offset = fh.tell()
    except BadCache:
        raise
    except (OSError, ValueError, SyntaxError, TypeError) as exc:  # empty, cut short, not .npy, a crafted header
        raise BadCache(f"{path} is not a .npy array ({str(exc)[:120]})") from None
    if fortran or dtype.hasobject or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise BadCache(f"{path}: a .npy header cramkit never writes ({dtype}, {shape!r:.80}, fortran {fortran})")
    need = offset + math.prod(shape) * dtype.itemsize
    if st.st_size != need:
        raise BadCache(
            f"{path}: its header says {dtype} {shape!r:.80} ({need:,} bytes) but the file has {st.st_size:,} bytes"
        )
    return tuple(shape), dtype, offset


def read_array(
    path: str | os.PathLike,
    *,
    rows: int | None = None,
    width: int | None = None,
    dtype: Any = np.float32,
    bound: float | None = None,
    mmap: bool = True,
) -> np.ndarray:
    """The 2-D ``dtype`` array of ``path`` (memory-mapped read-only with ``mmap``), checked first: the header
    and size (:func:`npy_header`), ``rows`` and ``width`` where given, every value finite and, with ``bound``,
    at most ``bound`` in magnitude. A :class:`BadCache` naming the file otherwise."""
    shape, have, _ = npy_header(path)
    if have != np.dtype(dtype) or len(shape) != 2:
        raise BadCache(f"{path} holds {have} {shape!r:.80}, not {np.dtype(dtype)} [rows, width]")
    if rows is not None and shape[0] != rows:
        raise BadCache(f"{path} holds {shape[0]:,} rows, not the {rows:,} expected")
    if width is not None and shape[1] != width:
        raise BadCache(f"{path} holds {shape[1]:,} values a row, not {width:,}")
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise BadCache(f"{path} is not a readable .npy array ({str(exc)[:120]})") from None
    check_values(arr, path, bound)
    return arr


def check_values(arr: np.ndarray, path: str | os.PathLike, bound: float | None = None, upto: int | None = None) -> None:
    """A :class:`BadCache` when a row of ``arr`` (the first ``upto``) holds NaN, an infinity or, with ``bound``,
    a value over it in magnitude; checked in chunks of rows."""
    end = len(arr) if upto is None else upto
    for start in range(0, end, CHUNK_ROWS):
        part = np.asarray(arr[start : min(end, start + CHUNK_ROWS)])
        if not np.isfinite(part).all():
            raise BadCache(f"{path} holds NaN or infinite values")
        if bound is not None and part.size and float(np.abs(part).max()) > bound:
            raise BadCache(f"{path} holds values over {bound:g} in magnitude, which cramkit never writes there")


def read_progress(path: str | os.PathLike, rows: int) -> int:
    """The rows done that progress record ``path`` (``{"done": D, "rows": N}``) says, checked: a small JSON
    object, ``rows`` equal to ``rows``, ``done`` an integer with ``0 <= done <= rows``; a :class:`BadCache`
    otherwise."""
    try:
        state = json_loads(json_text(path, PROGRESS_BYTES))
    except (OSError, UnicodeDecodeError, BadJson) as exc:
        raise BadCache(f"{path} is not a progress record ({str(exc).replace(str(path), 'it')[:160]})") from None
    if not isinstance(state, dict):
        raise BadCache(f"{path} is not a JSON object")
    done, total = _count(state.get("done")), _count(state.get("rows"))
    if total is None or total != rows:
        raise BadCache(f"{path}: 'rows' is {str(state.get('rows'))[:40]}, not the {rows:,} being computed")
    if done is None or done > rows:
        raise BadCache(f"{path}: 'done' is {str(state.get('done'))[:40]}, not a whole number from 0 to {rows:,}")
    return done


def _count(value: Any) -> int | None:
    """``value`` when it is a JSON integer >= 0 (not a boolean), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
