"""Text sources: encodings, line ends, document splits, formats, bad input, the built-in corpus."""

from __future__ import annotations

import gzip
import json

import pytest

from cramkit.errors import CramkitError
from cramkit.text import sources
from cramkit.text.sources import builtin_documents, iter_documents


def docs(*args, **kwargs) -> list[str]:
    return list(iter_documents(*args, **kwargs))


def test_bom_crlf_cr_nel_linesep_are_unified(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes("\ufeffFirst line\r\nsecond\rthird\u0085fourth\u2028fifth\r\n\r\nNext doc\r\n".encode())
    assert docs([str(f)]) == ["First line\nsecond\nthird\nfourth\nfifth", "Next doc"]


def test_crlf_split_across_chunks_and_multibyte_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_BYTES", 3)
    f = tmp_path / "a.txt"
    f.write_bytes("ab\r\ncd\r\n\r\n\u00e9\u00e9\u4e2d\u00e9\r\n".encode())
    assert docs([str(f)]) == ["ab\ncd", "\u00e9\u00e9\u4e2d\u00e9"]


@pytest.mark.parametrize("chunk", [4, 1 << 20])
def test_invalid_utf8_names_file_and_byte_offset(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(sources, "CHUNK_BYTES", chunk)
    f = tmp_path / "bad.txt"
    f.write_bytes(b"hello world\n\ncaf\xe9 au lait\n")
    with pytest.raises(CramkitError) as exc:
        docs([str(f)])
    msg = str(exc.value)
    assert "bad.txt" in msg and "byte offset 16" in msg and "--encoding cp1252" in msg and "--errors replace" in msg
    assert docs([str(f)], errors="replace") == ["hello world", "caf\ufffd au lait"]
    assert docs([str(f)], encoding="latin-1") == ["hello world", "caf\u00e9 au lait"]


def test_binary_file_is_refused(tmp_path):
    f = tmp_path / "blob.txt"
    f.write_bytes(b"abc" + bytes(range(256)) * 4)
    with pytest.raises(CramkitError, match=r"blob.txt looks like a binary file \(NUL byte at byte offset 3\)"):
        docs([str(f)])


def test_missing_path_empty_dir_and_unmatched_glob(tmp_path):
    with pytest.raises(CramkitError, match="nope.txt' does not exist"):
        docs([str(tmp_path / "nope.txt")])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "image.png").write_bytes(b"\x89PNG")
    with pytest.raises(CramkitError, match="holds no text files"):
        docs([str(tmp_path / "empty")])
    with pytest.raises(CramkitError, match="matches no files"):
        docs([str(tmp_path / "*.txt")])
    with pytest.raises(CramkitError, match="unknown encoding"):
        docs([str(tmp_path)], encoding="no-such-codec")
    with pytest.raises(CramkitError, match="unknown document split"):
        docs([str(tmp_path)], doc_split="sentences")


def test_directory_glob_order_and_split_modes(tmp_path):
    (tmp_path / "b.txt").write_text("b one\n\nb two\n")
    (tmp_path / "a.txt").write_text("a one\nstill a one\n\n\n\na two\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("c\n")
    (tmp_path / "notes.md").write_text("not corpus\n")
    assert docs([str(tmp_path)]) == ["a one\nstill a one", "a two", "b one", "b two", "c"]
    assert docs([str(tmp_path / "*.txt")], doc_split="file") == [
        "a one\nstill a one\n\na two",
        "b one\n\nb two",
    ]


def test_wikitext_headings(tmp_path):
    text = (
        " \n = Alpha = \n \n Alpha text . \n \n = = Section = = \n \n More alpha . \n \n = Beta = \n \n Beta text . \n"
    )
    (tmp_path / "w.tokens").write_text(text)
    (tmp_path / "w.txt").write_text(text)
    for name in ("w.tokens", "w.txt"):  # by suffix, and by sniffing the headings
        got = docs([str(tmp_path / name)])
        assert len(got) == 2
        assert got[0].startswith("Alpha\n") and "More alpha" in got[0] and "= Section =" in got[0]
        assert got[1].startswith("Beta\n") and "Beta text" in got[1]
    assert len(docs([str(tmp_path / "w.txt")], doc_split="blank")) > 2


def test_compressed_jsonl_parquet(tmp_path):
    with gzip.open(tmp_path / "a.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write("gz one\n\ngz two\n")
    import zstandard

    (tmp_path / "b.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"zst one\n\nzst two\n"))
    rows = [{"text": "json one", "id": 1}, {"text": "json\ntwo", "id": 2}, {"text": None}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["pq one", "pq two"], "n": [1, 2]}), tmp_path / "d.parquet")
    assert docs([str(tmp_path / "a.txt.gz"), str(tmp_path / "b.txt.zst"), str(tmp_path / "c.jsonl")]) == [
        "gz one",
        "gz two",
        "zst one",
        "zst two",
        "json one",
        "json\ntwo",
    ]
    assert docs([str(tmp_path / "d.parquet")], text_field="body") == ["pq one", "pq two"]
    with pytest.raises(CramkitError, match=r"no column 'text' \(columns: body, n\).*--text-field"):
        docs([str(tmp_path / "d.parquet")])
    with pytest.raises(CramkitError, match=r"c.jsonl line 1: no field 'body' \(has: text, id\)"):
        docs([str(tmp_path / "c.jsonl")], text_field="body")
    (tmp_path / "e.jsonl").write_text('{"text": "ok"}\n{broken\n')
    with pytest.raises(CramkitError, match="e.jsonl line 2: not valid JSON"):
        docs([str(tmp_path / "e.jsonl")])
    (tmp_path / "f.txt.gz").write_bytes(gzip.compress(b"truncated stream " * 100)[:40])
    with pytest.raises(CramkitError, match="f.txt.gz"):
        docs([str(tmp_path / "f.txt.gz")])


def test_hf_source_without_datasets_or_offline_is_a_clear_error():
    with pytest.raises(CramkitError, match="hf:wikitext"):
        docs(["hf:wikitext:wikitext-2-raw-v1:train"])
    with pytest.raises(CramkitError, match="hf:NAME"):
        docs(["hf:"])


def test_huge_single_line_is_read_in_bounded_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(sources, "MAX_DOC_CHARS", 10_000)
    words = [f"w{i}" for i in range(60_000)]  # ~400 KB on one line, no line break at all
    (tmp_path / "one.txt").write_text(" ".join(words))
    got = docs([str(tmp_path / "one.txt")], max_doc_chars=10_000)
    assert len(got) > 30
    assert max(map(len, got)) <= 10_000
    assert " ".join(got).split() == words  # cut at whitespace: no word broken or lost


def test_dedup_and_normalisation(tmp_path):
    (tmp_path / "a.txt").write_text("same text\n\nother\n\nsame text\n\ncafe\u0301\n")
    stats: dict = {}
    got = docs([str(tmp_path / "a.txt")], dedup=True, stats=stats)
    assert got == ["same text", "other", "caf\u00e9"]  # NFC composes e + combining acute
    assert stats == {"documents": 3, "duplicates": 1, "files": 1}
    assert docs([str(tmp_path / "a.txt")], normalize=None)[-1] == "cafe\u0301"


def test_builtin_corpus_is_real_prose_and_deterministic(builtin_docs):
    total = sum(map(len, builtin_docs))
    assert 1_000_000 < total < 4_000_000
    assert len(builtin_docs) > 300
    assert builtin_docs == docs(None)
    assert len(list(builtin_documents())) == len(builtin_docs)
    assert any("Return" in d for d in builtin_docs)
    assert docs([])[:5] == builtin_docs[:5]


def test_module_docstrings_read_with_ast_without_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        '"""Module docstring that is long enough to be kept here."""\nraise SystemExit(1)\n'
        'def f():\n    """Function docstring that is long enough to be kept too."""\n'
    )
    got = sources._module_docs(f)
    assert (
        got == "Module docstring that is long enough to be kept here.\n\n"
        "Function docstring that is long enough to be kept too."
    )
    (tmp_path / "bad.py").write_text("def (:\n")
    assert sources._module_docs(tmp_path / "bad.py") == ""


# ------------------------------------------------------------------------------------- real corpora


def test_webtext_latin1_and_nel(webtext_dir):
    with pytest.raises(CramkitError, match=r"firefox.txt is not valid UTF-8: bad byte b'\\xe4' at byte offset 64936"):
        docs([str(webtext_dir)])
    got = docs([str(webtext_dir)], errors="replace")
    assert len(got) > 1000
    assert not any("\r" in d or "\x85" in d or "\u2028" in d for d in got)
    firefox = docs([str(webtext_dir / "firefox.txt")], encoding="latin-1")
    assert any("Fahrpl\u00e4ne" in d for d in firefox)
    wine = docs([str(webtext_dir / "wine.txt")], errors="replace")
    assert not any("\x85" in d for d in wine)


def test_novel_bom_crlf(novels_dir):
    f = sorted(novels_dir.glob("*.txt"))[0]
    assert f.read_bytes().startswith(b"\xef\xbb\xbf") and b"\r\n" in f.read_bytes()[:1000]
    got = docs([str(f)])
    assert got[0].startswith("CLARA VAUGHAN\nBOOK I.\nCHAPTER I.\nI do not mean")
    assert not any("\r" in d or "\ufeff" in d for d in got)
    # no blank lines in this novel: it comes in pieces of at most MAX_DOC_CHARS, nothing lost
    assert len(got) > 1 and max(map(len, got)) <= sources.MAX_DOC_CHARS
    assert " ".join(got).split() == f.read_text(encoding="utf-8-sig").split()


def test_wikitext_real_articles(wikitext_dir):
    got = docs([str(wikitext_dir / "wiki.valid.tokens")])
    assert got[0].startswith("Homarus gammarus\n")
    assert 50 <= len(got) <= 70  # WikiText-2 validation has 60 articles
    assert all("\n = = " not in d.split("\n", 1)[0] for d in got)


def test_a_csv_is_read_by_its_column_never_its_header_or_labels(tmp_path):
    """A task's CSV given to pretraining: the named column's text only (quoted commas and newlines kept)."""
    f = tmp_path / "reviews.csv"
    f.write_text('review,label\n"A fine, quiet film.",positive\n"Dull.\nVery dull.",negative\n,positive\n')
    with pytest.raises(
        CramkitError,
        match=r"reviews.csv is a table with the columns review, label and no 'text'.*"
        r"never the header or the labels.*--text-field review",
    ):
        list(iter_documents([str(f)]))
    docs = list(iter_documents([str(f)], text_field="review"))
    assert docs == ["A fine, quiet film.", "Dull.\nVery dull."]
    tsv = tmp_path / "dev.tsv"
    tsv.write_text('sentence\tlabel\nsays "hello" twice\t1\n')
    assert list(iter_documents([str(tsv)], text_field="sentence")) == ['says "hello" twice']
    bad = tmp_path / "bad.csv"
    bad.write_text("text,label\nonly one column\nfine,1\n")
    with pytest.raises(CramkitError, match=r"bad.csv line 2: expected 2 columns \(as the header\), found 1"):
        list(iter_documents([str(bad)]))
    (tmp_path / "gz.csv.gz").write_bytes(gzip.compress(b"text\nx\n"))
    with pytest.raises(CramkitError, match="compressed table; decompress it first"):
        list(iter_documents([str(tmp_path / "gz.csv.gz")]))


@pytest.mark.integration
def test_pretrain_on_a_csv_trains_on_the_column(tmp_path):
    """Through the real command: refused with one line without --text-field, then the store holds the reviews'
    tokens and none of the label words."""
    import subprocess
    import sys

    f = tmp_path / "reviews.csv"
    rows = [f'"review number {i} was {"glowing" if i % 2 else "scathing"}",LABELPOS{i % 2}' for i in range(400)]
    f.write_text("review,sentiment\n" + "\n".join(rows) + "\n")
    base = [sys.executable, "-m", "cramkit", "pretrain", str(f), "--preset", "tiny-cpu", "--budget", "1steps"]
    base += ["--no-progress", "--set", "train.micro_batch=2", "--set", "train.batch_size=2", "--set", "data.seq_len=32"]
    proc = subprocess.run([*base, "--out", str(tmp_path / "r0")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--text-field review" in proc.stderr
    run = tmp_path / "r1"
    proc = subprocess.run(
        [*base, "--text-field", "review", "--out", str(run)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    vocab = (run / "tokenizer" / "vocab.txt").read_text().split()
    assert "glowing" in vocab and not any("labelpos" in w.lower() or w == "sentiment" for w in vocab)


def test_encoding_auto_reads_each_file_in_its_own_encoding(webtext_dir, tmp_path, capsys, monkeypatch):
    """A folder of mixed encodings (NLTK's webtext: firefox.txt is Latin-1, the others UTF-8): one --encoding
    garbles some files, --encoding auto reads each as it was written (UTF-8, else cp1252) and says which."""
    from cramkit.text import encoding

    monkeypatch.setattr(encoding, "_NOTED", set())  # noted once per file and process: other tests read it too
    utf8 = docs([str(webtext_dir / "grail.txt")])
    got = docs([str(webtext_dir)], encoding="auto")
    assert any("Fahrpl\u00e4ne" in d for d in got)  # firefox.txt read as cp1252
    assert set(utf8) <= set(got)  # the UTF-8 files unchanged
    err = capsys.readouterr().err
    assert "firefox.txt is not UTF-8; reading it as cp1252 (--encoding auto)" in err and "grail.txt" not in err
    table = tmp_path / "t.csv"
    table.write_bytes("text,label\ncaf\u00e9 cr\u00e8me,1\n".encode("cp1252"))
    assert docs([str(table)], encoding="auto") == ["caf\u00e9 cr\u00e8me"]
    with pytest.raises(CramkitError, match=r"t.csv is not valid UTF-8 .*or auto: each file UTF-8, else cp1252"):
        docs([str(table)])
