"""Tang et al.'s transfer set on real SST-2 / MRPC sentences: rates, POS tags kept, n-grams, seeds, pairs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cramkit.distillation.augment import MASK, AugmentConfig, PosTable, build_transfer, edit, load_tagger, words
from cramkit.errors import CramkitError


@pytest.fixture(scope="module")
def tagged(sst2_rows, nltk_data):
    """400 real SST-2 training sentences, their words and NLTK tags, and the per-tag unigram table."""
    sents = [words(t) for t, _ in sst2_rows["train"][:400]]
    tags = [[t for _, t in s] for s in load_tagger().tag_sents(sents)]
    table = PosTable([list(zip(w, t, strict=True)) for w, t in zip(sents, tags, strict=True)])
    return sents, tags, table


def test_mask_rate_and_no_edit_without_probabilities(tagged):
    sents, tags, table = tagged
    rng = np.random.default_rng(0)
    cfg = AugmentConfig(p_mask=0.3, p_pos=0.0, p_ng=0.0)
    masked = total = 0
    for w, t in zip(sents, tags, strict=True):
        out = edit(w, t, table, cfg, rng)
        assert len(out) == len(w)
        for a, b in zip(w, out, strict=True):
            assert b in (a, MASK)
        masked += sum(x == MASK for x in out)
        total += len(w)
    assert total > 3000
    assert abs(masked / total - 0.3) < 0.03
    none = AugmentConfig(p_mask=0.0, p_pos=0.0, p_ng=0.0)
    assert all(edit(w, t, table, none, rng) == w for w, t in zip(sents, tags, strict=True))


def test_pos_replacement_keeps_the_tag_and_follows_the_unigram_distribution(tagged):
    sents, tags, table = tagged
    rng = np.random.default_rng(1)
    cfg = AugmentConfig(p_mask=0.0, p_pos=1.0, p_ng=0.0)
    changed = 0
    for w, t in zip(sents, tags, strict=True):
        out = edit(w, t, table, cfg, rng)
        for new, old, tag in zip(out, w, t, strict=True):
            assert new in table.words[tag], f"{new!r} was never tagged {tag} in the training set"
            changed += new != old
    assert changed > 1000
    # the sampled frequency of a frequent determiner matches its unigram share within DT
    dt = table.words["DT"]
    share = np.diff(np.concatenate([[0.0], table.cum["DT"]]))[dt.index("the")]
    draws = [table.sample("DT", u) for u in np.random.default_rng(2).random(20000)]
    assert abs(draws.count("the") / len(draws) - share) < 0.02
    assert table.sample("NO-SUCH-TAG", 0.5) is None


def test_ngram_sampling_lengths(tagged):
    sents, tags, table = tagged
    rng = np.random.default_rng(3)
    cfg = AugmentConfig(p_mask=0.0, p_pos=0.0, p_ng=1.0, max_ngram=5)
    lengths = set()
    for w, t in zip(sents, tags, strict=True):
        if len(w) < 8:
            continue
        out = edit(w, t, table, cfg, rng)
        assert 1 <= len(out) <= 5
        # a contiguous run of the sentence
        assert any(w[i : i + len(out)] == out for i in range(len(w)))
        lengths.add(len(out))
    assert lengths == {1, 2, 3, 4, 5}
    half = AugmentConfig(p_mask=0.0, p_pos=0.0, p_ng=0.25)
    long = [(w, t) for w, t in zip(sents, tags, strict=True) if len(w) >= 8]
    cut = np.mean([len(edit(w, t, table, half, rng)) < len(w) for w, t in long * 5])
    assert abs(cut - 0.25) < 0.05


def _rows(root: Path) -> list[list]:
    return [json.loads(x) for x in (root / "transfer.jsonl").read_text(encoding="utf-8").splitlines()]


def test_transfer_set_is_seeded_deduplicated_and_independent_of_workers(sst2_rows, nltk_data, tmp_path):
    rows = sst2_rows["train"][:600]
    a, y = [t for t, _ in rows], [int(lab) for _, lab in rows]
    cfg = dict(n_iter=4)
    one = build_transfer(tmp_path / "w1", a, None, y, AugmentConfig(**cfg, workers=1), progress=False)
    two = build_transfer(tmp_path / "w2", a, None, y, AugmentConfig(**cfg, workers=2), progress=False)
    assert (tmp_path / "w1" / "transfer.jsonl").read_bytes() == (tmp_path / "w2" / "transfer.jsonl").read_bytes()
    other = build_transfer(tmp_path / "s1", a, None, y, AugmentConfig(**cfg, seed=1), progress=False)
    assert other.texts_a[600:] != one.texts_a[600:]
    got = _rows(tmp_path / "w2")
    keys = [(r[0], r[1]) for r in got]
    assert len(keys) == len(set(keys)) == two.manifest["rows"]
    # originals first, verbatim with their labels; copies unlabelled
    assert [r[0] for r in got[:600]] == a and [r[2] for r in got[:600]] == y and all(r[3] for r in got[:600])
    assert all(r[2] is None and not r[3] for r in got[600:])
    assert two.manifest["copies"] + two.manifest["duplicates_dropped"] == 600 * 4
    assert 0.5 * 2400 < two.manifest["copies"] <= 2400  # SST-2 has many 1-3 word phrases: duplicates
    assert sum(MASK in t for t in two.texts_a[600:]) > 0.3 * two.manifest["copies"]
    student_a, _ = two.rendered("[UNK]")
    assert not any(MASK in t for t in student_a) and sum("[UNK]" in t for t in student_a) > 100
    # complete sets are reused as they are
    again = build_transfer(tmp_path / "w1", a[:10], None, y[:10], AugmentConfig(**cfg), progress=False)
    assert len(again) == len(one)


def test_pairs_edit_the_first_the_second_or_both(shared_data, nltk_data, tmp_path):
    lines = (shared_data / "glue" / "MRPC" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:201]
    fields = [x.split("\t") for x in lines]
    a, b, y = [f[3] for f in fields], [f[4] for f in fields], [int(f[0]) for f in fields]
    ts = build_transfer(tmp_path / "p", a, b, y, AugmentConfig(), progress=False)
    assert ts.manifest["config"]["n_iter"] == 10 and ts.manifest["pairs"]
    wa, wb = {" ".join(words(x)) for x in a}, {" ".join(words(x)) for x in b}
    only_a = only_b = both = 0
    for x, z in zip(ts.texts_a[200:], ts.texts_b[200:], strict=True):
        ka, kb = x in wa, z in wb
        only_b += ka and not kb
        only_a += kb and not ka
        both += not ka and not kb
    assert min(only_a, only_b, both) > 100


def test_missing_tagger_says_how_to_install_it(monkeypatch, tmp_path):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    with pytest.raises(CramkitError, match=r"nltk\.download\('averaged_perceptron_tagger_eng'\)"):
        load_tagger()
    with pytest.raises(CramkitError, match="nltk.download"):
        build_transfer(tmp_path / "t", ["a fine film"], None, [1], AugmentConfig(), progress=False)
    assert not (tmp_path / "t" / "manifest.json").exists()
    # without POS replacement no tagger is needed
    ts = build_transfer(tmp_path / "np", ["a fine film indeed"], None, [1], AugmentConfig(p_pos=0), progress=False)
    assert ts.manifest["originals"] == 1
