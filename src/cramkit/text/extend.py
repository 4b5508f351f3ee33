"""Vocabulary extension: whole words of a new corpus added to an existing WordPiece vocabulary.

The words chosen are the most frequent words of the corpus that the tokenizer splits into several pieces
(none of them [UNK]); each gets a new id after the existing ones, so every old id keeps its meaning and a
model's embedding table only grows. WordPiece matches the longest vocabulary entry first, so an added
word is one token wherever it stands alone. The extended tokenizer is still plain BERT WordPiece:
``BertTokenizerFast.from_pretrained`` reads it.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.text.tokenizer import special_id

if TYPE_CHECKING:
    import tokenizers

MAX_WORD_CHARS = 40  # longer "words" are URLs, hashes and tables, not vocabulary


@dataclass
class Extension:
    """What :func:`extend_vocabulary` added and what it changed."""

    words: list[str]
    pieces: list[list[int]]  # each new word's ids under the old tokenizer (its embedding starts as their mean)
    first_id: int  # the id of words[0]; the others follow
    words_counted: int  # word occurrences in the text counted
    split_before: float  # share of those occurrences split into several pieces, before ...
    split_after: float  # ... and after the extension

    def to_json(self) -> dict[str, Any]:
        return {
            "added": len(self.words),
            "first_id": self.first_id,
            "words_counted": self.words_counted,
            "split_share_before": round(self.split_before, 6),
            "split_share_after": round(self.split_after, 6),
            "words": self.words,
            "pieces": self.pieces,
        }


def check_extensible(tok: tokenizers.Tokenizer, what: str) -> None:
    spec = json.loads(tok.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        raise CramkitError(
            f"--extend-vocab: {what}'s tokenizer is {model.get('type') or 'unknown'}, not WordPiece; only a "
            "WordPiece vocabulary (BERT's) can be extended"
        )


def count_words(tok: tokenizers.Tokenizer, documents: Iterable[str], *, max_chars: int = 200_000_000) -> Counter[str]:
    """Occurrences of each word of ``documents`` as the tokenizer sees words (after its normaliser and
    pre-tokeniser: lowercased, punctuation and CJK characters split off), over at most ``max_chars``."""
    normalizer, pre = tok.normalizer, tok.pre_tokenizer
    counts: Counter[str] = Counter()
    seen, t0, last = 0, time.monotonic(), time.monotonic()
    for doc in documents:
        text = normalizer.normalize_str(doc) if normalizer is not None else doc
        words = [w for w, _ in pre.pre_tokenize_str(text)] if pre is not None else text.split()
        counts.update(words)
        seen += len(doc)
        now = time.monotonic()
        if now - last > 10:
            last = now
            print(
                f"cramkit: counting words: {seen / 1e6:,.0f}M characters, {seen / 1e6 / (now - t0):,.1f}M/s",
                file=sys.stderr,
                flush=True,
            )
        if seen >= max_chars:
            break
    return counts


def _pieces(tok: tokenizers.Tokenizer, words: list[str]) -> list[list[int]]:
    model = tok.model
    return [[t.id for t in model.tokenize(w)] for w in words]


def split_share(tok: tokenizers.Tokenizer, counts: Counter[str]) -> float:
    """Share of the counted word occurrences that ``tok`` splits into more than one piece."""
    total = sum(counts.values())
    if not total:
        return 0.0
    words = list(counts)
    split = sum(counts[w] for w, p in zip(words, _pieces(tok, words), strict=True) if len(p) > 1)
    return split / total


def extend_vocabulary(
    tok: tokenizers.Tokenizer, counts: Counter[str], n: int
) -> tuple[tokenizers.Tokenizer, Extension]:
    """A copy of ``tok`` with the ``n`` most frequent split words of ``counts`` added as whole tokens."""
    from tokenizers import Tokenizer

    unk = special_id(tok, "unk")
    vocab = tok.get_vocab(with_added_tokens=True)
    words: list[str] = []
    pieces: list[list[int]] = []
    for word, _ in counts.most_common():
        if len(words) == n:
            break
        if word in vocab or len(word) > MAX_WORD_CHARS or not any(c.isalnum() for c in word):
            continue
        ids = [t.id for t in tok.model.tokenize(word)]
        if len(ids) > 1 and unk not in ids:
            words.append(word)
            pieces.append(ids)
    if not words:
        raise CramkitError(
            "--extend-vocab: the corpus has no word that the tokenizer splits into pieces; nothing to add"
        )
    spec = json.loads(tok.to_str())
    first = tok.get_vocab_size(with_added_tokens=True)
    for i, word in enumerate(words):
        spec["model"]["vocab"][word] = first + i
    new = Tokenizer.from_str(json.dumps(spec))
    ext = Extension(
        words=words,
        pieces=pieces,
        first_id=first,
        words_counted=sum(counts.values()),
        split_before=split_share(tok, counts),
        split_after=split_share(new, counts),
    )
    return new, ext
