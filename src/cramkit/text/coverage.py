"""How much of a text a tokenizer covers: the share of word pieces that become ``[UNK]``.

A model's vocabulary made for one language turns most of another's characters into ``[UNK]`` (an English
BERT vocabulary on Chinese text: two thirds of the pieces), and fine-tuning then learns from almost
nothing while it runs as if all were well. `unk_report` says so before the work starts.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from cramkit.text.tokenizer import special_id

UNK_WARN_RATE = 0.05  # above this share of [UNK] pieces the text is in a language the vocabulary lacks
SAMPLE = 2000  # texts looked at (spread over the whole list)


def unk_rate(tokenizer: Any, texts: Sequence[str]) -> tuple[float, int]:
    """(share of ``[UNK]`` among the word pieces, number of pieces) of up to SAMPLE of ``texts``."""
    unk = special_id(tokenizer, "unk")
    if unk is None or not texts:
        return 0.0, 0
    step = max(1, len(texts) // SAMPLE)
    sample = [t for t in texts[::step][:SAMPLE] if t]
    total = unknown = 0
    for enc in tokenizer.encode_batch(sample, add_special_tokens=False):
        total += len(enc.ids)
        unknown += enc.ids.count(unk)
    return (unknown / total if total else 0.0), total


def unk_report(tokenizer: Any, texts: Sequence[str], model: str, *, verbose: bool = True) -> float:
    """Print (to stderr) the ``[UNK]`` rate of ``texts`` under ``model``'s tokenizer when ``verbose``, and
    a warning naming what to do when it is above UNK_WARN_RATE whatever ``verbose``; the rate."""
    rate, pieces = unk_rate(tokenizer, texts)
    if rate > UNK_WARN_RATE:
        print(
            f"warning: {rate:.1%} of the training text's {pieces:,} word pieces are [UNK] for {model}'s "
            "tokenizer: its vocabulary does not cover this text's language, so fine-tuning learns little. Use "
            "a model whose tokenizer covers the language (cramkit tokenizer train + cramkit pretrain on such "
            f"text), or extend this one: cramkit pretrain --from {model} on text of the language, with its "
            "vocabulary extended",
            file=sys.stderr,
        )
    elif verbose and pieces:
        print(f"training text: {rate:.1%} of {pieces:,} word pieces are [UNK]", file=sys.stderr)
    return rate
