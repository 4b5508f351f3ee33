"""Mixtures: several tasks trained together at set rates (seqio's mixtures, without its machinery).

A :class:`Mixture` names tasks and how often each one's batches are drawn:

- ``proportional``: by the number of training examples (every example seen about equally often);
- ``capped:N``: by size, each task counted as at most N examples (T5's examples-proportional mixing with
  an artificial limit, so a large task does not drown the small ones);
- ``temperature:T``: by size to the power 1/T (T=1 is proportional, large T tends to equal);
- ``equal``: the same rate for every task;
- explicit weights, one per task in order (``2,1,1``; normalised).

    mix = resolve_mixture("glue/mrpc,glue/rte", rates="capped:2000")
    mix.rates_for([3668, 2490])   # -> array([0.5, 0.5])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from cramkit.errors import CramkitError
from cramkit.tasks.registry import _unknown, list_tasks

# below this, size ** (1/T) puts every draw on the largest task (and overflows float64)
MIN_TEMPERATURE = 0.01
RATE_KINDS = ("proportional", "capped:N", "temperature:T", "equal", "w1,w2,...")


@dataclass(frozen=True)
class Mixture:
    """Task names and the rate rule that draws each step's task."""

    name: str
    tasks: tuple[str, ...]
    rates: str = "proportional"
    description: str = ""

    def __post_init__(self) -> None:
        if len(self.tasks) < 2:
            raise CramkitError(f"mixture {self.name}: a mixture needs at least two tasks, got {list(self.tasks)}")
        if len(set(self.tasks)) != len(self.tasks):
            raise CramkitError(f"mixture {self.name}: a task is named twice in {list(self.tasks)}")
        parse_rates(self.rates, len(self.tasks))  # fails here on a rate that does not parse

    def rates_for(self, sizes: Sequence[int]) -> np.ndarray:
        """The probability of drawing each task's batch, given the tasks' training examples."""
        return mixture_rates(self.rates, sizes)

    def examples_per_epoch(self, sizes: Sequence[int]) -> int:
        """What one epoch of the mixture is: every example once, a capped task counted at its cap."""
        kind, value = parse_rates(self.rates, len(sizes))
        if kind == "capped":
            return int(sum(min(n, int(cast(float, value))) for n in sizes))
        return int(sum(sizes))


def parse_rates(spec: str, n_tasks: int) -> tuple[str, float | list[float] | None]:
    """(kind, parameter) of a rate rule; one CramkitError naming the forms on anything else."""
    text = str(spec).strip().lower()
    hint = f"--rates {spec!r}: give one of {', '.join(RATE_KINDS)}"
    if text in ("proportional", "equal"):
        return text, None
    kind, sep, arg = text.partition(":")
    if sep and kind in ("capped", "temperature"):
        try:
            value = float(arg)
        except ValueError:
            raise CramkitError(
                f"{hint} ({kind} needs a number, e.g. {kind}:{2000 if kind == 'capped' else 2})"
            ) from None
        if not value > 0 or not math.isfinite(value):
            raise CramkitError(f"{hint} ({kind}:{arg} must be positive)")
        if kind == "temperature" and value < MIN_TEMPERATURE:
            raise CramkitError(
                f"--rates {spec!r}: the temperature must be at least {MIN_TEMPERATURE} (1 draws in proportion to "
                "the tasks' sizes, a large one tends to equal; a tiny one would put every draw on the largest task)"
            )
        return kind, value
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        raise CramkitError(hint) from None
    if len(weights) != n_tasks:
        raise CramkitError(f"--rates {spec!r}: {len(weights)} weights for {n_tasks} tasks; give one per task")
    if any(not (w >= 0 and math.isfinite(w)) for w in weights) or sum(weights) <= 0:
        raise CramkitError(f"--rates {spec!r}: weights must be non-negative numbers, not all 0")
    return "weights", weights


def mixture_rates(spec: str, sizes: Sequence[int]) -> np.ndarray:
    """Rates (summing to 1) of tasks with ``sizes`` training examples under the rule ``spec``."""
    kind, value = parse_rates(spec, len(sizes))
    n = np.asarray(sizes, dtype=np.float64)
    if kind == "proportional":
        w = n
    elif kind == "equal":
        w = np.ones_like(n)
    elif kind == "capped":
        w = np.minimum(n, float(cast(float, value)))
    elif kind == "temperature":  # size ** (1/T), in logs: large sizes at a small T overflow float64
        with np.errstate(divide="ignore"):
            logs = np.log(n) / float(cast(float, value))
        w = np.exp(logs - logs.max()) if np.isfinite(logs.max()) else np.zeros_like(n)
    else:
        w = np.asarray(value, dtype=np.float64)
    if not w.max() > 0:
        raise CramkitError("every task of the mixture has 0 training examples")
    w = w / w.max()  # weights of 1e308 each: their sum would overflow to inf
    rates = w / w.sum()
    if not np.isfinite(rates).all():
        raise CramkitError(f"--rates {spec!r} gives no usable rates for tasks of sizes {list(sizes)}; give other rates")
    return rates


_MIXTURES: dict[str, Mixture] = {}


def register_mixture(mixture: Mixture) -> Mixture:
    _MIXTURES[mixture.name] = mixture
    return mixture


def list_mixtures() -> list[str]:
    return sorted(_MIXTURES)


def get_mixture(name: str) -> Mixture:
    if name not in _MIXTURES:
        raise _unknown("mixture", name, sorted(_MIXTURES))
    return _MIXTURES[name]


def resolve_mixture(spec: str, rates: str | None = None) -> Mixture:
    """A registered mixture's name, or task names separated by commas (``glue/mrpc,glue/rte``); ``rates``
    replaces the mixture's own rule. Unknown task names fail with a did-you-mean."""
    spec = spec.strip()
    if spec in _MIXTURES:
        mix = _MIXTURES[spec]
        return mix if rates is None else Mixture(mix.name, mix.tasks, rates, mix.description)
    names = tuple(t.strip() for t in spec.split(",") if t.strip())
    known = list_tasks()
    for name in names:
        if name not in known:
            if len(names) == 1:
                raise _unknown("mixture", name, sorted(_MIXTURES) or ["(none registered)"])
            raise _unknown("task", name, known)
    return Mixture("+".join(n.split("/")[-1] for n in names), names, rates or "proportional")


register_mixture(
    Mixture(
        "glue-small",
        ("glue/mrpc", "glue/rte", "glue/stsb", "glue/cola"),
        "proportional",
        "GLUE's four small tasks (MRPC, RTE, STS-B, CoLA), which gain most from training together",
    )
)
register_mixture(
    Mixture(
        "glue",
        (
            "glue/cola",
            "glue/sst2",
            "glue/mrpc",
            "glue/stsb",
            "glue/qqp",
            "glue/mnli",
            "glue/qnli",
            "glue/rte",
        ),
        "capped:50000",
        "every GLUE task but WNLI, each counted as at most 50,000 examples (T5's capped mixing)",
    )
)
