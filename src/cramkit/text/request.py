"""What ``cramkit tokenizer train`` and :func:`cramkit.text.verbs.tokenizer_train` take, declared once
(:mod:`cramkit.request`): the command line's flags and the function's keywords come from here."""

from __future__ import annotations

import os
from dataclasses import KW_ONLY, dataclass
from pathlib import Path

from cramkit.errors import CramkitError
from cramkit.request import param
from cramkit.text import MIN_FREQUENCY, VOCAB_SIZE, ZH_VOCAB_SIZE
from cramkit.text.reading import Documents, Normalizing, Reading


@dataclass
class Sources(Reading, Documents, Normalizing):
    """Raw text to read, and how (``tokenizer train``, ``data build``)."""

    sources: list[str] = param(
        [],
        positional=True,
        metavar="SOURCE",
        help="text files, directories, globs, .jsonl/.json (JSON Lines)/.parquet, .gz/.zst, or hf:NAME:CONFIG:SPLIT "
        "(none: the built-in corpus, this Python's standard-library docstrings)",
    )

    def __post_init__(self) -> None:  # one path given alone, or paths: a list of strings
        raw: object = self.sources
        self.sources = [os.fspath(raw)] if isinstance(raw, (str, os.PathLike)) else [os.fspath(s) for s in self.sources]


@dataclass
class TokenizerTrainRequest(Sources):
    """A WordPiece tokenizer trained on raw text, written to a directory."""

    _: KW_ONLY
    out: str | os.PathLike = param(required=True, help="directory for tokenizer.json, vocab.txt, ...")
    vocab_size: int | None = param(
        None,
        help=f"tokens in the vocabulary (default {VOCAB_SIZE}; {ZH_VOCAB_SIZE} for Chinese, as bert-base-chinese)",
    )
    lang: str = param(
        "auto",
        choices=("auto", "zh", "generic"),
        help="zh: character-level WordPiece for Chinese (each CJK character a token, Latin words as pieces, accents "
        "kept); generic: BERT's; auto (default): zh when most letters of a sample are Chinese",
    )
    force: bool = param(False, help="replace a tokenizer already in --out")
    lowercase: bool = param(True, flags=("--no-lowercase",), help="keep case")
    strip_accents: bool = param(True, flags=("--keep-accents",), help="do not strip accents")
    min_frequency: int = param(MIN_FREQUENCY, help="times a piece must occur to enter the vocabulary")

    def check(self) -> None:
        """No tokenizer in ``out`` is replaced unless ``force``."""
        refuse_overwrite(self.out, ["tokenizer.json", "vocab.txt"], self.force)


def refuse_overwrite(out: str | os.PathLike, names: list[str], force: bool) -> None:
    """One CramkitError when ``out`` already holds one of ``names`` and ``force`` is not given."""
    found = [n for n in names if (Path(out) / n).exists()]
    if found and not force:
        raise CramkitError(
            f"--out {out} already holds {', '.join(found)}; choose another --out or pass --force to replace it"
        )
