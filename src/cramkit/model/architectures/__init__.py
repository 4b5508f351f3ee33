"""The Hugging Face encoder families cramkit imports exactly and exports back under their own ``model_type``.

Each family is one file holding a :class:`Family`: the ``model_type`` values it reads, its config mapping (their
config.json <-> :class:`~cramkit.model.encoder.ModelConfig`) and its weight names (theirs -> ours, one table that
import reads one way and export the other). Every family maps onto cramkit's own encoder: what differs between them
is a config field (RoBERTa's position offset, ELECTRA's narrower embeddings, MPNet's relative position buckets,
DeBERTa's disentangled attention), so every verb (fine-tuning, pretraining, distillation, embedding, serving,
export) runs on all of them.

To add a family: a file with its ``Family``, registered in ``FAMILIES`` below, and a test against transformers'
outputs (tests/model/test_architectures.py builds a tiny random model of each with transformers' config class).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, cast

from cramkit.errors import CramkitError
from cramkit.model.architectures import bert, deberta, distilbert, electra, modernbert, mpnet, roberta
from cramkit.model.architectures.family import KIND_SUFFIX, READ_SUFFIXES, UNSUPPORTED, Family

__all__ = ["FAMILIES", "KIND_SUFFIX", "READ_SUFFIXES", "Family", "family_of", "pooler_activation", "supported_types"]

FAMILIES: tuple[Family, ...] = (
    bert.FAMILY,
    roberta.FAMILY,
    distilbert.FAMILY,
    electra.FAMILY,
    mpnet.FAMILY,
    modernbert.FAMILY,
    deberta.FAMILY,
)


def supported_types() -> list[str]:
    """The ``model_type`` values cramkit imports."""
    return [t for fam in FAMILIES for t in fam.model_types]


def family_of(model_type: object, file: Path) -> Family:
    """The family that reads ``model_type``, else one line naming what is supported."""
    for fam in FAMILIES:
        if model_type in fam.model_types:
            return fam
    why = ""
    if model_type in UNSUPPORTED:
        why = f" ({UNSUPPORTED[str(model_type)]} has no equivalent in cramkit's encoder yet)"
    raise CramkitError(
        f"{file}: model_type {model_type!r} is not supported{why}; cramkit imports {', '.join(supported_types())}. "
        "Pick a model of one of these types, or pretrain one with cramkit"
    )


def pooler_activation(model_type: str) -> Literal["tanh", "relu", "gelu"]:
    """The activation of a new classifier's pooler on a model imported as ``model_type`` (its family's, so that
    the classifier exports under that family: DeBERTa's and ELECTRA's GELU); tanh (BERT's) for cramkit's own."""
    found = next((fam.pooler_activation for fam in FAMILIES if model_type in fam.model_types), "tanh")
    return cast('Literal["tanh", "relu", "gelu"]', found)
