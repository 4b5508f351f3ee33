"""The training engine: one loop for pretraining, fine-tuning and distillation.

One optimizer step::

    fraction = budget spent (time, tokens or steps)        -> lr, micro-batches per step (batch ramp)
    for each micro-batch: forward, backward of its share  -> gradients of the mean over ALL items of
                                                             the global batch (predicted tokens, examples)
    clip, optimizer step (skipped if the loss or gradient is not finite)

What is trained is an :class:`Objective` (a recipe: the model, its batches, its loss, its evaluation);
everything else is the engine's: device, precision, seeding and determinism, ``parallelize()`` (compile,
then DDP or FSDP2), parameter groups and optimizer, budget-keyed schedules, progress and metrics,
checkpoints (train/checkpoint.py) and resume, SIGINT/SIGTERM. The loss of a global batch is the mean
over every item of every micro-batch on every rank: micro-batch losses are weighted by their item count
and the count is summed over ranks, so 1 and N processes (and any accumulation) follow the same curve.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from cramkit import errors
from cramkit.errors import CramkitError
from cramkit.model.encoder import flops_per_token
from cramkit.model.heads import IGNORE, MaskedLM
from cramkit.train import checkpoint as ckpt
from cramkit.train import parallel
from cramkit.train.budget import format_seconds, parse_budget, parse_every
from cramkit.train.config import RunConfig, TrainConfig
from cramkit.train.metrics import MetricsLog, Progress, peak_flops, plot_losses
from cramkit.train.optim import build_optimizer
from cramkit.train.schedule import accumulation_steps, lr_factor, split_batch


class TrainData(Protocol):
    """What the loop needs from the data layer (``cramkit.data.loader.PretrainData``)."""

    def train_loader(self, micro_batch: int, *, rank: int = 0, world: int = 1) -> Any: ...

    def val_batches(self, micro_batch: int, max_batches: int, *, rank: int = 0, world: int = 1) -> Any: ...


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
    model: torch.nn.Module | None = None  # the trained model (plain: not compiled, wrapped or sharded)


@dataclass
class Progressed:
    """Counters saved in every checkpoint."""

    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0  # training seconds spent (evaluation and checkpointing excluded)
    nan_streak: int = 0
    skipped: int = 0
    last_ckpt: tuple[float, int] = (0.0, 0)
    last_eval: tuple[float, int] = (0.0, 0)


# ---------------------------------------------------------------- settings resolved for this machine


def resolve_precision(tcfg: TrainConfig, device: torch.device) -> str:
    if tcfg.precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if tcfg.precision == "fp16" and device.type != "cuda":
        raise CramkitError("train.precision=fp16 needs a CUDA device; use fp32 (or bf16) on CPU")
    return tcfg.precision


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


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


# ---------------------------------------------------------------- signals


class StopFlag:
    """SIGINT/SIGTERM set a flag; the loop finishes its step, saves and exits. A second SIGINT aborts at
    once, without saving (what is already on disk stays intact: a checkpoint is complete or ignored)."""

    def __init__(self, announce: bool = True) -> None:
        self.signum: int | None = None
        self.announce = announce
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            # the command line ends the process at once, wherever the main thread is (a KeyboardInterrupt
            # raised inside a checkpoint writer's critical section could leave a lock held and the process
            # waiting forever); a library caller gets a KeyboardInterrupt instead
            if errors.ABORT_AT_ONCE:
                print("\ncramkit: interrupted again: stopping now; the checkpoints already saved are intact",
                      file=sys.stderr, flush=True)  # fmt: skip
                sys.stdout.flush()
                os._exit(128 + signal.SIGINT)
            raise KeyboardInterrupt
        self.signum = signum
        if self.announce:
            print(
                f"\ncramkit: {signal.Signals(signum).name}: finishing this step and saving a checkpoint; "
                "press Ctrl-C again to abort without saving",
                file=sys.stderr,
                flush=True,
            )

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


# ---------------------------------------------------------------- what is trained


class Objective(Protocol):
    """A recipe for the engine: the model, its batches, its loss and its evaluation."""

    title: str  # progress bar title, e.g. "pretrain 3m" or "sst2 seed 0"
    resume_hint: str  # the stop message's last words: how to continue the run
    flops_per_token: float | None  # for MFU; None when unknown

    def build_model(self) -> torch.nn.Module: ...

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1) -> Any:
        """An endless iterator of micro-batches with ``state_dict()`` / ``load_state_dict()``."""

    def count(self, batch: dict[str, torch.Tensor]) -> int:
        """Items the loss of ``batch`` averages over (predicted tokens, examples)."""

    def tokens(self, batch: dict[str, torch.Tensor]) -> int:
        """Tokens ``batch`` feeds the model (for tokens/s)."""

    def loss(
        self, model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device
    ) -> torch.Tensor:
        """Mean loss over the batch's ``count`` items (any finite graph when count is 0)."""

    def evaluate(self, model: torch.nn.Module, ctx: parallel.DistContext, precision: str) -> float | None:
        """A held-out loss (lower is better), or None when the recipe evaluates elsewhere."""

    # optional: ``lr_scales``, a dict of parameter-name prefix -> learning-rate multiplier (e.g. a fresh head
    # on a pretrained encoder); ``begin_step(fraction) -> dict | None`` is called before each optimizer step with the
    # fraction of the budget spent (e.g. a loss weight that decays with it); what it returns is logged


def forward_backward(
    model: torch.nn.Module,
    batches: list[dict[str, torch.Tensor]],
    ctx: parallel.DistContext,
    precision: str = "fp32",
    scaler: torch.amp.GradScaler | None = None,
    objective: Objective | None = None,
) -> tuple[float, int]:
    """Accumulate the gradient of one global batch; returns (its loss, its tokens over all ranks).

    The loss is the mean over every item of the global batch: each micro-batch contributes
    ``loss_i * n_i / N`` with N the items summed over micro-batches and ranks (times the world size, as
    DDP averages gradients over ranks). Gradients are reduced on the last micro-batch only.
    """
    objective = objective or MLMObjective()
    device, world = ctx.device, ctx.world
    n_local = [objective.count(b) for b in batches]
    counts = torch.tensor([float(sum(n_local))], dtype=torch.float64)
    n_global = max(float(parallel.all_reduce(counts.to(device), ctx).item()), 1.0)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    tokens = 0
    for i, batch in enumerate(batches):
        tokens += objective.tokens(batch) * world
        with parallel.sync_gradients(model, i == len(batches) - 1):
            with autocast(precision, device):
                loss = objective.loss(model, batch, device)
            if n_local[i] == 0:  # nothing to learn from: no contribution (but keep the graph for DDP)
                share = loss * 0.0
            else:
                share = loss * (n_local[i] * world / n_global)
                loss_sum += loss.detach().double() * n_local[i]
            (scaler.scale(share) if scaler is not None else share).backward()
    return float(parallel.all_reduce(loss_sum, ctx).item()) / n_global, tokens


class MLMObjective:
    """Masked-LM pretraining (the Cramming recipe): loss over the masked positions only."""

    def __init__(self, cfg: RunConfig | None = None, data: TrainData | None = None) -> None:
        self.cfg, self.data = cfg, data
        if cfg is not None:
            self.title = f"pretrain {parse_budget(cfg.train.budget).describe()}"
            self.flops_per_token = flops_per_token(
                cfg.model, cfg.data.seq_len, predicted_fraction=cfg.data.mask_rate
            )
        self.resume_hint = "continue with `cramkit pretrain --resume {run}`"

    def build_model(self) -> torch.nn.Module:
        return MaskedLM(self.cfg.model)

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1) -> Any:
        return self.data.train_loader(micro, rank=rank, world=world)

    def count(self, batch: dict[str, torch.Tensor]) -> int:
        return int((batch["labels"] != IGNORE).sum())

    def tokens(self, batch: dict[str, torch.Tensor]) -> int:
        return batch["input_ids"].numel()

    def loss(
        self, model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device
    ) -> torch.Tensor:
        ids = batch["input_ids"].to(device, non_blocking=True)
        labels = batch["labels"].to(device, non_blocking=True)
        out = model(ids, labels)
        return out.loss if out.n_predicted > 0 else out.logits.sum() * 0.0

    def evaluate(self, model: torch.nn.Module, ctx: parallel.DistContext, precision: str) -> float | None:
        """Mean MLM loss over all predicted tokens of the held-out batches (the same batches every time)."""
        tcfg = self.cfg.train
        total = torch.zeros(2, dtype=torch.float64, device=ctx.device)
        with torch.no_grad():
            for batch in self.data.val_batches(
                tcfg.micro_batch, tcfg.eval_batches, rank=ctx.rank, world=ctx.world
            ):
                ids = batch["input_ids"].to(ctx.device, non_blocking=True)
                labels = batch["labels"].to(ctx.device, non_blocking=True)
                with autocast(precision, ctx.device):
                    out = model(ids, labels)
                n = out.n_predicted.to(torch.float64)
                if n > 0:
                    total[0] += out.loss.double() * n
                    total[1] += n
        parallel.all_reduce(total, ctx)
        return float(total[0] / total[1]) if total[1] > 0 else None


def train(
    cfg: RunConfig,
    run: Path,
    data: TrainData,
    *,
    resume: bool = False,
    ctx: parallel.DistContext | None = None,
) -> TrainResult:
    """Pretrain ``MaskedLM(cfg.model)`` on ``data`` into run directory ``run`` until the budget is spent."""
    return fit(MLMObjective(cfg, data), cfg.train, cfg.parallel, run, resume=resume, ctx=ctx)


# ---------------------------------------------------------------- the engine


def fit(
    objective: Objective,
    tcfg: TrainConfig,
    pcfg: parallel.ParallelConfig,
    run: Path,
    *,
    resume: bool = False,
    ctx: parallel.DistContext | None = None,
) -> TrainResult:
    """Train ``objective.build_model()`` into run directory ``run`` (checkpoints, metrics, plots) until
    ``tcfg.budget`` is spent; with ``resume``, continue from the run's latest checkpoint."""
    run = Path(run)
    ctx = ctx or parallel.init_distributed(tcfg.device)
    device = ctx.device
    precision = resolve_precision(tcfg, device)
    if tcfg.threads > 0:
        torch.set_num_threads(tcfg.threads)
    budget = parse_budget(tcfg.budget)
    ckpt_every = parse_every(tcfg.checkpoint_every, "train.checkpoint_every")
    eval_every = parse_every(tcfg.eval_every, "train.eval_every")
    deterministic = _auto(tcfg.deterministic, device.type == "cpu")
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    # deterministic mode also fills every new tensor with NaN (to expose reads of uninitialised memory):
    # pure overhead here, as no kernel we run reads memory it did not write
    torch.utils.deterministic.fill_uninitialized_memory = False

    # model and optimizer, seeded: the same seed gives the same weights on every rank
    torch.manual_seed(tcfg.seed)
    np.random.seed(tcfg.seed % 2**32)
    model = objective.build_model().to(device)
    # compile each block, then DDP / FSDP2 (torchtitan's order); the optimizer is built on the (sharded)
    # parameters
    compile_on = _auto(tcfg.compile, device.type == "cuda")
    train_model = parallel.parallelize(model, pcfg, ctx, precision, compile=compile_on)
    optimizer = build_optimizer(
        model,
        tcfg.optimizer,
        tcfg.lr,
        tcfg.betas,
        tcfg.eps,
        tcfg.weight_decay,
        device,
        getattr(objective, "lr_scales", None),
    )
    writer = ckpt.Checkpointer(
        run, ctx, keep=tcfg.keep_checkpoints, async_save=pcfg.async_checkpoint, overlap_staging=True
    )
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    # the global batch is exactly train.batch_size on any number of processes: each takes an equal share in
    # micro-batches of at most train.micro_batch
    micro, target_accum = split_batch(tcfg.batch_size, tcfg.micro_batch, ctx.world)
    loader = objective.train_loader(micro, rank=ctx.rank, world=ctx.world)
    log = MetricsLog(run, enabled=ctx.is_main)
    if not resume:  # records an attempt left before its first checkpoint are not part of this run
        log.truncate_after(0)
    p = Progressed()
    last_ckpt: Path | None = None
    hint = objective.resume_hint.format(run=run)

    if resume:
        found = ckpt.find_latest(run)
        if found is None:
            raise CramkitError(
                f"{run}: the run has no complete checkpoint yet; start it again without resuming"
            )
        # written by any number of processes: resharded to this world size, checksums verified first
        state = ckpt.load(found, model, optimizer, process_group=writer.pg)
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        loader.load_state_dict(_from_json(state["loader"]))
        ckpt.restore_rng(state["rng"])
        p = Progressed(
            step=state["step"], tokens=state["tokens"], elapsed=state["elapsed"],
            nan_streak=state.get("nan_streak", 0), skipped=state.get("skipped", 0),
            last_ckpt=(state["elapsed"], state["step"]), last_eval=tuple(state.get("last_eval", (0.0, 0))),
        )  # fmt: skip
        log.truncate_after(p.step)
        last_ckpt = found
        if ctx.is_main:
            print(
                f"cramkit: resuming {run} from {found.name} (step {p.step}, {p.tokens:,} tokens)",
                file=sys.stderr,
            )

    train_model.train()

    world = ctx.world
    flops_tok = objective.flops_per_token
    peak = peak_flops(device) if precision in ("bf16", "fp16") else None
    bar = Progress(tcfg.progress if ctx.is_main else False, objective.title, budget.fraction(
        p.elapsed, p.tokens, p.step))  # fmt: skip
    history: list[dict[str, Any]] = []
    window: list[float] = []
    window_tokens, window_time = 0, 0.0
    val_loss: float | None = None

    def save(reason: str) -> Path | None:
        nonlocal last_ckpt
        state = {
            "step": p.step, "tokens": p.tokens, "elapsed": p.elapsed, "nan_streak": p.nan_streak,
            "skipped": p.skipped, "last_eval": list(p.last_eval), "budget": tcfg.budget,
            "fraction": budget.fraction(p.elapsed, p.tokens, p.step), "world": world, "reason": reason,
            "loader": _to_json(loader.state_dict()), "rng": ckpt.encode_rng(),
            "scaler": scaler.state_dict() if scaler is not None else None,
        }  # fmt: skip
        # every rank writes its shards; in the background unless stopping
        last_ckpt = writer.save(p.step, model, optimizer, state, block=reason != "periodic")
        p.last_ckpt = (p.elapsed, p.step)
        return last_ckpt

    def run_eval() -> float | None:
        nonlocal val_loss
        was_training = train_model.training
        train_model.eval()
        val_loss = objective.evaluate(train_model, ctx, precision)
        train_model.train(was_training)
        p.last_eval = (p.elapsed, p.step)
        if val_loss is not None:
            rec = {"step": p.step, "tokens": p.tokens, "elapsed": round(p.elapsed, 3), "val_loss": val_loss}
            log.write(rec)
            history.append(rec)
        return val_loss

    try:
        with StopFlag(announce=ctx.is_main) as stop:
            while not budget.done(p.elapsed, p.tokens, p.step):
                t0 = time.perf_counter()
                fraction = budget.fraction(p.elapsed, p.tokens, p.step)
                accum = accumulation_steps(fraction, target_accum, tcfg.batch_ramp)
                lr = tcfg.lr * lr_factor(fraction, tcfg.schedule, tcfg.warmup, tcfg.cooldown, tcfg.lr_start)
                for group in optimizer.param_groups:
                    group["lr"] = lr * group.get("lr_scale", 1.0)
                step_info = objective.begin_step(fraction) if hasattr(objective, "begin_step") else None

                batches = [next(loader) for _ in range(accum)]
                loss, step_tokens = forward_backward(train_model, batches, ctx, precision, scaler, objective)

                if scaler is not None:
                    scaler.unscale_(optimizer)
                grad_norm = _clip(train_model, tcfg.grad_clip)
                finite = math.isfinite(loss) and (scaler is not None or math.isfinite(grad_norm))
                writer.before_update()  # a checkpoint's host copy must be complete before the update
                if finite:
                    if scaler is not None:
                        scaler.step(optimizer)
                        scaler.update()
                    else:
                        optimizer.step()
                    p.nan_streak = 0
                else:
                    p.nan_streak += 1
                    p.skipped += 1
                    if scaler is not None:
                        scaler.update()
                optimizer.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                dt = time.perf_counter() - t0
                # every rank uses rank 0's clock (time budgets must give the same schedule everywhere)
                # and stops when any rank was signalled
                agreed = torch.tensor(
                    [dt if ctx.is_main else 0.0, 1.0 if stop.signum is not None else 0.0], dtype=torch.float64
                )
                agreed = parallel.all_reduce(agreed.to(device), ctx).cpu()
                dt, stop_now = float(agreed[0]), bool(agreed[1] > 0)
                p.step += 1
                p.tokens += step_tokens
                p.elapsed += dt

                if not finite:
                    bar.note(f"cramkit: step {p.step}: loss {loss} / gradient norm {grad_norm} not finite; "
                             f"update skipped ({p.nan_streak} in a row)")  # fmt: skip
                    if p.nan_streak >= tcfg.max_nan_steps:
                        prev = (
                            f"the last good checkpoint is {last_ckpt}"
                            if last_ckpt
                            else "no checkpoint was saved"
                        )
                        raise CramkitError(
                            f"the training loss was not finite for {p.nan_streak} steps in a row (step {p.step}); "
                            f"stopped; {prev}. Lower the learning rate, raise the warmup, use fp32 precision, or "
                            "check the data"
                        )
                else:
                    window.append(loss)
                window_tokens += step_tokens
                window_time += dt
                done = budget.done(p.elapsed, p.tokens, p.step)
                if p.step % tcfg.log_every == 0 or p.step == 1 or done or stop_now:
                    tps = window_tokens / max(window_time, 1e-9)
                    mfu = flops_tok * tps / (peak * world) if peak and flops_tok else None
                    rec = {
                        "step": p.step, "tokens": p.tokens, "elapsed": round(p.elapsed, 3),
                        "loss": sum(window) / len(window) if window else float("nan"), "lr": lr,
                        "tokens_per_s": round(tps, 1), "batch_size": accum * micro * world,
                        "grad_norm": grad_norm if math.isfinite(grad_norm) else str(grad_norm), "mfu": mfu,
                        "skipped": p.skipped or None,
                    } | (step_info or {})  # fmt: skip
                    log.write(rec)
                    history.append(rec)
                    fraction = budget.fraction(p.elapsed, p.tokens, p.step)
                    left = _time_left(budget, fraction, p.elapsed)
                    fields = {"loss": f"{rec['loss']:.3f}", "tok/s": f"{tps:,.0f}", "lr": f"{lr:.2e}"}
                    if mfu is not None:
                        fields["mfu"] = f"{mfu:.1%}"
                    if val_loss is not None:
                        fields["val"] = f"{val_loss:.3f}"
                    fields["left"] = left
                    bar.update(fraction, fields)
                    window, window_tokens, window_time = [], 0, 0.0

                if done:
                    break
                if eval_every.due(p.last_eval[0], p.elapsed, p.last_eval[1], p.step):
                    run_eval()
                # (never during a run of non-finite losses: the latest checkpoint stays a good one)
                if p.nan_streak == 0 and ckpt_every.due(p.last_ckpt[0], p.elapsed, p.last_ckpt[1], p.step):
                    save("periodic")
                if stop_now:
                    saved = save(f"signal {stop.signum}")
                    signum = stop.signum or signal.SIGTERM
                    name = signal.Signals(signum).name
                    raise TrainingInterrupted(
                        f"stopped by {name} at step {p.step} ({p.tokens:,} tokens); checkpoint saved to {saved}; {hint}",
                        signum,
                    )

        if p.last_eval[1] != p.step or val_loss is None:
            run_eval()
        final = save("end")
        if ctx.is_main:
            what = f"; validation loss {val_loss:.4f}" if val_loss is not None else ""
            bar.note(
                f"cramkit: {objective.title}: done: {p.step} steps, {p.tokens:,} tokens in "
                f"{format_seconds(p.elapsed)}{what}"
            )
        return TrainResult(run, p.step, p.tokens, p.elapsed, val_loss, final, history, model)
    finally:
        writer.close(wait=sys.exc_info()[0] is None)
        bar.close()
        log.close()
        torch.use_deterministic_algorithms(was_deterministic)
        torch.utils.deterministic.fill_uninitialized_memory = was_filling
        if ctx.is_main:
            with contextlib.suppress(Exception):
                plot_losses(run)


def _clip(model: torch.nn.Module, max_norm: float) -> float:
    """Clip by the global gradient norm (all ranks' shards under FSDP2); returns the norm."""
    return float(parallel.clip_grad_norm(model, max_norm))


def _time_left(budget: Any, fraction: float, elapsed: float) -> str:
    if budget.kind == "time":
        return format_seconds(budget.amount - elapsed)
    if fraction <= 0:
        return "?"
    return "~" + format_seconds(elapsed / fraction - elapsed)
