"""MPNet (all-mpnet-base-v2): BERT-like post-LN layers, positions from the padding index + 1, no token types, and
a relative position bias (32 buckets, shared by the layers) added to every attention's scores."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.model.architectures.bert import DENSE_OUT_PROJ, EMBEDDINGS, LM_HEAD, POOLER
from cramkit.model.architectures.family import Family, activation, common_config_in, common_config_out, number

if TYPE_CHECKING:
    from cramkit.model.encoder import ModelConfig

BUCKETS = 32  # MPNetEncoder.compute_position_bias's own default: the config's count sizes the table only


def config_in(hf: dict[str, Any], file: Path) -> dict[str, Any]:
    buckets = number(hf, "relative_attention_num_buckets", BUCKETS)
    if buckets != BUCKETS:
        raise CramkitError(
            f"{file}: relative_attention_num_buckets={buckets}; transformers' MPNet computes {BUCKETS} buckets "
            "whatever the config says, so cramkit imports only that"
        )
    common = common_config_in(hf)
    return {
        **common,
        "activation": activation(hf, "hidden_act", file),
        "type_vocab_size": 0,
        "position_offset": common["pad_token_id"] + 1,
        "relative_buckets": buckets,
        "relative_max_distance": 128,
    }


def config_out(cfg: ModelConfig) -> dict[str, Any]:
    return {
        **common_config_out(cfg),
        "relative_attention_num_buckets": cfg.relative_buckets,
        "bos_token_id": 0,
        "eos_token_id": 2,
    }


FAMILY = Family(
    name="MPNet",
    model_types={"mpnet": "MPNet"},
    base="mpnet.",
    names={
        **{k: v for k, v in EMBEDDINGS.items() if "token_type" not in k},
        **POOLER,
        "encoder.relative_attention_bias.weight": "relative.weight",
    },
    layer="encoder.layer.{i}.",
    qkv=("attention.attn.q", "attention.attn.k", "attention.attn.v"),
    layer_names={
        "attention.attn.o": "attn.out",
        "attention.LayerNorm": "norm_attn",
        "intermediate.dense": "mlp.fc_in",
        "output.dense": "mlp.fc_out",
        "output.LayerNorm": "norm_mlp",
    },
    mlm=LM_HEAD,
    classifier=DENSE_OUT_PROJ,
    config_in=config_in,
    config_out=config_out,
    ignored=(r"embeddings\.position_ids",),
)
