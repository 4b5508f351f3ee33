"""A token store read back as text: its sequences cut into chunk spans, the document of each sequence, the
spans decoded with the tokenizer the store was built with (what ``cramkit embed`` and an index read from a
store)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from cramkit.errors import CramkitError


def store_chunk_spans(store: Any, chunk_tokens: int) -> np.ndarray:
    """int64 [n, 3] (sequence, token start, token end): every sequence cut into ``chunk_tokens`` pieces,
    the last one shorter; the order of the store (the alignment of ``index neighbours``)."""
    sizes = np.asarray(store.sizes, dtype=np.int64)
    per = (sizes + chunk_tokens - 1) // chunk_tokens
    seq = np.repeat(np.arange(len(sizes), dtype=np.int64), per)
    first = np.concatenate([[0], np.cumsum(per)[:-1]]) if len(per) else np.zeros(0, np.int64)
    start = (np.arange(len(seq), dtype=np.int64) - np.repeat(first, per)) * chunk_tokens
    end = np.minimum(start + chunk_tokens, sizes[seq]) if len(seq) else start
    return np.stack([seq, start, end], axis=1)


def store_documents(store: Any) -> np.ndarray:
    """int64 [sequences]: the document of each sequence (from the store's document index)."""
    n = len(store)
    if store.num_documents == 0:
        return np.arange(n, dtype=np.int64)
    return np.searchsorted(np.asarray(store.doc_idx), np.arange(n), side="right").astype(np.int64) - 1


def decode_spans(store: Any, tokenizer: Any, spans: np.ndarray, batch: int = 4096) -> Iterator[str]:
    """The text of each (sequence, start, end) span of ``store``, decoded with ``tokenizer``."""
    for i in range(0, len(spans), batch):
        part = spans[i : i + batch]
        ids = [store[int(s)][int(a) : int(b)].astype(np.int64).tolist() for s, a, b in part]
        yield from tokenizer.decode_batch(ids, skip_special_tokens=True)


def store_tokenizer(store: Any, encoder_tokenizer: Any, given: str | None) -> Any:
    """The tokenizer that decodes the store: ``given``; else the encoder's when the store was built with
    it; else the copy the store keeps beside itself (``tokenizer_file``, checked against its hash)."""
    from tokenizers import Tokenizer

    from cramkit.io import inside
    from cramkit.text.tokenizer import load_tokenizer, tokenizer_hash

    want = store.meta.get("tokenizer_hash")
    tok: Tokenizer | None
    if given:
        tok = load_tokenizer(given)
        if want and tokenizer_hash(tok) != want:
            raise CramkitError(
                f"--store-tokenizer {given} is not the tokenizer token store {store.prefix} was built with; "
                f"give the one it records ({store.meta.get('tokenizer_path') or 'see its .json'})"
            )
        return tok
    if want is None or tokenizer_hash(encoder_tokenizer) == want:
        return encoder_tokenizer
    copy = store.meta.get("tokenizer_file")
    if isinstance(copy, str) and copy:
        try:
            path = inside(store.prefix.parent, copy)
            tok = Tokenizer.from_file(str(path)) if path.is_file() else None
        except (ValueError, Exception):  # a damaged or foreign file: fall through to the error
            tok = None
        if tok is not None and tokenizer_hash(tok) == want:
            return tok
    raise CramkitError(
        f"token store {store.prefix} was built with another tokenizer than the encoder's; give it with "
        f"--store-tokenizer {store.meta.get('tokenizer_path') or 'DIR'} so its chunks can be decoded to text"
    )
