from __future__ import annotations

import torch

from cramkit.model import MaskedLM, ModelConfig
from cramkit.train.distributed import DistContext
from cramkit.train.trainer import forward_backward


def _batches(n: int, length: int = 16, vocab: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (n, length), generator=g)
    # uneven numbers of predicted tokens per sequence, so that a plain mean of micro-batch means is wrong
    rate = torch.linspace(0.05, 0.6, n)[:, None]
    labels = torch.where(torch.rand(n, length, generator=g) < rate, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "labels": labels}


def _grads(model: MaskedLM) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_accumulation_2x4_equals_one_batch_of_8() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, hidden=32, layers=2, heads=2, intermediate=64, max_position=16)
    model = MaskedLM(cfg)  # (the head computes its loss in fp32)
    full = _batches(8)
    halves = [{k: v[:4] for k, v in full.items()}, {k: v[4:] for k, v in full.items()}]
    ctx = DistContext()

    loss_one, tokens_one = forward_backward(model, [full], ctx)
    g_one = _grads(model)
    model.zero_grad(set_to_none=True)
    loss_two, tokens_two = forward_backward(model, halves, ctx)
    g_two = _grads(model)

    direct = model(full["input_ids"], full["labels"]).loss.item()
    assert abs(loss_one - direct) < 1e-6 and abs(loss_two - direct) < 1e-6
    assert tokens_one == tokens_two == 8 * 16
    assert g_one.keys() == g_two.keys()
    for name in g_one:
        torch.testing.assert_close(g_one[name], g_two[name], rtol=1e-4, atol=1e-7, msg=name)
    # the naive mean of the two micro-batch means differs (the halves predict different numbers of tokens)
    naive = sum(model(h["input_ids"], h["labels"]).loss.item() for h in halves) / 2
    assert abs(naive - direct) > 1e-3
