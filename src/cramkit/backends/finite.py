"""Finite numbers only: a model's weights checked when it is opened, its outputs checked as they leave it.

A NaN or an infinity in a weight table (a crafted or damaged export, a model whose training diverged) makes
every answer that touches it NaN, which JSON cannot hold: ``predict`` would write bare ``NaN`` and the server
answer nulls. So every format checks its weight tables on load (:func:`check_weights`, one line naming the file
and the fix), and the one place outputs leave a backend, the runner the :class:`~cramkit.infer.Engine` holds,
is wrapped in a :class:`FiniteRunner`: an output that is not finite (finite weights whose forward pass
overflows) is a :class:`NonFiniteOutput` naming the model, for every verb and route alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from cramkit.errors import CramkitError

if TYPE_CHECKING:
    from cramkit.backends.base import Inputs, Runner

# the export's fix, in every line that refuses one
EXPORT_FIX = "the export is damaged or crafted: export the model again from a model whose weights are finite"


class NonFiniteOutput(CramkitError):
    """A model answered NaN or infinity at run time (the server's 500, the command line's one line)."""


def count_nonfinite(values: Any) -> int:
    """How many entries of an array (numpy or torch, any float type; bf16 as raw uint16 bits too) are NaN or
    infinite; 0 for integers."""
    if hasattr(values, "detach"):  # a torch tensor
        import torch

        if not torch.is_floating_point(values):
            return 0
        return int((~torch.isfinite(values)).sum())
    a = np.asarray(values)
    if a.dtype.kind == "f":
        return int(a.size - np.count_nonzero(np.isfinite(a)))
    if a.dtype.kind == "c":
        return int(a.size - np.count_nonzero(np.isfinite(a)))
    if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: numpy cannot test it, its float32 value can
        return count_nonfinite(a.astype(np.float32))
    return 0


def weight_faults(values: Any) -> int:
    """The values of a weight table that no trained model holds: NaN anywhere, and infinity in a table of more
    than one value (a lone -inf constant is an attention mask's fill, which a graph may keep as a scalar)."""
    size = int(values.numel()) if hasattr(values, "numel") else int(np.size(values))
    if size > 1:
        return count_nonfinite(values)
    if hasattr(values, "detach"):
        values = values.detach().float().cpu().numpy()
    a = np.asarray(values)
    if a.dtype.name == "bfloat16":
        a = a.astype(np.float32)
    return int(np.isnan(a).sum()) if a.dtype.kind in "fc" else 0


def bf16_faults(raw: bytes | memoryview) -> int:
    """:func:`weight_faults` of bfloat16 values stored as little-endian 16-bit words (the exponent's eight bits
    all set: infinity, or NaN with a mantissa)."""
    words = np.frombuffer(raw, dtype="<u2")
    top = (words & 0x7F80) == 0x7F80
    return int(np.count_nonzero(top if words.size > 1 else top & ((words & 0x007F) != 0)))


def refuse_table(where: Any, name: str, bad: int, size: int, fix: str = EXPORT_FIX) -> None:
    """One CramkitError line when ``bad`` of the ``size`` values of the weight table ``name`` are not finite."""
    if bad:
        raise CramkitError(
            f"{where}: the weight table {name!r} holds {bad:,} NaN or infinite values of {size:,}; {fix}"
        )


def check_weights(where: Any, tables: Iterable[tuple[str, Any]], fix: str = EXPORT_FIX) -> None:
    """Refuse, in one line naming ``where`` and the first bad table, weights holding NaN or infinity."""
    for name, values in tables:
        size = int(values.numel()) if hasattr(values, "numel") else int(np.size(values))
        refuse_table(where, name, weight_faults(values), size, fix)


# ------------------------------------------------------------------------------------------ at answer time


def _check(source: str, what: str, values: Any) -> Any:
    bad = count_nonfinite(values)
    if bad:
        rows = int(np.shape(values)[0]) if np.ndim(values) else 1
        raise NonFiniteOutput(
            f"{source}: the model answered NaN or infinity ({bad:,} NaN or infinite values in its {what} for a pass "
            f"of {rows} input(s)); its weights are finite, so its forward pass overflows on these inputs and there "
            "is no answer to give: the model is broken on them, train it again or use another model"
        )
    return values


class FiniteRunner:
    """A :class:`~cramkit.backends.Runner` whose every output is checked: NaN or infinity is a
    :class:`NonFiniteOutput` naming ``source``; anything else the runner has (its name, precision, device,
    budget, workers, torch module) is the runner's own."""

    def __init__(self, runner: Runner, source: str) -> None:
        self.inner = runner
        self.source = source

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def pooled(self, x: Inputs) -> tuple[np.ndarray, np.ndarray]:
        mean, cls = self.inner.pooled(x)
        return _check(self.source, "embeddings", mean), _check(self.source, "embeddings", cls)

    def logits(self, x: Inputs) -> np.ndarray:
        return _check(self.source, "scores (logits)", self.inner.logits(x))

    def mask_topk(self, x: Inputs, where: np.ndarray, k: int) -> tuple[Any, Any]:
        probs, ids = self.inner.mask_topk(x, where, k)
        return _check(self.source, "token probabilities", probs), ids
