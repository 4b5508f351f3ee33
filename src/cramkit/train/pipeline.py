"""Pipeline parallelism (``parallel.pp=P``) for masked-LM pretraining, with ``torch.distributed.pipelining``.

The encoder's blocks are cut into P x V stages of equal length, V per process (``parallel.pp_virtual``; V > 1
with the interleaved schedule, placed round the ranks: rank r holds stages r, r + P, ...): stage 0 holds the
embeddings and the first blocks, the last stage the last blocks, the final norm, the MLM head and the loss.
Each rank builds the whole model from the run's seed (the same weights as one process) and then drops what
other ranks hold, so its parameters keep their full names (``encoder.layers.5.attn.qkv.weight``): checkpoints
(DCP) are the whole model whatever the degrees, and a run resumes on another ``parallel.pp`` (or one process).

Between stages only tensors travel: the hidden states, the labels (the last block computes its queries at
the masked positions only, and the head reads them: sparse prediction) and, with document masks, the segments;
each stage rebuilds its attention masks from them. The micro-batches of one step (``train.micro_batch``, the
gradient accumulation) are the pipeline's micro-batches, run by torch's GPipe, 1F1B or interleaved 1F1B
schedule; the last stage returns each micro-batch's summed cross-entropy divided by the global batch's
predicted tokens, so the gradients are exactly those of one process.

The processes form a 3-D ("dp", "pp", "tp") mesh, a pipeline's P x T ranks consecutive: with ``parallel.tp=T``
each stage's blocks are split over T ranks (``tensor_parallel.apply_tp``); pipelines read different batches, their
gradients averaged over the dp group (DDP's arithmetic) or, with ``parallel.strategy=fsdp``, each stage is an
FSDP2 root of its own sharded over the dp group (the schedule tells FSDP2 which backward is the last). The tied
word embedding / MLM decoder weight lives on the first and the last stage: its two gradients are summed after
every step, so both copies stay equal (the same update from the same state). Clipping uses the norm over all
stages.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from cramkit import runtime
from cramkit.errors import CramkitError
from cramkit.model.encoder import Selection, _segment_masks, select_positions
from cramkit.model.heads import IGNORE, MaskedLM, MLMOutput
from cramkit.train import distributed, parallel, tensor_parallel

if TYPE_CHECKING:
    from cramkit.train.distributed import DistContext, ParallelConfig

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def stages_per_rank(cfg: ParallelConfig) -> int:
    """The pipeline stages each process holds: ``parallel.pp_virtual``, or 1 (2 with the interleaved schedule)."""
    return cfg.pp_virtual or (2 if cfg.pp_schedule == "interleaved" else 1)


def check_pp(model_cfg: Any, pp: int, world: int | None = None, *, virtual: int = 1, tp: int = 1) -> None:
    """One clear line when ``pp`` (times ``virtual`` stages per process) does not divide the layers, or ``pp``
    times ``tp`` the processes, or meets MoE."""
    if pp == 1 or model_cfg is None:
        return
    if getattr(model_cfg, "moe_experts", 0):
        raise CramkitError(
            f"parallel.pp={pp} does not pipeline mixture-of-experts models (model.moe_experts="
            f"{model_cfg.moe_experts}); train MoE with parallel.pp=1"
        )
    stages = pp * virtual
    if model_cfg.layers % stages:
        per = f" ({pp} processes x {virtual} stages each)" if virtual > 1 else ""
        raise CramkitError(
            f"parallel.pp={pp} must divide model.layers ({model_cfg.layers}) into {stages} stages{per} of equal "
            "length; choose a parallel.pp (or parallel.pp_virtual) that divides it"
        )
    if world is not None and world == 1:
        raise CramkitError(
            f"parallel.pp={pp} splits the model's blocks across {pp} processes, but this is one process; "
            f"launch with --nproc {pp} (or a multiple of it), or set parallel.pp=1"
        )
    if world is not None and world % (pp * tp):
        what = f"{pp * tp} (parallel.pp={pp} x parallel.tp={tp})" if tp > 1 else str(pp)
        raise CramkitError(
            f"parallel.pp={pp} must divide the number of processes ({world}); launch a multiple of {what} "
            "processes (--nproc) or change parallel.pp"
        )


class Groups(NamedTuple):
    pp: Any  # this rank's pipeline (its stages' ranks with this rank's tensor-parallel index)
    dp: Any  # the ranks holding the same part in other pipelines
    tied: Any  # this pipeline's first and last rank (the tied embedding's two copies)
    rank: int  # this rank's place in its pipeline (it holds stages rank, rank + P, ...)
    size: int  # P
    dp_rank: int
    dp_size: int
    mesh: Any  # the ("dp", "pp", "tp") device mesh


def _groups(cfg: ParallelConfig, ctx: DistContext) -> Groups:
    """The 3-D ("dp", "pp", "tp") mesh, a pipeline's P x T ranks consecutive (its T tensor-parallel ranks
    innermost); every rank creates every group, in the same order (torch.distributed's rule)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    pp, tp = cfg.pp, cfg.tp
    dp = ctx.world // (pp * tp)
    mesh = init_device_mesh(ctx.device.type, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))
    d, rest = divmod(ctx.rank, pp * tp)
    s, t = divmod(rest, tp)
    tied = None
    for dd in range(dp):
        for tt in range(tp):
            g = dist.new_group([dd * pp * tp + tt, dd * pp * tp + (pp - 1) * tp + tt])
            if (dd, tt) == (d, t):
                tied = g
    return Groups(mesh["pp"].get_group(), mesh["dp"].get_group(), tied, s, pp, d, dp, mesh)


class _WordOnly(nn.Module):
    """The last stage's view of the embeddings: the tied word embedding only (the MLM decoder's weight)."""

    def __init__(self, word: nn.Embedding) -> None:
        super().__init__()
        self.word = word


def prune(model: MaskedLM, stages: list[int], total: int) -> list[range]:
    """Keep in ``model`` only what this rank's ``stages`` of ``total`` compute (their blocks; the embeddings
    with stage 0, the final norm and head with the last; the tied word embedding with both); other blocks
    become parameter-free ``Identity`` so that the names stay those of the whole model. Returns each stage's
    blocks."""
    n = len(model.encoder.layers)
    per = n // total
    owns = [range(s * per, (s + 1) * per) for s in stages]
    for i in range(n):
        if not any(i in own for own in owns):
            model.encoder.layers[i] = nn.Identity()
    first, last = 0 in stages, total - 1 in stages
    if not first:
        tied = model.cfg.tie_embeddings and last
        model.encoder.embeddings = _WordOnly(model.encoder.embeddings.word) if tied else None  # type: ignore[assignment]
    if not last:
        model.encoder.final_norm = None  # type: ignore[assignment]
        model.head = None  # type: ignore[assignment]
    return owns


class _Stage(nn.Module):
    """What ``PipelineStage`` runs for one stage: tensors in, tensors out (the loss share on the last stage).
    Its submodules are the stage's own parts of the model (``layers``, and the embeddings, final norm and head
    where it has them), so that FSDP2 can shard each stage as a root of its own."""

    def __init__(
        self, model: MaskedLM, own: range, stage: int, stages: int, precision: str, device: torch.device
    ) -> None:
        super().__init__()
        enc = model.encoder
        self.cfg = model.cfg
        self.own, self.first, self.last = own, stage == 0, stage == stages - 1
        self.layers = nn.ModuleList(enc.layers[i] for i in own)
        self.embeddings = enc.embeddings if self.first else None
        self.final_norm = enc.final_norm if self.last else None
        self.head = model.head if self.last else None
        self.word = enc.embeddings if self.last and model.cfg.tie_embeddings else None  # (the decoder's weight)
        self.precision, self.device = precision, device
        self.scale = 1.0  # the last stage's loss = summed cross-entropy * scale (dp / predicted tokens)
        self.sums: list[torch.Tensor] = []  # the last stage's summed cross-entropy of each micro-batch

    def forward(self, x: torch.Tensor, labels: torch.Tensor, *segments: torch.Tensor) -> Any:
        with runtime.autocast(self.precision, self.device):
            return self._forward(x, labels, segments[0] if segments else None)

    def _forward(self, x: torch.Tensor, labels: torch.Tensor, segments: torch.Tensor | None) -> Any:
        if self.embeddings is not None:
            x = self.embeddings(x)
        keep = labels != IGNORE
        predicted = self.last and bool(keep.any())
        chosen: Selection | None = select_positions(keep) if predicted else None
        mask = last_mask = None
        if segments is not None:
            mask, last_mask = _segment_masks(segments, None, chosen, x.dtype)
        for j, block in enumerate(self.layers):
            # (the model's last block computes its queries at the masked positions only)
            sel, m = (chosen, last_mask) if self.last and j == len(self.layers) - 1 else (None, mask)
            if self.cfg.gradient_checkpointing and self.training:
                from torch.utils.checkpoint import checkpoint

                x = checkpoint(block, x, m, sel, None, use_reentrant=False)
            else:
                x = block(x, m, sel, None)
        if not self.last:
            return (x, labels) if segments is None else (x, labels, segments)
        assert self.final_norm is not None and self.head is not None  # (the last stage has them)
        x = self.final_norm(x)
        if not predicted:
            return _local(self.head(x)).sum() * 0.0
        targets = labels.reshape(-1)[keep.reshape(-1)]
        # (with tensor parallelism the logits stay split over the vocabulary: loss-parallel cross-entropy)
        ce = _local(F.cross_entropy(self.head(x).float(), targets, reduction="sum"))
        self.sums.append(ce.detach().double())
        return ce * self.scale


def _local(t: Any) -> torch.Tensor:
    """A plain tensor: a replicated DTensor's local value (what travels between stages, and the loss)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


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
        if model.cfg.pairwise_attention:
            raise CramkitError(
                f"parallel.pp={cfg.pp}: the stages rebuild plain attention masks, without this model's relative "
                "position bias, local attention layers or disentangled attention (MPNet, ModernBERT, DeBERTa); set "
                "parallel.pp=1"
            )
        self.virtual = stages_per_rank(cfg)
        check_pp(model.cfg, cfg.pp, ctx.world, virtual=self.virtual, tp=cfg.tp)
        if cfg.tp > 1:
            tensor_parallel.check_tp(model.cfg, cfg.tp)
        if cfg.pp_schedule not in SCHEDULES:
            raise CramkitError(f"parallel.pp_schedule={cfg.pp_schedule!r} is not one of {', '.join(SCHEDULES)}")
        self.cfg, self.ctx, self.precision = cfg, ctx, precision
        self.groups = g = _groups(cfg, ctx)
        parallel._broadcast_from_rank0(model)  # every rank cuts its stages out of the same weights
        self.tie = bool(model.cfg.tie_embeddings)
        self.total = cfg.pp * self.virtual
        # looped placement (Megatron's interleaving): this rank holds stages rank, rank + P, rank + 2P, ...
        self.stage_ids = [g.rank + v * cfg.pp for v in range(self.virtual)]
        owns = prune(model, self.stage_ids, self.total)
        self.lm = model
        if cfg.tp > 1:  # each stage's blocks (and embeddings, head) split over the tensor-parallel ranks
            tensor_parallel.apply_tp(model, g.mesh["tp"])
        self.stages = nn.ModuleList(
            _Stage(model, own, s, self.total, precision, ctx.device)
            for own, s in zip(owns, self.stage_ids, strict=True)
        )
        if compile:  # this rank's blocks, each compiled in place (as ``parallel.apply_compile``)
            for stage in self.stages:
                for block in cast("_Stage", stage).layers:
                    block.compile()
        self.fsdp = cfg.strategy == "fsdp"
        if self.fsdp:  # FSDP2 over the pipelines: each stage a root, its blocks sharded one by one (over the
            for stage in self.stages:  # tensor-parallel parts where parallel.tp > 1, as ``parallel.parallelize``)
                parallel.apply_fsdp(stage, cfg, ctx, precision, g.mesh["dp"])
        self.is_first, self.is_last = g.rank == 0, g.rank == g.size - 1  # (which ranks hold the tied copies)
        self._schedules: dict[tuple[int, tuple[int, ...], bool], Any] = {}
        self.data_ctx = distributed.DistContext(
            rank=g.dp_rank,
            world=g.dp_size,
            local_rank=ctx.local_rank,
            device=ctx.device,
            timeout=ctx.timeout,
            group=g.dp,
        )

    # ------------------------------------------------------------ training

    def _schedule(self, n: int, shape: tuple[int, ...], segments: bool) -> Any:
        """The schedule (and its stages) for ``n`` micro-batches of ``shape`` ([rows, length]). 1F1B needs at
        least as many micro-batches as stages (fewer: GPipe), interleaved 1F1B a count its rounds divide
        (else the looped breadth-first schedule). The tensors between stages are declared (static metadata:
        nothing is inferred by running a stage on placeholder labels)."""
        key = (n, shape, segments)
        if key not in self._schedules:
            from torch.distributed.pipelining import (
                PipelineStage,
                Schedule1F1B,
                ScheduleGPipe,
                ScheduleInterleaved1F1B,
                ScheduleLoopedBFS,
            )

            device, size = self.ctx.device, self.groups.size
            ints = torch.zeros(shape, dtype=torch.long, device=device)
            # (the hidden states carry gradients back: declared with requires_grad, as the loss is)
            hidden = torch.zeros((*shape, self.lm.cfg.hidden), device=device, requires_grad=True)
            between = (hidden, ints, ints) if segments else (hidden, ints)
            stages: list[Any] = []
            for stage, index in zip(self.stages, self.stage_ids, strict=True):
                st = cast("_Stage", stage)
                inputs = ((ints, ints, ints) if segments else (ints, ints)) if st.first else between
                outputs = torch.zeros((), device=device, requires_grad=True) if st.last else between
                stages.append(
                    PipelineStage(
                        stage, index, self.total, device, input_args=inputs, output_args=outputs, group=self.groups.pp
                    )
                )
            schedule: Any
            if self.virtual > 1:
                rounds = max(1, n // size)
                multi = ScheduleInterleaved1F1B if n % rounds == 0 else ScheduleLoopedBFS
                schedule = multi(stages, n, loss_fn=_identity_loss, scale_grads=False)
            else:
                single = Schedule1F1B if self.cfg.pp_schedule == "1f1b" and n >= size else ScheduleGPipe
                schedule = single(stages[0], n, loss_fn=_identity_loss, scale_grads=False)
            self._schedules[key] = schedule
        return self._schedules[key]

    def forward_backward(
        self, batches: list[dict[str, torch.Tensor]], count: Any, tokens: Any
    ) -> tuple[torch.Tensor, int]:
        """Accumulate the gradient of one global batch through the pipeline (every rank of a pipeline holds
        the same micro-batches); returns (its mean loss on every rank, its tokens over all ranks). Gradients
        are averaged over the dp group (by FSDP2's reduce-scatter, or here) and the tied embedding's two
        copies summed."""
        device, g = self.ctx.device, self.groups
        n_local = sum(count(b) for b in batches)
        counts = torch.tensor([float(n_local)], dtype=torch.float64, device=device)
        n_global = float(distributed.all_reduce(counts, self.data_ctx)[0].clamp_min(1.0))
        for stage in self.stages:
            st = cast("_Stage", stage)
            st.scale, st.sums = g.dp_size / n_global, []
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
        last = cast("_Stage", self.stages[-1])
        if last.last and last.sums:
            total += torch.stack(last.sums).sum()
        import torch.distributed as dist

        dist.all_reduce(total)  # the last stages' sums (other ranks add zero), over every pipeline ...
        total /= self.cfg.tp  # ... and each pipeline's tensor-parallel ranks, which hold the same sums
        return total / n_global, sum(tokens(b) for b in batches) * g.dp_size

    def _sync_gradients(self) -> None:
        import torch.distributed as dist

        g = self.groups
        if self.fsdp:  # FSDP2 reduced the sharded gradients; only the parameters it left whole remain
            for stage in self.stages:
                parallel._average_gradients(stage)
        elif g.dp_size > 1:
            with torch.no_grad():
                for p in self.lm.parameters():
                    if p.grad is not None:
                        grad = _local(p.grad)
                        dist.all_reduce(grad, group=g.dp)
                        grad /= g.dp_size
        if self.tie and (self.is_first or self.is_last):
            from torch.distributed.tensor import DTensor

            word = self.lm.encoder.embeddings.word.weight
            if word.grad is None:
                word.grad = torch.zeros_like(word)
            if isinstance(word, DTensor) and isinstance(word.grad, DTensor):  # tensor parallel: the two copies'
                word.grad = word.grad.redistribute(placements=word.placements)  # alike (the embedding's: replicated)
            dist.all_reduce(_local(word.grad), group=g.tied)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The gradient norm over all stages (the tied weight counted once), every rank clipping alike: each
        rank's squares divided by the number of ranks of its stage that hold the same values (the data-
        parallel replicas, the tensor-parallel ranks of a replicated weight), summed over all ranks."""
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        params = [p for p in self.lm.parameters() if p.grad is not None]
        word = self.lm.encoder.embeddings.word.weight if self.tie and self.is_last else None
        dp, tp = self.groups.dp_size, self.cfg.tp
        square = torch.zeros((), dtype=torch.float32, device=self.ctx.device)
        for p in params:
            if p is word:
                continue
            g = p.grad
            if isinstance(g, DTensor):
                names = g.device_mesh.mesh_dim_names or ()
                copies = math.prod(g.device_mesh.size(i) for i, pl in enumerate(g.placements) if pl.is_replicate())
                copies *= (1 if "dp" in names else dp) * (1 if "tp" in names else tp)
                g = g.to_local()
            else:
                copies = dp * tp
            assert g is not None
            square += torch.linalg.vector_norm(g, dtype=torch.float32).square() / copies
        dist.all_reduce(square)
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
        stage to stage, round the ranks as many times as each holds stages; for evaluation):
        ``MLMOutput(loss, logits (empty), n_predicted)``."""
        import torch.distributed as dist

        if labels is None or attention_mask is not None or token_type_ids is not None:
            raise CramkitError("a pipeline-parallel model computes the MLM loss of labelled batches only")
        g = self.groups
        device = input_ids.device
        ranks = dist.get_process_group_ranks(g.pp)
        result = torch.zeros(2, dtype=torch.float64, device=device)
        for stage in self.stages:
            st = cast("_Stage", stage)
            x: torch.Tensor = input_ids
            if not st.first:  # the hidden states travel in fp32 (the residual stream's dtype under autocast)
                x = torch.empty((*input_ids.shape, self.lm.cfg.hidden), dtype=torch.float32, device=device)
                dist.recv(x, src=ranks[(g.rank - 1) % g.size], group=g.pp)
            scale, sums = st.scale, st.sums
            st.scale, st.sums = 1.0, []
            try:
                out = st(x, labels) if segments is None else st(x, labels, segments)
                if st.last:
                    result[0] = st.sums[0] if st.sums else 0.0
                    result[1] = (labels != IGNORE).sum()
            finally:
                st.scale, st.sums = scale, sums
            if not st.last:
                dist.send(out[0].float().contiguous(), dst=ranks[(g.rank + 1) % g.size], group=g.pp)
        dist.broadcast(result, src=ranks[-1], group=g.pp)
        n = result[1]
        loss = (result[0] / n.clamp_min(1.0)).float() if n > 0 else torch.full((), float("nan"))
        return MLMOutput(loss, torch.empty(0, device=device), n.long())
