"""The token store against an independent reader/writer of Megatron's .idx layout (from the issue's text)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from cramkit.data.build import build_store
from cramkit.data.tokenstore import TokenStore, TokenStoreWriter
from cramkit.errors import CramkitError

# dtype codes as the issue lists them
CODES = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f8", 7: "<f4", 8: "<u2"}


def read_megatron(prefix) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, np.dtype]:
    """Independent reader: header, int32 lengths, int64 pointers, int64 document indices, then .bin."""
    raw = Path(f"{prefix}.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack("<Q", raw[9:17])
    (code,) = struct.unpack("<B", raw[17:18])
    (n_seq,) = struct.unpack("<Q", raw[18:26])
    (n_doc,) = struct.unpack("<Q", raw[26:34])
    assert version == 1
    off = 34
    lengths = np.frombuffer(raw, "<i4", n_seq, off)
    off += 4 * n_seq
    pointers = np.frombuffer(raw, "<i8", n_seq, off)
    off += 8 * n_seq
    docs = np.frombuffer(raw, "<i8", n_doc, off)
    off += 8 * n_doc
    assert off == len(raw)
    dtype = np.dtype(CODES[code])
    data = Path(f"{prefix}.bin").read_bytes()
    seqs = [np.frombuffer(data, dtype, int(n), int(p)) for n, p in zip(lengths, pointers, strict=True)]
    return lengths, seqs, docs, dtype


def write_megatron(prefix, seqs: list[list[int]], doc_ends: list[int], code: int = 8) -> None:
    """Independent writer of the same layout (as another tool would produce it)."""
    dtype = np.dtype(CODES[code])
    lengths = np.array([len(s) for s in seqs], "<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize)]).astype("<i8")
    docs = np.array([0, *doc_ends], "<i8")
    with open(f"{prefix}.idx", "wb") as fh:
        fh.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        fh.write(struct.pack("<Q", len(seqs)) + struct.pack("<Q", len(docs)))
        fh.write(lengths.tobytes() + pointers.tobytes() + docs.tobytes())
    with open(f"{prefix}.bin", "wb") as fh:
        for s in seqs:
            fh.write(np.array(s, dtype).tobytes())


@pytest.fixture
def corpus(tmp_path):
    text = "\n\n".join(
        f"Document number {i} says: return the value {i * 7} of the attribute." * (1 + i % 5) for i in range(40)
    )
    (tmp_path / "c.txt").write_text(text + "\n")
    return tmp_path / "c.txt"


def test_build_matches_independent_reader(tmp_path, corpus, tok):
    prefix = build_store([str(corpus)], tok, tmp_path / "store", workers=1)
    lengths, seqs, docs, dtype = read_megatron(prefix)
    assert dtype == np.dtype("<u2")  # vocabulary under 65500
    texts = corpus.read_text().strip().split("\n\n")
    assert len(seqs) == len(texts) == 40
    assert docs.tolist() == list(range(41))  # one sequence per document
    for text, seq in zip(texts, seqs, strict=True):
        assert seq.tolist() == tok.encode(text, add_special_tokens=False).ids
    store = TokenStore(tmp_path / "store")
    assert len(store) == 40 and store.num_tokens == int(lengths.sum())
    assert all(np.array_equal(store[i], seqs[i]) for i in range(40))
    meta = json.loads((tmp_path / "store" / "train.json").read_text())
    assert meta["counts"]["documents"] == 40 and meta["vocab_size"] == tok.get_vocab_size()
    assert meta["special_ids"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


def test_reads_foreign_store_with_multi_sequence_documents(tmp_path):
    seqs = [[5, 6, 7], [8], [9, 10], [70000, 11]]
    write_megatron(tmp_path / "m", seqs, doc_ends=[2, 4], code=4)
    store = TokenStore(tmp_path / "m.idx")
    assert store.dtype == np.int32 and len(store) == 4 and store.num_documents == 2
    assert [store[i].tolist() for i in range(4)] == seqs and store[-1].tolist() == [70000, 11]
    assert store.meta == {}
    store.check_tokenizer(None)  # nothing recorded: nothing to compare


def test_writer_int32_and_round_trip(tmp_path):
    with TokenStoreWriter(tmp_path / "w", np.int32) as w:
        w.add_document([1, 2, 70000])
        w.add_documents(np.array([4, 5, 6]), np.array([1, 2]))
        w.finalize({"note": "x"})
    lengths, seqs, docs, dtype = read_megatron(tmp_path / "w")
    assert dtype == np.dtype("<i4") and [s.tolist() for s in seqs] == [[1, 2, 70000], [4], [5, 6]]
    assert docs.tolist() == [0, 1, 2, 3]
    assert not list(tmp_path.glob(".*"))  # no temporary files left


def test_interrupted_writer_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), TokenStoreWriter(tmp_path / "w") as w:
        w.add_document([1, 2, 3])
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("which", ["idx", "bin"])
def test_truncated_files_are_clear_errors(tmp_path, which):
    write_megatron(tmp_path / "t", [[1, 2, 3], [4, 5]], doc_ends=[1, 2])
    f = tmp_path / f"t.{which}"
    f.write_bytes(f.read_bytes()[:-3])
    with pytest.raises(CramkitError, match=rf"t\.{which} is truncated.*rebuild the store"):
        TokenStore(tmp_path / "t")


def test_bad_header_missing_files_and_ambiguous_dirs(tmp_path):
    with pytest.raises(CramkitError, match="holds no token store"):
        TokenStore(tmp_path)
    write_megatron(tmp_path / "a", [[1]], [1])
    (tmp_path / "b.idx").write_bytes(b"NOTMEGATRON" + bytes(40))
    (tmp_path / "b.bin").write_bytes(b"")
    with pytest.raises(CramkitError, match="several stores"):
        TokenStore(tmp_path)
    with pytest.raises(CramkitError, match="b.idx is not a Megatron token index"):
        TokenStore(tmp_path, name="b")
    assert TokenStore(tmp_path, name="a")[0].tolist() == [1]
    (tmp_path / "a.bin").unlink()
    with pytest.raises(CramkitError, match="a.bin is missing"):
        TokenStore(tmp_path / "a")


def test_wrong_tokenizer_is_detected(tmp_path, corpus, tok, builtin_docs):
    from cramkit.text.tokenizer import train_tokenizer

    build_store([str(corpus)], tok, tmp_path / "s", workers=1)
    store = TokenStore(tmp_path / "s")
    store.check_tokenizer(tok)
    other = train_tokenizer(builtin_docs[:40], 1000)
    with pytest.raises(CramkitError, match="built with another tokenizer.*rebuild the store"):
        store.check_tokenizer(other)
