"""The learning rate "auto" of the recipes that start from a trained encoder: one rule, by the model's width.

A model from MiniLM's width (384) up trains at its recipe's rate; a narrower one (cramkit's tiny presets, 256)
barely moves at such a rate after a short pretraining and learns at 1e-3 (bench/RESULTS.md "Few labels: the
rate"). Each recipe gives its own rate for wide models and the width it assumes for a model that declares none:

- fine-tuning (``FinetuneConfig.lr``): Cramming's 4e-5; a model without a width (a student) counts as wide;
- SetFit's body (``FinetuneConfig.setfit_lr``): SetFit's 2e-5; a model without a width counts as wide;
- the contrastive stage (``ContrastiveConfig.lr``): sentence-transformers' 2e-5; a model without a width counts
  as narrow.
"""

from __future__ import annotations

WIDE_FROM = 384  # the narrowest width that trains at its recipe's own rate (MiniLM's)
NARROW_LR = 1e-3  # the rate of narrower models
FINETUNE_LR = 4e-5  # fine-tuning's rate for wide models (Cramming's)
EMBEDDING_LR = 2e-5  # the rate of wide models trained to embed: SetFit's body, the contrastive stage


def width_lr(setting: float | str, hidden: int | None, *, wide: float, undeclared_width: int) -> float:
    """``setting`` as a number; for "auto", ``wide`` when the model is at least WIDE_FROM wide, else NARROW_LR.
    ``hidden``: the model's width; None (a model that declares none) counts as ``undeclared_width``."""
    if setting != "auto":
        return float(setting)
    width = undeclared_width if hidden is None else hidden
    return wide if width >= WIDE_FROM else NARROW_LR
