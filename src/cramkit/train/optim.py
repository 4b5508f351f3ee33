"""Optimizers: AdamW (PyTorch's, fused on CUDA) and LAMB (arXiv 1904.00962, implemented here).

Weight decay follows Cramming (``limited_decay_keys``): every weight matrix and embedding decays;
biases, norm weights and other 1-d parameters do not.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch
from torch import nn


def param_groups(
    model: nn.Module, weight_decay: float, lr_scales: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """Weight matrices and embeddings (decayed); biases, norms, scalars (not decayed). ``lr_scales`` maps a
    parameter-name prefix to a multiplier of the learning rate (its own groups, ``lr_scale``). Tensor-parallel
    (DTensor) and replicated parameters go to separate groups: a fused step takes one kind or the other."""
    from torch.distributed.tensor import DTensor

    groups: dict[tuple[bool, float, bool], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        scale = next((s for prefix, s in (lr_scales or {}).items() if name.startswith(prefix)), 1.0)
        groups.setdefault((p.ndim >= 2, scale, isinstance(p, DTensor)), []).append(p)
    return [
        {"params": ps, "weight_decay": weight_decay if decay else 0.0, "lr_scale": scale}
        for (decay, scale, _), ps in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1], kv[0][2]))
    ]


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    device: torch.device,
    lr_scales: dict[str, float] | None = None,
) -> torch.optim.Optimizer:
    groups = param_groups(model, weight_decay, lr_scales)
    if name == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps)
    # fused: one kernel over all parameters (CUDA and CPU; on CPU 1.4x the fine-tuning step of foreach)
    kwargs: dict[str, Any] = {"fused": True} if device.type in ("cuda", "cpu") else {"foreach": True}
    return torch.optim.AdamW(groups, lr=lr, betas=cast("tuple[float, float]", tuple(betas)), eps=eps, **kwargs)


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., arXiv 1904.00962, Algorithm 2), layer-wise trust ratio, decoupled decay.

    For each parameter tensor x with gradient g at step t::

        m = b1 m + (1 - b1) g            v = b2 v + (1 - b2) g^2
        r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * x
        x = x - lr * (||x|| / ||r||) * r      (trust ratio 1 where either norm is 0)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid LAMB settings lr={lr} betas={betas} eps={eps}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                # state in fp32 for half-precision parameters, else in the parameter's own dtype
                dtype = torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype
                grad = p.grad.to(dtype)
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=dtype)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype)
                state["step"] += 1
                # bias corrections as 0-dim tensors: no .item(), so no host sync per parameter
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                tt = t.to(torch.float64)
                bc1, bc2 = 1 - torch.pow(beta1, tt), 1 - torch.pow(beta2, tt)
                update = (m / bc1) / ((v / bc2).sqrt_().add_(group["eps"]))
                x = p.to(dtype)
                if group["weight_decay"]:
                    update.add_(x, alpha=group["weight_decay"])
                w_norm, u_norm = x.norm(), update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                p.add_((update * (-group["lr"] * trust)).to(p.dtype))
        return loss


def reuse_embedding_grads(model: nn.Module, min_rows: int = 4096) -> int:
    """One process on a CPU: each large embedding table's gradient lands in one buffer kept across steps.

    A dense embedding backward allocates a zeroed ``[rows, width]`` gradient every step (47 MB for BERT's
    word embeddings); on a CPU an allocation that size is fresh pages from the kernel each time, and faulting
    them in cost 7-9% of a contrastive step of all-MiniLM-L6-v2 (``bench/bench_contrastive.py``). Here the
    lookup's gradient is sparse (the rows the batch used) and is added into a buffer that was faulted in once;
    what the optimizer, clipping and accumulation see is the same dense gradient. Not for DDP/FSDP2/TP (their
    hooks and shards want dense gradients). Returns the number of tables changed."""
    changed = 0
    for module in model.modules():
        if not isinstance(module, nn.Embedding) or module.sparse or module.num_embeddings < min_rows:
            continue
        weight = module.weight
        if type(weight) is not nn.Parameter or not weight.requires_grad:
            continue
        module.sparse = True
        buffer: list[torch.Tensor] = []

        def densify(p: torch.Tensor, buffer: list[torch.Tensor] = buffer) -> None:
            grad = p.grad
            if grad is None or not grad.is_sparse:
                return  # already dense (a second micro-batch added into it, or a tied weight's summed gradient)
            if not buffer:
                buffer.append(torch.zeros_like(p))
            p.grad = buffer[0].zero_().add_(grad)

        weight.register_post_accumulate_grad_hook(densify)
        changed += 1
    return changed
