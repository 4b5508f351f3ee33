"""Data parallelism through PyTorch's own engine (torchrun, DDP, FSDP2), applied to a plain model.

Contract used by the trainer (``cramkit.train.trainer``):

- ``init_distributed(device, cfg)`` joins torchrun's job (its facts from ``cramkit.runtime``) and
  returns a :class:`DistContext`; without torchrun it is world size 1 and no process group is created.
- ``apply_parallel(model, cfg, ctx)`` returns the module to train: the model itself (world 1),
  DDP-wrapped, or ``fully_shard``-ed per transformer block (FSDP2). The model code knows nothing of it.
  Like torchtitan, each strategy is a separate function on a plain model (``apply_compile``,
  ``apply_ddp``, ``apply_fsdp``), composed in that order.
- ``sync_gradients(model, enabled)`` is a context manager around forward+backward: gradients are
  reduced across ranks only on the last micro-step of an accumulation.
- ``all_reduce(tensor, ctx)`` sums a tensor over ranks in place (no-op at world size 1).
- ``fault_guard(ctx)`` turns a collective that failed because another rank died (or timed out) into
  one clear :class:`CramkitError` instead of a deep traceback or a hang.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

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

    def validate(self) -> None:
        if self.timeout <= 0:
            raise CramkitError(f"parallel.timeout must be a positive number of seconds, got {self.timeout}")


@dataclass
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    timeout: float = 600.0  # seconds a collective waits for the other ranks (ParallelConfig.timeout)

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


# ---------------------------------------------------------------------------------------------------
# strategies, each a function on a plain model


def apply_compile(model: nn.Module) -> nn.Module:
    """Compile each transformer block in place (keeps parameter names; torchtitan's per-block compile)."""
    for block in _blocks(model):
        block.compile()
    return model


def apply_ddp(model: nn.Module, ctx: DistContext) -> nn.Module:
    """DistributedDataParallel: replicas kept equal by averaging gradients (rank 0's init is broadcast)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    # buffers (position tables) are computed, not learned: synced once at init, not at every forward
    return DDP(model, device_ids=device_ids, gradient_as_bucket_view=True, forward_sync_buffers=False)


def apply_fsdp(model: nn.Module, cfg: ParallelConfig, ctx: DistContext, precision: str = "auto") -> nn.Module:
    """FSDP2: ``fully_shard`` each transformer block, then the root.

    The root group holds the embeddings, the final norm and the MLM head; the tied word embedding /
    decoder weight therefore lives in exactly one group (sharding the embeddings on their own would
    split a shared parameter across two groups). With bf16 training (``precision``, resolved by
    ``runtime.resolve_precision``) parameters are gathered in bf16 and gradients reduced in fp32 (the sharded master weights
    stay fp32); ``cpu_offload`` keeps parameters, gradients and optimizer state in host memory.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    _broadcast_from_rank0(model)  # FSDP shards what each rank holds: make sure they all hold the same
    mesh = init_device_mesh(ctx.device.type, (ctx.world,))
    mp = MixedPrecisionPolicy()
    if runtime.resolve_precision(precision, ctx.device) == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda") if cfg.cpu_offload else OffloadPolicy()
    # fully_shard cannot shard 0-dim parameters (the scaled-sinusoidal position scale): they stay
    # replicated on every rank and their gradients are averaged by ``sync_gradients``
    scalars = {p for p in model.parameters() if p.dim() == 0}
    model._cramkit_replicated = [p for p in model.parameters() if p in scalars]
    kwargs = dict(mesh=mesh, mp_policy=mp, offload_policy=offload, ignored_params=scalars or None)
    blocks = _blocks(model)
    for i, block in enumerate(blocks):
        # the last block's parameters are needed again at once in backward: keep them gathered
        reshard = cfg.reshard_after_forward and i < len(blocks) - 1
        fully_shard(block, reshard_after_forward=reshard, **kwargs)
    fully_shard(model, reshard_after_forward=cfg.reshard_after_forward, **kwargs)
    return model


def parallelize(
    model: nn.Module, cfg: ParallelConfig, ctx: DistContext, precision: str = "auto", *, compile: bool = False
) -> nn.Module:
    """The module to train, in torchtitan's order: per-block ``torch.compile`` first (when ``compile``),
    then DDP or FSDP2 (see :func:`apply_parallel`)."""
    if compile:
        apply_compile(model)
    return apply_parallel(model, cfg, ctx, precision)


def apply_parallel(
    model: nn.Module, cfg: ParallelConfig, ctx: DistContext, precision: str = "auto"
) -> nn.Module:
    """The module to train: ``model`` itself (world 1), DDP-wrapped, or FSDP2-sharded in place.

    ``precision`` is the trainer's resolved one (fp32, bf16, fp16); it sets FSDP2's mixed precision."""
    if not ctx.distributed:
        if cfg.cpu_offload:
            raise CramkitError(
                "parallel.cpu_offload needs FSDP across processes; launch with torchrun (or --nproc N) "
                "and --set parallel.strategy=fsdp, or drop parallel.cpu_offload"
            )
        return model
    if cfg.strategy == "fsdp":
        return apply_fsdp(model, cfg, ctx, precision)
    if cfg.cpu_offload:
        raise CramkitError("parallel.cpu_offload works with parallel.strategy=fsdp only, not ddp")
    return apply_ddp(model, ctx)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model under a DDP wrapper (FSDP2 and compile-in-place keep the model itself)."""
    return getattr(model, "module", model)


def _blocks(model: nn.Module) -> list[nn.Module]:
    model = unwrap(model)
    encoder = getattr(model, "encoder", model)
    layers = getattr(encoder, "layers", None)
    if layers is None:
        raise CramkitError(
            f"{type(model).__name__} has no transformer blocks at .encoder.layers; FSDP and per-block "
            "compile need a cramkit encoder model"
        )
    return list(layers)


def _broadcast_from_rank0(model: nn.Module) -> None:
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor, src=0)


# ---------------------------------------------------------------------------------------------------
# the training step


@contextlib.contextmanager
def sync_gradients(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Wrap forward+backward of a micro-step; with ``enabled=False`` gradients only accumulate locally."""
    if enabled:
        yield
        replicated = [p for p in getattr(model, "_cramkit_replicated", ()) if p.grad is not None]
        if replicated:
            import torch.distributed as dist

            for p in replicated:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG if p.grad.is_cuda else dist.ReduceOp.SUM)
                if not p.grad.is_cuda:
                    p.grad /= dist.get_world_size()
        return
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    if hasattr(model, "no_sync"):  # DDP
        with model.no_sync():
            yield
        return
    yield


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip gradients by their global norm (across all ranks' shards under FSDP); returns the norm."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    sharded = [g for g in grads if isinstance(g, DTensor)]
    if not sharded:
        if not grads:
            return torch.zeros(())
        params = [p for p in model.parameters() if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    # FSDP2: the norm of all ranks' shards (a DTensor reduced to a full tensor) and of the replicated rest
    norms = [torch.nn.utils.get_total_norm(sharded).full_tensor()]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    if plain:
        norms.append(torch.nn.utils.get_total_norm(plain).to(norms[0].device))
    total = torch.linalg.vector_norm(torch.stack(norms))
    if max_norm > 0:
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale.to(g.device))
    return total


def all_reduce(tensor: torch.Tensor, ctx: DistContext, op: str = "sum") -> torch.Tensor:
    """Reduce ``tensor`` over ranks in place (``op``: sum, max, min, avg); no-op at world size 1."""
    if ctx.distributed:
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        if op == "avg":
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            tensor /= ctx.world
        else:
            dist.all_reduce(tensor, op=ops[op])
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
