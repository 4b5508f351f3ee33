"""Distillation into small fast students (Tang et al. 2019): transfer-set augmentation, cached teacher
logits, BiLSTM and small-encoder students.

This package is also the verb: ``cramkit.distill(teacher, student=..., task=..., out=...)`` calls
:func:`cramkit.distill.verb.distill` (``cramkit distill``'s front door: task names, files, checks); the recipe
on a resolved task is :func:`cramkit.distill.core.distill`. Its names load on first use (PEP 562): ``import
cramkit`` imports this package and must not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cramkit.lazy import callable_package, lazy_names

if TYPE_CHECKING:
    from cramkit.distill.augment import AugmentConfig, build_transfer, read_transfer
    from cramkit.distill.config import DistillConfig, config_from
    from cramkit.distill.core import distill
    from cramkit.distill.students import build_student
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
__getattr__ = lazy_names(
    __name__,
    {
        "AugmentConfig": "cramkit.distill.augment",
        "build_transfer": "cramkit.distill.augment",
        "read_transfer": "cramkit.distill.augment",
        "DistillConfig": "cramkit.distill.config",
        "config_from": "cramkit.distill.config",
        "build_student": "cramkit.distill.students",
        "distill": "cramkit.distill.core",
        "read_unlabelled": "cramkit.distill.unlabelled",
    },
)
callable_package(__name__, "cramkit.distill.verb", "distill")
