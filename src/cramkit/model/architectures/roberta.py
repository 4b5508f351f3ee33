"""RoBERTa, XLM-R and CamemBERT: BERT's layers with positions counted from the padding index + 1, one token
type, a masked-LM head ``lm_head`` and a classifier head (dense + tanh + out_proj) of their own."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.model.architectures.bert import DENSE_OUT_PROJ, EMBEDDINGS, LAYER, LAYER_NAMES, LM_HEAD, POOLER, QKV
from cramkit.model.architectures.family import Family, activation, common_config_in, common_config_out, encoder_problems

if TYPE_CHECKING:
    from cramkit.model.encoder import ModelConfig


def config_in(hf: dict[str, Any], file: Path) -> dict[str, Any]:
    problems = encoder_problems(hf)
    if problems:
        raise CramkitError(
            f"{file}: cannot import this {hf.get('model_type')} checkpoint exactly: " + "; ".join(problems)
        )
    common = common_config_in(hf)
    return {
        **common,
        "activation": activation(hf, "hidden_act", file),
        "type_vocab_size": int(hf.get("type_vocab_size", 1)),
        # create_position_ids_from_input_ids: the first real token sits at padding_idx + 1
        "position_offset": common["pad_token_id"] + 1,
    }


def config_out(cfg: ModelConfig) -> dict[str, Any]:
    return {
        **common_config_out(cfg),
        "type_vocab_size": max(cfg.type_vocab_size, 1),
        "position_embedding_type": "absolute",
        "bos_token_id": 0,
        "eos_token_id": 2,
    }


FAMILY = Family(
    name="RoBERTa",
    model_types={"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert"},
    base="roberta.",
    names={**EMBEDDINGS, **POOLER},
    layer=LAYER,
    qkv=QKV,
    layer_names=LAYER_NAMES,
    mlm=LM_HEAD,
    classifier=DENSE_OUT_PROJ,
    config_in=config_in,
    config_out=config_out,
    ignored=(r"embeddings\.position_ids",),
)
