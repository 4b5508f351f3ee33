"""ModernBERT: pre-LN blocks with no biases, rotary positions, GeGLU, and alternating attention: every third layer
global (rotary base 160,000), the others local (keys within 64 positions, base 10,000); the first block has no norm
before its attention (the embeddings end in one). Its encoder and masked-LM head import; its classifier head
(dense + GELU + norm) is not cramkit's, so fine-tuning starts a head of cramkit's own."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.model.architectures.family import Family, number

if TYPE_CHECKING:
    import torch

    from cramkit.model.encoder import ModelConfig


def _rope_bases(hf: dict[str, Any]) -> tuple[float, float]:
    """(global, local) rotary bases: transformers 5's ``rope_parameters`` or the older ``*_rope_theta``."""
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict) or not all(isinstance(p, dict) or p is None for p in params.values()):
        raise ValueError("rope_parameters is not an object of objects")
    full = (params.get("full_attention") or {}).get("rope_theta", hf.get("global_rope_theta", 160000.0))
    local = (params.get("sliding_attention") or {}).get("rope_theta", hf.get("local_rope_theta", 10000.0))
    for p in params.values():
        if isinstance(p, dict) and p.get("rope_type", "default") != "default":
            raise ValueError(f"rope_type {p['rope_type']!r} (only the default rotary embedding is supported)")
    if not all(isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 for b in (full, local)):
        raise ValueError("a rope_theta is not a positive number")
    return float(full), float(local)


def _global_every(hf: dict[str, Any], layers: int) -> int:
    every = number(hf, "global_attn_every_n_layers", 3)
    if every < 1:
        raise ValueError(f"global_attn_every_n_layers={every} (at least 1)")
    types = hf.get("layer_types")
    if types is not None and not isinstance(types, list):
        raise ValueError("layer_types is not a list")
    if types is not None:
        want = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(layers)]
        if list(types) != want:
            every = next(
                (
                    n
                    for n in range(1, layers + 1)
                    if list(types) == ["full_attention" if i % n == 0 else "sliding_attention" for i in range(layers)]
                ),
                0,
            )
            if not every:
                raise ValueError("layer_types is not one global layer every N (the pattern cramkit reproduces)")
    return every


def config_in(hf: dict[str, Any], file: Path) -> dict[str, Any]:
    biases = {hf.get(k, False) for k in ("norm_bias", "attention_bias", "mlp_bias", "classifier_bias")}
    problems = []
    if len(biases) != 1:
        problems.append("norm_bias, attention_bias, mlp_bias and classifier_bias differ (cramkit has one bias flag)")
    for key in ("hidden_activation", "classifier_activation"):
        if hf.get(key, "gelu") != "gelu":
            problems.append(f"{key} {hf.get(key)!r} (exact gelu only)")
    if problems:
        raise CramkitError(f"{file}: cannot import this ModernBERT checkpoint exactly: " + "; ".join(problems))
    layers = number(hf, "num_hidden_layers", 22)
    full, local = _rope_bases(hf)
    return {
        "vocab_size": number(hf, "vocab_size", 50368),
        "hidden": number(hf, "hidden_size", 768),
        "layers": layers,
        "heads": number(hf, "num_attention_heads", 12),
        "intermediate": 2 * number(hf, "intermediate_size", 1152),  # GeGLU: cramkit's width holds both halves
        "activation": "gelu_glu",
        "norm": "layernorm",
        "norm_position": "pre",
        "norm_eps": number(hf, "norm_eps", 1e-5, float),
        "bias": bool(biases.pop()),
        "position": "rope",
        "rope_base": full,
        "max_position": number(hf, "max_position_embeddings", 8192),
        "type_vocab_size": 0,
        "embedding_norm": True,
        "final_norm": True,
        "tie_embeddings": bool(hf.get("tie_word_embeddings", True)),
        "head_transform": True,
        "dropout": number(hf, "mlp_dropout", 0.0, float),
        "attention_dropout": number(hf, "attention_dropout", 0.0, float),
        "init_std": number(hf, "initializer_range", 0.02, float),
        "pad_token_id": number(hf, "pad_token_id", 50283),
        "local_window": number(hf, "local_attention", 128) // 2,
        "global_every": _global_every(hf, layers),
        "local_rope_base": local,
        "first_attention_norm": False,
        "decoder_bias": bool(hf.get("decoder_bias", True)),
    }


def config_out(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "intermediate_size": cfg.intermediate // 2,
        "hidden_activation": "gelu" if cfg.activation == "gelu_glu" else cfg.activation,
        "classifier_activation": "gelu",
        "max_position_embeddings": cfg.max_position,
        "initializer_range": cfg.init_std,
        "norm_eps": cfg.norm_eps,
        "norm_bias": cfg.bias,
        "attention_bias": cfg.bias,
        "mlp_bias": cfg.bias,
        "classifier_bias": cfg.bias,
        "decoder_bias": cfg.decoder_bias,
        "pad_token_id": cfg.pad_token_id,
        "tie_word_embeddings": cfg.tie_embeddings,
        "local_attention": 2 * cfg.local_window,
        "global_attn_every_n_layers": cfg.global_every,
        "layer_types": ["sliding_attention" if cfg.is_local(i) else "full_attention" for i in range(cfg.layers)],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_base},
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.local_rope_base or cfg.rope_base},
        },
        "mlp_dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
    }


def _halves(cfg: ModelConfig) -> Any:
    """Within each head, the rows of rotate_half's layout (pairs j, j + d/2) in cramkit's interleaved order (pairs
    2j, 2j + 1): index i of cramkit's rows is row ``order[i]`` of theirs."""
    import torch

    d = cfg.head_dim
    per_head = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).reshape(-1)
    return torch.cat([per_head + h * d for h in range(cfg.heads)])


def _adjust(state: dict[str, torch.Tensor], cfg: ModelConfig, inward: bool) -> None:
    """Their rotary halves <-> cramkit's interleaved pairs (query and key rows), their GeGLU's act(first) * second
    <-> cramkit's first * act(second)."""
    import torch

    order = _halves(cfg)
    if not inward:
        order = torch.argsort(order)
    h = cfg.hidden
    for i in range(cfg.layers):
        for kind in ("weight", "bias"):
            name = f"layers.{i}.attn.qkv.{kind}"
            if name in state:
                q, k, v = state[name].split(h, dim=0)
                state[name] = torch.cat([q[order], k[order], v], dim=0)
            name = f"layers.{i}.mlp.fc_in.{kind}"
            if name in state:
                first, second = state[name].chunk(2, dim=0)
                state[name] = torch.cat([second, first], dim=0)


def adjust_in(state: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
    _adjust(state, cfg, inward=True)


def adjust_out(state: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
    _adjust(state, cfg, inward=False)


FAMILY = Family(
    name="ModernBERT",
    model_types={"modernbert": "ModernBert"},
    base="model.",
    names={
        "embeddings.tok_embeddings.weight": "embeddings.word.weight",
        "embeddings.norm.weight": "embeddings.norm.weight",
        "embeddings.norm.bias": "embeddings.norm.bias",
        "final_norm.weight": "final_norm.weight",
        "final_norm.bias": "final_norm.bias",
    },
    layer="layers.{i}.",
    qkv=(),
    layer_names={
        "attn.Wqkv": "attn.qkv",
        "attn.Wo": "attn.out",
        "attn_norm": "norm_attn",
        "mlp_norm": "norm_mlp",
        "mlp.Wi": "mlp.fc_in",
        "mlp.Wo": "mlp.fc_out",
    },
    mlm={
        "head.dense.weight": "head.transform.0.weight",
        "head.dense.bias": "head.transform.0.bias",
        "head.norm.weight": "head.transform.2.weight",
        "head.norm.bias": "head.transform.2.bias",
        "decoder.weight": "head.decoder.weight",
        "decoder.bias": "head.decoder.bias",
    },
    classifier={},
    config_in=config_in,
    config_out=config_out,
    read_suffixes=("Model", "ForMaskedLM"),
    adjust_in=adjust_in,
    adjust_out=adjust_out,
)
