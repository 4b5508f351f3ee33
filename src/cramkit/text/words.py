"""Where words begin in a sequence of WordPiece ids, for whole-word masking.

A WordPiece token that starts with ``##`` continues the word before it. Chinese text has no such marks:
BERT's normaliser splits it into single characters, so runs of CJK-character tokens are cut into words
by a segmenter (jieba, ``pip install 'cramkit[zh]'``), as Chinese-BERT-wwm does with its own segmenter.
Everything is computed from the ids alone, so a sample's words are the same in every run and on resume.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from cramkit.errors import CramkitError
from cramkit.text.tokenizer import is_cjk_char

if TYPE_CHECKING:
    import tokenizers

JIEBA_HINT = "pip install 'cramkit[zh]' (or: pip install jieba)"


def load_jieba(why: str) -> Any:
    """The jieba module (quiet), or one clear line saying how to install it."""
    try:
        import jieba
    except ImportError:
        raise CramkitError(f"{why} needs the Chinese word segmenter jieba: {JIEBA_HINT}") from None
    jieba.setLogLevel(logging.WARNING)
    return jieba


class WordBoundaries:
    """``starts(ids)`` -> [B, L] bool, True where a word begins (special tokens begin their own word)."""

    def __init__(self, tok: tokenizers.Tokenizer) -> None:
        vocab = tok.get_vocab(with_added_tokens=True)
        size = max(vocab.values()) + 1
        self.continues = np.zeros(size, dtype=bool)
        self.cjk = np.zeros(size, dtype=bool)
        self.chars = np.full(size, " ", dtype="<U1")
        for token, i in vocab.items():
            if token.startswith("##") and len(token) > 2:
                self.continues[i] = True
            elif len(token) == 1 and is_cjk_char(token):
                self.cjk[i] = True
                self.chars[i] = token
        self._jieba: Any = None

    @property
    def has_cjk(self) -> bool:
        return bool(self.cjk.any())

    def needs_segmenter(self, sample: np.ndarray) -> bool:
        """Whether ``sample`` (token ids) holds Chinese characters to segment."""
        return self.has_cjk and bool(self.cjk.take(np.asarray(sample, dtype=np.int64), mode="clip").any())

    def require_segmenter(self) -> None:
        if self._jieba is None:
            self._jieba = load_jieba("whole-word masking of Chinese text (data.masking=whole_word)")

    def starts(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        start = ~self.continues.take(ids, mode="clip")
        if not self.has_cjk:
            return start
        cjk = self.cjk.take(ids, mode="clip")
        if not cjk.any():
            return start
        self.require_segmenter()
        for row in np.flatnonzero(cjk.any(axis=1)):
            self._segment_row(ids[row], cjk[row], start[row])
        return start

    def _segment_row(self, ids: np.ndarray, cjk: np.ndarray, start: np.ndarray) -> None:
        """Mark the first character of each jieba word in every run of CJK tokens of one row."""
        edges = np.diff(np.concatenate([[0], cjk.view(np.int8), [0]]))
        for lo, hi in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True):
            text = "".join(self.chars[ids[lo:hi]])
            start[lo:hi] = False
            pos = lo
            for word in self._jieba.lcut(text, HMM=True):
                start[pos] = True
                pos += len(word)
