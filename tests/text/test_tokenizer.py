"""WordPiece tokenizer: training, saving for transformers, loading, hashing, round trips."""

from __future__ import annotations

import json

import pytest

from cramkit.errors import CramkitError
from cramkit.text.sources import iter_documents
from cramkit.text.tokenizer import (
    SpecialIds,
    load_tokenizer,
    save_tokenizer,
    special_ids,
    tokenizer_hash,
    train_tokenizer,
)


def _round_trip_ok(tok, text: str) -> bool | None:
    """decode(encode(text)) equals the normalised text up to whitespace; None when [UNK] is involved."""
    enc = tok.encode(text, add_special_tokens=False)
    if tok.token_to_id("[UNK]") in enc.ids:
        return None
    want = "".join(tok.normalizer.normalize_str(text).split())
    return "".join(tok.decode(enc.ids).split()) == want


def test_saved_files_and_specials(tok_dir, tok):
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tok_dir / name).is_file()
    vocab = (tok_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(vocab) == tok.get_vocab_size()
    assert special_ids(tok) == SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
    assert json.loads((tok_dir / "tokenizer_config.json").read_text())["do_lower_case"] is True
    # raw encodings for the store have no specials; the standard call gets BERT's template
    assert tok.encode("hello world", add_special_tokens=False).ids[0] not in (2, 3)
    ids = tok.encode("hello world").ids
    assert ids[0] == 2 and ids[-1] == 3
    pair = tok.encode("hello", "world").ids
    assert pair[0] == 2 and pair.count(3) == 2


def test_transformers_loads_it_and_encodes_identically(tok_dir, tok):
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertTokenizerFast.from_pretrained(str(tok_dir))
    for text in [
        "Return the value of the named attribute.",
        "Caf\u00e9 NA\u00cfVE \u4e2d\u6587 text",
        "a, b; (c)!",
    ]:
        assert hf(text)["input_ids"] == tok.encode(text).ids
    assert hf("first", "second")["input_ids"] == tok.encode("first", "second").ids
    assert hf.mask_token_id == 4 and hf.pad_token_id == 0


def test_round_trip_on_builtin_corpus(tok, builtin_docs):
    results = [_round_trip_ok(tok, d) for d in builtin_docs[300:400]]
    checked = [r for r in results if r is not None]
    assert len(checked) >= 30  # most documents have no [UNK]
    assert all(checked)


@pytest.mark.integration
def test_round_trip_on_real_corpora(webtext_dir, wikitext_dir):
    files = [webtext_dir / "grail.txt", webtext_dir / "pirates.txt", wikitext_dir / "wiki.valid.tokens"]
    docs = list(iter_documents([str(f) for f in files], encoding="latin-1"))
    tok = train_tokenizer(docs, 4000)  # its alphabet covers every character seen
    results = [_round_trip_ok(tok, d) for d in docs]
    checked = [r for r in results if r is not None]
    assert len(checked) >= 0.95 * len(docs) and all(checked)


def test_cjk_split_and_case_accent_options(builtin_docs):
    docs = (
        builtin_docs[:50] + ["\u6211\u7231\u4e2d\u6587 \u4e2d\u6587\u5b57"] * 3 + ["Caf\u00e9 Caf\u00e9 Na\u00efve"] * 3
    )
    tok = train_tokenizer(docs, 1500)
    assert tok.encode("\u6211\u7231\u4e2d\u6587", add_special_tokens=False).tokens == [
        "\u6211",
        "\u7231",
        "\u4e2d",
        "\u6587",
    ]
    assert tok.decode(tok.encode("Caf\u00e9", add_special_tokens=False).ids) == "cafe"
    cased = train_tokenizer(docs, 1500, lowercase=False, strip_accents=False)
    assert cased.decode(cased.encode("Caf\u00e9", add_special_tokens=False).ids) == "Caf\u00e9"
    assert tokenizer_hash(cased) != tokenizer_hash(tok)


def test_hash_is_stable_and_load_variants(tok, tok_dir, tmp_path):
    h = tokenizer_hash(tok)
    assert h == tokenizer_hash(load_tokenizer(tok_dir / "tokenizer.json"))
    resaved = save_tokenizer(tok, tmp_path / "again")
    assert tokenizer_hash(load_tokenizer(resaved)) == h
    # a bare BERT vocab.txt (e.g. someone else's) loads and encodes the same words
    (tmp_path / "vocab_only").mkdir()
    (tmp_path / "vocab_only" / "vocab.txt").write_bytes((tok_dir / "vocab.txt").read_bytes())
    from_vocab = load_tokenizer(tmp_path / "vocab_only")
    text = "Return the value of the named attribute."
    assert from_vocab.encode(text).ids == tok.encode(text).ids


def test_load_errors(tmp_path):
    with pytest.raises(CramkitError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(CramkitError, match="holds no tokenizer.json or vocab.txt; train one"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CramkitError, match="not a valid tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "v.txt").write_text("a\nb\n")
    with pytest.raises(CramkitError, match="no \\[UNK\\] token"):
        load_tokenizer(tmp_path / "v.txt")


def test_missing_special_tokens_and_empty_corpus(tmp_path):
    from tokenizers import Tokenizer, models

    bare = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    with pytest.raises(
        CramkitError,
        match=r"lacks the special token\(s\) \[PAD\] or <pad>, \[CLS\] or <s>, \[SEP\] or </s>, \[MASK\] or <mask>",
    ):
        special_ids(bare)
    with pytest.raises(CramkitError, match="no documents"):
        train_tokenizer(iter([]), 1000)
    with pytest.raises(CramkitError, match="too small"):
        train_tokenizer(["text"], 3)


_TRAIN_AND_PRINT_VOCAB = """
import sys
from cramkit.text.sources import iter_documents
from cramkit.text.tokenizer import train_tokenizer
tok = train_tokenizer(lambda: iter_documents([sys.argv[1]]), 3000)
v = tok.get_vocab()
print("\\n".join(sorted(v, key=v.get)))
"""


@pytest.mark.integration
def test_training_is_deterministic_across_processes(wikitext_dir):
    # HF's WordPiece trainer alone gives a different vocabulary (or ids) from run to run on this file
    # (huggingface/tokenizers#1794); ours must not
    import subprocess
    import sys

    src = str(wikitext_dir / "wiki.valid.tokens")
    runs = [
        subprocess.run(
            [sys.executable, "-c", _TRAIN_AND_PRINT_VOCAB, src], capture_output=True, text=True, check=True
        ).stdout
        for _ in range(3)
    ]
    assert len(runs[0].splitlines()) == 3000
    assert runs[0] == runs[1] == runs[2]
    vocab = runs[0].splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert "##s" in vocab and "the" in vocab


def test_continuation_symbols_are_ordinary_tokens(wikitext_dir):
    from cramkit.text.sources import iter_documents
    from cramkit.text.tokenizer import train_tokenizer

    tok = train_tokenizer(list(iter_documents([str(wikitext_dir / "wiki.valid.tokens")]))[:200], 1500)
    # only BERT's five special tokens are special: "##x" in the text is ordinary text, not a token
    enc = tok.encode("##e walking", add_special_tokens=False)
    assert enc.tokens[0] != "##e" and enc.offsets[0] == (0, 1)
    assert sorted(t.content for t in tok.get_added_tokens_decoder().values()) == sorted(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )
