"""The neighbours' labels (issue 49): label spreading over the backbone's sentence embeddings, a labeller for
self-training that reads the unlabelled text's own structure.

The labelled rows (the training rows and the selection dev rows) and the unlabelled rows are one graph: each row
linked to its ``NEIGHBOURS`` nearest by cosine (weights the cosine cubed, the graph made symmetric and normalised),
and the labelled rows' classes spread along it (Zhou et al. 2004, "Learning with local and global consistency":
``F <- ALPHA * S F + (1 - ALPHA) * Y``, ``STEPS`` times), each class's mass then made equal (the classes of the
K-per-class protocol are). A row's probabilities are its share of each class, calibrated by one temperature.

Whether they are worth anything depends on whether the backbone's neighbours share the task's classes: on the topic
task abc at K=16, from all-MiniLM-L6-v2's embeddings of 8,000 unlabelled rows, the spreading labels the dev
sentences 89.5 ± 1.1% right against 80.3 ± 1.3 for a linear classifier on the same 32 rows' embeddings; on SST-2,
whose neighbours are topical, 59.2 ± 4.2 against 65.1 ± 5.6 (bench/RESULTS.md, 2026-11-30). So the labelled rows
decide, held out: in ``FOLDS`` folds each fold's labels are spread from the others', and a logistic regression
on the same vectors fitted on the others answers them too. The neighbours join the labellers unless their
held-out answers, calibrated, trail that linear classifier's in log-loss (a proper score: on 64 rows accuracy moves
in steps of 1.6 points) by more than ``MARGIN`` of the standard error of the rows' differences: a tie joins, since
the neighbours carry what the unlabelled rows hold and the held-out rows cannot show. The temperature is fitted on
those answers. Otherwise (and for a task that pairs two texts: a pair's neighbours are not its class's) they are
left out, and the run says why. The margin was set on 10 splits (abc: level on one, -0.05 standard errors, ahead
by 1.3-2.2 on four; SST-2: -0.79 to -2.2 on four, +0.58 on one); on abc the student with them scored 90.0 on that
level split against 75.2 without.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cramkit.loading import LoadedModel
from cramkit.recipes.finetune_config import FinetuneConfig
from cramkit.tasks.registry import Task

NEIGHBOURS = 30  # links per row
ALPHA = 0.99  # how far the labels travel: the share of each step taken from the neighbours
STEPS = 30
MARGIN = 0.5  # standard errors the neighbours may trail the linear classifier by, held out, and still join
FOLDS = 4  # the labelled rows' folds: the neighbours are weighed on each fold spread from the others
BLOCK = 2048  # rows whose similarities are computed at once (a block of [BLOCK, n] float32)


def graph(vectors: np.ndarray, k: int = NEIGHBOURS) -> Any:
    """The normalised ``k``-nearest-neighbour graph of unit-length ``vectors`` [n, d] (a sparse torch tensor
    D^-1/2 W D^-1/2, W the cosines cubed of each row's ``k`` nearest, made symmetric), built once for every
    :func:`spread` over the same rows."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(vectors, np.float32))
    n = len(x)
    k = max(1, min(k, n - 1))
    rows, cols, vals = [], [], []
    for i in range(0, n, BLOCK):
        sim = x[i : i + BLOCK] @ x.T
        sim[torch.arange(len(sim)), torch.arange(i, i + len(sim))] = -2.0  # no row is its own neighbour
        top, idx = sim.topk(k, dim=1)
        rows.append(torch.arange(i, i + len(sim)).repeat_interleave(k))
        cols.append(idx.reshape(-1))
        vals.append(top.clamp(min=0).pow(3).reshape(-1))
    r, c, v = torch.cat(rows), torch.cat(cols), torch.cat(vals)
    links = torch.sparse_coo_tensor(
        torch.stack([torch.cat([r, c]), torch.cat([c, r])]), torch.cat([v, v]), (n, n), check_invariants=True
    ).coalesce()
    degree = torch.zeros(n).index_add_(0, links.indices()[0], links.values()).clamp(min=1e-12)
    scale = degree.rsqrt()
    i0, i1 = links.indices()
    return torch.sparse_coo_tensor(
        links.indices(), links.values() * scale[i0] * scale[i1], (n, n), check_invariants=True
    ).coalesce()


def spread(norm: Any, seeds: np.ndarray, classes: int) -> np.ndarray:
    """Label spreading over ``norm`` (:func:`graph`) from the labelled rows: ``seeds`` [n] holds each row's class,
    or -1 for an unlabelled row. Returns each row's share of each class [n, classes] (rows sum to 1; a row the
    labels never reach gets equal shares), every class's total mass made equal first."""
    import torch

    start = torch.zeros(len(seeds), classes)
    labelled = torch.from_numpy(np.flatnonzero(seeds >= 0))
    start[labelled, torch.from_numpy(seeds[seeds >= 0].astype(np.int64))] = 1.0
    f = start.clone()
    for _ in range(STEPS):
        f = ALPHA * torch.sparse.mm(norm, f) + (1 - ALPHA) * start
    f = f / f.sum(0, keepdim=True).clamp(min=1e-12)  # each class's mass equal
    total = f.sum(1, keepdim=True)
    out = torch.where(total > 0, f / total.clamp(min=1e-30), torch.full_like(f, 1.0 / classes))
    return out.numpy().astype(np.float32)


def neighbour_probs(
    loaded: LoadedModel,
    task: Task,
    rows: list[tuple[str, str | None]],
    cfg: FinetuneConfig,
    root: Path,
    pair: bool,
    progress: bool = True,
) -> tuple[np.ndarray | None, dict[str, Any]]:
    """The neighbours' calibrated probabilities over ``rows`` (None where they are left out, with why) and what
    they were: their and the linear classifier's held-out accuracy on the labelled rows, the temperature."""
    from cramkit.recipes.calibrate import softmax
    from cramkit.recipes.label_prior import CALIBRATION_ROWS
    from cramkit.recipes.setfit import logistic_regression
    from cramkit.selftraining.prior import backbone_engine, embed_rows

    if not cfg.self_train_neighbours:
        return None, {"used": False, "why": "self_train_neighbours false"}
    if pair:
        return None, {
            "used": False,
            "why": f"task {task.name} pairs two texts; a pair's neighbours are not its class's",
        }
    engine, why = backbone_engine(loaded, cfg)
    if engine is None:
        return None, {"used": False, "why": why}
    splits = [task.train_split, *(s for s in task.selection_splits[:1] if s not in task.scored_splits)]
    labelled = [e for s in splits for e in task.examples(s)][:CALIBRATION_ROWS]
    y = np.asarray([int(e.label) for e in labelled])  # type: ignore[arg-type]
    classes = len(task.labels) if task.labels else int(y.max()) + 1
    own = np.asarray(engine.embed([e.text_a for e in labelled], normalize=True), np.float32)
    links = graph(np.concatenate([own, embed_rows(engine, [a for a, _ in rows], root, "a", progress)]))
    fold = folds(y)
    held = np.zeros((len(y), classes))  # each labelled row's log-shares, spread from the other folds' labels
    linear = np.zeros((len(y), classes))  # and the linear classifier's logits, fitted on the other folds
    for f in range(FOLDS):
        seeds = np.concatenate([np.where(fold == f, -1, y), np.full(len(rows), -1)])
        held[fold == f] = np.log(np.clip(spread(links, seeds, classes)[: len(y)][fold == f], 1e-6, None))
        linear[fold == f] = own[fold == f] @ logistic_regression(own[fold != f], y[fold != f], classes).T
    temperature, theirs = calibrated_losses(held, y)
    ours = calibrated_losses(linear, y)[1]
    lead = ours - theirs  # per labelled row: how much lower the neighbours' loss is
    se = float(lead.std(ddof=1) / np.sqrt(len(lead))) if len(lead) > 1 else float("inf")
    info: dict[str, Any] = {
        "links": NEIGHBOURS,
        "alpha": ALPHA,
        "labelled_rows": len(y),
        "held_out_accuracy": round(float((held.argmax(1) == y).mean()), 4),
        "held_out_loss": round(float(theirs.mean()), 4),
        "linear_accuracy": round(float((linear.argmax(1) == y).mean()), 4),
        "linear_loss": round(float(ours.mean()), 4),
        "lead": round(float(lead.mean()), 4),
        "lead_se": round(se, 4),
        "temperature": round(temperature, 6),
    }
    if lead.mean() < -MARGIN * se:
        why = (
            f"held out, their calibrated log-loss on the {len(y)} labelled rows ({theirs.mean():.3f}) is above a "
            f"linear classifier's on the same vectors ({ours.mean():.3f}) by more than {MARGIN} of its standard "
            f"error ({se:.3f}): the backbone's neighbours do not share the task's classes"
        )
        return None, {**info, "used": False, "why": why}
    shares = spread(links, np.concatenate([y, np.full(len(rows), -1)]), classes)[len(y) :]
    return softmax(np.log(np.clip(shares, 1e-6, None)), temperature).astype(np.float32), {**info, "used": True}


def calibrated_losses(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """The temperature fitted on ``logits`` and ``labels``, and each row's negative log-likelihood at it."""
    from cramkit.recipes.calibrate import fit_temperature, softmax

    temperature = fit_temperature(logits, labels)
    probs = softmax(logits, temperature)
    return temperature, -np.log(probs[np.arange(len(labels)), labels].clip(1e-12))


def folds(labels: np.ndarray, k: int = FOLDS) -> np.ndarray:
    """Each row's fold of ``k``, the classes dealt out evenly (a class's i-th row in fold i mod k)."""
    out = np.zeros(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        where = np.flatnonzero(labels == c)
        out[where] = np.arange(len(where)) % k
    return out
