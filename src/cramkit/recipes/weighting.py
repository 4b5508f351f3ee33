"""Multi-task weighting: how the gradients of every task's batch combine into one step (``--weighting``).

With ``--weighting`` a mixture's step takes one batch of every task (instead of one task drawn by the
rates), and the tasks' gradients on the shared encoder combine by one of:

- ``sum``: the plain sum of the task losses (one backward pass; the baseline);
- ``gradnorm``: each task's gradient on the encoder rescaled to the mean of the tasks' gradient norms, so
  every task pulls the encoder equally hard whatever the scale of its loss (GradNorm's target with
  alpha = 0, Chen et al. 2018, "GradNorm: Gradient Normalization for Adaptive Loss Balancing in Deep
  Multitask Networks", reached in closed form each step instead of by learned loss weights);
- ``pcgrad``: PCGrad (Yu et al. 2020, "Gradient Surgery for Multi-Task Learning"): each task's gradient
  loses its component along every other task's gradient it conflicts with (negative dot product), the
  other tasks taken in a random order drawn each step; then the projected gradients are summed.

``primary`` (``--primary TASK``): primary and auxiliary tasks. Each auxiliary task's gradient loses its
component opposing the primary task's gradient (a negative dot product: to first order it would raise the
primary loss), so the step never pulls against the primary task (the projection variant of Du et al. 2018,
"Adapting Auxiliary Losses Using Gradient Similarity", and of PCGrad's surgery made one-sided). It applies
after ``sum`` or ``gradnorm``.

Task heads always get their own task's gradient unchanged: only the shared encoder's gradients combine.
Every rule combines the tasks' gradients linearly: the weights are decided on the tasks' Gram matrix
(tasks x tasks dot products, one pass over the gradients), then applied in one more pass. Nothing here
reads a value on the host (no device sync).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from cramkit.errors import CramkitError

WEIGHTINGS = ("sum", "gradnorm", "pcgrad")
_TINY = 1e-20


def check_weighting(weighting: str | None, primary: str | None, tasks: Sequence[str]) -> tuple[str, int | None]:
    """The weighting and the primary task's index, checked: an unknown weighting or a primary task that is not
    in the mixture is one line. ``primary`` may be a task's full name (glue/mrpc) or its short one (mrpc)."""
    weighting = weighting or "sum"
    if weighting not in WEIGHTINGS:
        raise CramkitError(f"--weighting {weighting}: unknown; choose one of {', '.join(WEIGHTINGS)}")
    if primary is None:
        return weighting, None
    if weighting == "pcgrad":
        raise CramkitError(
            "--primary already projects the auxiliary tasks' gradients against the primary task's; it applies "
            "after --weighting sum or gradnorm, not pcgrad"
        )
    names = list(tasks)
    found = [i for i, n in enumerate(names) if primary in (n, n.rsplit("/", 1)[-1])]
    if len(found) != 1:
        raise CramkitError(f"--primary {primary}: not a task of the mixture ({', '.join(names)}); name one of them")
    return weighting, found[0]


def needs_task_gradients(weighting: str, primary: int | None) -> bool:
    """Whether the weighting needs each task's gradient apart (every weighting but a plain ``sum``)."""
    return weighting != "sum" or primary is not None


def pcgrad_order(seed: int, batch: int, tasks: int) -> list[list[int]]:
    """For each task, the other tasks in the order PCGrad projects against them at global batch ``batch``: a
    random order drawn by a generator seeded by (seed, batch), so a resumed run draws the same."""
    rng = np.random.default_rng([seed, 0x70636772, batch])
    return [[int(j) for j in rng.permutation(tasks) if j != i] for i in range(tasks)]


def task_weights(
    gram: torch.Tensor,
    weighting: str,
    primary: int | None = None,
    order: list[list[int]] | None = None,
) -> torch.Tensor:
    """The combined gradient's weight on each task's gradient, from the tasks' Gram matrix (``gram[i, j]``: the
    dot product of task i's and task j's gradients on the shared parameters): every rule here combines the
    tasks' gradients linearly, so the combination is decided on the small matrix and applied in one pass.

    ``sum``: 1 each; ``gradnorm``: mean norm / own norm; ``pcgrad``: each task's gradient projected (in
    ``order[i]``, default 0, 1, ...) off every other task's original gradient it conflicts with (negative dot
    product, Yu et al.), then summed; ``primary``: after the weighting's scaling, every other task's gradient
    loses its component opposing the primary task's."""
    n = gram.shape[0]
    g = gram.double()
    rows = torch.eye(n, dtype=torch.float64, device=gram.device)  # rows[i]: task i's gradient, in task gradients
    if weighting == "gradnorm":
        norms = g.diagonal().clamp_min(0).sqrt()
        rows = torch.diag(norms.mean() / norms.clamp_min(_TINY))
    elif weighting == "pcgrad":
        out = []
        for i in range(n):
            m = rows[i]
            for j in order[i] if order is not None else [j for j in range(n) if j != i]:
                dot = m @ g[:, j]  # (task i's projected gradient) . (task j's original one)
                m = m - (dot.clamp(max=0.0) / g[j, j].clamp_min(_TINY)) * rows[j]
            out.append(m)
        rows = torch.stack(out)
    elif weighting != "sum":
        raise CramkitError(f"--weighting {weighting}: unknown; choose one of {', '.join(WEIGHTINGS)}")
    if primary is not None:
        p = rows[primary]
        gp = g @ p
        p_sq = p @ gp
        rows = torch.stack(
            [
                rows[i] if i == primary else rows[i] - ((rows[i] @ gp).clamp(max=0.0) / p_sq.clamp_min(_TINY)) * p
                for i in range(n)
            ]
        )
    return rows.sum(dim=0)


def combine(
    grads: torch.Tensor,
    weighting: str,
    primary: int | None = None,
    order: list[list[int]] | None = None,
) -> torch.Tensor:
    """The shared parameters' combined gradient from ``grads`` (one row per task, flattened): see
    :func:`task_weights`."""
    weights = task_weights(grads @ grads.T, weighting, primary, order)
    return weights.to(grads.dtype) @ grads


def gradient_figures(gram: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The figures logged for one step, as one device vector, from the tasks' Gram matrix and the combined
    gradient's weights (:func:`task_weights`): each task's gradient norm on the shared parameters, the cosine of
    every pair of tasks (i < j, in order), and the cosine of the combined gradient with each task's.
    :func:`figure_names` names them."""
    g = gram.double()
    w = weights.double()
    norms = g.diagonal().clamp_min(0).sqrt()
    cos = g / (norms.unsqueeze(0) * norms.unsqueeze(1)).clamp_min(_TINY)
    i, j = torch.triu_indices(len(g), len(g), 1, device=g.device)
    along = g @ w  # (combined gradient) . (task k's)
    combined_norm = (w @ along).clamp_min(0).sqrt()
    with_combined = along / (norms * combined_norm).clamp_min(_TINY)
    return torch.cat([norms, cos[i, j], with_combined]).float()


def figure_names(names: Sequence[str]) -> list[str]:
    """The names of :func:`gradient_figures`'s values, for metrics.jsonl."""
    n = len(names)
    pairs = [f"grad_cos.{names[i]}~{names[j]}" for i in range(n) for j in range(i + 1, n)]
    return [f"grad_norm.{x}" for x in names] + pairs + [f"grad_cos.combined~{x}" for x in names]
