"""Training on examples for a number of epochs: the life cycle fine-tuning and distillation share.

An epoch is ``ceil(examples / batch_size)`` optimizer steps (``data.batching.BatchLoader``'s batches);
the engine runs the steps into a run directory (a temporary one when none is given): a run with a
checkpoint resumes from it. What comes back is the finished model and what the training did.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cramkit.train import checkpoint as ckpt
from cramkit.train.config import TrainConfig
from cramkit.train.distributed import DistContext, ParallelConfig
from cramkit.train.metrics import read_metrics
from cramkit.train.objectives import Objective
from cramkit.train.trainer import fit


def epoch_steps(examples: int, batch_size: int, epochs: float) -> int:
    """Optimizer steps of ``epochs`` epochs over ``examples`` in batches of ``batch_size`` (at least 1)."""
    return max(1, math.ceil(epochs * math.ceil(examples / batch_size)))


@dataclass
class EpochsResult:
    model: torch.nn.Module  # the finished model (plain, whole)
    steps: int
    seconds: float
    examples_seen: int
    losses: list[float] = field(default_factory=list)  # the finite training losses logged, the whole run's
    evals: list[dict[str, Any]] = field(default_factory=list)  # each evaluation's step and held-out figures

    @property
    def examples_per_s(self) -> float:
        return self.examples_seen / max(self.seconds, 1e-9)


def train_epochs(
    objective: Objective,
    tcfg: TrainConfig,
    run: str | os.PathLike | None,
    *,
    examples: int,
    batch_size: int,
    ctx: DistContext | None = None,
) -> EpochsResult:
    """Train ``objective`` for the steps of ``tcfg.budget`` (see :func:`epoch_steps`) into ``run``."""
    with contextlib.ExitStack() as stack:
        if run is None:
            run = stack.enter_context(tempfile.TemporaryDirectory(prefix="cramkit-train-"))
        run = Path(run)
        result = fit(objective, tcfg, ParallelConfig(), run, resume=ckpt.find_latest(run) is not None, ctx=ctx)
        history: list[dict[str, Any]] = read_metrics(run) or result.history  # also when it resumed midway
    losses = [r["loss"] for r in history if isinstance(r.get("loss"), float) and math.isfinite(r["loss"])]
    evals = [
        {k: v for k, v in r.items() if k == "step" or k == "val_loss" or k.startswith("dev_")}
        for r in history
        if "val_loss" in r
    ]
    per_epoch = math.ceil(examples / batch_size)
    seen = (result.step // per_epoch) * examples + min((result.step % per_epoch) * batch_size, examples)
    assert result.model is not None  # fit's result carries the finished model
    return EpochsResult(result.model, result.step, result.elapsed, seen, losses, evals)
