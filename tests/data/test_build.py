"""Parallel store build: determinism across worker counts, filters, atomicity, real corpora."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cramkit.data.build import build_store
from cramkit.data.tokenstore import TokenStore
from cramkit.errors import CramkitError
from cramkit.text.sources import iter_documents


def _files(prefix) -> dict[str, bytes]:
    return {sfx: Path(f"{prefix}{sfx}").read_bytes() for sfx in (".bin", ".idx", ".json")}


def test_identical_for_any_worker_count_and_repeatable(tmp_path, tok, builtin_docs):
    src = tmp_path / "docs.txt"
    src.write_text("\n\n".join(d.replace("\n\n", "\n") for d in builtin_docs[:120]) + "\n")
    a = build_store([str(src)], tok, tmp_path / "a", workers=1, batch_chars=4096)
    b = build_store([str(src)], tok, tmp_path / "b", workers=2, batch_chars=4096)
    c = build_store([str(src)], tok, tmp_path / "c", workers=3, batch_chars=4096)
    assert _files(a) == _files(b) == _files(c)
    d = build_store([str(src)], tok, tmp_path / "a", workers=2, batch_chars=4096)  # rebuild in place
    assert _files(d) == _files(a)
    assert len(TokenStore(a)) == len(list(iter_documents([str(src)]))) > 120


def test_dedup_quality_filter_and_counts(tmp_path, tok):
    good = "The function returns the value of the named attribute of the object."
    junk = "zq9x7 kk2j3 0x9f8e7d 1a2b3c4d qqq777zzz"
    (tmp_path / "t.txt").write_text("\n\n".join([good, junk, good, "\u200b\u200b", good + " Again."]) + "\n")
    out = build_store([str(tmp_path / "t.txt")], tok, tmp_path / "s", workers=1, dedup=True, quality_cutoff=0.3)
    store = TokenStore(out)
    c = store.meta["counts"]
    assert c["documents_read"] == 4 and c["duplicates_dropped"] == 1
    assert c["quality_dropped"] == 1 and c["documents"] == len(store) == 2
    assert len(tok.encode(junk, add_special_tokens=False).ids) > 0.3 * len(junk)
    assert store[0].tolist() == tok.encode(good, add_special_tokens=False).ids


def test_empty_corpus_and_everything_filtered(tmp_path, tok):
    (tmp_path / "empty.txt").write_text("\n  \n\n")
    with pytest.raises(CramkitError, match="no documents found in .*empty.txt"):
        build_store([str(tmp_path / "empty.txt")], tok, tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()  # nothing created
    (tmp_path / "junk.txt").write_text("x9q z8k\n")
    with pytest.raises(CramkitError, match="all 1 documents were dropped"):
        build_store([str(tmp_path / "junk.txt")], tok, tmp_path / "out", workers=1, quality_cutoff=0.01)
    with pytest.raises(CramkitError, match="--workers 0"):
        build_store([str(tmp_path / "junk.txt")], tok, tmp_path / "out", workers=0)


def test_failed_rebuild_keeps_the_old_store(tmp_path, tok):
    (tmp_path / "ok.txt").write_text("Return the value.\n\nAnother document here.\n")
    (tmp_path / "zbad.txt").write_bytes(b"fine text\n\n" * 2000 + b"caf\xe9\n")
    out = tmp_path / "store"
    build_store([str(tmp_path / "ok.txt")], tok, out, workers=1)
    before = _files(out / "train")
    for workers in (1, 2):
        with pytest.raises(CramkitError, match=r"zbad.txt is not valid UTF-8.*byte offset 22003"):
            build_store(
                [str(tmp_path / "ok.txt"), str(tmp_path / "zbad.txt")],
                tok,
                out,
                workers=workers,
                batch_chars=64,
            )
        assert _files(out / "train") == before
        assert sorted(p.name for p in out.iterdir()) == [
            "train.bin",
            "train.idx",
            "train.json",
            "train.tokenizer.json",
        ]


def test_tokenizer_from_path_and_round_trip(tmp_path, tok_dir, tok):
    (tmp_path / "t.txt").write_text("Caf\u00e9 au lait, \u4e2d\u6587.\n\nReturn the VALUE of x.\n")
    store = TokenStore(build_store([str(tmp_path / "t.txt")], str(tok_dir), tmp_path / "s", workers=1))
    assert store.meta["tokenizer_path"] == str(tok_dir.resolve())
    assert tok.decode(store[1].tolist()) == "return the value of x."
    store.check_tokenizer(tok)


def test_real_corpora(tmp_path, tok, novels_dir, webtext_dir, wikitext_dir):
    novels = sorted(novels_dir.glob("*.txt"))[:2]
    sources = [str(p) for p in novels] + [str(webtext_dir), str(wikitext_dir / "wiki.valid.tokens")]
    out = build_store(sources, tok, tmp_path / "real", workers=2, errors="replace")
    store = TokenStore(out)
    docs = list(iter_documents(sources, errors="replace"))
    assert len(store) == len(docs) > 1000
    assert store.num_tokens > 500_000
    for i in np.linspace(0, len(docs) - 1, 25).astype(int):
        assert store[i].tolist() == tok.encode(docs[i], add_special_tokens=False).ids


# this process's peak RSS in KiB. Not getrusage(RUSAGE_SELF).ru_maxrss: Linux carries that high-water mark
# over execve, so a subprocess would report the (large) pytest process it was forked from.
_PEAK_KB = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])"


@pytest.mark.slow
def test_single_line_of_hundreds_of_megabytes_in_bounded_memory(tmp_path, tok_dir):
    """A 300 MB file without a line break: read in bounded memory; a 30 MB one built into a store."""
    import subprocess
    import sys

    words = " ".join(f"word{i % 5000}" for i in range(100_000)) + " "
    huge = tmp_path / "huge.txt"
    with open(huge, "w") as fh:
        for _ in range(300_000_000 // len(words)):
            fh.write(words)
    size = huge.stat().st_size
    code = (
        "import resource, sys\n"
        "from cramkit.text import iter_documents\n"
        "n = sum(len(d.split()) for d in iter_documents([sys.argv[1]]))\n"
        "print(n, " + _PEAK_KB + ")\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(huge)], capture_output=True, text=True, check=True).stdout
    n_words, peak_kb = map(int, out.split())
    assert n_words == size // len(words) * 100_000
    assert peak_kb < 200_000  # bounded: far below the file's 300 MB
    small = tmp_path / "small.txt"
    small.write_bytes(huge.read_bytes()[:30_000_000])
    code = (
        "import resource, sys\n"
        "from cramkit.data import build_store, TokenStore\n"
        "p = build_store([sys.argv[1]], sys.argv[2], sys.argv[3], workers=2)\n"
        "r = max(" + _PEAK_KB + ", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "print(TokenStore(p).num_tokens, r)\n"
    )
    argv = [sys.executable, "-c", code, str(small), str(tok_dir), str(tmp_path / "store")]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    tokens, peak_kb = map(int, out.split())
    assert tokens > 1_000_000 and peak_kb < 400_000
