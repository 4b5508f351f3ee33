"""cramkit.model: the encoder, its heads, Hugging Face import/export, and batched forward passes for scoring
(forward.py)."""

from cramkit.model.encoder import Encoder, ModelConfig, count_parameters, flops_per_token
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
