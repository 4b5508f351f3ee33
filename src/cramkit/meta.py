"""Numbers and names read from a metadata file (a manifest, a part's schema metadata, a progress record),
checked before they size anything: one :class:`CramkitError` naming the file, the field and the fix.

A crafted or damaged file may hold ``1e10`` where a count belongs, a string, ``null``, a list or ``true``;
each reader takes its numbers through :func:`meta_int` (an integer in a range, never a bool, a float or a
string) and its names through :func:`meta_str`, so a list is never sized from a file and no ``int()`` of a
string raises a traceback.
"""

from __future__ import annotations

import json
import os
from typing import Any

from cramkit.errors import CramkitError

# bounds of what a cramkit file may record: rows of an embedding or chunks of an index (2^40: a trillion),
# a vector's width, the parts/shards of a split (five-digit names: part-KKKKK-of-PPPPP, NAME-IIIII)
MAX_ROWS = 1 << 40
MAX_DIM = 1 << 16
MAX_PARTS = 99_999

_MISSING = object()


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field(meta: Any, key: str, file: str | os.PathLike, fix: str, default: Any) -> Any:
    if not isinstance(meta, dict):
        raise CramkitError(f"{file}: expected a JSON object holding {key!r}, got {_shown(meta)}; {fix}")
    value = meta.get(key, _MISSING)
    if value is _MISSING and default is _MISSING:
        raise CramkitError(f"{file}: field {key!r} is missing; {fix}")
    return value


def meta_int(
    meta: Any,
    key: str,
    file: str | os.PathLike,
    fix: str,
    *,
    lo: int = 0,
    hi: int = MAX_ROWS,
    default: Any = _MISSING,
) -> int:
    """``meta[key]``, an integer in ``[lo, hi]`` (a JSON integer: never a bool, a float such as 1e10, a string,
    null or a list); else one CramkitError naming ``file``, the field, what it holds and ``fix``. A missing
    field is ``default`` when one is given, else an error too."""
    value = _field(meta, key, file, fix, default)
    if value is _MISSING:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise CramkitError(
            f"{file}: field {key!r} must be an integer from {lo:,} to {hi:,}, got {_shown(value)}; {fix}"
        )
    return value


def meta_str(meta: Any, key: str, file: str | os.PathLike, fix: str, *, default: Any = _MISSING) -> str:
    """``meta[key]``, a string; else one CramkitError as :func:`meta_int`'s."""
    value = _field(meta, key, file, fix, default)
    if value is _MISSING:
        return default
    if not isinstance(value, str):
        raise CramkitError(f"{file}: field {key!r} must be a string, got {_shown(value)}; {fix}")
    return value


def meta_strings(meta: Any, key: str, file: str | os.PathLike, fix: str, *, default: Any = _MISSING) -> list[str]:
    """``meta[key]``, a list of strings (never nested lists, numbers or null); else one CramkitError."""
    value = _field(meta, key, file, fix, default)
    if value is _MISSING:
        return default
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CramkitError(f"{file}: field {key!r} must be a list of strings, got {_shown(value)}; {fix}")
    return value


def meta_dict(meta: Any, key: str, file: str | os.PathLike, fix: str, *, default: Any = _MISSING) -> dict[str, Any]:
    """``meta[key]``, a JSON object; else one CramkitError."""
    value = _field(meta, key, file, fix, default)
    if value is _MISSING:
        return default
    if not isinstance(value, dict):
        raise CramkitError(f"{file}: field {key!r} must be a JSON object, got {_shown(value)}; {fix}")
    return value
