"""The processes of a parallel job (torchrun's), apart from any strategy that splits the model over them.

- :class:`ParallelConfig` (the ``parallel`` section: data, tensor, pipeline and expert parallelism) and
  :class:`DistContext` (this process's rank, world size and device).
- ``init_distributed(device, cfg)`` joins torchrun's job (its facts from ``cramkit.runtime``) and returns a
  :class:`DistContext`; without torchrun it is world size 1 and no process group is created.
- ``data_context(ctx, cfg)``: the ranks that read different batches (a tensor-parallel group shares its
  batches), for the data loader, the loss average and evaluation.
- ``all_reduce(tensor, ctx)`` sums a tensor over ranks in place (no-op at world size 1);
  ``broadcast_object`` and ``main_first`` (rank 0 runs a body first, the others after it succeeded).
- ``fault_guard(ctx)`` turns a collective that failed because another rank died (or timed out) into one
  clear :class:`CramkitError` instead of a deep traceback or a hang; ``shutdown(ctx)`` leaves the group.
- ``unwrap`` and ``encoder_blocks``: the plain model under a wrapper, and its transformer blocks (what the
  strategies of ``cramkit.train.parallel`` and ``cramkit.train.tensor_parallel`` split or compile).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from cramkit import runtime
from cramkit.errors import CramkitError


@dataclass
class ParallelConfig:
    strategy: Literal["ddp", "fsdp"] = "ddp"  # used when the world size is above 1
    cpu_offload: bool = False  # FSDP2: keep parameters, gradients and optimizer state in host memory
    reshard_after_forward: bool = True  # FSDP2: free gathered parameters after forward
    async_checkpoint: bool = True  # checkpoints are written in the background (train/checkpoint.py)
    # seconds a collective may wait for the other ranks before the job stops with an error (a rank that
    # died usually fails the collective at once; this bounds the case of a rank that hangs)
    timeout: float = 600.0
    # tensor parallelism: each layer split across this many ranks (attention heads, MLP width, vocabulary);
    # data parallelism (``strategy``) runs over the world size / tp groups of ranks
    tp: int = 1
    # pipeline parallelism (train/pipeline.py): the encoder's blocks cut into this many stages, one per rank of a
    # pipeline; data parallelism runs over the world size / pp pipelines; micro-batches scheduled by pp_schedule
    pp: int = 1
    pp_schedule: Literal["gpipe", "1f1b", "interleaved"] = "1f1b"
    # stages per process (Megatron's virtual stages, looped: rank r holds stages r, r + pp, ...): 0 = 1, or 2 with
    # the interleaved schedule (which needs at least 2: a bubble smaller by that factor, more messages)
    pp_virtual: int = 0
    # expert parallelism: each mixture-of-experts layer's experts split across this many ranks (all of them), the
    # tokens exchanged by all-to-all; the other weights replicated, their gradients averaged as DDP's
    ep: int = 1

    def validate(self) -> None:
        if self.timeout <= 0:
            raise CramkitError(f"parallel.timeout must be a positive number of seconds, got {self.timeout}")
        if self.tp < 1:
            raise CramkitError(f"parallel.tp must be at least 1 (1 = no tensor parallelism), got {self.tp}")
        if self.tp > 1 and self.cpu_offload:
            raise CramkitError(
                f"parallel.tp={self.tp} does not work with parallel.cpu_offload; drop one of them (tensor "
                "parallelism already divides each rank's weights by tp)"
            )
        if self.pp < 1:
            raise CramkitError(f"parallel.pp must be at least 1 (1 = no pipeline parallelism), got {self.pp}")
        if self.pp_virtual < 0:
            raise CramkitError(f"parallel.pp_virtual must be 0 (automatic) or a stage count, got {self.pp_virtual}")
        if self.pp_virtual > 1 and self.pp_schedule != "interleaved":
            raise CramkitError(
                f"parallel.pp_virtual={self.pp_virtual} (stages per process) needs parallel.pp_schedule=interleaved; "
                f"the {self.pp_schedule} schedule runs one stage per process"
            )
        if self.pp_virtual == 1 and self.pp_schedule == "interleaved":
            raise CramkitError(
                "parallel.pp_schedule=interleaved needs at least 2 stages per process (parallel.pp_virtual=2, the "
                "default); with one use parallel.pp_schedule=1f1b"
            )
        if self.ep < 1:
            raise CramkitError(f"parallel.ep must be at least 1 (1 = no expert parallelism), got {self.ep}")
        if self.ep > 1 and (self.tp > 1 or self.pp > 1 or self.strategy == "fsdp" or self.cpu_offload):
            raise CramkitError(
                f"parallel.ep={self.ep} runs with parallel.strategy=ddp only, without parallel.tp, parallel.pp or "
                "cpu_offload; drop one of them"
            )
        if self.pp > 1 and self.cpu_offload:
            raise CramkitError(
                f"parallel.pp={self.pp} does not work with parallel.cpu_offload (a stage's parameters stay on its "
                "device); drop one of them"
            )


@dataclass
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    timeout: float = 600.0  # seconds a collective waits for the other ranks (ParallelConfig.timeout)
    group: Any = None  # the process group of these ranks (None: all of them); see ``data_context``

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def init_distributed(device: str = "auto", cfg: ParallelConfig | None = None) -> DistContext:
    """Join torchrun's process group when launched by torchrun; otherwise a world of one.

    NCCL on CUDA (with gloo beside it for CPU collectives such as checkpoint planning), gloo on CPU.
    """
    cfg = cfg or ParallelConfig()
    job = runtime.torchrun()
    dev = runtime.resolve_device(device)
    if job.world <= 1:
        return DistContext(device=dev, timeout=cfg.timeout)
    rank, world, local_rank = job.rank, job.world, job.local_rank
    if dev.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise CramkitError(
                f"local rank {local_rank} has no GPU (this node has {torch.cuda.device_count()}); "
                "lower --nproc_per_node to the number of GPUs"
            )
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    import torch.distributed as dist

    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=cfg.timeout)
        if dev.type == "cuda":
            dist.init_process_group(backend="cpu:gloo,cuda:nccl", timeout=timeout, device_id=dev)
        else:
            dist.init_process_group(backend="gloo", timeout=timeout)
    ctx = DistContext(rank=rank, world=world, local_rank=local_rank, device=dev, timeout=cfg.timeout)
    _exit_on_sigterm(ctx)
    return ctx


def _exit_on_sigterm(ctx: DistContext) -> None:
    """Outside the training loop (whose own handler saves a checkpoint first), a SIGTERM from torchrun
    ends this rank at once with one line saying why, instead of a silent kill or a traceback."""
    import signal
    import sys
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: object) -> None:
        print(
            f"cramkit: rank {ctx.rank}/{ctx.world}: stopped by SIGTERM (torchrun stops every process of the "
            "job when one of them fails or the job is cancelled: see its summary). Continue from the last "
            "complete checkpoint with `cramkit pretrain --resume RUN`",
            file=sys.stderr,
            flush=True,
        )
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def data_context(ctx: DistContext, cfg: ParallelConfig) -> DistContext:
    """The ranks that read different data: all of them, or with tensor parallelism one per tensor-parallel
    group (the ``tp`` ranks of a group train on the same batch). Its ``rank``/``world`` pick the data shard,
    its ``all_reduce`` sums over the ranks of this rank's data-parallel group (call on every rank)."""
    if cfg.tp == 1 or not ctx.distributed:
        return ctx
    import torch.distributed as dist

    dp = ctx.world // cfg.tp
    groups = [dist.new_group([d * cfg.tp + j for d in range(dp)]) for j in range(cfg.tp)]  # as ``parallel.init_mesh``
    return DistContext(
        rank=ctx.rank // cfg.tp,
        world=dp,
        local_rank=ctx.local_rank,
        device=ctx.device,
        timeout=ctx.timeout,
        group=groups[ctx.rank % cfg.tp],
    )


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model under a DDP wrapper (FSDP2 and compile-in-place keep the model itself)."""
    return getattr(model, "module", model)


def encoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a cramkit encoder model (under a wrapper or not)."""
    model = unwrap(model)
    encoder = getattr(model, "encoder", model)
    layers = getattr(encoder, "layers", None)
    if layers is None:
        raise CramkitError(
            f"{type(model).__name__} has no transformer blocks at .encoder.layers; FSDP and per-block "
            "compile need a cramkit encoder model"
        )
    return list(layers)


# ---------------------------------------------------------------------------------------------------
# collectives


def all_reduce(tensor: torch.Tensor, ctx: DistContext, op: str = "sum") -> torch.Tensor:
    """Reduce ``tensor`` over ranks in place (``op``: sum, max, min, avg); no-op at world size 1."""
    if ctx.distributed:
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        if op == "avg":
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=ctx.group)
            tensor /= ctx.world
        else:
            dist.all_reduce(tensor, op=ops[op], group=ctx.group)
    return tensor


def broadcast_object(obj: object, ctx: DistContext, src: int = 0) -> object:
    """Rank ``src``'s (small, trusted, in-memory) Python object on every rank."""
    if not ctx.distributed:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


@contextlib.contextmanager
def main_first(ctx: DistContext, what: str = "preparing the data") -> Iterator[None]:
    """Rank 0 runs the body first (e.g. training the tokenizer, building the token store into the run
    directory); the other ranks run it after rank 0 succeeded (and then find its results cached).

    The wait has no practical time limit (a corpus can take hours to tokenize); if rank 0 fails, the
    others stop with an error naming it instead of waiting."""
    if not ctx.distributed:
        yield
        return
    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=1))
    try:
        if ctx.is_main:
            try:
                yield
            except BaseException as exc:
                dist.broadcast_object_list([f"{type(exc).__name__}: {exc}"], src=0, group=group)
                raise
            dist.broadcast_object_list([None], src=0, group=group)
            return
        box: list[object] = [None]
        dist.broadcast_object_list(box, src=0, group=group)
        if box[0] is not None:
            raise CramkitError(f"rank {ctx.rank}: rank 0 failed while {what} ({box[0]}); see its message")
        yield
    finally:
        dist.destroy_process_group(group)


@contextlib.contextmanager
def fault_guard(ctx: DistContext) -> Iterator[None]:
    """A failed collective (a peer died, or timed out) becomes one clear error naming this rank."""
    if not ctx.distributed:
        yield
        return
    try:
        yield
    except CramkitError:
        raise
    except (RuntimeError, OSError) as exc:
        if not _is_comm_failure(exc):
            raise
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise CramkitError(
            f"rank {ctx.rank}/{ctx.world}: lost contact with the other ranks ({first}); another process "
            "probably died or hung (see its log above). Resume from the last complete checkpoint with "
            "`cramkit pretrain --resume RUN`"
        ) from None


def _is_comm_failure(exc: BaseException) -> bool:
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc).lower()
    markers = ("gloo", "nccl", "connection", "timed out", "timeout", "peer", "socket", "broken pipe")
    return any(m in text for m in markers)


def shutdown(ctx: DistContext) -> None:
    if ctx.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
