"""cramkit.model: the encoder, its heads, Hugging Face import/export, and batched forward passes for scoring
(forward.py).

The names below are imported on first use (PEP 562), so that reading a model directory's metadata
(``cramkit.model.loaded``, which ``cramkit.load`` and the command line import) does not load torch:
``cramkit --help`` stays instant."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cramkit.lazy import lazy_names

if TYPE_CHECKING:
    from cramkit.model.config import ModelConfig, flops_per_token
    from cramkit.model.encoder import Encoder, count_parameters
    from cramkit.model.heads import IGNORE, ClassifierConfig, MaskedLM, MLMOutput, SequenceClassifier

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
__getattr__ = lazy_names(
    __name__,
    {
        "Encoder": "cramkit.model.encoder",
        "ModelConfig": "cramkit.model.config",
        "count_parameters": "cramkit.model.encoder",
        "flops_per_token": "cramkit.model.config",
        "IGNORE": "cramkit.model.heads",
        "ClassifierConfig": "cramkit.model.heads",
        "MaskedLM": "cramkit.model.heads",
        "MLMOutput": "cramkit.model.heads",
        "SequenceClassifier": "cramkit.model.heads",
    },
)
