"""Fixtures for the trainer tests: a small real token store (webtext) and a tiny model config."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY = [
    "model.hidden=64",
    "model.layers=2",
    "model.heads=2",
    "model.intermediate=128",
    "data.seq_len=64",
    "data.validation_fraction=0.05",
    "train.micro_batch=8",
    "train.batch_size=8",
    "train.batch_ramp=0",
    "train.eval_batches=4",
    "train.log_every=1",
    "train.progress=false",
    "train.threads=1",
]


@pytest.fixture
def tiny() -> list[str]:
    """--set overrides for a tiny model and short, silent, single-threaded runs."""
    return list(TINY)


@pytest.fixture(scope="session")
def wiki_files(wikitext_dir: Path) -> list[str]:
    return [str(wikitext_dir / "wiki.valid.tokens")]


@pytest.fixture(scope="session")
def small_store(tmp_path_factory: pytest.TempPathFactory, wikitext_dir: Path) -> Path:
    """A token store (tokenizer vocabulary 1000) built from WikiText-2's test split."""
    from cramkit.data.build import build_store
    from cramkit.text.sources import iter_documents
    from cramkit.text.tokenizer import save_tokenizer, train_tokenizer

    root = tmp_path_factory.mktemp("store")
    files = [str(wikitext_dir / "wiki.test.tokens")]
    tok = train_tokenizer(iter_documents(files), 1000)
    save_tokenizer(tok, root / "tokenizer")
    build_store(files, tok, root / "store", name="train", workers=1)
    return root / "store"
