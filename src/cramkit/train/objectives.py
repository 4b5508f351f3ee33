"""What the engine trains: the :class:`Objective` base class, and masked-LM pretraining (:class:`MLMObjective`).

An objective is a recipe: the model, its batches, its loss and its evaluation. Everything else (device,
precision, parallelism, optimizer, schedules, checkpoints, resume, metrics) is the engine's
(``cramkit.train.trainer``). The objectives over examples (fine-tuning's
``recipes.finetune_objective.ClassifierObjective``, mixtures', the contrastive stage's, distillation's
``distill.objective.DistillObjective``) share :class:`ExampleObjective`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol

import torch

from cramkit.model.config import flops_per_token
from cramkit.model.heads import IGNORE, MaskedLM
from cramkit.model.moe import moe_losses
from cramkit.runtime import autocast
from cramkit.train import distributed
from cramkit.train.config import RunConfig


class TrainData(Protocol):
    """What pretraining needs from the data layer (``cramkit.data.loader.PretrainData``)."""

    def train_loader(self, micro_batch: int, *, rank: int = 0, world: int = 1) -> Any: ...

    def val_batches(self, micro_batch: int, max_batches: int, *, rank: int = 0, world: int = 1) -> Any: ...


class Objective:
    """The base of every objective: a recipe for the engine (the model, its batches, its loss and its evaluation).

    A subclass gives ``title``, ``resume_hint`` and ``flops_per_token`` and implements the methods up to
    :meth:`evaluate`. The optional hooks after them have defaults that change nothing; the engine calls them
    on every objective, and a recipe overrides those it needs."""

    title: str  # progress bar title, e.g. "pretrain 3m" or "sst2 seed 0"
    resume_hint: str  # the stop message's last words: how to continue the run
    flops_per_token: float | None  # for MFU; None when unknown

    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1) -> Any:
        """An endless iterator of micro-batches with ``state_dict()`` / ``load_state_dict()``. The engine runs it
        in a thread of its own, ahead of the step (train/prefetch.py): its batches must follow from its state
        alone (its own seeded generators, no global random state)."""
        raise NotImplementedError

    def count(self, batch: dict[str, torch.Tensor]) -> int:
        """Items the loss of ``batch`` averages over (predicted tokens, examples), from the host batch."""
        raise NotImplementedError

    def tokens(self, batch: dict[str, torch.Tensor]) -> int:
        """Tokens ``batch`` feeds the model (for tokens/s)."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        """Mean loss over the batch's ``count`` items (any finite graph when count is 0)."""
        raise NotImplementedError

    def evaluate(
        self, model: torch.nn.Module, ctx: distributed.DistContext, precision: str
    ) -> float | dict[str, float] | None:
        """A held-out loss (lower is better), or None when the recipe evaluates elsewhere; or a dict of the loss
        (``val_loss``) and the recipe's own figures (dev metrics), which the engine logs beside it."""
        raise NotImplementedError

    # ---- optional hooks: the defaults change nothing

    # parameter-name prefix -> learning-rate multiplier (e.g. a fresh head on a pretrained encoder)
    lr_scales: dict[str, float] | None = None
    # the recipe's settings (a dataclass): reported to the trackers of train.report_to as the run's
    # hyperparameters (anything else: none)
    cfg: Any = None
    # keywords of loss.png's plot (``train.metrics.plot_losses``: title, loss_name, x)
    plot: Mapping[str, str] = MappingProxyType({})

    def begin_step(self, fraction: float) -> dict[str, Any] | None:
        """Called before each optimizer step with the fraction of the budget spent (e.g. a loss weight that
        decays with it); what it returns is logged with the step."""
        return None

    def step_metrics(self) -> dict[str, float] | None:
        """Called when a step is logged: the recipe's own figures of the steps since the last call (e.g. the
        experts' load of a mixture of experts, a mixture's per-task gradient norms), logged with the step (read
        only then: no device sync at other steps)."""
        return None


def _segments(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """``segments=`` for the model when the batch carries documents' segments (data.doc_mask)."""
    seg = batch.get("segments")
    return {} if seg is None else {"segments": seg.to(device, non_blocking=True)}


class ExampleObjective(Objective):
    """The base of the objectives over examples (fine-tuning, mixtures, the contrastive stage, distillation):
    a batch carries the ``count`` of examples its loss averages over, and its tokens are the attention mask's
    ones (all of ``input_ids`` without a mask). A subclass adds the model, its batches, its loss and its
    evaluation (:class:`Objective`)."""

    def count(self, batch: dict[str, Any]) -> int:
        return int(batch["count"])

    def tokens(self, batch: dict[str, Any]) -> int:
        mask = batch.get("attention_mask")
        return int(mask.sum()) if mask is not None else batch["input_ids"].numel()


class MLMObjective(Objective):
    """Masked-LM pretraining (the Cramming recipe): loss over the masked positions only."""

    cfg: RunConfig | None  # (the hyperparameters the engine reports)

    def __init__(self, cfg: RunConfig | None = None, data: TrainData | None = None) -> None:
        self.cfg, self.data = cfg, data
        if cfg is not None:
            self.title = f"pretrain {cfg.train.parsed_budget.describe()}"
            self.flops_per_token = flops_per_token(cfg.model, cfg.data.seq_len, predicted_fraction=cfg.data.mask_rate)
        self.resume_hint = "continue with `cramkit pretrain --resume {run}`"
        self._moe = cfg is None or cfg.model.moe_experts > 0  # whether to look for MoE layers after a forward
        self._moe_sum: torch.Tensor | None = None  # MoE figures summed over the micro-batches since the last log
        self._moe_n = 0

    def build_model(self) -> torch.nn.Module:
        assert self.cfg is not None  # MLMObjective() without cfg and data computes losses only
        return MaskedLM(self.cfg.model)

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1) -> Any:
        assert self.data is not None  # (as above)
        return self.data.train_loader(micro, rank=rank, world=world)

    def count(self, batch: dict[str, torch.Tensor]) -> int:
        return int((batch["labels"] != IGNORE).sum())

    def tokens(self, batch: dict[str, torch.Tensor]) -> int:
        return batch["input_ids"].numel()

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        predicted = bool((batch["labels"] != IGNORE).any())  # asked of the host batch: no device sync
        ids = batch["input_ids"].to(device, non_blocking=True)
        labels = batch["labels"].to(device, non_blocking=True)
        out = model(ids, labels, **_segments(batch, device))
        return self.with_moe(model, out.loss if predicted else out.logits.sum() * 0.0)

    def with_moe(self, model: torch.nn.Module, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` plus the mixture-of-experts layers' weighted load-balancing and z-losses of the forward just
        made (none in a dense model); their figures are kept for :meth:`step_metrics`."""
        if not self._moe:
            return loss
        extra, figures = moe_losses(model)
        if extra is None or figures is None:
            return loss
        self._moe_sum = figures if self._moe_sum is None else self._moe_sum + figures
        self._moe_n += 1
        return loss + extra.to(loss.dtype)

    def step_metrics(self) -> dict[str, float] | None:
        """The MoE layers' figures, averaged over the layers and this process's micro-batches since the last
        call: ``moe_aux`` (load-balancing loss, 1 = balanced), ``moe_z`` (router z-loss), ``moe_dropped`` (the
        fraction of token-expert assignments the capacity dropped), ``moe_load`` (the busiest expert's
        assignments over the mean: 1 = balanced, E = all on one)."""
        if self._moe_sum is None:
            return None
        aux, z, dropped, load = (self._moe_sum / self._moe_n).tolist()
        self._moe_sum, self._moe_n = None, 0
        return {
            "moe_aux": round(aux, 5),
            "moe_z": round(z, 4),
            "moe_dropped": round(dropped, 5),
            "moe_load": round(load, 4),
        }

    def evaluate(
        self, model: torch.nn.Module, ctx: distributed.DistContext, precision: str
    ) -> float | dict[str, float] | None:
        """Mean MLM loss over all predicted tokens of the held-out batches (the same batches every time)."""
        assert self.cfg is not None and self.data is not None  # (as in build_model)
        tcfg = self.cfg.train
        total = torch.zeros(2, dtype=torch.float64, device=ctx.device)
        with torch.no_grad():
            for batch in self.data.val_batches(tcfg.micro, tcfg.eval_batches, rank=ctx.rank, world=ctx.world):
                ids = batch["input_ids"].to(ctx.device, non_blocking=True)
                labels = batch["labels"].to(ctx.device, non_blocking=True)
                with autocast(precision, ctx.device):
                    out = model(ids, labels, **_segments(batch, ctx.device))
                n = out.n_predicted.to(torch.float64)
                if n > 0:
                    total[0] += out.loss.double() * n
                    total[1] += n
        distributed.all_reduce(total, ctx)
        return float(total[0] / total[1]) if total[1] > 0 else None
