"""DistilBERT: BERT's post-LN layers under other names, no token types, no pooler; its classifier is
``pre_classifier`` + ReLU + ``classifier``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.model.architectures.family import Family, activation, number

if TYPE_CHECKING:
    from cramkit.model.encoder import ModelConfig


def config_in(hf: dict[str, Any], file: Path) -> dict[str, Any]:
    if hf.get("sinusoidal_pos_embds"):
        raise CramkitError(
            f"{file}: sinusoidal_pos_embds=true is not supported (cramkit imports DistilBERT's learned positions)"
        )
    return {
        "vocab_size": number(hf, "vocab_size", 30522),
        "hidden": number(hf, "dim", 768),
        "layers": number(hf, "n_layers", 6),
        "heads": number(hf, "n_heads", 12),
        "intermediate": number(hf, "hidden_dim", 3072),
        "activation": activation(hf, "activation", file),
        "norm": "layernorm",
        "norm_position": "post",
        "norm_eps": 1e-12,  # DistilBERT's LayerNorms are built with eps=1e-12, whatever the config
        "bias": True,
        "position": "learned",
        "max_position": number(hf, "max_position_embeddings", 512),
        "type_vocab_size": 0,
        "embedding_norm": True,
        "final_norm": False,
        "tie_embeddings": bool(hf.get("tie_word_embeddings", True)),
        "head_transform": True,
        "dropout": number(hf, "dropout", 0.1, float),
        "attention_dropout": number(hf, "attention_dropout", 0.1, float),
        "init_std": number(hf, "initializer_range", 0.02, float),
        "pad_token_id": number(hf, "pad_token_id", 0),
    }


def config_out(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "vocab_size": cfg.vocab_size,
        "dim": cfg.hidden,
        "n_layers": cfg.layers,
        "n_heads": cfg.heads,
        "hidden_dim": cfg.intermediate,
        "activation": cfg.activation,
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "max_position_embeddings": cfg.max_position,
        "sinusoidal_pos_embds": False,
        "initializer_range": cfg.init_std,
        "pad_token_id": cfg.pad_token_id,
        "tie_word_embeddings": cfg.tie_embeddings,
    }


FAMILY = Family(
    name="DistilBERT",
    model_types={"distilbert": "DistilBert"},
    base="distilbert.",
    names={
        "embeddings.word_embeddings.weight": "embeddings.word.weight",
        "embeddings.position_embeddings.weight": "embeddings.position.weight",
        "embeddings.LayerNorm.weight": "embeddings.norm.weight",
        "embeddings.LayerNorm.bias": "embeddings.norm.bias",
    },
    layer="transformer.layer.{i}.",
    qkv=("attention.q_lin", "attention.k_lin", "attention.v_lin"),
    layer_names={
        "attention.out_lin": "attn.out",
        "sa_layer_norm": "norm_attn",
        "ffn.lin1": "mlp.fc_in",
        "ffn.lin2": "mlp.fc_out",
        "output_layer_norm": "norm_mlp",
    },
    mlm={
        "vocab_transform.weight": "head.transform.0.weight",
        "vocab_transform.bias": "head.transform.0.bias",
        "vocab_layer_norm.weight": "head.transform.2.weight",
        "vocab_layer_norm.bias": "head.transform.2.bias",
        "vocab_projector.weight": "head.decoder.weight",
        "vocab_projector.bias": "head.decoder.bias",
    },
    classifier={
        "pre_classifier.weight": "pooler.weight",
        "pre_classifier.bias": "pooler.bias",
        "classifier.weight": "classifier.weight",
        "classifier.bias": "classifier.bias",
    },
    config_in=config_in,
    config_out=config_out,
    pooler_activation="relu",
    ignored=(r"embeddings\.position_ids",),
)
