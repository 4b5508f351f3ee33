"""The contrastive stage's loss: InfoNCE with in-batch negatives (:func:`info_nce`: symmetric, Matryoshka cuts,
duplicates masked) and the vectors of every process gathered with their gradients (:func:`gather`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def info_nce(
    anchors: Any,
    candidates: Any,
    scale: Any,
    *,
    same: Any | None = None,
    symmetric: bool = False,
    dims: Sequence[int] = (),
    offset: int = 0,
    all_anchors: Any | None = None,
) -> Any:
    """In-batch negatives: anchors [B, d] against candidates [B + N, d] (the B positives first, then any hard
    negatives); row i's target is column i. ``same`` [B, B + N] bool: candidates that are the same text as
    row i's positive (other than column i itself) are masked out. ``symmetric``: the positives also pick
    their anchors among the batch's anchors. ``dims``: the loss is the mean over the full vectors and each
    leading-dimension cut (renormalised).

    Gathered across processes: ``candidates`` are every process's positives then every process's negatives,
    ``anchors`` this process's rows, whose own positives start at column ``offset``; ``same`` is the whole
    batch's mask [all anchors, candidates]; ``all_anchors`` every process's anchors (what the positives pick
    from when ``symmetric``)."""
    import torch
    import torch.nn.functional as F

    batch = anchors.shape[0]
    target = torch.arange(offset, offset + batch, device=anchors.device)
    every = anchors if all_anchors is None else all_anchors
    losses = []
    for d in (None, *dims):
        a = F.normalize(anchors[:, :d] if d else anchors, dim=-1)
        c = F.normalize(candidates[:, :d] if d else candidates, dim=-1)
        scores = (a @ c.T) * scale
        if same is not None:
            scores = scores.masked_fill(same[offset : offset + batch], float("-inf"))
        loss = F.cross_entropy(scores, target)
        if symmetric:
            e = F.normalize(every[:, :d] if d else every, dim=-1)
            back = (c[offset : offset + batch] @ e.T) * scale
            if same is not None:
                back = back.masked_fill(same[:, offset : offset + batch].T, float("-inf"))
            loss = (loss + F.cross_entropy(back, target)) / 2
        losses.append(loss)
    return torch.stack(losses).mean()


def gather(local: Any) -> Any:
    """Every process's rows of ``local`` [n, d] in rank order [world * n, d]; the gradient of this process's
    slice comes back to it in the backward pass (the other processes' slices send theirs to them), so the
    loss over the gathered rows trains every process's encoder as one process with the whole batch."""
    import torch
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(local.contiguous()))
