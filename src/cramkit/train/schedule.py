"""Learning-rate and batch-size schedules as pure functions of the fraction of the budget spent.

Every schedule is one shape: rise from ``start`` to the peak over ``[0, warmup]``, hold the peak, then
fall to ``end`` over the last ``cooldown`` of the budget.

- ``budget-triangle`` (Cramming's ``budget-triangle2``): start at 25% of the peak, peak at 75% of the
  budget, linear decay to 0 at the end.
- ``one-cycle`` (as ``torch.optim.lr_scheduler.OneCycleLR``): cosine rise from 4% over the first 30%,
  cosine decay to ~0.
- ``linear`` (Hugging Face's run_mlm): linear warmup from 0 over 6%, linear decay to 0.
- ``constant``: optional linear warmup, then the peak to the end.
- ``cosine`` (fine-tuning): linear warmup from 0 over 10%, cosine decay to 0.
"""

from __future__ import annotations

import math

# schedule -> (warmup, cooldown, start, end, shape)
SCHEDULES: dict[str, tuple[float, float, float, float, str]] = {
    "budget-triangle": (0.75, 0.25, 0.25, 0.0, "linear"),
    "one-cycle": (0.3, 0.7, 0.04, 0.0, "cosine"),
    "linear": (0.06, 0.94, 0.0, 0.0, "linear"),
    "constant": (0.0, 0.0, 1.0, 1.0, "linear"),
    # fine-tuning (Cramming's GLUE recipe): linear warmup from 0 over 10%, cosine decay to 0
    "cosine": (0.1, 0.9, 0.0, 0.0, "warmup-cosine"),
}


def schedule_params(
    name: str, warmup: float | None = None, cooldown: float | None = None, start: float | None = None
) -> tuple[float, float, float, float, str]:
    """The defaults of schedule ``name`` with any of warmup/cooldown/start overridden."""
    w, c, s, e, shape = SCHEDULES[name]
    if name == "constant" and warmup:
        s = 0.0  # a warmup for the constant schedule starts from zero
    return (
        w if warmup is None else warmup,
        c if cooldown is None else cooldown,
        s if start is None else start,
        e,
        shape,
    )


def _ramp(t: float, a: float, b: float, shape: str) -> float:
    """Interpolate from a (t=0) to b (t=1)."""
    t = min(1.0, max(0.0, t))
    if shape == "cosine":
        t = 0.5 - 0.5 * math.cos(math.pi * t)
    return a + (b - a) * t


def lr_factor(
    fraction: float,
    name: str = "budget-triangle",
    warmup: float | None = None,
    cooldown: float | None = None,
    start: float | None = None,
) -> float:
    """Multiplier of the peak learning rate after ``fraction`` of the budget (0..1)."""
    w, c, s, e, shape = schedule_params(name, warmup, cooldown, start)
    f = min(1.0, max(0.0, fraction))
    decay_from = 1.0 - c
    up_shape = "linear" if shape == "warmup-cosine" else shape
    shape = "cosine" if shape == "warmup-cosine" else shape
    if w > 0 and f < w:
        up = _ramp(f / w, s, 1.0, up_shape)
        if c > 0 and f > decay_from:  # warmup and cooldown overlap (a triangle): take the lower
            return min(up, _ramp((f - decay_from) / c, 1.0, e, shape))
        return up
    if c > 0 and f > decay_from:
        return _ramp((f - decay_from) / c, 1.0, e, shape)
    return 1.0


def accumulation_steps(fraction: float, target: int, ramp: float) -> int:
    """Micro-batches per optimizer step: grows linearly from 1 to ``target`` over the first ``ramp``
    of the budget (Cramming's batch-size ramp), then stays at ``target``."""
    if ramp <= 0 or fraction >= ramp:
        return target
    return max(1, min(target, 1 + math.floor((target - 1) * fraction / ramp)))


def split_batch(batch_size: int, micro_cap: int, world: int) -> tuple[int, int]:
    """(per-process micro-batch, accumulation steps) that make the global batch exactly ``batch_size``.

    Each of ``world`` processes takes ``batch_size / world`` sequences per step, in the fewest
    micro-batches of at most ``micro_cap`` sequences that divide it evenly. A batch that does not divide
    by the world size is an error: changing it silently would change the training (1 and N processes must
    follow the same curve).
    """
    from cramkit.errors import CramkitError

    if batch_size % world:
        raise CramkitError(
            f"train.batch_size={batch_size} does not divide evenly over {world} processes; use a multiple of "
            f"{world} (e.g. {batch_size + world - batch_size % world}) so every process takes the same share"
        )
    share = batch_size // world
    accum = max(1, -(-share // micro_cap))
    while share % accum:
        accum += 1
    return share // accum, accum
