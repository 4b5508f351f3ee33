"""ELECTRA: BERT's layers, embeddings of their own width (``embedding_size``) projected to the hidden size; the
discriminator's head (replaced-token detection) is not needed, the generator's masked-LM head is read; its
classifier is dense + GELU + out_proj."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.model.architectures.bert import DENSE_OUT_PROJ, EMBEDDINGS, LAYER, LAYER_NAMES, QKV
from cramkit.model.architectures.family import Family, activation, common_config_in, common_config_out, encoder_problems
from cramkit.model.architectures.family import number as _number

if TYPE_CHECKING:
    from cramkit.model.encoder import ModelConfig


def config_in(hf: dict[str, Any], file: Path) -> dict[str, Any]:
    problems = encoder_problems(hf)
    if problems:
        raise CramkitError(f"{file}: cannot import this ELECTRA checkpoint exactly: " + "; ".join(problems))
    common = common_config_in(hf)
    size = _number(hf, "embedding_size", common["hidden"])
    return {
        **common,
        "activation": activation(hf, "hidden_act", file),
        "type_vocab_size": int(hf.get("type_vocab_size", 2)),
        "embedding_size": 0 if size == common["hidden"] else size,
    }


def config_out(cfg: ModelConfig) -> dict[str, Any]:
    return {
        **common_config_out(cfg),
        "embedding_size": cfg.embedding_width,
        "type_vocab_size": max(cfg.type_vocab_size, 1),
        "position_embedding_type": "absolute",
    }


FAMILY = Family(
    name="ELECTRA",
    model_types={"electra": "Electra"},
    base="electra.",
    names={
        **EMBEDDINGS,
        "embeddings_project.weight": "embeddings.project.weight",
        "embeddings_project.bias": "embeddings.project.bias",
    },
    layer=LAYER,
    qkv=QKV,
    layer_names=LAYER_NAMES,
    mlm={
        "generator_predictions.dense.weight": "head.transform.0.weight",
        "generator_predictions.dense.bias": "head.transform.0.bias",
        "generator_predictions.LayerNorm.weight": "head.transform.2.weight",
        "generator_predictions.LayerNorm.bias": "head.transform.2.bias",
        "generator_lm_head.weight": "head.decoder.weight",
        "generator_lm_head.bias": "head.decoder.bias",
    },
    classifier=DENSE_OUT_PROJ,
    config_in=config_in,
    config_out=config_out,
    pooler_activation="gelu",
    ignored=(r"embeddings\.position_ids", r"discriminator_predictions\..*"),
)
