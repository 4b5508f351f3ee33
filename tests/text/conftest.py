"""Fixtures for the text layer: a small WordPiece tokenizer trained on the built-in corpus."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def builtin_docs() -> list[str]:
    from cramkit.text.sources import iter_documents

    return list(iter_documents())


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory, builtin_docs):
    """A 3000-token tokenizer trained on the stdlib docstrings, saved with save_tokenizer."""
    from cramkit.text.tokenizer import save_tokenizer, train_tokenizer

    tok = train_tokenizer(builtin_docs[:300], 3000)
    return save_tokenizer(tok, tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="session")
def tok(tok_dir):
    from cramkit.text.tokenizer import load_tokenizer

    return load_tokenizer(tok_dir)
