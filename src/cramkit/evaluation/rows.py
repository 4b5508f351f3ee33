"""The rows of an evaluation's data files: a malformed one is refused (one error naming it) or, with
--skip-bad-rows, skipped and counted; numbers are read from text or JSON values."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cramkit.errors import CramkitError


class BadRows:
    """Malformed rows of one file: refused (one error naming the first few) unless ``skip`` (counted)."""

    def __init__(self, path: Path, skip: bool) -> None:
        self.path, self.skip = path, skip
        self.rows: list[tuple[int, str]] = []

    def add(self, lineno: int, problem: str) -> None:
        self.rows.append((lineno, problem))

    def check(self) -> int:
        if self.rows and not self.skip:
            lineno, problem = self.rows[0]
            more = f" (and {len(self.rows) - 1} more bad rows)" if len(self.rows) > 1 else ""
            raise CramkitError(
                f"{self.path} line {lineno}: {problem}{more}; fix the file, or pass --skip-bad-rows to skip "
                "(and count) such rows"
            )
        return len(self.rows)


def parse_number(value: Any) -> float | None:
    """``value`` as a finite float (text stripped), else None (a bool is no number)."""
    if isinstance(value, bool):
        return None
    try:
        x = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
