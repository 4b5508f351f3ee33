"""Distillation into small fast students (Tang et al. 2019): transfer-set augmentation, cached teacher
logits, BiLSTM and small-encoder students.

This package is also the verb: ``cramkit.distill(teacher, student=..., task=..., out=...)`` calls
:func:`cramkit.distill.verb.distill` (``cramkit distill``'s front door: task names, files, checks); the recipe
on a resolved task is :func:`cramkit.distill.core.distill`. Its names load on first use (PEP 562): ``import
cramkit`` imports this package and must not import torch."""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cramkit.distill.augment import AugmentConfig, build_transfer, read_transfer
    from cramkit.distill.config import DistillConfig, config_from
    from cramkit.distill.core import distill
    from cramkit.distill.students import build_student
    from cramkit.distill.unlabelled import read_unlabelled

_WHERE = {
    "AugmentConfig": "augment",
    "build_transfer": "augment",
    "read_transfer": "augment",
    "DistillConfig": "config",
    "build_student": "students",
    "config_from": "config",
    "distill": "core",
    "read_unlabelled": "unlabelled",
}

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


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f"cramkit.distill.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cramkit.distill' has no attribute {name!r}")


def _verb() -> Any:
    from cramkit.distill.verb import distill

    return distill


class _VerbModule(types.ModuleType):
    """The package, callable as the verb (module ``__class__`` assignment: the package stays a package, so
    ``import cramkit.distill.core`` and ``cramkit.distill.DistillConfig`` work as before)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _verb()(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(_verb())


sys.modules[__name__].__class__ = _VerbModule
