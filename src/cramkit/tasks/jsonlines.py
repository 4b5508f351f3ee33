"""One official split file in JSON Lines (CLUE, FewCLUE, SuperGLUE): read, each row parsed by the suite, bad rows
named (or skipped and counted with ``skip_bad_rows``), rows without a gold label skipped and counted."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from cramkit.errors import CramkitError
from cramkit.io import BadJson, LoneSurrogate, json_row
from cramkit.tasks.glue import SKIP_HINT, BadRow
from cramkit.tasks.registry import Example

log = logging.getLogger(__name__)


class NoGold(BadRow):
    """A row the official data leaves without a gold label (NLI's ``-``): always skipped, counted."""


class JsonLinesSplit:
    """Loader of one split file: ``JsonLinesSplit(...)()`` -> list[Example]; ``.skipped`` after a call.
    ``parse(row, where, n)`` turns the n-th row (a JSON object; ``where`` names its file and line) into examples
    or raises :class:`BadRow` / :class:`NoGold`; ``unique_idx``: a row whose examples repeat an earlier row's
    ``idx`` is a bad row."""

    def __init__(
        self,
        task: str,
        path: Path,
        parse: Callable[[dict, str, int], list[Example]],
        *,
        suite: str,
        skip_bad_rows: bool = False,
        unique_idx: bool = False,
        hint: str = "",
    ):
        self.task, self.path, self.parse, self.suite = task, Path(path), parse, suite
        self.skip_bad_rows, self.unique_idx, self.hint = skip_bad_rows, unique_idx, hint
        self.source = str(self.path)
        self.skipped = 0

    def __call__(self) -> list[Example]:
        if not self.path.is_file():
            raise CramkitError(f"{self.task}: the split needs the file {self.path}, which does not exist. {self.hint}")
        self.skipped = 0
        no_gold = 0
        out: list[Example] = []
        seen: dict[int, int] = {}  # idx -> line
        n = 0
        try:
            text = self.path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as e:
            raise CramkitError(
                f"{self.path} is not UTF-8 text (byte {e.start}); {self.suite} files are UTF-8 JSON Lines"
            ) from None
        for lineno, line in enumerate(text.split("\n"), 1):  # lines end at newlines only
            if not line.strip():
                continue
            where = f"{self.path}, line {lineno}"
            try:
                rows = self.parse(self._row(line, where), where, n)
                for ex in rows if self.unique_idx else ():
                    if ex.idx in seen:
                        raise BadRow(f"{where}: idx {ex.idx} was already used on line {seen[ex.idx]}. {SKIP_HINT}")
            except NoGold:
                no_gold += 1
            except BadRow as e:
                if not self.skip_bad_rows:
                    raise CramkitError(str(e)) from None
                self.skipped += 1
            else:
                if self.unique_idx:
                    seen.update((ex.idx, lineno) for ex in rows)
                out.extend(rows)
            n += 1
        if no_gold:
            log.info("%s: %d rows of %s have no gold label ('-'): skipped", self.task, no_gold, self.path)
        if self.skipped:
            log.warning("%s: skipped %d bad rows of %s", self.task, self.skipped, self.path)
        self.skipped += no_gold
        if not out:
            raise CramkitError(f"{self.path} holds no {self.task} rows; use the file from the {self.suite} download")
        return out

    def _row(self, line: str, where: str) -> dict:
        try:
            row, _ = json_row(line)
        except LoneSurrogate as e:
            raise BadRow(f"{where}: {e}. {SKIP_HINT}") from None
        except BadJson as e:
            raise BadRow(
                f"{where}: {e}; {self.suite} files hold one JSON object per line (JSON Lines). {SKIP_HINT}"
            ) from None
        if not isinstance(row, dict):
            raise BadRow(
                f"{where} holds a JSON {type(row).__name__}, not an object; {self.suite} files hold one JSON object "
                f"per line (JSON Lines). {SKIP_HINT}"
            )
        return row
