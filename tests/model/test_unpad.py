"""Unpadding (``Encoder(..., unpad=True)``): the blocks run on the real tokens only, attention in groups of rows
of similar length; the hidden states and gradients equal the padded path's. And the embedding gradient buffer
(``reuse_embedding_grads``) that one CPU process trains with: the same gradients, one buffer."""

from __future__ import annotations

import pytest
import torch

from cramkit.model.encoder import Encoder, pack
from cramkit.train.config import resolve_config
from cramkit.train.optim import reuse_embedding_grads


def _encoder(position: str) -> Encoder:
    cfg = resolve_config("tiny-cpu").model.replace(
        vocab_size=5000, layers=2, hidden=32, heads=2, intermediate=64, position=position, dropout=0.0
    )
    torch.manual_seed(0)
    return Encoder(cfg)


def _batch(rows: int, length: int, *, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 5000, (rows, length), generator=g)
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    lengths[3] = length  # one row unpadded
    cols = torch.arange(length)[None]
    mask = (cols >= length - lengths[:, None]) if left else (cols < lengths[:, None])
    return ids, mask.long()


@pytest.mark.parametrize("position", ["learned", "rope"])
@pytest.mark.parametrize("left", [False, True])
def test_unpadded_hidden_states_and_gradients_equal_the_padded_ones(position: str, left: bool) -> None:
    model = _encoder(position)
    ids, mask = _batch(40, 24, left=left)  # 40 rows: three attention groups of 16, 16 and 8 rows
    keep = mask.bool()[..., None]
    weights = torch.randn(40, 24, 32, generator=torch.Generator().manual_seed(2))
    outs, grads = [], []
    for unpad in (False, True):
        model.zero_grad()
        hidden = model(ids, mask, None, unpad=unpad)
        (hidden * weights * keep).sum().backward()
        outs.append(hidden)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    padded, unpadded = outs
    assert torch.allclose(padded[keep.expand_as(padded)], unpadded[keep.expand_as(unpadded)], atol=1e-5)
    assert unpadded[~keep.expand_as(unpadded)].abs().max() == 0  # the padding's rows are zeros
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=1e-4), name


def test_packing_groups_rows_of_similar_length_and_keeps_their_columns() -> None:
    ids, mask = _batch(40, 24)
    src, packing = pack(mask, torch.float32, group=16)
    assert src.tolist() == mask.reshape(-1).nonzero().squeeze(1).tolist()
    rows = [r for r, _, _ in packing.groups]
    widths = [w for _, w, _ in packing.groups]
    assert rows == [16, 16, 8] and widths == sorted(widths) and widths[-1] == 24
    lengths = sorted(mask.sum(1).tolist())
    assert widths == [lengths[15], lengths[31], lengths[39]]  # each group padded to its own longest row only
    assert sum(r * w for r, w, _ in packing.groups) < mask.numel()
    assert len(set(packing.flat.tolist())) == int(mask.sum())  # every real token in its own slot


def test_an_unpadded_batch_runs_as_it_is() -> None:
    model = _encoder("learned").eval()
    ids = torch.randint(5, 5000, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    with torch.no_grad():
        assert torch.equal(model(ids, mask, None, unpad=True), model(ids, mask, None))


def test_the_embedding_gradient_lands_in_one_buffer_with_the_dense_values() -> None:
    ids, mask = _batch(8, 12)
    dense_model, model = _encoder("learned"), _encoder("learned")
    assert reuse_embedding_grads(model) == 1  # the word table only (positions and token types are small)
    assert model.embeddings.word.sparse and not model.embeddings.position.sparse
    seen = set()
    for step in range(3):
        for m in (dense_model, model):
            m.zero_grad(set_to_none=True)
            for half in (slice(0, 4), slice(4, 8)):  # two micro-batches accumulate into one gradient
                m(ids[half] + step, mask[half], None).sum().backward()
        got, want = model.embeddings.word.weight.grad, dense_model.embeddings.word.weight.grad
        assert got is not None and want is not None and not got.is_sparse
        assert torch.allclose(got, want, atol=1e-5)
        seen.add(got.data_ptr())
    assert len(seen) == 1  # the same buffer every step, not a fresh 47 MB allocation
