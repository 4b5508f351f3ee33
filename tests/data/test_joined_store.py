"""A store joined from shards (`data build --shard i/N`, then `data join`) is one token store to every verb
that takes one: `pretrain`, `embed` and `index build` read it, named as its directory, its prefix or its
manifest, the same way (data.tokenstore.is_store decides it for all of them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clirun import ok
from conftest import run_pretrain
from cramkit.data.tokenstore import TokenStore, is_store


@pytest.fixture(scope="module")
def joined(tmp_path_factory, builtin_docs, tok_dir) -> Path:
    src = tmp_path_factory.mktemp("texts")
    for i in range(4):
        (src / f"part{i}.txt").write_text("\n\n".join(builtin_docs[i * 60 : (i + 1) * 60]) + "\n", encoding="utf-8")
    out = tmp_path_factory.mktemp("joined") / "store"
    for i in range(2):
        ok("data", "build", src, "--tokenizer", tok_dir, "--out", out, "--shard", f"{i}/2", "--workers", "1", "--quiet")
    ok("data", "join", out)
    assert sorted(p.name for p in out.glob("*.idx")) == ["train-00000.idx", "train-00001.idx"]
    return out


def test_every_name_of_a_joined_store_is_a_store(joined: Path, tmp_path: Path) -> None:
    for name in (joined, joined / "train", joined / "train.json"):
        assert is_store(name), name
        assert len(TokenStore(name)) == len(TokenStore(joined))
    text = tmp_path / "reviews.json"  # a JSON text file is not a store, nor a folder of text beside an index
    text.write_text('{"text": "a"}\n', encoding="utf-8")
    assert not is_store(text) and not is_store(tmp_path / "missing")
    (tmp_path / "a.idx").write_bytes(b"")
    (tmp_path / "a.txt").write_text("text\n", encoding="utf-8")
    assert not is_store(tmp_path)


def test_pretrain_embed_and_index_read_a_joined_store(joined: Path, pretrained_run: Path, tmp_path: Path) -> None:
    rows = len(TokenStore(joined))
    run = run_pretrain(tmp_path / "run", str(joined / "train"), steps=2)
    assert (run / "checkpoints").is_dir()
    out = ok("embed", joined, "--from", pretrained_run, "--out", tmp_path / "emb")
    assert "store" in out or (tmp_path / "emb" / "embed.json").is_file()
    import numpy as np

    assert np.load(tmp_path / "emb" / "embeddings.npy", mmap_mode="r").shape[0] == rows
    ok("index", "build", joined / "train.json", "--encoder", pretrained_run, "--out", tmp_path / "idx")
    assert (tmp_path / "idx" / "index.json").is_file()
