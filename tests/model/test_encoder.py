"""Unit tests of the encoder: shapes, every architecture choice, masks, sparse MLM, DeepNorm, RoPE, ties."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cramkit.errors import CramkitError
from cramkit.model import IGNORE, Encoder, MaskedLM, ModelConfig, SequenceClassifier
from cramkit.model.encoder import Block, Rotary

TINY = ModelConfig(vocab_size=97, hidden=32, layers=2, heads=4, intermediate=64, max_position=24)
VARIANTS = {
    "cramming-default": {},
    "bert": {
        "norm_position": "post",
        "position": "learned",
        "bias": True,
        "activation": "gelu",
        "type_vocab_size": 2,
    },
    "relu-rmsnorm": {"activation": "relu", "norm": "rmsnorm"},
    "swiglu-rope": {"activation": "swiglu", "position": "rope"},
    "deepnorm-bias": {"norm_position": "deepnorm", "bias": True},
    "bare": {"embedding_norm": False, "final_norm": False, "head_transform": False, "tie_embeddings": False},
    "checkpointed-dropout": {"gradient_checkpointing": True, "dropout": 0.1, "attention_dropout": 0.1},
}


def _batch(length: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, TINY.vocab_size, (3, length), generator=g), torch.ones(3, length, dtype=torch.long)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_choice_runs_forward_and_backward(name: str) -> None:
    cfg = TINY.replace(**VARIANTS[name])
    torch.manual_seed(0)
    model = MaskedLM(cfg).train()
    ids, mask = _batch()
    mask[1, 8:] = 0
    labels = torch.full_like(ids, IGNORE)
    labels[:, ::3] = ids[:, ::3]
    types = torch.zeros_like(ids) if cfg.type_vocab_size else None
    out = model(ids, labels=labels, attention_mask=mask, token_type_ids=types)
    assert out.logits.shape == (int((labels != IGNORE).sum()), cfg.vocab_size)
    assert out.n_predicted.item() == int((labels != IGNORE).sum())
    assert torch.isfinite(out.loss) and abs(out.loss.item() - math.log(cfg.vocab_size)) < 1.5
    out.loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        if "token_type" not in pname:
            assert p.grad.abs().sum() > 0, pname
    assert model.encoder(ids, mask).shape == (3, 12, cfg.hidden)


def test_shapes_of_heads() -> None:
    ids, mask = _batch(7)
    mlm = MaskedLM(TINY).eval()
    assert mlm(ids).logits.shape == (3, 7, TINY.vocab_size)  # dense without labels
    clf = SequenceClassifier(TINY, num_labels=3).eval()
    loss, logits = clf(ids, mask, labels=torch.tensor([0, 2, 1]))
    assert logits.shape == (3, 3) and loss.ndim == 0
    reg = SequenceClassifier(TINY, num_labels=1)
    loss, logits = reg(ids, mask, labels=torch.tensor([0.5, 1.0, 2.0]))
    assert logits.shape == (3, 1) and torch.isfinite(loss)


@pytest.mark.parametrize("name", ["cramming-default", "bert", "swiglu-rope", "deepnorm-bias"])
def test_padding_does_not_change_real_positions(name: str) -> None:
    cfg = TINY.replace(**VARIANTS[name])
    torch.manual_seed(1)
    enc = Encoder(cfg).eval()
    ids, _ = _batch(6)
    padded = torch.cat([ids, torch.randint(1, cfg.vocab_size, (3, 5))], dim=1)  # garbage after the end
    mask = torch.cat([torch.ones(3, 6), torch.zeros(3, 5)], dim=1).long()
    with torch.no_grad():
        alone = enc(ids, torch.ones(3, 6, dtype=torch.long))
        with_pad = enc(padded, mask)
        unmasked = enc(padded)
    assert (alone - with_pad[:, :6]).abs().max().item() <= 1e-5
    assert (alone - unmasked[:, :6]).abs().max().item() > 1e-3  # the mask really matters


def test_sparse_mlm_loss_equals_dense_loss_on_masked_positions() -> None:
    torch.manual_seed(2)
    model = MaskedLM(TINY).eval()
    ids, mask = _batch(10)
    labels = torch.full_like(ids, IGNORE)
    pick = torch.rand(ids.shape, generator=torch.Generator().manual_seed(3)) < 0.3
    labels[pick] = ids[pick]
    with torch.no_grad():
        sparse = model(ids, labels=labels, attention_mask=mask)
        dense = model(ids, attention_mask=mask).logits
    expected = F.cross_entropy(dense.reshape(-1, TINY.vocab_size), labels.reshape(-1), ignore_index=IGNORE)
    assert abs(sparse.loss.item() - expected.item()) <= 1e-5
    assert torch.allclose(sparse.logits, dense[pick], atol=1e-5)


def test_deepnorm_alpha_beta_and_init() -> None:
    cfg = TINY.replace(hidden=256, heads=4, intermediate=512, layers=6, norm_position="deepnorm")
    assert cfg.deepnorm_alpha == pytest.approx((2 * 6) ** 0.25)
    assert cfg.deepnorm_beta == pytest.approx((8 * 6) ** -0.25)
    assert TINY.deepnorm_alpha == 1.0 and TINY.deepnorm_beta == 1.0
    torch.manual_seed(4)
    model = MaskedLM(cfg)
    qkv = model.encoder.layers[0].attn.qkv.weight
    h = cfg.hidden
    # xavier_normal_ std = gain * sqrt(2 / (fan_in + fan_out)): queries and keys (a 2h x h slice) gain 1,
    # values and the output projection (h x h) gain beta
    assert qkv[: 2 * h].std().item() == pytest.approx(math.sqrt(2.0 / (3 * h)), rel=0.05)
    assert qkv[2 * h :].std().item() == pytest.approx(cfg.deepnorm_beta * math.sqrt(1.0 / h), rel=0.05)
    out = model.encoder.layers[0].attn.out.weight
    assert out.std().item() == pytest.approx(cfg.deepnorm_beta * math.sqrt(1.0 / h), rel=0.05)
    # the residual is scaled by alpha before the norm
    block = model.encoder.layers[0].eval()
    x = torch.randn(2, 5, cfg.hidden)
    with torch.no_grad():
        h = block.norm_attn(cfg.deepnorm_alpha * x + block.attn(x, None))
        expected = block.norm_mlp(cfg.deepnorm_alpha * h + block.mlp(h))
        assert torch.allclose(block(x), expected, atol=1e-6)
    assert isinstance(block, Block) and block.alpha == cfg.deepnorm_alpha


def test_rope_scores_depend_on_relative_position_only() -> None:
    rot = Rotary(head_dim=16, max_position=32, base=10000.0)
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(16, generator=g), torch.randn(16, generator=g)
    length = 20
    rq = rot(q.expand(1, 1, length, 16))[0, 0]  # the same query vector at every position
    rk = rot(k.expand(1, 1, length, 16))[0, 0]
    scores = rq @ rk.T  # [m, n]
    for offset in (-7, 0, 3, 11):
        diag = torch.diagonal(scores, offset=offset)
        assert (diag - diag[0]).abs().max().item() <= 1e-4  # constant along m - n
    assert (torch.diagonal(scores, 0)[0] - torch.diagonal(scores, 3)[0]).abs().item() > 1e-3
    assert torch.allclose(rq.norm(dim=-1), q.norm().expand(length), atol=1e-5)  # a rotation


def test_tied_and_untied_embeddings() -> None:
    tied = MaskedLM(TINY)
    assert tied.head.decoder.weight is tied.encoder.embeddings.word.weight
    ids, _ = _batch(5)
    tied(ids, labels=ids).loss.backward()
    assert tied.encoder.embeddings.word.weight.grad is not None
    untied = MaskedLM(TINY.replace(tie_embeddings=False))
    assert untied.head.decoder.weight is not untied.encoder.embeddings.word.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == TINY.vocab_size * TINY.hidden


def test_bad_configs_and_lengths() -> None:
    with pytest.raises(CramkitError, match="divisible"):
        TINY.replace(heads=5).validate()
    with pytest.raises(CramkitError, match="even"):
        TINY.replace(intermediate=63).validate()
    enc = Encoder(TINY)
    with pytest.raises(CramkitError, match="max_position=24"):
        enc(torch.ones(1, 30, dtype=torch.long))
    rope = Encoder(TINY.replace(position="rope", max_position=64))
    assert rope(torch.ones(1, 30, dtype=torch.long)).shape == (1, 30, TINY.hidden)


SPARSE_VARIANTS = {
    "pre-sinusoidal": {},
    "post-learned-bias": {"norm_position": "post", "position": "learned", "bias": True, "activation": "gelu"},
    "deepnorm-rope": {"norm_position": "deepnorm", "position": "rope", "bias": True},
    "pre-rope-rmsnorm-checkpointed": {"position": "rope", "norm": "rmsnorm", "gradient_checkpointing": True},
    "post-checkpointed-bare": {
        "norm_position": "post",
        "gradient_checkpointing": True,
        "head_transform": False,
        "tie_embeddings": False,
    },
}


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name", list(SPARSE_VARIANTS))
def test_sparse_last_block_equals_dense_loss_and_gradients(name: str, padded: bool) -> None:
    """MaskedLM with labels computes the last block only at the predicted positions: the loss and every
    parameter's gradient equal those of the dense encoder followed by the head on the predicted rows."""
    cfg = TINY.replace(layers=3, **SPARSE_VARIANTS[name])
    torch.manual_seed(4)
    model = MaskedLM(cfg).train()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, cfg.vocab_size, (4, 16), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 9:] = 0
        mask[3, 5:] = 0
    pick = (torch.rand(ids.shape, generator=g) < 0.3) & mask.bool()
    pick[2] = False  # a row with nothing predicted
    pick[0, :8] = True  # rows with different counts
    labels = torch.where(pick, ids, torch.full_like(ids, IGNORE))

    sparse = model(ids, labels=labels, attention_mask=mask)
    sparse.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    hidden = model.encoder(ids, mask)  # the dense path (fine-tuning, HF export)
    assert hidden.shape == (4, 16, cfg.hidden)
    logits = model.head(hidden[pick])
    dense = F.cross_entropy(logits, ids[pick])
    dense.backward()

    assert sparse.n_predicted.item() == int(pick.sum())
    assert torch.allclose(sparse.logits, logits, rtol=1e-5, atol=1e-5)
    assert abs(sparse.loss.item() - dense.item()) <= 1e-5 * dense.item()
    for n, p in model.named_parameters():
        scale = p.grad.abs().max().item()
        assert scale > 0, n
        assert (grads[n] - p.grad).abs().max().item() <= 1e-5 * scale, n


def test_encoder_select_returns_selected_rows_and_rows_without_selection_are_dense() -> None:
    cfg = TINY.replace(position="rope")
    torch.manual_seed(6)
    enc = Encoder(cfg).eval()
    ids, mask = _batch(9)
    mask[0, 6:] = 0
    select = torch.zeros_like(ids, dtype=torch.bool)
    select[0, [1, 5]] = True
    select[2, [0, 3, 4, 8]] = True
    with torch.no_grad():
        rows = enc(ids, mask, select=select)
        full = enc(ids, mask)
    assert rows.shape == (6, cfg.hidden)
    assert torch.allclose(rows, full[select], atol=1e-5)
    # nothing predicted: the loss of an empty mean (NaN) and empty logits, no error
    model = MaskedLM(cfg)
    out = model(ids, labels=torch.full_like(ids, IGNORE))
    assert out.logits.shape == (0, cfg.vocab_size) and out.n_predicted.item() == 0


def test_rope_model_reads_inputs_longer_than_max_position() -> None:
    """Rotary models have no position table to outgrow: an input past ``max_position`` (24) is encoded, its
    first positions exactly as in a shorter input, and the sparse last block agrees with the dense one."""
    cfg = TINY.replace(position="rope", attention_dropout=0.0, dropout=0.0)
    torch.manual_seed(0)
    model = MaskedLM(cfg).eval()
    ids, mask = _batch(40)
    with torch.no_grad():
        long = model.encoder(ids, mask)
        short = model.encoder(ids[:, :20], mask[:, :20])
        assert long.shape == (3, 40, cfg.hidden) and torch.isfinite(long).all()
        rot = model.encoder.layers[0].attn.rotary
        x = torch.randn(1, 1, 40, cfg.head_dim)
        assert torch.equal(rot(x)[..., :24, :], rot(x[..., :24, :]))  # the table's rows, then computed ones
        labels = torch.full_like(ids, IGNORE)
        labels[:, 30:] = ids[:, 30:]  # predicted positions past max_position: the sparse last block
        sparse = model(ids, labels=labels, attention_mask=mask).logits
        dense = model(ids, attention_mask=mask).logits[:, 30:].reshape(-1, cfg.vocab_size)
    assert torch.allclose(sparse, dense, atol=1e-5)
    assert short.shape == (3, 20, cfg.hidden)


def test_cpu_bf16_training_attention_is_computed_in_fp32() -> None:
    """Training in bf16 on a CPU, attention runs in fp32 (torch's bf16 CPU attention backward is slow): the
    result is fp32 attention rounded to bf16, under autocast too; without gradients it stays plain bf16."""
    import torch.nn.functional as F

    from cramkit.model.encoder import attend

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 1, 1, 16, dtype=torch.bool)
    mask[1, ..., 12:] = False
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(torch.bfloat16)
    plain = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert not torch.equal(plain, want)  # bf16 attention differs: the comparison below can fail
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attend(q, k, v, mask, 0.0)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    got.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()
    with torch.no_grad():
        assert torch.equal(attend(q, k, v, mask, 0.0), plain)
