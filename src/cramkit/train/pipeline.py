"""Pipeline parallelism (``parallel.pp=P``) for masked-LM pretraining, with ``torch.distributed.pipelining``.

The encoder's blocks are cut into P stages of equal length: stage 0 holds the embeddings and the first
blocks, the last stage the last blocks, the final norm, the MLM head and the loss. Each rank builds the whole
model from the run's seed (the same weights as one process) and then drops what other stages hold, so its
parameters keep their full names (``encoder.layers.5.attn.qkv.weight``): checkpoints (DCP) are the whole model
whatever the degree, and a run resumes on another ``parallel.pp`` (or on one process).

Between stages only tensors travel: the hidden states, the labels (the last block computes its queries at
the masked positions only, and the head reads them: sparse prediction) and, with document masks, the segments;
each stage rebuilds its attention masks from them. The micro-batches of one step (``train.micro_batch``, the
gradient accumulation) are the pipeline's micro-batches, run by torch's GPipe or 1F1B schedule; the last stage
returns each micro-batch's summed cross-entropy divided by the global batch's predicted tokens, so the
gradients are exactly those of one process. A step with fewer micro-batches than stages (the batch ramp's first
steps) runs GPipe, which takes any count.

The processes form a 2-D ("dp", "pp") mesh, a pipeline's P ranks consecutive: pipelines read different
batches, their gradients averaged over the dp group (as tensor parallelism does). The tied word embedding /
MLM decoder weight lives on the first and the last stage: its two gradients are summed after every step, so
both copies stay equal (the same update from the same state). Clipping uses the norm over all stages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from cramkit import runtime
from cramkit.errors import CramkitError
from cramkit.model.encoder import Selection, _segment_masks, select_positions
from cramkit.model.heads import IGNORE, MaskedLM, MLMOutput
from cramkit.train import parallel

if TYPE_CHECKING:
    from cramkit.train.parallel import DistContext, ParallelConfig

SCHEDULES = ("gpipe", "1f1b")


def check_pp(model_cfg: Any, pp: int, world: int | None = None) -> None:
    """One clear line when ``pp`` does not divide the layers (or the processes), or meets MoE."""
    if pp == 1 or model_cfg is None:
        return
    if getattr(model_cfg, "moe_experts", 0):
        raise CramkitError(
            f"parallel.pp={pp} does not pipeline mixture-of-experts models (model.moe_experts="
            f"{model_cfg.moe_experts}); train MoE with parallel.pp=1"
        )
    if model_cfg.layers % pp:
        raise CramkitError(
            f"parallel.pp={pp} must divide model.layers ({model_cfg.layers}): each of the {pp} stages takes an "
            "equal number of blocks; choose a parallel.pp that divides it"
        )
    if world is not None and world == 1:
        raise CramkitError(
            f"parallel.pp={pp} splits the model's blocks across {pp} processes, but this is one process; "
            f"launch with --nproc {pp} (or a multiple of it), or set parallel.pp=1"
        )
    if world is not None and world % pp:
        raise CramkitError(
            f"parallel.pp={pp} must divide the number of processes ({world}); launch a multiple of {pp} "
            "processes (--nproc) or change parallel.pp"
        )


class Groups(NamedTuple):
    pp: Any  # this rank's pipeline (P consecutive ranks)
    dp: Any  # the ranks holding the same stage in other pipelines
    tied: Any  # this pipeline's first and last rank (the tied embedding's two copies)
    stage: int
    stages: int
    dp_rank: int
    dp_size: int


def _groups(pp: int, ctx: DistContext) -> Groups:
    """Every rank creates every group, in the same order (torch.distributed's rule)."""
    import torch.distributed as dist

    dp = ctx.world // pp
    mine: dict[str, Any] = {}
    for d in range(dp):
        g = dist.new_group([d * pp + s for s in range(pp)])
        if ctx.rank // pp == d:
            mine["pp"] = g
    for s in range(pp):
        g = dist.new_group([d * pp + s for d in range(dp)])
        if ctx.rank % pp == s:
            mine["dp"] = g
    for d in range(dp):
        g = dist.new_group([d * pp, d * pp + pp - 1])
        if ctx.rank // pp == d:
            mine["tied"] = g
    return Groups(mine["pp"], mine["dp"], mine["tied"], ctx.rank % pp, pp, ctx.rank // pp, dp)


class _WordOnly(nn.Module):
    """The last stage's view of the embeddings: the tied word embedding only (the MLM decoder's weight)."""

    def __init__(self, word: nn.Embedding) -> None:
        super().__init__()
        self.word = word


def prune(model: MaskedLM, stage: int, stages: int) -> range:
    """Keep in ``model`` only what stage ``stage`` of ``stages`` computes (its blocks; the embeddings on the
    first, the final norm and head on the last; the tied word embedding on both); other blocks become
    parameter-free ``Identity`` so that the names stay those of the whole model. Returns the stage's blocks."""
    n = len(model.encoder.layers)
    per = n // stages
    own = range(stage * per, (stage + 1) * per)
    for i in range(n):
        if i not in own:
            model.encoder.layers[i] = nn.Identity()
    first, last = stage == 0, stage == stages - 1
    if not first:
        tied = model.cfg.tie_embeddings and last
        model.encoder.embeddings = _WordOnly(model.encoder.embeddings.word) if tied else None  # type: ignore[assignment]
    if not last:
        model.encoder.final_norm = None  # type: ignore[assignment]
        model.head = None  # type: ignore[assignment]
    return own


class _Stage(nn.Module):
    """What ``PipelineStage`` runs on this rank: tensors in, tensors out (the loss share on the last stage)."""

    def __init__(self, model: MaskedLM, own: range, stage: int, stages: int, precision: str, device: torch.device):
        super().__init__()
        self.lm = model
        self.own, self.first, self.last = own, stage == 0, stage == stages - 1
        self.precision, self.device = precision, device
        self.scale = 1.0  # the last stage's loss = summed cross-entropy * scale (dp / predicted tokens)
        self.sums: list[torch.Tensor] = []  # the last stage's summed cross-entropy of each micro-batch

    def forward(self, x: torch.Tensor, labels: torch.Tensor, *segments: torch.Tensor) -> Any:
        with runtime.autocast(self.precision, self.device):
            return self._forward(x, labels, segments[0] if segments else None)

    def _forward(self, x: torch.Tensor, labels: torch.Tensor, segments: torch.Tensor | None) -> Any:
        lm, enc = self.lm, self.lm.encoder
        if self.first:
            x = enc.embeddings(x)
        keep = labels != IGNORE
        predicted = self.last and bool(keep.any())
        chosen: Selection | None = select_positions(keep) if predicted else None
        mask = last_mask = None
        if segments is not None:
            mask, last_mask = _segment_masks(segments, None, chosen, x.dtype)
        final = len(enc.layers) - 1
        for i in self.own:
            block = enc.layers[i]
            sel, m = (chosen, last_mask) if i == final else (None, mask)
            if lm.cfg.gradient_checkpointing and self.training:
                from torch.utils.checkpoint import checkpoint

                x = checkpoint(block, x, m, sel, None, use_reentrant=False)
            else:
                x = block(x, m, sel, None)
        if not self.last:
            return (x, labels) if segments is None else (x, labels, segments)
        x = enc.final_norm(x)
        if not predicted:
            return lm.head(x).sum() * 0.0
        targets = labels.reshape(-1)[keep.reshape(-1)]
        ce = F.cross_entropy(lm.head(x).float(), targets, reduction="sum")
        self.sums.append(ce.detach().double())
        return ce * self.scale


def _identity_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return output


class Pipeline(nn.Module):
    """The trainer's view of a pipeline-parallel model (``parallel.pp`` > 1): :meth:`forward_backward` for a
    step, :meth:`clip_grad_norm`, and a forward (evaluation) that returns the MLM loss on every rank."""

    def __init__(
        self, model: nn.Module, cfg: ParallelConfig, ctx: DistContext, precision: str, *, compile: bool = False
    ) -> None:
        super().__init__()
        if precision in ("fp16", "fp8"):
            raise CramkitError(
                f"parallel.pp={cfg.pp} does not support precision {precision} (no loss scaling or float8 layers "
                "across stages); use bf16 or fp32"
            )
        if not isinstance(model, MaskedLM):
            raise CramkitError(
                f"parallel.pp={cfg.pp} pipelines masked-LM pretraining only (`cramkit pretrain`), not "
                f"{type(model).__name__}; set parallel.pp=1"
            )
        check_pp(model.cfg, cfg.pp, ctx.world)
        if cfg.pp_schedule not in SCHEDULES:
            raise CramkitError(
                f"parallel.pp_schedule={cfg.pp_schedule!r} is not one of {', '.join(SCHEDULES)} (interleaved "
                "schedules need several stages per process, which cramkit does not build)"
            )
        self.cfg, self.ctx, self.precision = cfg, ctx, precision
        self.groups = g = _groups(cfg.pp, ctx)
        parallel._broadcast_from_rank0(model)  # every rank cuts its stage out of the same weights
        self.tie = bool(model.cfg.tie_embeddings)
        own = prune(model, g.stage, g.stages)
        self.lm = model
        self.stage_module = _Stage(model, own, g.stage, g.stages, precision, ctx.device)
        if compile:  # this stage's blocks, each compiled in place (as ``parallel.apply_compile``)
            for i in own:
                model.encoder.layers[i].compile()
        self.is_first, self.is_last = g.stage == 0, g.stage == g.stages - 1
        self._schedules: dict[tuple[int, tuple[int, ...], bool], Any] = {}
        self.data_ctx = parallel.DistContext(
            rank=g.dp_rank,
            world=g.dp_size,
            local_rank=ctx.local_rank,
            device=ctx.device,
            timeout=ctx.timeout,
            group=g.dp,
        )

    # ------------------------------------------------------------ training

    def _schedule(self, n: int, shape: tuple[int, ...], segments: bool) -> Any:
        """The schedule (and its stage) for ``n`` micro-batches of ``shape`` ([rows, length]): 1F1B needs at least
        as many micro-batches as stages. The tensors between stages are declared (static metadata: nothing is
        inferred by running a stage on placeholder labels)."""
        key = (n, shape, segments)
        if key not in self._schedules:
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

            device = self.ctx.device
            ints = torch.zeros(shape, dtype=torch.long, device=device)
            # (the hidden states carry gradients back: declared with requires_grad, as the loss is)
            hidden = torch.zeros((*shape, self.lm.cfg.hidden), device=device, requires_grad=True)
            between = (hidden, ints, ints) if segments else (hidden, ints)
            inputs = ((ints, ints, ints) if segments else (ints, ints)) if self.is_first else between
            outputs = torch.zeros((), device=device, requires_grad=True) if self.is_last else between
            stage = PipelineStage(
                self.stage_module,
                self.groups.stage,
                self.groups.stages,
                device,
                input_args=inputs,
                output_args=outputs,
                group=self.groups.pp,
            )
            kind = Schedule1F1B if self.cfg.pp_schedule == "1f1b" and n >= self.groups.stages else ScheduleGPipe
            self._schedules[key] = kind(stage, n, loss_fn=_identity_loss, scale_grads=False)
        return self._schedules[key]

    def forward_backward(
        self, batches: list[dict[str, torch.Tensor]], count: Any, tokens: Any
    ) -> tuple[torch.Tensor, int]:
        """Accumulate the gradient of one global batch through the pipeline (every rank of a pipeline holds
        the same micro-batches); returns (its mean loss on every rank, its tokens over all ranks). Gradients
        are averaged over the dp group and the tied embedding's two copies summed."""
        device, g = self.ctx.device, self.groups
        n_local = sum(count(b) for b in batches)
        counts = torch.tensor([float(n_local)], dtype=torch.float64, device=device)
        n_global = float(parallel.all_reduce(counts, self.data_ctx)[0].clamp_min(1.0))
        self.stage_module.scale = g.dp_size / n_global
        self.stage_module.sums = []
        # every tensor a stage sends is int64 or float32, as declared in ``_schedule``
        ids = torch.cat([b["input_ids"] for b in batches]).to(device, torch.long)
        labels = torch.cat([b["labels"] for b in batches]).to(device, torch.long)
        args = [ids, labels]
        if "segments" in batches[0]:
            # (int64, as declared to the stages: the loader's segments are int32)
            args.append(torch.cat([b["segments"] for b in batches]).to(device, torch.long))
        micro = tuple(batches[0]["input_ids"].shape)
        if any(tuple(b["input_ids"].shape) != micro for b in batches):  # (the loaders' micro-batches are equal)
            shapes = [tuple(b["input_ids"].shape) for b in batches]
            raise CramkitError(f"parallel.pp={self.cfg.pp} needs micro-batches of one shape; got {shapes}")
        schedule = self._schedule(len(batches), micro, len(args) == 3)
        # the first stage's inputs are given; later stages receive theirs from the previous one
        if self.is_first:
            schedule.step(*args, target=labels if self.is_last else None, return_outputs=False)
        else:
            schedule.step(target=labels if self.is_last else None, return_outputs=False)
        self._sync_gradients()
        total = torch.zeros((), dtype=torch.float64, device=device)
        if self.is_last and self.stage_module.sums:
            total += torch.stack(self.stage_module.sums).sum()
        import torch.distributed as dist

        dist.all_reduce(total)  # the last stages' sums (other ranks add zero), over every pipeline
        return total / n_global, sum(tokens(b) for b in batches) * g.dp_size

    def _sync_gradients(self) -> None:
        import torch.distributed as dist

        g = self.groups
        params = [p for p in self.lm.parameters() if p.grad is not None]
        if g.dp_size > 1:
            with torch.no_grad():
                for p in params:
                    assert p.grad is not None
                    dist.all_reduce(p.grad, group=g.dp)
                    p.grad /= g.dp_size
        if self.tie and (self.is_first or self.is_last):
            word = self.lm.encoder.embeddings.word.weight
            if word.grad is None:
                word.grad = torch.zeros_like(word)
            dist.all_reduce(word.grad, group=g.tied)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The gradient norm over all stages (the tied weight counted once), every rank clipping alike."""
        import torch.distributed as dist

        params = [p for p in self.lm.parameters() if p.grad is not None]
        counted = params
        if self.tie and self.is_last:
            word = self.lm.encoder.embeddings.word.weight
            counted = [p for p in params if p is not word]
        square = torch.zeros((), dtype=torch.float32, device=self.ctx.device)
        for p in counted:
            assert p.grad is not None
            square += torch.linalg.vector_norm(p.grad, dtype=torch.float32).square()
        dist.all_reduce(square, group=self.groups.pp)
        total = square.sqrt()
        if max_norm > 0:
            scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
            for p in params:
                assert p.grad is not None
                p.grad.mul_(scale.to(p.grad.dtype))
        return total

    # ------------------------------------------------------------ evaluation

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
    ) -> MLMOutput:
        """The MLM loss of one batch on every rank of the pipeline (forward only, one micro-batch passed from
        stage to stage; for evaluation): ``MLMOutput(loss, logits (empty), n_predicted)``."""
        import torch.distributed as dist

        if labels is None or attention_mask is not None or token_type_ids is not None:
            raise CramkitError("a pipeline-parallel model computes the MLM loss of labelled batches only")
        g, stage = self.groups, self.stage_module
        device = input_ids.device
        pp_ranks = dist.get_process_group_ranks(g.pp)
        x: torch.Tensor = input_ids
        if not self.is_first:  # the hidden states travel in fp32 (the residual stream's dtype under autocast)
            x = torch.empty((*input_ids.shape, self.lm.cfg.hidden), dtype=torch.float32, device=device)
            dist.recv(x, src=pp_ranks[g.stage - 1], group=g.pp)
        scale, sums = stage.scale, stage.sums
        stage.scale, stage.sums = 1.0, []
        try:
            out = stage(x, labels) if segments is None else stage(x, labels, segments)
            result = torch.zeros(2, dtype=torch.float64, device=device)
            if self.is_last:
                n = (labels != IGNORE).sum()
                result[0] = stage.sums[0] if stage.sums else 0.0
                result[1] = n
        finally:
            stage.scale, stage.sums = scale, sums
        if not self.is_last:
            dist.send(out[0].float().contiguous(), dst=pp_ranks[g.stage + 1], group=g.pp)
        dist.broadcast(result, src=pp_ranks[-1], group=g.pp)
        n = result[1]
        loss = (result[0] / n.clamp_min(1.0)).float() if n > 0 else torch.full((), float("nan"))
        return MLMOutput(loss, torch.empty(0, device=device), n.long())
