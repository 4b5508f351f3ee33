"""Data and tensor parallelism through PyTorch's own engine (DDP, FSDP2, DTensor), applied to a plain model
on the processes of ``cramkit.train.distributed`` (torchrun's job, its context and collectives).

Contract used by the trainer (``cramkit.train.trainer``):

- ``parallelize(model, cfg, ctx)`` returns the module to train: the model itself (world 1),
  DDP-wrapped, or ``fully_shard``-ed per transformer block (FSDP2); with ``parallel.tp=T`` first split
  across T ranks by tensor parallelism (``cramkit.train.tensor_parallel.apply_tp``, on a 2-D ("dp", "tp")
  mesh). The model code knows nothing of it but its local head count. Like torchtitan, each strategy is a
  separate function on a plain model (``apply_tp``, ``apply_compile``, ``apply_ddp`` / ``apply_fsdp``),
  composed in that order. With ``parallel.ep=N`` (``apply_ep``) each mixture-of-experts layer's experts are
  split over the N ranks. Pipeline parallelism (``parallel.pp``) is ``cramkit.train.pipeline``, which the
  trainer uses instead.
- ``sync_gradients(model, enabled)`` is a context manager around forward+backward: gradients are
  reduced across ranks only on the last micro-step of an accumulation.
- ``clip_grad_norm(model, max_norm)``: the global gradient norm over every rank's shards, and the clipping.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from cramkit import runtime
from cramkit.errors import CramkitError
from cramkit.train.distributed import DistContext, ParallelConfig, encoder_blocks, unwrap
from cramkit.train.tensor_parallel import apply_tp, check_tp, split_per_part

# ---------------------------------------------------------------------------------------------------
# strategies, each a function on a plain model


def apply_compile(model: nn.Module) -> nn.Module:
    """Compile each transformer block in place (keeps parameter names; torchtitan's per-block compile)."""
    for block in encoder_blocks(model):
        block.compile()
    return model


# the encoder's own matrix multiplies; the MLM head (whose decoder is the tied embedding) stays in bf16, as
# torchtitan keeps its output projection
FP8_LAYERS = ("attn.qkv", "attn.out", "mlp.fc_in", "mlp.fc_out")


def apply_float8(model: nn.Module, recipe: str = "tensorwise") -> nn.Module:
    """Swap the encoder blocks' linear layers for torchao's ``Float8Linear`` in place (float8 matrix
    multiplies with dynamic ``recipe`` scaling: tensorwise or rowwise; the master weights stay as they are,
    so checkpoints keep their names and dtypes). Layers whose sizes are not multiples of 16 stay as they are:
    the FP8 kernels need it."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def wanted(mod: nn.Module, fqn: str) -> bool:
        return (
            isinstance(mod, nn.Linear)
            and fqn.endswith(FP8_LAYERS)
            and mod.in_features % 16 == 0
            and mod.out_features % 16 == 0
        )

    # pad_inner_dim: the weight gradient's inner dimension is the token count, which need not be a multiple of 16
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), pad_inner_dim=True)
    convert_to_float8_training(model, config=config, module_filter_fn=wanted)
    return model


def apply_ddp(model: nn.Module, ctx: DistContext) -> nn.Module:
    """DistributedDataParallel: replicas kept equal by averaging gradients (rank 0's init is broadcast)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    # buffers (position tables) are computed, not learned: synced once at init, not at every forward
    return DDP(model, device_ids=device_ids, gradient_as_bucket_view=True, forward_sync_buffers=False)


def apply_fsdp(model: nn.Module, cfg: ParallelConfig, ctx: DistContext, precision: str, mesh: Any) -> nn.Module:
    """FSDP2: ``fully_shard`` each transformer block, then the root, over ``mesh`` (the data-parallel
    ranks).

    The root group holds the embeddings, the final norm and the MLM head; the tied word embedding /
    decoder weight therefore lives in exactly one group (sharding the embeddings on their own would
    split a shared parameter across two groups). With bf16 training (``precision``, resolved by
    ``runtime.resolve_precision``) parameters are gathered in bf16 and gradients reduced in fp32 (the sharded
    master weights stay fp32); ``cpu_offload`` keeps parameters, gradients and optimizer state in host memory.
    Over tensor-parallel weights (``apply_tp``) FSDP shards each rank's part: the per-part split Q/K/V and
    GLU weights along their input dimension (their rows are already split three or two ways).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    from torch.distributed.tensor import Shard

    mp = MixedPrecisionPolicy()
    if runtime.resolve_precision(precision, ctx.device) in ("bf16", "fp8"):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda") if cfg.cpu_offload else OffloadPolicy()
    # fully_shard cannot shard 0-dim parameters (the scaled-sinusoidal position scale), nor split again a
    # bias already split per part: they stay as they are, their gradients averaged by ``sync_gradients``
    ignored = [p for p in model.parameters() if p.dim() == 0 or (p.dim() == 1 and split_per_part(p))]
    _average_over(model, ignored, mesh)

    def placement(p: nn.Parameter) -> Any:
        return Shard(1) if split_per_part(p) else None

    kwargs = dict(
        mesh=mesh,
        mp_policy=mp,
        offload_policy=offload,
        ignored_params=set(ignored) or None,
        shard_placement_fn=placement,
    )
    blocks = encoder_blocks(model)
    for i, block in enumerate(blocks):
        # the last block's parameters are needed again at once in backward: keep them gathered
        reshard = cfg.reshard_after_forward and i < len(blocks) - 1
        fully_shard(block, reshard_after_forward=reshard, **kwargs)
    fully_shard(model, reshard_after_forward=cfg.reshard_after_forward, **kwargs)
    return model


def parallelize(
    model: nn.Module,
    cfg: ParallelConfig,
    ctx: DistContext,
    precision: str = "auto",
    *,
    compile: bool = False,
    fp8_recipe: str = "tensorwise",
) -> nn.Module:
    """The module to train, in torchtitan's order: float8 linear layers (precision fp8), tensor parallelism
    (``parallel.tp`` > 1), per-block ``torch.compile`` (when ``compile``), then data parallelism over the
    remaining ranks (DDP or FSDP2).

    Returns ``model`` itself (world 1, or tensor parallel with DDP-style gradient averaging), DDP-wrapped,
    or FSDP2-sharded in place. ``precision`` is the trainer's resolved one (fp32, bf16, fp16); it sets
    FSDP2's mixed precision."""
    if not ctx.distributed and cfg.cpu_offload:
        raise CramkitError(
            "parallel.cpu_offload needs FSDP across processes; launch with torchrun (or --nproc N) "
            "and --set parallel.strategy=fsdp, or drop parallel.cpu_offload"
        )
    if not ctx.distributed and cfg.tp > 1:
        raise CramkitError(
            f"parallel.tp={cfg.tp} splits each layer across {cfg.tp} processes, but this is one process; "
            f"launch with --nproc {cfg.tp} (or a multiple of it), or set parallel.tp=1"
        )
    if cfg.cpu_offload and cfg.strategy != "fsdp":
        raise CramkitError("parallel.cpu_offload works with parallel.strategy=fsdp only, not ddp")
    if cfg.ep > 1:
        check_ep(getattr(unwrap(model), "cfg", None), cfg.ep, ctx.world)
        if compile:
            apply_compile(model)
        return apply_ep(model, ctx)
    if precision == "fp8":
        if cfg.tp > 1:
            raise CramkitError("precision fp8 with tensor parallelism (parallel.tp > 1) is not supported; use bf16")
        apply_float8(model, fp8_recipe)
    mesh = None
    if ctx.distributed and (cfg.tp > 1 or cfg.strategy == "fsdp"):  # (DDP makes its own)
        mesh = init_mesh(cfg, ctx)
        _broadcast_from_rank0(model)  # TP and FSDP split what each rank holds: make sure all hold the same
    if cfg.tp > 1:
        check_tp(getattr(unwrap(model), "cfg", None), cfg.tp)
        assert mesh is not None  # tp > 1 was refused above without torch.distributed
        apply_tp(model, mesh["tp"])
    if compile:
        apply_compile(model)
    if not ctx.distributed:
        return model
    if mesh is None:
        return apply_ddp(model, ctx)
    dp_mesh = mesh["dp"] if cfg.tp > 1 else mesh
    if cfg.strategy == "fsdp":
        return apply_fsdp(model, cfg, ctx, precision, dp_mesh)
    # DDP does not take DTensor parameters: the gradients are averaged over the dp group by sync_gradients
    _average_over(model, list(model.parameters()), dp_mesh)
    return model


def check_ep(model_cfg: Any, ep: int, world: int | None = None) -> None:
    """One clear line when ``ep`` does not fit the model's experts or the processes."""
    if ep == 1:
        return
    experts = getattr(model_cfg, "moe_experts", 0)
    if not experts:
        raise CramkitError(
            f"parallel.ep={ep} splits mixture-of-experts layers, but the model has none (set model.moe_experts)"
        )
    if experts % ep:
        raise CramkitError(
            f"parallel.ep={ep} must divide model.moe_experts ({experts}): each rank holds an equal share of the "
            "experts; choose a parallel.ep that divides it"
        )
    if world is not None and world != ep:
        raise CramkitError(
            f"parallel.ep={ep} spreads the experts over all processes, but there are {world}; launch --nproc {ep} "
            f"or set parallel.ep={world}"
        )


def apply_ep(model: nn.Module, ctx: DistContext) -> nn.Module:
    """Expert parallelism over all ranks: each MoE layer keeps its share of the stacked expert weights (DTensor
    shards along the expert dimension, so checkpoints hold whole tensors under their names and resume on any
    degree) and exchanges tokens by all-to-all (``MoE._expert_parallel``); the other parameters stay whole, their
    gradients averaged over the ranks by ``sync_gradients``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from cramkit.model.moe import moe_layers

    mesh = init_device_mesh(ctx.device.type, (ctx.world,), mesh_dim_names=("ep",))
    _broadcast_from_rank0(model)
    for layer in moe_layers(model):
        for name in ("w_in", "w_out", "b_in", "b_out"):
            tensor = getattr(layer, name)
            if tensor is not None:
                setattr(layer, name, nn.Parameter(distribute_tensor(tensor.detach(), mesh, [Shard(0)])))
        layer.ep_group, layer.ep_size, layer.ep_rank = mesh.get_group(), ctx.world, ctx.rank
    _average_over(model, [p for p in model.parameters() if not isinstance(p, DTensor)], mesh)
    return model


def init_mesh(cfg: ParallelConfig, ctx: DistContext) -> Any:
    """The device mesh: 1-D over all ranks, or 2-D ("dp", "tp") with tensor-parallel groups of ``cfg.tp``
    consecutive ranks (on one node when the node's GPU count is a multiple of tp)."""
    from torch.distributed.device_mesh import init_device_mesh

    if cfg.tp == 1:
        return init_device_mesh(ctx.device.type, (ctx.world,), mesh_dim_names=("dp",))
    if ctx.world % cfg.tp:
        raise CramkitError(
            f"parallel.tp={cfg.tp} must divide the number of processes ({ctx.world}); launch a multiple of "
            f"{cfg.tp} processes (--nproc) or change parallel.tp"
        )
    return init_device_mesh(ctx.device.type, (ctx.world // cfg.tp, cfg.tp), mesh_dim_names=("dp", "tp"))


def _average_over(model: nn.Module, params: list[nn.Parameter], mesh: Any) -> None:
    """``sync_gradients`` averages these parameters' gradients (their local parts) over ``mesh``'s ranks."""
    model._cramkit_dp_sync = (params, mesh.get_group(), mesh.size())  # type: ignore[assignment]  # torch stubs: attrs are Tensor | Module


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
        _average_gradients(model)
        return
    set_sync = getattr(model, "set_requires_gradient_sync", None)
    if set_sync is not None:  # FSDP2
        set_sync(False)
        try:
            yield
        finally:
            set_sync(True)
        return
    no_sync = getattr(model, "no_sync", None)
    if no_sync is not None:  # DDP
        with no_sync():
            yield
        return
    yield


def _average_gradients(model: nn.Module) -> None:
    """Average the gradients that no wrapper reduces (see ``_average_over``) over their ranks."""
    params, group, size = getattr(model, "_cramkit_dp_sync", ((), None, 1))
    if size == 1:
        return
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for p in params:
            if p.grad is None:
                continue
            grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            if grad.is_cuda:
                dist.all_reduce(grad, op=dist.ReduceOp.AVG, group=group)
            else:  # gloo has no average
                dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=group)
                grad /= size


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip gradients by their global norm; returns the norm.

    Sharded gradients (FSDP2, tensor parallelism: DTensors) are summed over all ranks' shards in one
    all-reduce of the squares (each counted once however many ranks hold a copy), so that every rank
    gets the same norm and the same clipping."""
    from torch.distributed.tensor import DTensor

    params = [p for p in model.parameters() if p.grad is not None]
    grads = [p.grad for p in params if p.grad is not None]  # (all of them)
    if not any(isinstance(g, DTensor) for g in grads):  # one process or DDP: whole, equal gradients
        if not grads:
            return torch.zeros(())
        return torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    import torch.distributed as dist

    world = dist.get_world_size()
    squares = []
    for g in grads:
        if isinstance(g, DTensor):  # copies: the ranks outside its mesh, and its mesh dims that replicate it
            mesh = g.device_mesh
            replicated = [mesh.size(i) for i, p in enumerate(g.placements) if p.is_replicate()]
            copies, g = world // mesh.size() * math.prod(replicated), g.to_local()
        else:
            copies = world
        squares.append(torch.linalg.vector_norm(g, dtype=torch.float32).square() / copies)
    total = torch.stack(squares).sum()
    dist.all_reduce(total)
    total = total.sqrt()
    if max_norm > 0:
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale.to(g.device))
    return total
