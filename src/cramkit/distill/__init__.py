"""Distillation into small fast students (Tang et al. 2019): transfer-set augmentation, cached teacher
logits, BiLSTM and small-encoder students. See :func:`cramkit.distill.core.distill`."""

from cramkit.distill.augment import AugmentConfig, build_transfer, read_transfer
from cramkit.distill.core import DistillConfig, build_student, config_from, distill
from cramkit.distill.unlabelled import read_unlabelled

__all__ = [
    "AugmentConfig",
    "DistillConfig",
    "build_student",
    "build_transfer",
    "config_from",
    "distill",
    "read_transfer",
    "read_unlabelled",
]
