"""Distillation into small fast students (Tang et al. 2019): transfer-set augmentation, cached teacher
logits, BiLSTM and small-encoder students.

The verb ``cramkit.distill(teacher, student=..., task=..., out=...)`` is :func:`cramkit.distillation.verb.distill`
(``cramkit distill``'s front door: task names, files, checks); the recipe on a resolved task is
:func:`cramkit.distillation.core.distill`. Self-training (``cramkit finetune --unlabelled``), which labels text with
this package's teacher, is :mod:`cramkit.selftraining`. Names load on first use (PEP 562): this package must not
import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cramkit.lazy import lazy_names

if TYPE_CHECKING:
    from cramkit.distillation.augment import AugmentConfig, build_transfer, read_transfer
    from cramkit.distillation.config import DistillConfig, config_from
    from cramkit.distillation.core import distill
    from cramkit.distillation.students import build_student
    from cramkit.distillation.unlabelled import read_unlabelled

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
__getattr__ = lazy_names(
    __name__,
    {
        "AugmentConfig": "cramkit.distillation.augment",
        "build_transfer": "cramkit.distillation.augment",
        "read_transfer": "cramkit.distillation.augment",
        "DistillConfig": "cramkit.distillation.config",
        "config_from": "cramkit.distillation.config",
        "build_student": "cramkit.distillation.students",
        "distill": "cramkit.distillation.core",
        "read_unlabelled": "cramkit.distillation.unlabelled",
    },
)
