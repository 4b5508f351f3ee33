"""The verb of ``cramkit tokenizer``: :func:`tokenizer_train`, which takes its request
(:class:`~cramkit.text.request.TokenizerTrainRequest`) or the request's fields."""

from __future__ import annotations

import time
from pathlib import Path

from cramkit.request import verb
from cramkit.text import VOCAB_SIZE, ZH_VOCAB_SIZE
from cramkit.text.request import TokenizerTrainRequest

_LANG_NAMES = {"zh": "Chinese, one token per character", "generic": "generic WordPiece"}


@verb(TokenizerTrainRequest)
def tokenizer_train(request: TokenizerTrainRequest) -> Path:
    """``cramkit tokenizer train``: a tokenizer trained on the ``sources`` (:func:`cramkit.text.train_tokenizer`;
    ``lang="auto"``: ``zh`` when most letters of a sample are Chinese), saved into ``out`` (refused where one is,
    unless ``force``), each step said on stdout; returns ``out``."""
    from cramkit.text.sources import detect_language, iter_documents
    from cramkit.text.tokenizer import save_tokenizer, train_tokenizer

    r = request
    r.check()
    t0, reading = time.time(), r.reading_options()
    stats: dict[str, int] = {}
    lang = r.lang
    if lang == "auto":
        guess = detect_language(iter_documents(r.sources, **reading))
        lang = guess.lang
        print(f"tokenizer: {guess.describe()}: {_LANG_NAMES[lang]} (--lang to choose)")
    vocab_size = r.vocab_size or (ZH_VOCAB_SIZE if lang == "zh" else VOCAB_SIZE)
    tok = train_tokenizer(
        lambda: iter_documents(r.sources, stats=stats, **reading),
        vocab_size,
        lowercase=r.lowercase,
        strip_accents=r.strip_accents,
        min_frequency=r.min_frequency,
        lang=lang,
    )
    out = save_tokenizer(tok, r.out)
    n = tok.get_vocab_size()
    print(
        f"tokenizer: {n} tokens from {stats.get('documents', 0)} documents ({_LANG_NAMES[lang]}) in "
        f"{time.time() - t0:.1f}s -> {out}"
    )
    if n < vocab_size:
        print(f"note: the corpus yields only {n} of the {vocab_size} tokens asked for (every word is whole)")
    return out
