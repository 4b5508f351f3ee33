"""``finetune --method setfit``: few labels through the contrastive stage (SetFit, Tunstall et al. 2022).

A sentence encoder (all-MiniLM-L6-v2, or any encoder ``cramkit.load`` opens) learns a task from a handful of
labels in two steps, with no prompt and no MLM head:

1. **the body**: pairs drawn from the labelled rows, ``pairs_per_example`` positive pairs (same label) and as many
   negative ones (another label) per row, train the encoder so that the cosine of two pooled vectors is 1 for a
   positive pair and 0 for a negative one (SetFit's CosineSimilarityLoss: the squared error). 16 rows per class
   give 2 x 20 x 32 = 1,280 pairs: many more training signals than the 32 rows themselves;
2. **the head**: a logistic regression on the trained encoder's unit-length pooled vectors of the labelled rows
   (L2, C = 1, scikit-learn's default, fitted to convergence by L-BFGS), written into the classifier of an
   ordinary ``SequenceClassifier`` (:func:`fit_head`).

The body trains through the one engine (:class:`SetFitObjective`: its checkpoints, resume, torchrun, metrics)
at ``setfit_lr`` (``recipes.finetune_config.auto_lr``); the head is fitted at every evaluation (so ``eval_every``
and ``keep=best`` see the model as it would be kept) and at the end, before the final checkpoint. The result is a
model directory like ``--method head``'s: ``predict``, ``serve``, ``export`` and ``cramkit.load`` read it as they
read any classifier.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np

from cramkit.data.batching import BatchLoader, Encoded, EncodedChoices
from cramkit.errors import CramkitError
from cramkit.recipes.finetune_model import predict
from cramkit.recipes.finetune_objective import ClassifierObjective

L2_C = 1.0  # the head's inverse regularisation strength (scikit-learn's LogisticRegression default)


def make_pairs(labels: np.ndarray, per_example: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """SetFit's pairs: for each of ``per_example`` rounds and each row, one row of the same label (another row
    when the label has one) and one of another label. Returns the pairs [P, 2] (row indices) and their target
    cosines [P] (1.0 same label, 0.0 not)."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    if len(classes) < 2:
        raise CramkitError(
            f"--method setfit learns from pairs of different labels, but every training row has label {classes[0]!r}"
            if len(classes)
            else "--method setfit: no labelled training rows"
        )
    rng = np.random.default_rng(seed)
    members = {c: np.flatnonzero(labels == c) for c in classes}
    others = {c: np.flatnonzero(labels != c) for c in classes}
    pairs, targets = [], []
    for _ in range(per_example):
        for i, label in enumerate(labels):
            same = members[label]
            if len(same) > 1:
                j = i
                while j == i:
                    j = int(same[rng.integers(len(same))])
            else:
                j = i
            pairs.append((i, j))
            targets.append(1.0)
            pairs.append((i, int(others[label][rng.integers(len(others[label]))])))
            targets.append(0.0)
    return np.asarray(pairs, dtype=np.int64), np.asarray(targets, dtype=np.float32)


def pair_rows(train: Encoded, pairs: np.ndarray, targets: np.ndarray) -> EncodedChoices:
    """The pairs as two-row examples (the batch loader keeps an example's rows together and buckets by length)."""
    flat = pairs.reshape(-1)
    rows = Encoded(
        ids=[train.ids[i] for i in flat],
        b_start=train.b_start[flat],
        lengths=train.lengths[flat],
        labels=None,
        idx=flat,
        truncated=train.truncated[flat],
    )
    return EncodedChoices(
        pairs=rows, offsets=np.arange(0, len(flat) + 1, 2, dtype=np.int64), labels=targets, idx=np.arange(len(pairs))
    )


def steps(pairs_per_example: int, examples: int, batch_size: int) -> int:
    """Optimizer steps of the body: one pass over its pairs (2 x ``pairs_per_example`` per row), ``batch_size``
    pairs a step."""
    return math.ceil(2 * pairs_per_example * examples / batch_size)


def classifier_class() -> Any:
    from cramkit.model.heads import SequenceClassifier

    class PairClassifier(SequenceClassifier):
        """A SequenceClassifier whose forward also gives the pooled vectors (``embed=True``), so that the body's
        loss goes through the (DDP-wrapped) forward; its weights are a SequenceClassifier's."""

        def forward(  # embed by keyword only
            self, input_ids, attention_mask=None, token_type_ids=None, labels=None, *, embed: bool = False
        ):
            if not embed:
                return super().forward(input_ids, attention_mask, token_type_ids, labels)
            pooled = self.pool(self.encoder(input_ids, attention_mask, token_type_ids), attention_mask)
            return pooled, self.classifier(pooled)

    return PairClassifier


def pooled_view(model: Any) -> Any:
    """``model`` (a :func:`classifier_class` model) seen as a "classifier" whose outputs are its pooled vectors,
    the classifier's input ([n, hidden] float32; ``recipes.finetune_model.predict`` runs it in the passes of any
    model)."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner, self.num_labels = inner, inner.cfg.hidden

        def forward(self, ids, mask=None, types=None):
            return None, self.inner(ids, mask, types, embed=True)[0].float()

    return Pooled(model)


def logistic_regression(vectors: np.ndarray, labels: np.ndarray, classes: int) -> np.ndarray:
    """The weights [classes, width] of a multinomial logistic regression (L2, C = ``L2_C``, no intercept) on the
    ``vectors`` made unit-length and their ``labels``: mean cross-entropy + |W|^2 / (2 C n), minimised by L-BFGS in
    float64 (SetFit's head; the neighbours' labels' yardstick, ``distill/neighbours.py``)."""
    import torch
    import torch.nn.functional as F

    raw = torch.from_numpy(np.asarray(vectors)).double()
    x = raw / raw.norm(dim=1, keepdim=True).clamp_min(1e-12)
    y = torch.from_numpy(np.asarray(labels)).long()
    weight = torch.zeros(classes, x.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [weight], lr=1.0, max_iter=500, tolerance_grad=1e-7, tolerance_change=1e-10, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(x @ weight.T, y) + (weight**2).sum() / (2 * L2_C * len(y))
        loss.backward()
        return loss

    opt.step(closure)
    return weight.detach().numpy()


def fit_head(model: Any, vectors: np.ndarray, labels: np.ndarray) -> None:
    """Fit ``model.classifier`` as :func:`logistic_regression` on the pooled outputs of the labelled rows
    (:func:`pooled_view`) and their ``labels``. The classifier reads the raw pooled vector ``x``, so it gets W / m
    (m: the training vectors' mean length): its logits are the regression's times |x| / m, which keeps every
    prediction (a positive scale) and the probabilities' calibration on average. (On unit vectors the regression is
    the stronger one: K=16 SST-2 from all-MiniLM-L6-v2, 5 splits, 66.5% mean accuracy vs 63.6% on raw vectors with
    an intercept.)"""
    import torch

    weight = logistic_regression(vectors, labels, model.classifier.out_features)
    length = float(np.linalg.norm(np.asarray(vectors, np.float64), axis=1).clip(1e-12).mean())
    with torch.no_grad():
        model.classifier.weight.copy_(torch.from_numpy(weight / length).to(model.classifier.weight.dtype))
        model.classifier.bias.zero_()


class SetFitObjective(ClassifierObjective):
    """``--method setfit`` for the engine, the body: batches of pairs, the squared error of their cosine; each
    evaluation fits the head first (then scores the dev split as fine-tuning does)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self.train.labels is not None and isinstance(self.train, Encoded)  # checked by the caller
        pairs, targets = make_pairs(self.train.labels, self.cfg.setfit_pairs, self.seed)
        self.pairs = pair_rows(self.train, pairs, targets)
        self.title = f"{self.title} (setfit, {len(pairs):,} pairs)"
        self.plot = {**self.plot, "loss_name": "training loss (squared error of the pairs' cosine)"}

    def build_model(self):
        plain = super().build_model()
        model = classifier_class()(plain.cfg, plain.num_labels, plain.head_cfg)
        model.load_state_dict(plain.state_dict(), strict=True)
        return model

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1) -> BatchLoader:
        import torch

        assert self.pairs.labels is not None  # make_pairs gives every pair its target
        return self.batches(self.pairs, {"targets": torch.from_numpy(self.pairs.labels)}, micro, rank, world)

    def loss(self, model, batch: dict, device):
        import torch.nn.functional as F

        ids = batch["input_ids"].to(device, non_blocking=True)
        mask, types = batch["attention_mask"], batch["token_type_ids"]
        mask = mask.to(device, non_blocking=True) if mask is not None else None
        types = types.to(device, non_blocking=True) if types is not None else None
        pooled, logits = model(ids, mask, types, embed=True)
        cos = F.cosine_similarity(pooled[0::2].float(), pooled[1::2].float(), dim=-1)
        loss = F.mse_loss(cos, batch["targets"].to(device, non_blocking=True))
        return loss + 0.0 * logits.sum()  # the head takes part in every step (DDP expects every parameter's grad)

    def evaluate(self, model, ctx, precision: str) -> dict[str, float] | None:
        plain = getattr(model, "module", model)
        device, loaded = next(plain.parameters()).device, self.loaded
        vectors = predict(pooled_view(plain), self.train, self.cfg, device, loaded.pad_id, loaded.with_types)
        fit_head(plain, vectors, cast(np.ndarray, self.train.labels))
        return super().evaluate(model, ctx, precision)
