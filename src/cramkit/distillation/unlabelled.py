"""Unlabelled text for the transfer set: a text file (one text per line) or a token store's documents.

A token store (``cramkit data build`` / the store a ``cramkit pretrain`` run built) holds token ids; its
documents are decoded with the tokenizer saved beside it and cut into sentences, visiting documents in a
seeded random order until ``limit`` sentences are collected, so a large store costs only what is taken.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from cramkit.data.tokenstore import is_store
from cramkit.errors import CramkitError

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
STORE_DEFAULT_LIMIT = 100_000  # sentences taken from a token store unless max_unlabelled says otherwise


def is_text_file(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_file() and p.suffix not in (".idx", ".bin")


def read_unlabelled(path: str | os.PathLike, *, limit: int = 0, seed: int = 0, max_words: int = 60) -> list[str]:
    """Texts from ``path``: a UTF-8 text file, one text per line, or a token store directory / prefix (its
    documents as sentences of 3..``max_words`` words). ``limit`` > 0 keeps at most that many."""
    p = Path(path)
    if is_text_file(p):
        try:
            lines = [x.strip() for x in p.read_text(encoding="utf-8").splitlines() if x.strip()]
        except UnicodeDecodeError:
            raise CramkitError(f"--unlabelled {path} is not UTF-8 text; convert it (iconv -t utf-8)") from None
        if not lines:  # said before anything trains, not once the teacher has
            raise CramkitError(
                f"--unlabelled {path} holds no text (it is empty or blank lines only); give a text file with one "
                "text per line"
            )
        return lines[:limit] if limit > 0 else lines
    if not is_store(p):
        raise CramkitError(
            f"--unlabelled {path} is neither a text file nor a token store; give a text file (one text per line) or a "
            "token store directory (cramkit data build)"
        )
    return _from_store(p, limit, seed, max_words)


def _from_store(path: Path, limit: int, seed: int, max_words: int) -> list[str]:
    from cramkit.data.tokenstore import TokenStore
    from cramkit.text.tokenizer import load_tokenizer

    store = TokenStore(path)
    beside = store.prefix.with_name(store.prefix.name + ".tokenizer.json")
    if not beside.is_file():
        raise CramkitError(
            f"--unlabelled {path}: the token store has no tokenizer beside it ({beside.name}), so its ids "
            "cannot be turned back into text; give the raw text file instead"
        )
    tok = load_tokenizer(beside)
    docs = store.doc_idx
    out: list[str] = []
    order = np.random.default_rng(seed).permutation(max(len(docs) - 1, 0))
    for d in order:
        lo, hi = int(docs[d]), int(docs[d + 1])
        if hi <= lo:
            continue
        ids = np.concatenate([store[i] for i in range(lo, hi)]).tolist()
        text = tok.decode(ids, skip_special_tokens=True)
        for sent in _SENTENCE_END.split(text):
            words = sent.split()
            if 3 <= len(words) <= max_words:
                out.append(" ".join(words))
                if 0 < limit <= len(out):
                    return out
    if not out:
        raise CramkitError(
            f"--unlabelled {path}: the token store holds no sentence of 3..{max_words} words to add; give a text "
            "file instead"
        )
    return out
