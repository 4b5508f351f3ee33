"""BERT (``model_type: bert``): post-LN, learned positions, token types, biases; the pooler in the base model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.model.architectures.family import Family, activation, common_config_in, common_config_out, encoder_problems

if TYPE_CHECKING:
    from cramkit.model.encoder import ModelConfig

EMBEDDINGS = {
    "embeddings.word_embeddings.weight": "embeddings.word.weight",
    "embeddings.position_embeddings.weight": "embeddings.position.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.token_type.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "embeddings.norm.bias",
}
POOLER = {"pooler.dense.weight": "pooler.weight", "pooler.dense.bias": "pooler.bias"}
LAYER = "encoder.layer.{i}."
QKV = ("attention.self.query", "attention.self.key", "attention.self.value")
LAYER_NAMES = {
    "attention.output.dense": "attn.out",
    "attention.output.LayerNorm": "norm_attn",
    "intermediate.dense": "mlp.fc_in",
    "output.dense": "mlp.fc_out",
    "output.LayerNorm": "norm_mlp",
}
# RoBERTa's and MPNet's masked-LM head and classifier (dense + tanh + out_proj), shared with them
LM_HEAD = {
    "lm_head.dense.weight": "head.transform.0.weight",
    "lm_head.dense.bias": "head.transform.0.bias",
    "lm_head.layer_norm.weight": "head.transform.2.weight",
    "lm_head.layer_norm.bias": "head.transform.2.bias",
    "lm_head.decoder.weight": "head.decoder.weight",
    "lm_head.decoder.bias": "head.decoder.bias",  # the same tensor as lm_head.bias (written last: exported)
    "lm_head.bias": "head.decoder.bias",
}
# BERT's own masked-LM head (cls.predictions), also DeBERTa's legacy layout
CLS_PREDICTIONS = {
    "cls.predictions.transform.dense.weight": "head.transform.0.weight",
    "cls.predictions.transform.dense.bias": "head.transform.0.bias",
    "cls.predictions.transform.LayerNorm.weight": "head.transform.2.weight",
    "cls.predictions.transform.LayerNorm.bias": "head.transform.2.bias",
    "cls.predictions.decoder.weight": "head.decoder.weight",
    "cls.predictions.decoder.bias": "head.decoder.bias",
    "cls.predictions.bias": "head.decoder.bias",
}
DENSE_OUT_PROJ = {
    "classifier.dense.weight": "pooler.weight",
    "classifier.dense.bias": "pooler.bias",
    "classifier.out_proj.weight": "classifier.weight",
    "classifier.out_proj.bias": "classifier.bias",
}


def config_in(hf: dict[str, Any], file: Path) -> dict[str, Any]:
    problems = encoder_problems(hf)
    if problems:
        raise CramkitError(f"{file}: cannot import this BERT checkpoint exactly: " + "; ".join(problems))
    return {
        **common_config_in(hf),
        "activation": activation(hf, "hidden_act", file),
        "type_vocab_size": int(hf.get("type_vocab_size", 2)),
    }


def config_out(cfg: ModelConfig) -> dict[str, Any]:
    return {
        **common_config_out(cfg),
        "type_vocab_size": max(cfg.type_vocab_size, 1),  # BERT always adds a row (of zeros when cramkit has none)
        "position_embedding_type": "absolute",
    }


FAMILY = Family(
    name="BERT",
    model_types={"bert": "Bert"},
    base="bert.",
    names={**EMBEDDINGS, **POOLER},
    layer=LAYER,
    qkv=QKV,
    layer_names=LAYER_NAMES,
    mlm=CLS_PREDICTIONS,
    classifier={"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"},
    config_in=config_in,
    config_out=config_out,
    classifier_pooler="base",
    ignored=(r"embeddings\.position_ids", r"cls\.seq_relationship\..*"),
)
