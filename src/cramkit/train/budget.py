"""Budgets: how much a run may spend, as wall-clock time, tokens or optimizer steps.

Everything keyed to the budget (learning rate, batch-size ramp) reads :meth:`Budget.fraction`, so the
same recipe runs for 3 minutes on a laptop or 24 hours on a GPU (Cramming, arXiv 2212.14034).
Time budgets count training time only (evaluation and checkpoint writing are excluded), and the time
already spent is stored in each checkpoint so that a resumed run continues where it stopped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from cramkit.errors import CramkitError
from cramkit.progress import format_seconds

_FORMS = "'30s', '5m', '24h', '2d' (time), '2e9tok' (tokens) or '1000steps' (optimizer steps)"
_TIME_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(s|m|h|d|tok|tokens|steps?)\s*$")


@dataclass(frozen=True)
class Budget:
    kind: Literal["time", "tokens", "steps"]
    amount: float  # seconds, tokens or steps

    @classmethod
    def of_steps(cls, steps: int) -> Budget:
        """A budget of ``steps`` optimizer steps (a whole number, at least 1)."""
        if isinstance(steps, bool) or not float(steps).is_integer() or steps < 1:
            raise CramkitError(f"a step budget must be a whole number of at least 1, got {steps!r}")
        return cls("steps", float(steps))

    @property
    def text(self) -> str:
        """The canonical text form, which :func:`parse_budget` reads back: ``300s``, ``2000000000tok``, ``100steps``."""
        unit = {"time": "s", "tokens": "tok", "steps": "steps"}[self.kind]
        return f"{int(self.amount) if self.amount.is_integer() else repr(self.amount)}{unit}"

    def fraction(self, elapsed: float, tokens: int, steps: int) -> float:
        """Fraction of the budget spent, in [0, 1]."""
        spent = {"time": elapsed, "tokens": tokens, "steps": steps}[self.kind]
        return min(1.0, max(0.0, spent / self.amount))

    def done(self, elapsed: float, tokens: int, steps: int) -> bool:
        return self.fraction(elapsed, tokens, steps) >= 1.0

    def describe(self) -> str:
        if self.kind == "steps":
            return f"{int(self.amount)} steps"
        if self.kind == "tokens":
            return f"{self.amount:.3g} tokens"
        return format_seconds(self.amount)


def parse_budget(text: str | int | float, where: str = "train.budget") -> Budget:
    """``"5m"`` -> Budget("time", 300); ``"2e9tok"``; ``"1000steps"``. Clear error for anything else."""
    raw = str(text)
    match = _PATTERN.match(raw.lower())
    if not match:
        raise CramkitError(f"{where}: cannot read budget {raw!r}; write it as {_FORMS}")
    value, unit = float(match.group(1)), match.group(2)
    if value <= 0:
        raise CramkitError(f"{where}: the budget {raw!r} must be positive; write it as {_FORMS}")
    if unit in _TIME_UNITS:
        return Budget("time", value * _TIME_UNITS[unit])
    if unit in ("tok", "tokens"):
        return Budget("tokens", value)
    if not value.is_integer():
        raise CramkitError(f"{where}: a step budget must be a whole number, got {raw!r}")
    return Budget("steps", value)


@dataclass(frozen=True)
class Every:
    """A period for checkpoints or evaluations: every N seconds or every N steps (0 = never)."""

    kind: Literal["time", "steps", "never"]
    amount: float

    def due(self, last_elapsed: float, elapsed: float, last_step: int, step: int) -> bool:
        if self.kind == "never":
            return False
        if self.kind == "steps":
            return step - last_step >= self.amount
        return elapsed - last_elapsed >= self.amount


def parse_every(text: str | int, where: str) -> Every:
    """``"10m"``, ``"30s"``, ``"500steps"``, ``"0"``/``"never"`` (disabled); a bare number means steps."""
    raw = str(text).strip().lower()
    if raw in ("0", "never", "off", "none", ""):
        return Every("never", 0)
    if re.fullmatch(r"[0-9]+", raw):
        return Every("steps", float(raw))
    match = _PATTERN.match(raw)
    if not match or match.group(2) in ("tok", "tokens"):
        raise CramkitError(f"{where}: cannot read {raw!r}; write a period like '10m', '30s' or '500steps' (or 'never')")
    value, unit = float(match.group(1)), match.group(2)
    if value <= 0:
        return Every("never", 0)
    if unit in _TIME_UNITS:
        return Every("time", value * _TIME_UNITS[unit])
    return Every("steps", value)
