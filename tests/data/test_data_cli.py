"""`cramkit tokenizer train`, `cramkit data build|inspect`: outputs, exit codes and messages."""

from __future__ import annotations

import pytest

from cramkit.cli import main
from cramkit.data.tokenstore import TokenStore


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(3):
        paras = [
            f"Paragraph {j} of file {i}: the function returns the value of the named attribute." for j in range(30)
        ]
        (d / f"f{i}.txt").write_text("\n\n".join(paras) + "\n", encoding="utf-8")
    return d


def test_train_build_inspect(tmp_path, corpus, capsys):
    tok = tmp_path / "tok"
    assert (
        main(
            [
                "tokenizer",
                "train",
                str(corpus),
                "--vocab-size",
                "400",
                "--out",
                str(tok),
                "--min-frequency",
                "1",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "tokens from 90 documents" in printed and "note: the corpus yields only" in printed
    out = tmp_path / "store"
    assert main(["data", "build", str(corpus), "--tokenizer", str(tok), "--out", str(out), "--workers", "2"]) == 0
    assert "90 documents" in capsys.readouterr().out
    assert len(TokenStore(out)) == 90
    assert main(["data", "inspect", str(out), "--samples", "2"]) == 0
    text = capsys.readouterr().out
    assert "sequences  90   documents 90" in text and "histogram" in text
    assert "the function returns the value of the named attribute" in text  # decoded samples


def test_builtin_corpus_when_no_source(tmp_path, capsys, builtin_docs):
    tok = tmp_path / "tok"
    assert main(["tokenizer", "train", "--vocab-size", "2000", "--out", str(tok)]) == 0
    out = tmp_path / "store"
    assert main(["data", "build", "--tokenizer", str(tok), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    store = TokenStore(out)
    assert len(store) == len(builtin_docs) and store.meta["sources"] == ["builtin:stdlib-docstrings"]


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.err


def test_bad_inputs_exit_2_with_one_clear_message(tmp_path, corpus, capsys, tok_dir):
    out = str(tmp_path / "s")
    err = _error(capsys, ["data", "build", str(tmp_path / "nope"), "--tokenizer", str(tok_dir), "--out", out])
    assert err.startswith("cramkit: error: source") and "does not exist" in err
    (tmp_path / "bad.txt").write_bytes(b"good text\n\nbad \xff byte\n")
    err = _error(capsys, ["data", "build", str(tmp_path / "bad.txt"), "--tokenizer", str(tok_dir), "--out", out])
    assert "bad.txt is not valid UTF-8" in err and "byte offset 15" in err and "--errors replace" in err
    assert (
        main(
            [
                "data",
                "build",
                str(tmp_path / "bad.txt"),
                "--tokenizer",
                str(tok_dir),
                "--out",
                out,
                "--errors",
                "replace",
            ]
        )
        == 0
    )
    (tmp_path / "bin.txt").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00")
    assert "looks like a binary file" in _error(
        capsys, ["tokenizer", "train", str(tmp_path / "bin.txt"), "--out", str(tmp_path / "t")]
    )
    (tmp_path / "empty.txt").write_text("\n\n")
    assert "no documents" in _error(
        capsys, ["tokenizer", "train", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "t")]
    )
    assert "no documents" in _error(
        capsys,
        ["data", "build", str(tmp_path / "empty.txt"), "--tokenizer", str(tok_dir), "--out", out, "--force"],
    )
    assert "holds no tokenizer.json or vocab.txt" in _error(
        capsys, ["data", "build", str(corpus), "--tokenizer", str(corpus), "--out", out, "--force"]
    )
    # the store built above is intact after all these failures (even with --force)
    assert len(TokenStore(out)) == 2
    idx = tmp_path / "s" / "train.idx"
    idx.write_bytes(idx.read_bytes()[:-5])
    err = _error(capsys, ["data", "inspect", out])
    assert "train.idx is truncated" in err and "rebuild the store" in err
    assert "holds no token store" in _error(capsys, ["data", "inspect", str(corpus)])
    # a store's metadata that is not a JSON object, or not JSON at all
    meta = tmp_path / "s" / "train.json"
    for text, said in (("[1]", "does not hold a JSON object"), ("{nope", "is not valid JSON")):
        meta.write_text(text)
        err = _error(capsys, ["data", "inspect", out])
        assert said in err and "train.json" in err and "rebuild the store" in err
