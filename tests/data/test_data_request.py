"""`cramkit data build|join|inspect` and `cramkit tokenizer train` are their requests' functions
(cramkit.data.verbs, cramkit.text.verbs.tokenizer_train): each takes one request or its fields, and a rule of
what may be done gives the same line from the command line and from Python."""

from __future__ import annotations

from pathlib import Path

import pytest

from cramkit.cli import main
from cramkit.data.request import DataBuildRequest, DataInspectRequest
from cramkit.data.tokenstore import TokenStore
from cramkit.data.verbs import data_build, data_inspect
from cramkit.errors import CramkitError
from cramkit.text.request import TokenizerTrainRequest
from cramkit.text.tokenizer import load_tokenizer
from cramkit.text.verbs import tokenizer_train


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    text = "\n\n".join(f"Paragraph {j}: the function returns the value of the named attribute." for j in range(40))
    (tmp_path / "a.txt").write_text(text + "\n", encoding="utf-8")
    return tmp_path / "a.txt"


def test_a_request_or_its_fields(tmp_path: Path, corpus: Path, tok_dir: Path, capsys) -> None:
    tokenizer_train(TokenizerTrainRequest(sources=[str(corpus)], out=tmp_path / "t1", vocab_size=200, lang="generic"))
    tokenizer_train(corpus, out=tmp_path / "t2", vocab_size=200, lang="generic")  # one path, as keywords
    assert load_tokenizer(tmp_path / "t1").get_vocab() == load_tokenizer(tmp_path / "t2").get_vocab()
    one = data_build(DataBuildRequest(sources=[str(corpus)], tokenizer=str(tok_dir), out=tmp_path / "s", workers=1))
    two = data_build([str(corpus)], tokenizer=str(tok_dir), out=tmp_path / "s", name="again", workers=1)
    assert one.name == "train" and two.name == "again"
    assert [list(a) for a in TokenStore(one)] == [list(b) for b in TokenStore(two)]
    assert ": 40 documents, " in capsys.readouterr().out  # the command line's lines, from Python too
    shown = data_inspect(DataInspectRequest(store=tmp_path / "s", name="again", samples=1))
    assert shown == data_inspect(tmp_path / "s", name="again", samples=1) and "histogram" in shown


def test_a_rule_is_the_same_line_from_both_doors(tmp_path: Path, corpus: Path, tok_dir: Path, capsys) -> None:
    argv = ["data", "build", str(corpus), "--tokenizer", str(tok_dir), "--out", str(tmp_path / "s"), "--quiet"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 2  # the store is there: not replaced without --force
    line = capsys.readouterr().err.strip()
    with pytest.raises(CramkitError) as python:
        data_build(corpus, tokenizer=tok_dir, out=tmp_path / "s")
    assert line == f"cramkit: error: {python.value}" and "--force" in line
    assert main([*argv, "--shard", "2/2"]) == 2
    line = capsys.readouterr().err.strip()
    with pytest.raises(CramkitError) as python:
        data_build(corpus, tokenizer=tok_dir, out=tmp_path / "s", shard="2/2")
    assert line == f"cramkit: error: {python.value}"
