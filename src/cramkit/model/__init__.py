"""cramkit.model: the encoder, its heads, Hugging Face import/export, and batched forward passes for scoring
(forward.py).

The names below are imported on first use (PEP 562), so that reading a model directory's metadata
(``cramkit.model.loaded``, which ``cramkit.load`` and the command line import) does not load torch:
``cramkit --help`` stays instant."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cramkit.model.encoder import Encoder, ModelConfig, count_parameters, flops_per_token
    from cramkit.model.heads import IGNORE, ClassifierConfig, MaskedLM, MLMOutput, SequenceClassifier

_WHERE = {
    "Encoder": "encoder",
    "ModelConfig": "encoder",
    "count_parameters": "encoder",
    "flops_per_token": "encoder",
    "IGNORE": "heads",
    "ClassifierConfig": "heads",
    "MaskedLM": "heads",
    "MLMOutput": "heads",
    "SequenceClassifier": "heads",
}

__all__ = [
    "IGNORE",
    "ClassifierConfig",
    "Encoder",
    "MLMOutput",
    "MaskedLM",
    "ModelConfig",
    "SequenceClassifier",
    "count_parameters",
    "flops_per_token",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'cramkit.model' has no attribute {name!r}")
    return getattr(importlib.import_module(f"cramkit.model.{_WHERE[name]}"), name)
