"""The trainer's parts (:class:`TrainerParts`, the base of ``cramkit.train.trainer.Trainer``): device and
precision, the model (compiled, wrapped or sharded, or this rank's pipeline stage), optimizer, loader, checkpoint
writer, metrics log, and the counters (:class:`TrainState`), all built once from the run's settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cramkit import runtime
from cramkit.errors import CramkitError
from cramkit.progress import Pace, Progress
from cramkit.train import checkpoint as ckpt
from cramkit.train import distributed, parallel
from cramkit.train.budget import parse_every
from cramkit.train.config import TrainConfig
from cramkit.train.metrics import Ceiling, MetricsLog
from cramkit.train.objectives import MLMObjective, Objective
from cramkit.train.optim import build_optimizer, reuse_embedding_grads
from cramkit.train.pipeline import Pipeline
from cramkit.train.prefetch import Prefetcher
from cramkit.train.schedule import split_batch


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


class TrainerParts:
    """What a training run is made of: built by :class:`~cramkit.train.trainer.Trainer`'s constructor."""

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
        self.budget = tcfg.parsed_budget
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
