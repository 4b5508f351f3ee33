"""Packing, masking and the sampler: against plain-Python references, resume, sharding, rates."""

from __future__ import annotations

import numpy as np
import pytest

from cramkit.data.loader import PretrainData, document_spans, permute
from cramkit.data.mlm import DataConfig, PackedSequences, mask_tokens
from cramkit.data.tokenstore import TokenStore, TokenStoreWriter
from cramkit.errors import CramkitError
from cramkit.text.tokenizer import SpecialIds

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 1000


def make_store(tmp_path, n_docs: int = 300, seed: int = 0) -> TokenStore:
    rng = np.random.default_rng(seed)
    with TokenStoreWriter(tmp_path / "s") as w:
        for _ in range(n_docs):
            w.add_document(rng.integers(5, VOCAB, size=int(rng.integers(1, 120))))
        w.finalize({})
    return TokenStore(tmp_path / "s")


def reference_pack(docs: list[list[int]], seq_len: int, sep: int, cls: int | None) -> list[list[int]]:
    stream = [t for d in docs for t in [*d, sep]]
    c = seq_len - (cls is not None)
    seqs = [stream[i : i + c] for i in range(0, len(stream) - c + 1, c)]
    return [[cls, *s] if cls is not None else s for s in seqs]


@pytest.mark.parametrize("add_cls", [False, True])
def test_packing_matches_reference(tmp_path, add_cls):
    store = make_store(tmp_path)
    data = PretrainData(store, DataConfig(seq_len=32, add_cls=add_cls, validation_fraction=0.05), SPECIAL, VOCAB)
    start, _ = document_spans(store)
    # which documents went to validation: those whose start is not among the training documents'
    train_starts = set(data.train.doc_start.tolist())
    val_docs = [i for i in range(len(store)) if int(start[i]) not in train_starts]
    train_docs = [i for i in range(len(store)) if int(start[i]) in train_starts]
    assert len(val_docs) == data.num_val_documents == 15 and len(train_docs) == 285
    for docs, packed in ((train_docs, data.train), (val_docs, data.val)):
        want = reference_pack([store[i].tolist() for i in docs], 32, SPECIAL.sep, SPECIAL.cls if add_cls else None)
        got = packed.gather(np.arange(len(packed)))
        assert got.tolist() == want
    assert data.tokens_per_sequence == 32


def test_gather_with_empty_and_tiny_documents():
    tokens = np.arange(10, 40, dtype=np.uint16)
    packed = PackedSequences(tokens, np.array([0, 1, 1, 5, 20]), np.array([1, 0, 4, 15, 10]), 4, sep=3)
    docs = [[10], [], [11, 12, 13, 14], list(range(15, 30)), list(range(30, 40))]
    assert packed.gather(np.arange(len(packed))).tolist() == reference_pack(docs, 4, 3, None)
    assert packed.gather(np.array([3, 0, 3])).tolist()[0] == packed.gather(np.array([3])).tolist()[0]


def test_validation_split_is_deterministic_and_seed_independent(tmp_path):
    store = make_store(tmp_path)
    a = PretrainData(store, DataConfig(seed=1), SPECIAL, VOCAB)
    b = PretrainData(store, DataConfig(seed=2), SPECIAL, VOCAB)
    assert np.array_equal(a.val.doc_start, b.val.doc_start) and a.num_val_documents == 3  # 1% of 300
    assert not set(a.val.doc_start.tolist()) & set(a.train.doc_start.tolist())
    none = PretrainData(store, DataConfig(validation_fraction=0.0), SPECIAL, VOCAB)
    assert none.num_val_sequences == 0 and none.num_train_documents == 300
    with pytest.raises(CramkitError, match="too few for a validation split"):
        PretrainData(make_store(tmp_path / "one", n_docs=1), DataConfig(), SPECIAL, VOCAB)
    with pytest.raises(CramkitError, match="fewer than one sequence"):
        PretrainData(store, DataConfig(seq_len=100_000, validation_fraction=0.0), SPECIAL, VOCAB)
    with pytest.raises(CramkitError, match="data.mask_rate"):
        DataConfig(mask_rate=1.5).validate()
    with pytest.raises(CramkitError, match="data.random_token_frac"):
        DataConfig(mask_token_frac=0.9, random_token_frac=0.2).validate()


def test_mask_rates_and_specials_never_masked():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(512, 128))
    ids[:, ::7] = SPECIAL.sep
    ids[:, 1::11] = SPECIAL.cls
    cfg = DataConfig()
    out, labels = mask_tokens(ids, seed=3, offsets=np.arange(512), cfg=cfg, special=SPECIAL, vocab_size=VOCAB)
    special = np.isin(ids, SPECIAL.all())
    chosen = labels != -100
    assert not chosen[special].any() and np.array_equal(out[special], ids[special])
    assert np.array_equal(labels[chosen], ids[chosen])
    rate = chosen.sum() / (~special).sum()
    n = chosen.sum()
    assert abs(rate - 0.25) < 4 * np.sqrt(0.25 * 0.75 / (~special).sum())
    as_mask = (out == SPECIAL.mask) & chosen
    unchanged = (out == ids) & chosen
    randomised = chosen & ~as_mask & ~unchanged
    for frac, want in (
        (as_mask.sum() / n, 0.8),
        (randomised.sum() / n, 0.1 * (1 - 1 / VOCAB)),
        (unchanged.sum() / n, 0.1),
    ):
        assert abs(frac - want) < 4 * np.sqrt(want * (1 - want) / n) + 1e-3
    assert not np.isin(out[randomised], SPECIAL.all()).any()
    assert len(np.unique(out[randomised])) > 500  # spread over the vocabulary
    # no token outside the chosen ones changes
    assert np.array_equal(out[~chosen], ids[~chosen])


def test_masking_is_counter_based():
    ids = np.random.default_rng(1).integers(5, VOCAB, size=(8, 64))
    cfg = DataConfig()
    kw = dict(cfg=cfg, special=SPECIAL, vocab_size=VOCAB)
    full_out, full_lab = mask_tokens(ids, seed=7, offsets=np.arange(100, 108), **kw)
    for i in range(8):  # row by row, any batch composition: same result
        o, lab = mask_tokens(ids[i : i + 1], seed=7, offsets=np.array([100 + i]), **kw)
        assert np.array_equal(o[0], full_out[i]) and np.array_equal(lab[0], full_lab[i])
    other, _ = mask_tokens(ids, seed=8, offsets=np.arange(100, 108), **kw)
    assert not np.array_equal(other, full_out)


def test_permutation_is_a_permutation():
    for n in (1, 2, 3, 17, 1000, 4096, 4097):
        for epoch in (0, 1):
            p = permute(np.arange(n), n, 5, epoch)
            assert sorted(p.tolist()) == list(range(n))
    assert not np.array_equal(permute(np.arange(1000), 1000, 5, 0), permute(np.arange(1000), 1000, 5, 1))
    assert not np.array_equal(permute(np.arange(1000), 1000, 5, 0), np.arange(1000))


def _seq_ids(loader, steps: int) -> list[list[int]]:
    return [loader.next_indices()[0].tolist() for _ in range(steps)]


def test_resume_gives_the_same_batches(tmp_path):
    data = PretrainData(make_store(tmp_path), DataConfig(seq_len=64), SPECIAL, VOCAB)
    n = data.num_train_sequences
    loader = data.train_loader(8)
    batches = [next(loader) for _ in range(2 * (n // 8) + 3)]  # crosses two epoch ends
    assert loader.epoch == 2
    fresh = data.train_loader(8)
    for _ in range(5):
        next(fresh)
    state = fresh.state_dict()
    assert state == {"epoch": 0, "position": 40, "seed": 0, "num_sequences": n}
    resumed = data.train_loader(8)
    resumed.load_state_dict(state)
    for want in batches[5:]:
        got = next(resumed)
        assert got["input_ids"].dtype.is_floating_point is False
        assert got["input_ids"].shape == (8, 64) and got["labels"].shape == (8, 64)
        assert (got["input_ids"] == want["input_ids"]).all() and (got["labels"] == want["labels"]).all()
    epoch0 = [i for b in _seq_ids(data.train_loader(8), n // 8) for i in b]
    assert len(set(epoch0)) == len(epoch0) == (n // 8) * 8


def test_shards_partition_each_global_batch_and_world_size_change(tmp_path):
    data = PretrainData(make_store(tmp_path), DataConfig(seq_len=64), SPECIAL, VOCAB)
    single = data.train_loader(4)
    ranks = [data.train_loader(2, rank=r, world=2) for r in range(2)]
    for _ in range(30):
        whole = single.next_indices()[0].tolist()
        parts = [rk.next_indices()[0].tolist() for rk in ranks]
        assert parts[0] + parts[1] == whole
    # two ranks run 5 steps, then the job resumes on one rank from their (global) state
    ranks = [data.train_loader(3, rank=r, world=2) for r in range(2)]
    seen = [i for _ in range(5) for rk in ranks for i in rk.next_indices()[0].tolist()]
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict() and state["position"] == 30
    one = data.train_loader(3)
    one.load_state_dict(state)
    after = [i for b in _seq_ids(one, 4) for i in b]
    reference = [i for b in _seq_ids(data.train_loader(6), 9) for i in b]
    assert seen + after == reference[: len(seen) + len(after)]
    # the masking of a sequence does not depend on which rank or world size drew it
    ref = data.train_loader(6)
    ref.load_state_dict(one.state_dict())
    a = next(ref)
    b = next(one)
    assert (a["input_ids"][:3] == b["input_ids"]).all()


def test_bad_loader_arguments_and_state(tmp_path):
    data = PretrainData(make_store(tmp_path, n_docs=20), DataConfig(seq_len=64), SPECIAL, VOCAB)
    with pytest.raises(CramkitError, match="fewer than one global batch"):
        data.train_loader(1000)
    with pytest.raises(CramkitError, match="rank 2 / world size 2"):
        data.train_loader(2, rank=2, world=2)
    loader = data.train_loader(2)
    with pytest.raises(CramkitError, match="data seed 9"):
        loader.load_state_dict({"epoch": 0, "position": 0, "seed": 9})
    with pytest.raises(CramkitError, match="same token store"):
        loader.load_state_dict({"epoch": 0, "position": 0, "seed": 0, "num_sequences": 1})


def test_validation_batches_fixed_and_sharded(tmp_path):
    data = PretrainData(
        make_store(tmp_path, n_docs=600), DataConfig(seq_len=32, validation_fraction=0.1), SPECIAL, VOCAB
    )
    nv = data.num_val_sequences
    assert nv > 20
    one = list(data.val_batches(4))
    again = list(data.val_batches(4))
    assert sum(len(b["input_ids"]) for b in one) == nv
    assert all(
        (x["input_ids"] == y["input_ids"]).all() and (x["labels"] == y["labels"]).all()
        for x, y in zip(one, again, strict=True)
    )
    assert len(list(data.val_batches(4, max_batches=2))) == 2
    flat = np.concatenate([b["input_ids"].numpy() for b in one])
    shards = [list(data.val_batches(2, rank=r, world=2)) for r in range(2)]
    assert len(shards[0]) == len(shards[1])
    rows = []
    for b0, b1 in zip(*shards, strict=True):
        rows += [b0["input_ids"].numpy(), b1["input_ids"].numpy()]
    joined = np.concatenate(rows)
    assert np.array_equal(np.sort(joined, axis=0), np.sort(flat[: len(joined)], axis=0))
    assert len(joined) >= nv - 1
