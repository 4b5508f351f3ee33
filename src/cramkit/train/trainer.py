"""The training engine: one :class:`Trainer` for pretraining, fine-tuning and distillation.

One optimizer step (:meth:`Trainer.step`)::

    fraction = budget spent (time, tokens or steps)        -> lr, micro-batches per step (batch ramp)
    for each micro-batch: forward, backward of its share  -> gradients of the mean over ALL items of
                                                             the global batch (predicted tokens, examples)
    clip, optimizer step (skipped if the loss or gradient is not finite)

What is trained is an :class:`~cramkit.train.objectives.Objective` (a recipe: the model, its batches,
its loss, its evaluation); everything else is the trainer's: device and precision (``cramkit.runtime``),
seeding and determinism, ``parallelize()`` (compile, then DDP or FSDP2), parameter groups and
optimizer, budget-keyed schedules, progress and metrics, checkpoints (train/checkpoint.py) and resume,
SIGINT/SIGTERM. The loss of a global batch is the mean over every item of every micro-batch on every
rank: micro-batch losses are weighted by their item count and the count is summed over ranks, so 1 and
N processes (and any accumulation) follow the same curve.

Item counts, the loss, the gradient norm and their finiteness stay on the device: a fused AdamW skips
a non-finite update by itself, and the host reads the steps' values in one copy when it needs them
(:meth:`Trainer.settle`: a logged step, a checkpoint due, the end), not at every step. The next
micro-batches are prepared by a thread while the model runs (train/prefetch.py); a checkpoint records the
loader's state after the batches consumed, not those prepared.

    trainer = Trainer(objective, tcfg, pcfg, run)
    trainer.resume()          # optional: continue from the run's latest checkpoint
    result = trainer.run()    # until the budget is spent; then finish(): final evaluation and checkpoint

:class:`Trainer` is the loop (the step, the run, its end); it builds on, one over the other, its parts
(trainer_parts.py: what the run is made of, built once), its reports (trainer_progress.py: the values read
back, evaluation, metrics, the progress line) and its checkpoints (trainer_checkpoints.py: save, resume).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cramkit import runtime
from cramkit.errors import CramkitError
from cramkit.progress import Progress, format_seconds
from cramkit.train import checkpoint as ckpt
from cramkit.train import distributed, parallel
from cramkit.train.config import RunConfig, TrainConfig
from cramkit.train.metrics import plot_losses
from cramkit.train.objectives import MLMObjective, Objective, TrainData
from cramkit.train.schedule import accumulation_steps, lr_factor
from cramkit.train.trainer_checkpoints import TrainerCheckpoints
from cramkit.train.trainer_parts import TrainState as TrainState
from cramkit.train.trainer_progress import _time_left as _time_left


class TrainingInterrupted(CramkitError):
    """SIGINT/SIGTERM: the step finished, a checkpoint was saved, the run can be resumed."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


@dataclass
class TrainResult:
    run: Path
    step: int
    tokens: int
    elapsed: float
    val_loss: float | None
    checkpoint: Path | None
    history: list[dict[str, Any]] = field(default_factory=list)
    model: torch.nn.Module | None = None  # the finished model: plain (not compiled, wrapped or sharded), whole


# ---------------------------------------------------------------- one global batch


def forward_backward(
    model: torch.nn.Module,
    batches: list[dict[str, torch.Tensor]],
    ctx: distributed.DistContext,
    precision: str = "fp32",
    scaler: torch.amp.GradScaler | None = None,
    objective: Objective | None = None,
) -> tuple[torch.Tensor, int]:
    """Accumulate the gradient of one global batch; returns (its loss as a 0-dim float64 tensor on the
    device, its tokens over all ranks).

    The loss is the mean over every item of the global batch: each micro-batch contributes
    ``loss_i * n_i / N`` with N the items summed over micro-batches and ranks (times the world size, as
    DDP averages gradients over ranks). N stays on the device. Gradients are reduced on the last
    micro-batch only.
    """
    objective = objective or MLMObjective()
    device, world = ctx.device, ctx.world
    n_local = [objective.count(b) for b in batches]  # counted on the host batches
    counts = torch.tensor([float(sum(n_local))], dtype=torch.float64).to(device, non_blocking=True)
    n_global = distributed.all_reduce(counts, ctx)[0].clamp_min(1.0)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    tokens = 0
    for i, batch in enumerate(batches):
        tokens += objective.tokens(batch) * world
        with parallel.sync_gradients(model, i == len(batches) - 1):
            with runtime.autocast(precision, device):
                loss = objective.loss(model, batch, device)
            if n_local[i] == 0:  # nothing to learn from: no contribution (but keep the graph for DDP)
                share = loss * 0.0
            else:
                share = loss * (n_local[i] * world / n_global).to(loss.dtype)
                loss_sum += loss.detach().double() * n_local[i]
            (scaler.scale(share) if scaler is not None else share).backward()
    return distributed.all_reduce(loss_sum, ctx) / n_global, tokens


# ---------------------------------------------------------------- the engine


class Trainer(TrainerCheckpoints):
    """Trains ``objective.build_model()`` into run directory ``run`` (checkpoints, metrics.jsonl, loss.png)
    until ``tcfg.budget`` is spent (``Trainer(objective, tcfg, pcfg, run, *, ctx=None)``: TrainerParts')."""

    # ------------------------------------------------------------ one optimizer step

    def step(self, stop: runtime.StopFlag | None = None) -> dict[str, Any]:
        """One optimizer step over one global batch; returns the step's facts (loss, grad_norm and finite
        are device tensors until :meth:`settle`)."""
        tcfg, s, opt = self.tcfg, self.state, self.optimizer
        t0 = time.perf_counter()
        fraction = self.budget.fraction(s.elapsed, s.tokens, s.step)
        accum = accumulation_steps(fraction, self.target_accum, tcfg.batch_ramp)
        lr = tcfg.lr * lr_factor(fraction, tcfg.schedule, tcfg.warmup, tcfg.cooldown, tcfg.lr_start)
        for group in opt.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        info = self.objective.begin_step(fraction) or {}

        batches = [next(self.loader) for _ in range(accum)]
        if self.pipe is not None:
            loss, tokens = self.pipe.forward_backward(batches, self.objective.count, self.objective.tokens)
            grad_norm = self.pipe.clip_grad_norm(tcfg.grad_clip)
        else:
            loss, tokens = forward_backward(
                self.train_model, batches, self.data_ctx, self.precision, self.scaler, self.objective
            )
            if self.scaler is not None:
                self.scaler.unscale_(opt)
            grad_norm = parallel.clip_grad_norm(self.train_model, tcfg.grad_clip)
        finite = torch.isfinite(loss)
        if self.scaler is None:  # (fp16's scaler skips inf/NaN gradients itself)
            finite = finite & torch.isfinite(grad_norm.to(loss.device))
        self.writer.before_update()  # a checkpoint's host copy must be complete before the update
        self._update(finite)
        opt.zero_grad(set_to_none=True)

        dt = time.perf_counter() - t0
        # every rank uses rank 0's clock (time budgets must give the same schedule everywhere) and stops
        # when any rank was signalled
        signalled = stop is not None and stop.signum is not None
        agreed = torch.tensor([dt if self.ctx.is_main else 0.0, 1.0 if signalled else 0.0], dtype=torch.float64)
        dt, stop_now = distributed.all_reduce(agreed, self.ctx).tolist()
        s.step, s.tokens, s.elapsed = s.step + 1, s.tokens + tokens, s.elapsed + dt
        facts = {
            "step": s.step,
            "loss": loss,
            "grad_norm": grad_norm,
            "finite": finite,
            "lr": lr,
            "accum": accum,
            "tokens": tokens,
            "dt": dt,
            "stop": stop_now > 0,
            "info": info,
        }
        self._unsettled.append(facts)
        return facts

    def _update(self, finite: torch.Tensor) -> None:
        """The optimizer step, skipped when ``finite`` is false."""
        opt = self.optimizer
        if self.scaler is not None:
            if bool(finite):
                self.scaler.step(opt)
            self.scaler.update()
        elif self._skip_on_device:
            opt.found_inf = (~finite).to(torch.float32)  # type: ignore[attr-defined]  # read by fused AdamW; not in torch's stubs
            try:
                opt.step()
            finally:
                del opt.found_inf  # type: ignore[attr-defined]  # (as above)
        elif bool(finite):
            opt.step()

    # ------------------------------------------------------------ the run

    def run(self) -> TrainResult:
        """Train until the budget is spent, then :meth:`finish`. SIGINT/SIGTERM: the step ends, a checkpoint
        is saved and :class:`TrainingInterrupted` says how to continue."""
        tcfg, s = self.tcfg, self.state
        was_deterministic = torch.are_deterministic_algorithms_enabled()
        was_filling = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]  # torch: a module property
        torch.use_deterministic_algorithms(self.deterministic, warn_only=True)
        # deterministic mode also fills every new tensor with NaN (to expose reads of uninitialised memory):
        # pure overhead here, as no kernel we run reads memory it did not write
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]  # (as above)
        if self._resumed:
            self.log.truncate_after(s.step)
        else:  # records an attempt left before its first checkpoint are not part of this run
            self.log.truncate_after(0)
        self.log.start_reporting(s.step, self.hyperparameters())
        show = tcfg.progress if self.ctx.is_main else False
        initial = round(self.budget.fraction(s.elapsed, s.tokens, s.step) * 100, 1)
        self._bar = Progress(self.objective.title, 100.0, initial=initial, enabled=show, counts=False, first=True)
        if self.ctx.is_main:
            self._bar.note(
                f"cramkit: {self.objective.title}: precision {self.precision} ({self.precision_reason}); "
                f"{self._ceiling.describe()}"
            )
        self.train_model.train()
        try:
            with runtime.StopFlag(announce=self.ctx.is_main) as stop:
                while not self.budget.done(s.elapsed, s.tokens, s.step):
                    facts = self.step(stop)
                    self._window_tokens += facts["tokens"]
                    self._window_time += facts["dt"]
                    done = self.budget.done(s.elapsed, s.tokens, s.step)
                    if s.step % tcfg.log_every == 0 or s.step == 1 or done or facts["stop"]:
                        self.settle()
                        self._log_step(facts, last=done or facts["stop"])
                    if done:
                        break
                    if self.eval_due():
                        self.evaluate()
                    if self.checkpoint_due():
                        self.save("periodic")
                    if facts["stop"]:
                        self._interrupted(stop)
                result = self.finish()
                if stop.signum is not None:  # it came during the last step or the final evaluation and save
                    self._interrupted(stop, finished=result.checkpoint)
            return result
        finally:
            self.loader.close()
            self.writer.close(wait=sys.exc_info()[0] is None)
            self._bar.close()
            self.log.close(ok=sys.exc_info()[0] is None)
            torch.use_deterministic_algorithms(was_deterministic)
            torch.utils.deterministic.fill_uninitialized_memory = was_filling  # type: ignore[attr-defined]  # (as above)
            if self.ctx.is_main:
                with contextlib.suppress(Exception):
                    plot_losses(self.run_dir, **self.objective.plot)

    def _interrupted(self, stop: runtime.StopFlag, finished: Path | None = None) -> None:
        """Raise TrainingInterrupted after saving (``finished``: the run had just ended, its final checkpoint is
        that one, and a signal that came during its last step or final evaluation still stops the command)."""
        s = self.state
        saved = finished or self.save(f"signal {stop.signum}")
        signum = stop.signum or signal.SIGTERM
        hint = self.objective.resume_hint.format(run=self.run_dir)
        what = "after the run finished" if finished else f"at step {s.step} ({s.tokens:,} tokens)"
        raise TrainingInterrupted(
            f"stopped by {signal.Signals(signum).name} {what}; checkpoint saved to {saved}; {hint}", signum
        )

    def finish(self) -> TrainResult:
        """The final evaluation (unless one was just made) and checkpoint; the result with the finished
        plain model, whole (read back from the final checkpoint when training sharded it)."""
        s = self.state
        self.loader.close()  # no batch is needed any more
        self.settle()
        if s.last_eval[1] != s.step or self.val_loss is None:
            self.evaluate()
        final = self.save("end")
        model = self.model
        if self._partial:  # each rank holds shards or a stage only: the whole model from the final checkpoint
            model = self.objective.build_model()
            model.load_state_dict(ckpt.load_model_state(final))
            model.to(self.device)
        if self.ctx.is_main:
            what = f"; validation loss {self.val_loss:.4f}" if self.val_loss is not None else ""
            self._bar.note(
                f"cramkit: {self.objective.title}: done: {s.step} steps, {s.tokens:,} tokens in "
                f"{format_seconds(s.elapsed)}{what}"
            )
        return TrainResult(self.run_dir, s.step, s.tokens, s.elapsed, self.val_loss, final, self.history, model)


def fit(
    objective: Objective,
    tcfg: TrainConfig,
    pcfg: distributed.ParallelConfig,
    run: Path,
    *,
    resume: bool = False,
    ctx: distributed.DistContext | None = None,
) -> TrainResult:
    """Train ``objective`` into run directory ``run`` until ``tcfg.budget`` is spent; with ``resume``,
    continue from the run's latest checkpoint."""
    trainer = Trainer(objective, tcfg, pcfg, run, ctx=ctx)
    if resume:
        trainer.resume()
    return trainer.run()


def train(
    cfg: RunConfig,
    run: Path,
    data: TrainData,
    *,
    resume: bool = False,
    ctx: distributed.DistContext | None = None,
) -> TrainResult:
    """Pretrain ``MaskedLM(cfg.model)`` on ``data`` into run directory ``run`` until the budget is spent."""
    return fit(MLMObjective(cfg, data), cfg.train, cfg.parallel, run, resume=resume, ctx=ctx)
