"""A row is tokenised only as far as the model reads it: one line of 49 MB made `embed` peak at 7.9 GB (the whole
line was tokenised before it was cut to 128 tokens). The ids a model sees, and whether the row was cut, are the
whole text's, for WordPiece and byte-level BPE, with spaces, newlines, long words and no spaces at all."""

from __future__ import annotations

import numpy as np
import pytest

from cramkit.data.batching import encode_texts
from cramkit.text.tokenizer import encode_prefixes


@pytest.fixture(scope="module")
def bpe(builtin_docs):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(builtin_docs[:200], trainers.BpeTrainer(vocab_size=800, special_tokens=["<s>", "</s>"]))
    return tok


def _texts(docs: list[str]) -> list[str]:
    prose = " ".join(docs[:400])  # real text, ~100k+ characters
    return [
        prose,
        "short one",
        " " * 50_000 + prose[:3000],  # spaces first: the first pieces hold no token
        "x" * 70_000 + " " + prose[:2000],  # one word longer than any piece
        prose.replace(" ", "")[:60_000],  # no space at all
        prose.replace(" ", "\n")[:60_000],
        "",
    ]


@pytest.mark.parametrize("which", ["tok", "bpe"])
@pytest.mark.parametrize("max_length", [16, 128, 512])
def test_prefixes_give_the_whole_texts_first_ids(request, builtin_docs, which, max_length):
    tokenizer = request.getfixturevalue(which)
    texts = _texts(builtin_docs)
    whole = tokenizer.encode_batch(texts, add_special_tokens=False)
    cut = encode_prefixes(tokenizer, texts, max_length, add_special_tokens=False)
    for w, c, text in zip(whole, cut, texts, strict=True):
        assert c.ids[:max_length] == w.ids[:max_length], text[:40]
        assert (len(c.ids) > max_length) == (len(w.ids) > max_length)
    assert len(cut[0].ids) < len(whole[0].ids) // 4  # the long prose was not tokenised whole


def test_pairs_and_the_cut_flag_are_unchanged(tok, builtin_docs):
    texts = _texts(builtin_docs)
    got = encode_texts(tok, texts, texts[::-1], 128)
    for i, (a, b) in enumerate(zip(texts, texts[::-1], strict=True)):
        ea, eb = tok.encode(a, add_special_tokens=False).ids, tok.encode(b, add_special_tokens=False).ids
        from cramkit.data.batching import truncate_pair

        na, nb = truncate_pair(len(ea), len(eb), 128 - 3)
        assert got.ids[i][1 : 1 + na].tolist() == ea[:na]
        assert bool(got.truncated[i]) == (na < len(ea) or nb < len(eb))
    assert np.all(got.lengths <= 128)
