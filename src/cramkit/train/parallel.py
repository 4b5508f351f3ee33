"""Data and tensor parallelism through PyTorch's own engine (torchrun, DDP, FSDP2, DTensor), applied to a
plain model.

Contract used by the trainer (``cramkit.train.trainer``):

- ``init_distributed(device, cfg)`` joins torchrun's job (its facts from ``cramkit.runtime``) and
  returns a :class:`DistContext`; without torchrun it is world size 1 and no process group is created.
- ``parallelize(model, cfg, ctx)`` returns the module to train: the model itself (world 1),
  DDP-wrapped, or ``fully_shard``-ed per transformer block (FSDP2); with ``parallel.tp=T`` first split
  across T ranks by tensor parallelism (``apply_tp``, on a 2-D ("dp", "tp") mesh). The model code knows
  nothing of it but its local head count. Like torchtitan, each strategy is a separate function on a
  plain model (``apply_tp``, ``apply_compile``, ``apply_ddp`` / ``apply_fsdp``), composed in that order.
  With ``parallel.ep=N`` (``apply_ep``) each mixture-of-experts layer's experts are split over the N ranks.
  Pipeline parallelism (``parallel.pp``) is ``cramkit.train.pipeline``, which the trainer uses instead.
- ``data_context(ctx, cfg)``: the ranks that read different batches (a tensor-parallel group shares
  its batches), for the data loader, the loss average and evaluation.
- ``sync_gradients(model, enabled)`` is a context manager around forward+backward: gradients are
  reduced across ranks only on the last micro-step of an accumulation.
- ``all_reduce(tensor, ctx)`` sums a tensor over ranks in place (no-op at world size 1).
- ``fault_guard(ctx)`` turns a collective that failed because another rank died (or timed out) into
  one clear :class:`CramkitError` instead of a deep traceback or a hang.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from torch import nn

from cramkit import runtime
from cramkit.errors import CramkitError

if TYPE_CHECKING:
    from cramkit.model.encoder import MLP, Block, ModelConfig


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


# ---------------------------------------------------------------------------------------------------
# strategies, each a function on a plain model


def apply_compile(model: nn.Module) -> nn.Module:
    """Compile each transformer block in place (keeps parameter names; torchtitan's per-block compile)."""
    for block in _blocks(model):
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
    blocks = _blocks(model)
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


def data_context(ctx: DistContext, cfg: ParallelConfig) -> DistContext:
    """The ranks that read different data: all of them, or with tensor parallelism one per tensor-parallel
    group (the ``tp`` ranks of a group train on the same batch). Its ``rank``/``world`` pick the data shard,
    its ``all_reduce`` sums over the ranks of this rank's data-parallel group (call on every rank)."""
    if cfg.tp == 1 or not ctx.distributed:
        return ctx
    import torch.distributed as dist

    dp = ctx.world // cfg.tp
    groups = [dist.new_group([d * cfg.tp + j for d in range(dp)]) for j in range(cfg.tp)]  # as ``init_mesh``
    return DistContext(
        rank=ctx.rank // cfg.tp,
        world=dp,
        local_rank=ctx.local_rank,
        device=ctx.device,
        timeout=ctx.timeout,
        group=groups[ctx.rank % cfg.tp],
    )


def _average_over(model: nn.Module, params: list[nn.Parameter], mesh: Any) -> None:
    """``sync_gradients`` averages these parameters' gradients (their local parts) over ``mesh``'s ranks."""
    model._cramkit_dp_sync = (params, mesh.get_group(), mesh.size())  # type: ignore[assignment]  # torch stubs: attrs are Tensor | Module


# ---------------------------------------------------------------------------------------------------
# tensor parallelism (Megatron-LM's split, with PyTorch's DTensor)


def check_tp(model_cfg: Any, tp: int) -> None:
    """One clear line when ``tp`` does not divide the attention heads or the MLP width (a vocabulary that
    it does not divide is split unevenly)."""
    if tp == 1 or model_cfg is None:
        return
    if getattr(model_cfg, "moe_experts", 0):
        raise CramkitError(
            f"parallel.tp={tp} does not split mixture-of-experts layers (model.moe_experts="
            f"{model_cfg.moe_experts}); train MoE with parallel.tp=1 (DDP or FSDP2)"
        )
    glu = model_cfg.activation in ("gelu_glu", "swiglu")
    sizes = [
        ("model.heads", model_cfg.heads),
        (
            "the MLP width (model.intermediate / 2 with a GLU activation)" if glu else "model.intermediate",
            model_cfg.intermediate // 2 if glu else model_cfg.intermediate,
        ),
    ]
    for name, size in sizes:
        if size % tp:
            raise CramkitError(
                f"parallel.tp={tp} must divide {name} ({size}): each of the {tp} ranks takes an equal part; "
                f"choose a parallel.tp that divides it (or change the model)"
            )


def split_per_part(t: torch.Tensor) -> bool:
    """Whether ``t`` is a tensor-parallel weight split per part: the fused Q/K/V projection (each rank
    its heads' rows of Q, K and V) or a GLU input projection (its rows of each half)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

    if not isinstance(t, DTensor):
        return False
    names = t.device_mesh.mesh_dim_names or ()
    return any(isinstance(p, _StridedShard) and names[i] == "tp" for i, p in enumerate(t.placements))


def apply_tp(model: nn.Module, mesh: Any) -> None:
    """Split a cramkit encoder model across the ranks of the 1-D mesh ``mesh`` (tensor parallelism).

    Megatron-LM's plan in the encoder's names (torchtitan's for Llama): the token embedding row-wise (the
    vocabulary split, outputs summed), each block's Q/K/V and MLP input projections column-wise (each rank
    computes its heads, its part of the MLP width), the attention output and MLP output projections
    row-wise (partial outputs summed: two all-reduces per block forward, two backward), the MLM decoder
    column-wise (each rank its part of the vocabulary) with torch's loss-parallel cross-entropy over the
    masked positions (the logits are never gathered). The fused Q/K/V weight is split per part (rank r
    holds its heads' rows of Q, of K and of V), like a GLU's two halves.

    Everything else (norms, the position table, the MLM head's transform) is replicated, and so are
    the activations between blocks: no sequence parallelism, because sparse prediction picks the
    masked positions out of the whole sequence in the last block (a sequence-sharded activation would
    need a gather there) and the MLM head reads only those positions.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plain = unwrap(model)
    tp = mesh.size()
    plan: dict[str, Any] = {}
    # (a pipeline stage, ``pipeline.prune``, may lack the embeddings and has Identity for others' blocks)
    encoder = getattr(plain, "encoder", None)
    staged = isinstance(encoder, nn.Module) and getattr(encoder, "embeddings", True) is None
    word = None if staged else _find(plain, ("encoder.embeddings.word", "embeddings.word"))
    if word is not None:
        plan[word] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    prefix = "encoder." if hasattr(plain, "encoder") else ""
    blocks = [(i, b) for i, b in enumerate(_blocks(plain)) if not isinstance(b, nn.Identity)]
    for i, _ in blocks:
        plan[f"{prefix}layers.{i}.attn.out"] = RowwiseParallel()
        plan[f"{prefix}layers.{i}.mlp.fc_out"] = RowwiseParallel()
    head = getattr(plain, "head", None)
    decoder = getattr(head, "decoder", None)
    if decoder is not None:  # logits stay split over the vocabulary for the loss-parallel cross-entropy
        plan["head.decoder"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(plain, mesh, plan)
    for block in cast("list[Block]", [b for _, b in blocks]):  # check_tp: a cramkit encoder's blocks (no MoE)
        mlp = cast("MLP", block.mlp)
        _split_rows(block.attn.qkv, mesh, 3)
        _split_rows(mlp.fc_in, mesh, 2 if mlp.glu else 1)
        block.attn.heads //= tp
        block.attn.register_forward_pre_hook(_into_tp_region(mesh))
        block.mlp.register_forward_pre_hook(_into_tp_region(mesh))
    if decoder is not None:
        assert head is not None  # the decoder is head.decoder
        if word is not None and cast("ModelConfig", plain.cfg).tie_embeddings:  # tie the two again
            head.decoder.weight = plain.get_submodule(word).weight
        plain.register_forward_hook(_local_loss)
        _enable_loss_parallel()


def _find(model: nn.Module, names: tuple[str, ...]) -> str:
    for name in names:
        try:
            model.get_submodule(name)
            return name
        except AttributeError:
            continue
    raise CramkitError(
        f"{type(model).__name__} has no token embedding at {' or '.join(names)}; tensor parallelism needs a "
        "cramkit encoder model"
    )


def _split_rows(linear: nn.Linear, mesh: Any, parts: int) -> None:
    """Shard a projection's output rows over ``mesh``; with ``parts`` > 1 each of its ``parts`` equal
    blocks of rows (Q, K, V; or a GLU's value and gate) is split, and a rank holds its rows of each."""
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    placement = _StridedShard(0, split_factor=parts) if parts > 1 else Shard(0)
    for name in ("weight", "bias"):
        tensor = getattr(linear, name)
        if tensor is not None:
            setattr(linear, name, nn.Parameter(distribute_tensor(tensor.detach(), mesh, [placement])))


def _into_tp_region(mesh: Any) -> Any:
    """A forward pre-hook: the replicated input enters a column-split layer unchanged, and its gradient
    (each rank's part) is summed over the tensor-parallel ranks in backward (Megatron's "f")."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = DTensor.from_local(args[0], mesh, [Replicate()], run_check=False)
        return (x.to_local(grad_placements=[Partial()]), *args[1:])

    return hook


def _local_loss(module: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
    """The MLM loss (the same on every tensor-parallel rank) as a plain tensor; logits stay split."""
    from torch.distributed.tensor import DTensor

    loss = getattr(out, "loss", None)
    # a copy: FSDP2 warns about a view returned by its root module
    return out._replace(loss=loss.to_local().clone()) if isinstance(loss, DTensor) else out


_loss_parallel: contextlib.AbstractContextManager | None = None


def _enable_loss_parallel() -> None:
    """Switch on torch's loss parallelism for this process (once): a cross-entropy over logits split on
    the vocabulary is computed without gathering them, in forward and backward. Its context must enclose
    the backward too, which runs in the trainer; it only changes cross-entropy on DTensors."""
    global _loss_parallel
    if _loss_parallel is None:
        from torch.distributed.tensor.parallel import loss_parallel

        _loss_parallel = loss_parallel()
        _loss_parallel.__enter__()


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
