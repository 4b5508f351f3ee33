"""``--encoding auto``: each file's own encoding, for a folder whose files were saved by different tools.

A file that is valid UTF-8 (a byte-order mark allowed) is read as UTF-8, any other as Windows-1252, the
encoding of most legacy Western text (a superset of Latin-1's printable range; its five unassigned bytes
decode as U+FFFD). The choice is made per file from all of its bytes, before the first document is read,
so a file is never read twice in two encodings.
"""

from __future__ import annotations

import codecs
import gzip
import sys
from pathlib import Path
from types import TracebackType
from typing import Protocol

from cramkit.errors import CramkitError


class _BinaryReader(Protocol):
    """What reading a file takes: a plain, gzip or zstd stream."""

    def read(self, size: int = -1, /) -> bytes: ...
    def __enter__(self) -> _BinaryReader: ...
    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None, /
    ) -> object: ...


def open_binary(path: str) -> _BinaryReader:
    """``path``'s bytes, decompressed when it ends in .gz or .zst."""
    try:
        if path.lower().endswith(".gz"):
            return gzip.open(path, "rb")
        if path.lower().endswith(".zst"):
            try:
                import zstandard
            except ImportError:
                raise CramkitError(f"{path} is zstd-compressed; pip install zstandard to read it") from None
            return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
        return open(path, "rb")
    except OSError as exc:
        raise CramkitError(f"cannot read {path}: {exc.strerror or exc}; check the path and permissions") from None


AUTO = "auto"
FALLBACK = "cp1252"
_CHUNK = 1 << 20
_NOTED: set[str] = set()


def is_utf8(path: str | Path) -> bool:
    """Whether all of ``path``'s bytes (decompressed when .gz or .zst) are valid UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    with open_binary(str(path)) as f:
        try:
            while chunk := f.read(_CHUNK):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return False
    return True


def file_encoding(path: str | Path, encoding: str | None) -> tuple[str | None, str]:
    """(the encoding to read ``path`` with, the errors rule to add) for an asked ``encoding`` (None: UTF-8).
    For ``auto``: UTF-8 when the file is valid UTF-8, else cp1252 with its unassigned bytes replaced (noted
    once per file on stderr)."""
    if encoding != AUTO:
        return encoding, ""
    if is_utf8(path):
        return "utf-8", ""
    if str(path) not in _NOTED:
        _NOTED.add(str(path))
        print(f"cramkit: note: {path} is not UTF-8; reading it as {FALLBACK} (--encoding auto)", file=sys.stderr)
    return FALLBACK, "replace"
