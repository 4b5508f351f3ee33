"""DeBERTa-v2 and v3 (``model_type: deberta-v2``): BERT-like post-LN layers whose attention adds disentangled
relative position terms (:mod:`cramkit.model.disentangled`); v3 has no absolute positions and no token types. The
configurations the public checkpoints use are imported exactly (relative attention with both terms, shared
position projections, log buckets, the table normalised, no convolution layer); anything else is one line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.model.architectures.bert import CLS_PREDICTIONS, EMBEDDINGS, LAYER, LAYER_NAMES
from cramkit.model.architectures.family import (
    READ_SUFFIXES,
    Family,
    activation,
    common_config_in,
    common_config_out,
    number,
)

if TYPE_CHECKING:
    from cramkit.model.encoder import ModelConfig

# the masked-LM head: the legacy layout (BERT's cls.predictions) and the current one (lm_predictions.lm_head, the
# decoder being the word embeddings): the same computation
_CURRENT = {
    "lm_predictions.lm_head.dense.weight": "head.transform.0.weight",
    "lm_predictions.lm_head.dense.bias": "head.transform.0.bias",
    "lm_predictions.lm_head.LayerNorm.weight": "head.transform.2.weight",
    "lm_predictions.lm_head.LayerNorm.bias": "head.transform.2.bias",
    "lm_predictions.lm_head.bias": "head.decoder.bias",
}


def _terms(hf: dict[str, Any]) -> set[str]:
    kinds = hf.get("pos_att_type") or []
    if isinstance(kinds, str):
        kinds = kinds.lower().split("|")
    return {str(k).strip() for k in kinds} if isinstance(kinds, list) else {"?"}


def config_in(hf: dict[str, Any], file: Path) -> dict[str, Any]:
    common = common_config_in(hf)
    hidden = common["hidden"]
    problems = []
    if not hf.get("relative_attention", False):
        problems.append("relative_attention=false (DeBERTa without its relative attention)")
    if _terms(hf) != {"c2p", "p2c"}:
        problems.append(f"pos_att_type={hf.get('pos_att_type')!r} (both c2p and p2c are supported)")
    if not hf.get("share_att_key", False):
        problems.append("share_att_key=false (separate position projections)")
    if number(hf, "conv_kernel_size", 0):
        problems.append(f"conv_kernel_size={hf.get('conv_kernel_size')} (DeBERTa-v2's convolution layer)")
    if "layer_norm" not in str(hf.get("norm_rel_ebd", "none")).lower():
        problems.append(f"norm_rel_ebd={hf.get('norm_rel_ebd')!r} (the position table normalised: layer_norm)")
    buckets = number(hf, "position_buckets", -1)
    if buckets <= 0:
        problems.append(f"position_buckets={buckets} (log buckets are supported)")
    for key in ("embedding_size", "pooler_hidden_size"):
        if number(hf, key, hidden) != hidden:
            problems.append(f"{key}={hf.get(key)} (differs from hidden_size {hidden})")
    if number(hf, "attention_head_size", hidden // max(common["heads"], 1)) * common["heads"] != hidden:
        problems.append(f"attention_head_size={hf.get('attention_head_size')} (heads x size differs from hidden)")
    if hf.get("pooler_hidden_act", "gelu") != "gelu":
        problems.append(f"pooler_hidden_act={hf.get('pooler_hidden_act')!r} (gelu is supported)")
    if problems:
        raise CramkitError(f"{file}: cannot import this DeBERTa checkpoint exactly: " + "; ".join(problems))
    max_distance = number(hf, "max_relative_positions", -1)
    return {
        **common,
        "activation": activation(hf, "hidden_act", file),
        "position": "learned" if hf.get("position_biased_input", True) else "none",
        "type_vocab_size": number(hf, "type_vocab_size", 0),
        "disentangled_buckets": buckets,
        "disentangled_max_distance": max_distance if max_distance >= 1 else common["max_position"],
    }


def config_out(cfg: ModelConfig) -> dict[str, Any]:
    return {
        **common_config_out(cfg),
        "type_vocab_size": cfg.type_vocab_size,
        "position_biased_input": cfg.position == "learned",
        "relative_attention": True,
        "pos_att_type": ["p2c", "c2p"],
        "share_att_key": True,
        "norm_rel_ebd": "layer_norm",
        "position_buckets": cfg.disentangled_buckets,
        "max_relative_positions": cfg.disentangled_max_distance,
        "pooler_hidden_size": cfg.hidden,
        "pooler_hidden_act": "gelu",
        "pooler_dropout": 0,
        "legacy": True,
    }


FAMILY = Family(
    name="DeBERTa",
    model_types={"deberta-v2": "DebertaV2"},
    base="deberta.",
    names={
        **EMBEDDINGS,
        "encoder.rel_embeddings.weight": "disentangled.weight",
        "encoder.LayerNorm.weight": "disentangled_norm.weight",
        "encoder.LayerNorm.bias": "disentangled_norm.bias",
    },
    layer=LAYER,
    qkv=("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj"),
    layer_names=LAYER_NAMES,
    mlm={**_CURRENT, **CLS_PREDICTIONS},  # (export writes the legacy names: transformers' default layout)
    classifier={
        "pooler.dense.weight": "pooler.weight",
        "pooler.dense.bias": "pooler.bias",
        "classifier.weight": "classifier.weight",
        "classifier.bias": "classifier.bias",
    },
    config_in=config_in,
    config_out=config_out,
    pooler_activation="gelu",
    # a multiple-choice model's pooler is its own (ContextPooler), not a base model's: not written
    read_suffixes=tuple(s for s in READ_SUFFIXES if s not in ("ForMultipleChoice", "ForPreTraining")),
    # the position ids buffer; ELECTRA-style discriminators' replaced-token head (DeBERTa-v3's pretraining)
    ignored=(r"embeddings\.position_ids", r"mask_predictions\..*", r"lm_predictions\.lm_head\.decoder\..*"),
)
