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
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cramkit import runtime
from cramkit.errors import CramkitError
from cramkit.progress import Pace, Progress, format_seconds
from cramkit.train import checkpoint as ckpt
from cramkit.train import distributed, parallel
from cramkit.train.budget import parse_budget, parse_every
from cramkit.train.config import RunConfig, TrainConfig
from cramkit.train.metrics import Ceiling, MetricsLog, plot_losses
from cramkit.train.objectives import MLMObjective, Objective, TrainData
from cramkit.train.optim import build_optimizer, reuse_embedding_grads
from cramkit.train.pipeline import Pipeline
from cramkit.train.prefetch import Prefetcher
from cramkit.train.schedule import accumulation_steps, lr_factor, split_batch


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


@dataclass
class TrainState:
    """The trainer's counters, saved in every checkpoint."""

    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0  # training seconds spent (evaluation and checkpointing excluded)
    nan_streak: int = 0
    skipped: int = 0
    last_ckpt: tuple[float, int] = (0.0, 0)  # (elapsed, step) of the latest checkpoint
    last_eval: tuple[float, int] = (0.0, 0)  # (elapsed, step) of the latest evaluation

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> TrainState:
        return cls(
            step=state["step"],
            tokens=state["tokens"],
            elapsed=state["elapsed"],
            nan_streak=state.get("nan_streak", 0),
            skipped=state.get("skipped", 0),
            last_ckpt=(state["elapsed"], state["step"]),
            last_eval=tuple(state.get("last_eval", (0.0, 0))),
        )


def _auto(value: bool | str, default: bool) -> bool:
    return default if value == "auto" else bool(value)


# ---------------------------------------------------------------- JSON-safe loader state


def _to_json(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, torch.Tensor):
        return {"__tensor__": value.tolist(), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.asarray(value["__ndarray__"], dtype=value["dtype"])
        if "__tensor__" in value:
            return torch.tensor(value["__tensor__"], dtype=getattr(torch, value["dtype"]))
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


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


class Trainer:
    """Trains ``objective.build_model()`` into run directory ``run`` (checkpoints, metrics.jsonl, loss.png)
    until ``tcfg.budget`` is spent."""

    def __init__(
        self,
        objective: Objective,
        tcfg: TrainConfig,
        pcfg: distributed.ParallelConfig,
        run: Path,
        *,
        ctx: distributed.DistContext | None = None,
    ) -> None:
        self.objective, self.tcfg, self.run_dir = objective, tcfg, Path(run)
        # recorded in each checkpoint: the layout it was written in (a resume may change it; one line names it)
        self.degrees = {"pp": pcfg.pp, "tp": pcfg.tp, "ep": pcfg.ep, "strategy": pcfg.strategy}
        self.ctx = ctx = ctx or distributed.init_distributed(tcfg.device)
        self.device = device = ctx.device
        self.precision, self.precision_reason = runtime.precision_rule(tcfg.precision, device)
        if tcfg.threads > 0:
            torch.set_num_threads(tcfg.threads)
        self.budget = parse_budget(tcfg.budget)
        self.ckpt_every = parse_every(tcfg.checkpoint_every, "train.checkpoint_every")
        self.eval_every = parse_every(tcfg.eval_every, "train.eval_every")
        self.deterministic = _auto(tcfg.deterministic, device.type == "cpu")

        # model and optimizer, seeded: the same seed gives the same weights on every rank
        torch.manual_seed(tcfg.seed)
        np.random.seed(tcfg.seed % 2**32)
        self.model = objective.build_model().to(device)
        # compile each block, then DDP / FSDP2 (torchtitan's order); the optimizer is built on the (sharded)
        # parameters
        compile_on = _auto(tcfg.compile, device.type == "cuda")
        # pipeline parallelism (parallel.pp > 1): this rank keeps its stage of the model (full parameter names)
        self.pipe: Pipeline | None = None
        if pcfg.pp > 1:
            if type(objective) is not MLMObjective:
                raise CramkitError(
                    f"parallel.pp={pcfg.pp} pipelines masked-LM pretraining only (`cramkit pretrain`), not "
                    f"{objective.title}; set parallel.pp=1"
                )
            self.pipe = Pipeline(self.model, pcfg, ctx, self.precision, compile=compile_on)
            self.train_model: torch.nn.Module = self.pipe
            self.data_ctx = self.pipe.data_ctx  # the pipelines read different batches, a pipeline's ranks the same
        else:
            self.train_model = parallel.parallelize(
                self.model, pcfg, ctx, self.precision, compile=compile_on, fp8_recipe=tcfg.fp8_recipe
            )
            # the ranks that read different batches (with tensor parallelism, one per group of parallel.tp ranks)
            self.data_ctx = distributed.data_context(ctx, pcfg)
        if ctx.world == 1 and device.type == "cpu" and not compile_on and self.pipe is None:
            reuse_embedding_grads(self.model)
        self.optimizer = build_optimizer(
            self.model,
            tcfg.optimizer,
            tcfg.lr,
            tcfg.betas,
            tcfg.eps,
            tcfg.weight_decay,
            device,
            objective.lr_scales,
        )
        from torch.distributed.tensor import DTensor

        self._sharded = any(isinstance(p, DTensor) for p in self.model.parameters())  # FSDP2
        # each rank holds part of the model (FSDP2's shards, a pipeline's stage): the whole one from a checkpoint
        self._partial = self._sharded or self.pipe is not None
        self._tied: list[str] | None = None  # the whole model's tied parameter names, when this rank holds a stage
        if self.pipe is not None:
            with torch.device("meta"):
                self._tied = ckpt.tied_aliases(objective.build_model())
        # a fused AdamW skips a non-finite update itself (``found_inf``), without the host looking first;
        # not on sharded parameters, whose kernels would mix DTensors with a plain flag
        self._skip_on_device = bool(self.optimizer.defaults.get("fused")) and not self._sharded
        self.writer = ckpt.Checkpointer(
            run, ctx, keep=tcfg.keep_checkpoints, async_save=pcfg.async_checkpoint, overlap_staging=True
        )
        self.scaler = torch.amp.GradScaler(device.type) if self.precision == "fp16" else None
        # the global batch is exactly train.batch_size on any number of processes: each data-parallel rank takes
        # an equal share in micro-batches of at most train.micro_batch
        data = self.data_ctx
        self.micro, self.target_accum = split_batch(tcfg.batch_size, tcfg.micro, data.world)
        # a thread prepares the next step's micro-batches while the model runs this one (train/prefetch.py):
        # a step takes all of its micro-batches before its first forward (their item counts weight the loss)
        loader = objective.train_loader(self.micro, rank=data.rank, world=data.world)
        self.loader = Prefetcher(loader, depth=max(2, self.target_accum), device=device)
        # only the main process writes metrics.jsonl and reports to the trackers of train.report_to
        self.log = MetricsLog(self.run_dir, enabled=ctx.is_main, report_to=tcfg.report_to)
        self.state = TrainState()
        self.last_checkpoint: Path | None = None
        self.val_loss: float | None = None
        self.history: list[dict[str, Any]] = []
        self._resumed = False
        # MFU against the dense bf16 peak, fp8 included (torchtitan's convention); on a CPU against its measured
        # matrix-product ceiling at the run's precision and threads, when `cramkit doctor` has measured it, raised
        # when the run computes faster (a stale ceiling): never above 100% (metrics.Ceiling)
        self._ceiling = Ceiling(device, self.precision, main=ctx.is_main)
        self._window: list[float] = []
        self._pace = Pace()  # the budget spent per second, behind the time left
        self._unsettled: list[dict[str, Any]] = []  # steps whose device values the host has not read yet
        self._window_tokens, self._window_time = 0, 0.0
        # what the shown line averages: the steps since the last line shown (a log shows one per ~10 s)
        self._shown: list[float] = [0.0, 0.0, 0.0, 0.0]  # loss sum, losses, tokens, seconds
        self._bar = Progress(objective.title, 100.0, enabled=False)  # notes only; run() shows the bar

    # ------------------------------------------------------------ resume

    def resume(self) -> None:
        """Continue from the run's latest checkpoint (written by any number of processes: resharded to this
        world size, checksums verified first)."""
        found = ckpt.find_latest(self.run_dir)
        if found is None:
            raise CramkitError(
                f"{self.run_dir}: the run has no complete checkpoint yet; start it again without resuming"
            )
        saved = ckpt.load(found, self.model, self.optimizer, process_group=self.writer.pg)
        if self.scaler is not None and saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])
        self.loader.load_state_dict(_from_json(saved["loader"]))
        ckpt.restore_rng(saved["rng"])
        self.state = TrainState.from_checkpoint(saved)
        self.last_checkpoint, self._resumed = found, True
        if self.ctx.is_main:
            print(
                f"cramkit: resuming {self.run_dir} from {found.name} (step {self.state.step}, "
                f"{self.state.tokens:,} tokens)",
                file=sys.stderr,
            )

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

    def settle(self) -> None:
        """Read the device values of the steps run since the last read (one copy to the host), and count
        their non-finite losses: the skipped steps, the streak, the stop after ``train.max_nan_steps``."""
        pending, self._unsettled = self._unsettled, []
        if not pending:
            return
        values = torch.stack(
            [torch.stack([f["loss"], f["grad_norm"].to(f["loss"]), f["finite"].to(f["loss"])]) for f in pending]
        ).tolist()
        s = self.state
        for facts, (loss, norm, finite) in zip(pending, values, strict=True):
            facts.update(loss=loss, grad_norm=norm, finite=bool(finite))
            if facts["finite"]:
                s.nan_streak = 0
                self._window.append(loss)
                continue
            s.nan_streak, s.skipped = s.nan_streak + 1, s.skipped + 1
            self._bar.note(
                f"cramkit: step {facts['step']}: loss {loss} / gradient norm {norm} not finite; update "
                f"skipped ({s.nan_streak} in a row)"
            )
            if s.nan_streak >= self.tcfg.max_nan_steps:
                prev = (
                    f"the last good checkpoint is {self.last_checkpoint}"
                    if self.last_checkpoint
                    else ("no checkpoint was saved")
                )
                raise CramkitError(
                    f"the training loss was not finite for {s.nan_streak} steps in a row (step {facts['step']}); "
                    f"stopped; {prev}. Lower the learning rate, raise the warmup, use fp32 precision, or "
                    "check the data"
                )

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

    # ------------------------------------------------------------ policies

    def eval_due(self) -> bool:
        s = self.state
        return self.eval_every.due(s.last_eval[0], s.elapsed, s.last_eval[1], s.step)

    def checkpoint_due(self) -> bool:
        """Due by ``train.checkpoint_every``, never during a run of non-finite losses (the latest checkpoint
        stays a good one)."""
        s = self.state
        if not self.ckpt_every.due(s.last_ckpt[0], s.elapsed, s.last_ckpt[1], s.step):
            return False
        self.settle()
        return s.nan_streak == 0

    def evaluate(self) -> float | None:
        """The objective's held-out loss, logged."""
        s, model = self.state, self.train_model
        was_training = model.training
        model.eval()
        result = self.objective.evaluate(model, self.data_ctx, self.precision)
        model.train(was_training)
        extra: dict[str, Any] = {}
        if isinstance(result, dict):  # the held-out loss and the recipe's own figures (dev metrics)
            extra = {k: v for k, v in result.items() if k != "val_loss"}
            result = result.get("val_loss")
        self.val_loss = result
        s.last_eval = (s.elapsed, s.step)
        if self.val_loss is not None:
            rec = {
                "step": s.step,
                "tokens": s.tokens,
                "elapsed": round(s.elapsed, 3),
                "val_loss": self.val_loss,
                **extra,
            }
            self.log.write(rec)
            self.history.append(rec)
        return self.val_loss

    def save(self, reason: str) -> Path:
        """A checkpoint of everything a resume needs (every rank writes its shards; in the background
        unless ``reason`` is not "periodic")."""
        self.settle()
        s = self.state
        trainer_state = {
            "step": s.step,
            "tokens": s.tokens,
            "elapsed": s.elapsed,
            "nan_streak": s.nan_streak,
            "skipped": s.skipped,
            "last_eval": list(s.last_eval),
            "budget": self.tcfg.budget,
            "fraction": self.budget.fraction(s.elapsed, s.tokens, s.step),
            "world": self.ctx.world,
            "parallel": self.degrees,
            "reason": reason,
            "loader": _to_json(self.loader.state_dict()),
            "rng": ckpt.encode_rng(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }
        self.last_checkpoint = self.writer.save(
            s.step, self.model, self.optimizer, trainer_state, block=reason != "periodic", tied=self._tied
        )
        s.last_ckpt = (s.elapsed, s.step)
        return self.last_checkpoint

    def hyperparameters(self) -> dict[str, Any]:
        """The run's resolved configuration, for the trackers: the recipe's settings (the objective's ``cfg``,
        when it has one) and the engine's (``train``)."""
        import dataclasses

        from cramkit.config import to_dict

        cfg = self.objective.cfg
        settings = to_dict(cfg) if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type) else {}
        return {**settings, "train": to_dict(self.tcfg), "world": self.ctx.world}

    # ------------------------------------------------------------ progress

    def _log_step(self, facts: dict[str, Any], last: bool = False) -> None:
        s, world = self.state, self.ctx.world
        tps = self._window_tokens / max(self._window_time, 1e-9)
        flops_tok = self.objective.flops_per_token
        mfu = self._ceiling.mfu(flops_tok * tps / world, self._bar.note) if flops_tok else None
        window, norm = self._window, facts["grad_norm"]
        rec = {
            "step": s.step,
            "tokens": s.tokens,
            "elapsed": round(s.elapsed, 3),
            "loss": sum(window) / len(window) if window else float("nan"),
            "lr": facts["lr"],
            "tokens_per_s": round(tps, 1),
            "batch_size": facts["accum"] * self.micro * self.data_ctx.world,
            "grad_norm": norm if math.isfinite(norm) else str(norm),
            "mfu": mfu,
            "skipped": s.skipped or None,
            "precision": self.precision,
        } | facts["info"]
        rec |= self.objective.step_metrics() or {}
        self.log.write(rec)
        self.history.append(rec)
        fraction = self.budget.fraction(s.elapsed, s.tokens, s.step)
        shown = self._shown
        for i, v in enumerate((sum(window), len(window), self._window_tokens, self._window_time)):
            shown[i] += v
        loss = shown[0] / shown[1] if shown[1] else float("nan")
        fields = {"loss": f"{loss:.3f}", "tok/s": f"{shown[2] / max(shown[3], 1e-9):,.0f}", "lr": f"{facts['lr']:.2e}"}
        if mfu is not None:
            fields["mfu"] = f"{mfu:.1%}"
        if self.val_loss is not None:
            fields["val"] = f"{self.val_loss:.3f}"
        fields["left"] = _time_left(self.budget, fraction, s.elapsed, self._pace)
        if self._bar.to(round(fraction * 100, 1), fields, force=last):
            self._shown = [0.0, 0.0, 0.0, 0.0]
        self._window, self._window_tokens, self._window_time = [], 0, 0.0

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


def _time_left(budget: Any, fraction: float, elapsed: float, pace: Pace | None = None) -> str:
    """Training time left: exact for a time budget; else the rest of the budget at ``pace``'s rate, averaged from
    the first log line on (so the first steps, allocation, compilation, a cold cache, do not inflate every later
    estimate, and one slow step does not swing it); at the rate since the start before ``pace`` has one."""
    if budget.kind == "time":
        return format_seconds(budget.amount - elapsed)
    left = pace.left(fraction, 1.0, elapsed) if pace is not None else None
    if left is not None:
        return "~" + format_seconds(left)
    if fraction <= 0:
        return "?"
    return "~" + format_seconds(elapsed / fraction - elapsed)


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
