from __future__ import annotations

import math

import pytest
import torch

from cramkit.model import MaskedLM, ModelConfig
from cramkit.train.optim import Lamb, build_optimizer, param_groups


def lamb_by_hand(x, grads, lr, b1, b2, eps, wd):
    """LAMB (arXiv 1904.00962, Algorithm 2) on a flat list of floats, step by step."""
    m = [0.0] * len(x)
    v = [0.0] * len(x)
    for t, g in enumerate(grads, start=1):
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g, strict=True)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g, strict=True)]
        m_hat = [mi / (1 - b1**t) for mi in m]
        v_hat = [vi / (1 - b2**t) for vi in v]
        r = [mh / (math.sqrt(vh) + eps) + wd * xi for mh, vh, xi in zip(m_hat, v_hat, x, strict=True)]
        x_norm = math.sqrt(sum(xi * xi for xi in x))
        r_norm = math.sqrt(sum(ri * ri for ri in r))
        trust = x_norm / r_norm if x_norm > 0 and r_norm > 0 else 1.0
        x = [xi - lr * trust * ri for xi, ri in zip(x, r, strict=True)]
    return x


def test_lamb_matches_paper_formula() -> None:
    x0 = [0.5, -1.0, 2.0, 0.25, -0.75, 1.5]
    grads = [
        [0.1, -0.2, 0.3, 0.05, 0.0, -0.4],
        [-0.3, 0.1, 0.2, 0.6, -0.1, 0.2],
        [0.2, 0.2, -0.1, 0.0, 0.3, 0.1],
    ]
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-6, 0.01
    p = torch.nn.Parameter(torch.tensor(x0, dtype=torch.float64).view(2, 3))
    opt = Lamb([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64).view(2, 3)
        opt.step()
    expected = lamb_by_hand(x0, grads, lr, b1, b2, eps, wd)
    assert p.detach().flatten().tolist() == pytest.approx(expected, rel=1e-12, abs=1e-14)
    # the trust ratio really matters: plain Adam-with-decay would land elsewhere
    assert p.detach().flatten().tolist() != pytest.approx(lamb_by_hand(x0, grads, lr, b1, b2, eps, 0.0), abs=1e-6)


def test_lamb_zero_weights_use_trust_ratio_one() -> None:
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    opt = Lamb([p], lr=0.1, betas=(0.9, 0.999), eps=1e-10, weight_decay=0.0)
    p.grad = torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64)
    opt.step()
    # first step: m_hat = g, v_hat = g^2 -> r = sign(g); trust 1 -> x = -lr * sign(g)
    assert p.detach().tolist() == pytest.approx([-0.1, 0.1, -0.1, 0.0], abs=1e-9)


def test_weight_decay_groups_follow_cramming() -> None:
    cfg = ModelConfig(vocab_size=100, hidden=16, layers=1, heads=2, intermediate=32, max_position=16, bias=True)
    model = MaskedLM(cfg)
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert "encoder.embeddings.word.weight" in decayed  # embeddings decay (tied with the decoder)
    assert any(n.endswith("qkv.weight") for n in decayed)
    norm_params = {
        f"{m_name}.{p_name}"
        for m_name, m in model.named_modules()
        if isinstance(m, torch.nn.LayerNorm)
        for p_name, _ in m.named_parameters()
    }
    assert kept == norm_params | {n for n in names.values() if n.endswith(".bias")} | {
        "encoder.embeddings.position_scale"
    }
    assert any("norm" in n for n in kept) and any(n.endswith(".bias") for n in kept)
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.01
    # every parameter exactly once (the tied decoder weight is not counted twice)
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_build_optimizer_kinds() -> None:
    model = MaskedLM(ModelConfig(vocab_size=50, hidden=8, layers=1, heads=2, intermediate=16, max_position=8))
    adamw = build_optimizer(model, "adamw", 1e-3, (0.9, 0.98), 1e-12, 0.01, torch.device("cpu"))
    assert isinstance(adamw, torch.optim.AdamW) and adamw.defaults["betas"] == (0.9, 0.98)
    assert isinstance(build_optimizer(model, "lamb", 1e-3, (0.9, 0.98), 1e-6, 0.01, torch.device("cpu")), Lamb)
