"""Tensor parallelism (Megatron-LM's split, with PyTorch's DTensor) of a plain cramkit encoder model.

``apply_tp(model, mesh)`` splits each layer across the ranks of a 1-D mesh (attention heads, MLP width,
vocabulary); ``check_tp`` says in one line when ``parallel.tp`` does not fit the model; ``split_per_part``
tells the weights split per part (the fused Q/K/V, a GLU's halves), which FSDP2 and checkpoints treat apart.
``cramkit.train.parallel.parallelize`` applies it first, before compile and data parallelism.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from cramkit.errors import CramkitError
from cramkit.train.distributed import encoder_blocks, unwrap

if TYPE_CHECKING:
    from cramkit.model.encoder import MLP, Block, ModelConfig


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
    blocks = [(i, b) for i, b in enumerate(encoder_blocks(plain)) if not isinstance(b, nn.Identity)]
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
