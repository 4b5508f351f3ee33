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
The functions here take the tasks' gradients as rows of one (tasks x parameters) matrix and never read
a value on the host (no device sync).
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


def _project_out(g: torch.Tensor, other: torch.Tensor, other_sq: torch.Tensor) -> torch.Tensor:
    """``g`` without its component along ``other`` when the two conflict (g . other < 0); unchanged otherwise."""
    dot = torch.dot(g, other)
    return g - (dot.clamp(max=0.0) / other_sq.clamp_min(_TINY)) * other


def combine(
    grads: torch.Tensor,
    weighting: str,
    primary: int | None = None,
    order: list[list[int]] | None = None,
) -> torch.Tensor:
    """The shared parameters' combined gradient from ``grads`` (one row per task, flattened).

    ``sum``: the rows' sum; ``gradnorm``: each row rescaled to the mean row norm, then summed; ``pcgrad``: each
    row projected (in ``order[i]``, default 0, 1, ...) off every other row it conflicts with, then summed.
    ``primary``: after the weighting's scaling, every other row loses its component opposing that row."""
    n = grads.shape[0]
    rows = grads
    if weighting == "gradnorm":
        norms = rows.norm(dim=1)
        rows = rows * (norms.mean() / norms.clamp_min(_TINY)).unsqueeze(1)
    elif weighting == "pcgrad":
        sq = (grads * grads).sum(dim=1)
        out = []
        for i in range(n):
            g = grads[i]
            for j in order[i] if order is not None else [j for j in range(n) if j != i]:
                g = _project_out(g, grads[j], sq[j])  # against the other task's original gradient (Yu et al.)
            out.append(g)
        rows = torch.stack(out)
    elif weighting != "sum":
        raise CramkitError(f"--weighting {weighting}: unknown; choose one of {', '.join(WEIGHTINGS)}")
    if primary is not None:
        p = rows[primary]
        p_sq = torch.dot(p, p)
        rows = torch.stack([rows[i] if i == primary else _project_out(rows[i], p, p_sq) for i in range(n)])
    return rows.sum(dim=0)


def gradient_figures(grads: torch.Tensor, combined: torch.Tensor) -> torch.Tensor:
    """The figures logged for one step, as one device vector: each task's gradient norm on the shared
    parameters, the cosine of every pair of tasks (i < j, in order), and the cosine of the combined gradient
    with each task's. :func:`figure_names` names them."""
    norms = grads.norm(dim=1)
    unit = grads / norms.clamp_min(_TINY).unsqueeze(1)
    cos = unit @ unit.T
    i, j = torch.triu_indices(len(grads), len(grads), 1, device=grads.device)
    with_combined = unit @ (combined / combined.norm().clamp_min(_TINY))
    return torch.cat([norms, cos[i, j], with_combined])


def figure_names(names: Sequence[str]) -> list[str]:
    """The names of :func:`gradient_figures`'s values, for metrics.jsonl."""
    n = len(names)
    pairs = [f"grad_cos.{names[i]}~{names[j]}" for i in range(n) for j in range(i + 1, n)]
    return [f"grad_norm.{x}" for x in names] + pairs + [f"grad_cos.combined~{x}" for x in names]
