"""The mixture-of-experts feed-forward against a naive reference loop: routing, gates, capacity drops counted
exactly, the losses; the encoder with MoE blocks (parameters, the dense path unchanged); upcycling."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cramkit.errors import CramkitError
from cramkit.model.config import config_parameters
from cramkit.model.encoder import Block, ModelConfig, count_parameters
from cramkit.model.heads import MaskedLM
from cramkit.model.moe import MoE, moe_layers, moe_losses, upcycle_state


def naive(m: MoE, x: torch.Tensor, capacity: int | None) -> tuple[torch.Tensor, int]:
    """Token by token: each token's top-k experts, gates renormalised, first choices before second ones,
    an assignment past an expert's ``capacity`` dropped; returns the output and the count dropped."""
    x = x.reshape(-1, x.shape[-1])
    probs = (x.double() @ m.router.weight.double().t()).softmax(-1)
    top_p, top_e = probs.topk(m.top_k)
    gates = top_p / top_p.sum(-1, keepdim=True)
    y = torch.zeros_like(x, dtype=torch.float64)
    used, dropped = [0] * m.experts, 0
    for j in range(m.top_k):
        for t in range(x.shape[0]):
            e = int(top_e[t, j])
            if capacity is not None and used[e] >= capacity:
                dropped += 1
                continue
            used[e] += 1
            h = F.linear(x[t].double(), m.w_in[e].double(), None if m.b_in is None else m.b_in[e].double())
            if m.glu:
                value, gate = h.chunk(2)
                h = value * m.act(gate)
            else:
                h = m.act(h)
            out = F.linear(h, m.w_out[e].double(), None if m.b_out is None else m.b_out[e].double())
            y[t] += gates[t, j] * out
    return y, dropped


@pytest.mark.parametrize(
    ("k", "activation", "bias"), [(1, "gelu_glu", False), (2, "gelu", True), (2, "swiglu", False), (3, "relu", True)]
)
def test_outputs_are_the_gated_sum_of_the_top_k_experts(k: int, activation: str, bias: bool) -> None:
    torch.manual_seed(k)
    m = MoE(16, 32, 4, k, capacity=1.0, activation=activation, bias=bias)
    with torch.no_grad():
        m.router.weight.normal_(std=0.5)
        if bias:
            m.b_in.normal_()  # type: ignore[union-attr]
            m.b_out.normal_()  # type: ignore[union-attr]
    x = torch.randn(3, 10, 16)
    m.eval()  # no dropping
    want, dropped = naive(m, x, None)
    assert dropped == 0
    got = m(x)
    assert got.shape == x.shape
    torch.testing.assert_close(got.reshape(-1, 16).double(), want, atol=1e-5, rtol=1e-5)
    assert float(m.stats.dropped) == 0.0  # type: ignore[union-attr]
    m.eval()  # an exporter's static graph: every expert on every token, the same outputs
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.compiler, "is_exporting", lambda: True)
        torch.testing.assert_close(m(x).reshape(-1, 16).double(), want, atol=1e-5, rtol=1e-5)
    m.train()  # capacity ceil(1.0 * k * 30 / 4): some assignments are dropped
    cap = math.ceil(k * 30 / 4)
    want, dropped = naive(m, x, cap)
    got = m(x)
    torch.testing.assert_close(got.reshape(-1, 16).double(), want, atol=1e-5, rtol=1e-5)
    assert float(m.stats.dropped) == pytest.approx(dropped / (k * 30))  # type: ignore[union-attr]


def test_capacity_drops_are_counted_exactly_and_dropped_tokens_pass_the_residual() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=50, hidden=16, layers=1, heads=2, intermediate=32, moe_experts=4, moe_capacity=1.0, moe_top_k=1
    )
    block = Block(cfg, 0)
    moe = block.mlp
    assert isinstance(moe, MoE)
    base = torch.randn(16)
    x = base + 0.01 * torch.randn(1, 16, 16)  # 16 tokens near one vector
    with torch.no_grad():  # every token's router prefers expert 2: its logit near 10 |h|^2, the others' 0
        moe.router.weight.zero_()
        moe.router.weight[2] = 10 * block.norm_mlp(base)
        h = block.norm_mlp(x)
    assert bool((moe.route(h.reshape(-1, 16))[1] == 2).all())
    y = moe(h)
    # capacity ceil(1.0 * 16 / 4) = 4: the first 4 tokens (token order) go through, 12 of 16 are dropped
    assert float(moe.stats.dropped) == 12 / 16  # type: ignore[union-attr]
    assert float(moe.stats.load) == 4.0  # all on one expert: E times the mean  # type: ignore[union-attr]
    flat = y.reshape(16, 16)
    assert bool((flat[4:] == 0).all()) and bool((flat[:4] != 0).any())
    # in the block: a dropped token's MLP adds nothing, its output is the attention's residual stream
    block.train()
    with torch.no_grad():
        mid = x + block._attend(block.norm_attn(x), None, None)
        out = block(x)
    torch.testing.assert_close(out[0, 4:], mid[0, 4:])
    block.eval()  # inference drops nothing
    moe(h)
    assert float(moe.stats.dropped) == 0.0  # type: ignore[union-attr]


def test_losses_balance_and_z() -> None:
    torch.manual_seed(0)
    m = MoE(8, 16, 4, 1, capacity=2.0, aux_weight=0.5, z_weight=0.1)
    x = torch.randn(64, 8)
    m.train()
    m(x)
    stats = m.stats
    assert stats is not None
    logits = x @ m.router.weight.t()
    probs = logits.softmax(-1)
    counts = torch.bincount(probs.argmax(-1), minlength=4).float()
    want_aux = 4 * ((counts / 64) * probs.mean(0)).sum()
    torch.testing.assert_close(stats.aux, want_aux)
    torch.testing.assert_close(stats.z, torch.logsumexp(logits, -1).pow(2).mean())
    assert float(stats.load) == pytest.approx(float(counts.max() / 16))
    loss, figures = moe_losses(m)
    assert loss is not None and figures is not None
    torch.testing.assert_close(loss, 0.5 * want_aux + 0.1 * stats.z)
    loss.backward()
    assert m.router.weight.grad is not None and float(m.router.weight.grad.abs().sum()) > 0


def test_moe_encoder_parameters_and_layers() -> None:
    cfg = ModelConfig(vocab_size=100, hidden=32, layers=4, heads=2, intermediate=64, moe_experts=4, moe_every=2)
    model = MaskedLM(cfg)
    assert cfg.moe_layers == [1, 3]
    assert [type(b.mlp).__name__ for b in model.encoder.layers] == ["MLP", "MoE", "MLP", "MoE"]
    assert count_parameters(model) == config_parameters(cfg)
    assert len(moe_layers(model)) == 2
    # the dense path: no MoE module, the same parameters (names, shapes, init) as before MoE existed
    dense = ModelConfig(vocab_size=100, hidden=32, layers=4, heads=2, intermediate=64)
    torch.manual_seed(0)
    a = MaskedLM(dense)
    assert not moe_layers(a) and count_parameters(a) == config_parameters(dense)
    assert not any("router" in k or "w_in" in k for k in a.state_dict())


@pytest.mark.parametrize("k", [1, 2])
def test_upcycled_model_computes_the_dense_function(k: int) -> None:
    torch.manual_seed(0)
    dense_cfg = ModelConfig(vocab_size=100, hidden=32, layers=2, heads=2, intermediate=64, bias=True)
    dense = MaskedLM(dense_cfg).eval()
    moe_cfg = dense_cfg.replace(moe_experts=4, moe_top_k=k, moe_capacity=0.0)
    moe = MaskedLM(moe_cfg)
    moe.load_state_dict(upcycle_state(dense.state_dict(), moe))
    layer = moe.encoder.layers[0].mlp
    assert isinstance(layer, MoE) and torch.equal(layer.w_in[3], dense.encoder.layers[0].mlp.fc_in.weight)
    ids = torch.randint(5, 100, (3, 20))
    with torch.no_grad():
        want = dense(ids).logits
        for mode in (False, True):  # inference, and training with no capacity limit
            moe.train(mode)
            torch.testing.assert_close(moe(ids).logits, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"moe_experts": 4, "moe_top_k": 5}, "moe_top_k=5 must be between 1 and model.moe_experts"),
        ({"moe_experts": 1}, "at least 2 experts"),
        ({"moe_experts": 4, "moe_every": 0}, "moe_every=0 must be at least 1"),
        ({"moe_experts": 4, "moe_every": 5}, "exceeds model.layers"),
        ({"moe_aux": -0.1}, "moe_aux must not be negative"),
        ({"moe_z_loss": -1.0}, "moe_z_loss must not be negative"),
        ({"moe_capacity": -1.0}, "moe_capacity must not be negative"),
    ],
)
def test_bad_settings_are_one_line(changes: dict, message: str) -> None:
    cfg = ModelConfig(layers=4).replace(**changes)
    with pytest.raises(CramkitError, match=message) as info:
        cfg.validate()
    assert "\n" not in str(info.value)


def test_tensor_parallel_refuses_moe() -> None:
    from cramkit.train.tensor_parallel import check_tp

    with pytest.raises(CramkitError, match="does not split mixture-of-experts"):
        check_tp(ModelConfig(moe_experts=4), 2)
