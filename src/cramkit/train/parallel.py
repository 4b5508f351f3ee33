"""Data parallelism through PyTorch's own engine (torchrun, DDP, FSDP2), applied to a plain model.

Contract used by the trainer (``cramkit.train.loop``):

- ``init_distributed(device)`` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) and returns a
  :class:`DistContext`; without torchrun it is world size 1 and no process group is created.
- ``apply_parallel(model, cfg, ctx)`` returns the module to train: the model itself (world 1),
  DDP-wrapped, or ``fully_shard``-ed per transformer block (FSDP2). The model code knows nothing of it.
- ``sync_gradients(model, enabled)`` is a context manager: gradients are reduced only on the last
  micro-step of an accumulation.
- ``all_reduce(tensor, ctx)`` sums a tensor over ranks in place (no-op at world size 1).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from cramkit.errors import CramkitError


@dataclass
class ParallelConfig:
    strategy: Literal["ddp", "fsdp"] = "ddp"  # used when the world size is above 1
    cpu_offload: bool = False  # FSDP2: keep parameters and optimizer state in host memory
    reshard_after_forward: bool = True  # FSDP2: free gathered parameters after forward
    async_checkpoint: bool = True  # sharded checkpoints are written in the background


@dataclass
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise CramkitError(
            f"device '{name}' was asked for but CUDA is not available here; use --set train.device=cpu"
        )
    return torch.device(name)


def init_distributed(device: str = "auto") -> DistContext:
    """Join torchrun's process group when launched by torchrun; otherwise a world of one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dev = resolve_device(device)
    if world <= 1:
        return DistContext(device=dev)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if dev.type == "cuda" else "gloo", device_id=dev if dev.type == "cuda" else None
        )
    return DistContext(rank=rank, world=world, local_rank=local_rank, device=dev)


def apply_parallel(model: nn.Module, cfg: ParallelConfig, ctx: DistContext) -> nn.Module:
    if not ctx.distributed:
        return model
    raise CramkitError("distributed training is not available in this build yet")


@contextlib.contextmanager
def sync_gradients(model: nn.Module, enabled: bool) -> Iterator[None]:
    if enabled or not hasattr(model, "no_sync"):
        yield
        return
    with model.no_sync():
        yield


def all_reduce(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.distributed:
        import torch.distributed as dist

        dist.all_reduce(tensor)
    return tensor


def shutdown(ctx: DistContext) -> None:
    if ctx.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
