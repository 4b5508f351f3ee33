"""Fine-tuning for the engine (train/trainer.py): :class:`ClassifierObjective`, the objective of every method's
classifier (a head, a prompt, deep prompts): its length-bucketed batches, its loss, the dev split scored at each
evaluation and, with ``keep=best``, the model of the best dev score kept (in memory, or beside the run's
checkpoints for a resume). SetFit's body subclasses it (``recipes/setfit.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cramkit.data.batching import BatchLoader, Encoded, EncodedChoices
from cramkit.io import json_loads, json_text
from cramkit.loading import LoadedModel
from cramkit.recipes.finetune_config import FinetuneConfig
from cramkit.recipes.finetune_model import build_model, predict
from cramkit.tasks.registry import Task
from cramkit.train.objectives import ExampleObjective

if TYPE_CHECKING:
    from cramkit.data.prompts import PromptSpec

BEST_FILE, BEST_WEIGHTS = "best.json", "best.safetensors"


def rank(score: float, loss: float) -> tuple[float, float]:
    """How ``keep=best`` orders dev evaluations: the higher score, and of equal scores the lower dev loss (a
    proper score that still separates checkpoints which a few dev rows score alike: 32 rows score in steps of 3
    points). On abc K=16 a self-trained student kept at the first of four equal scores (step 200 of 1,006) scored
    84.6 on the 500 dev sentences; bench/RESULTS.md, "which checkpoint a self-trained student keeps"."""
    return score, -loss


class ClassifierObjective(ExampleObjective):
    """Fine-tuning for the engine (train/trainer.py): a SequenceClassifier on length-bucketed batches.

    Every global batch of ``batch_size`` examples is split evenly over the processes, then into the same
    number of micro-batches on each; the loss is the mean over the batch's examples. The batch order is a
    function of (seed, epoch), so a resumed run continues with the very batches it would have seen."""

    cfg: FinetuneConfig  # (the hyperparameters the engine reports)

    def __init__(
        self,
        loaded: LoadedModel,
        train: Encoded | EncodedChoices,
        num_labels: int,
        cfg: FinetuneConfig,
        seed: int,
        title: str,
        resume_hint: str,
        multilabel: bool = False,
        multiple_choice: bool = False,
        prompt: PromptSpec | None = None,
    ) -> None:
        self.loaded, self.train, self.num_labels, self.cfg, self.seed = loaded, train, num_labels, cfg, seed
        self.prompt = prompt
        self.multilabel, self.multiple_choice = multilabel, multiple_choice
        self.title, self.resume_hint = title, resume_hint
        self.flops_per_token = None
        self.dev: tuple[Task, str, Encoded | EncodedChoices] | None = None  # scored at each evaluation
        self.best_dir: Path | None = None  # where the best model so far is kept (keep=best), for a resume
        # (dev score, dev loss, weights when kept in memory): the best is the highest score, and of equal scores
        # the lowest loss (32 dev rows score in steps of 3 points: ties are the rule, not the exception)
        self.best: tuple[float, float, dict | None] | None = None
        self.head_weight: np.ndarray | None = None  # the head's starting rows (recipes/label_prior.py), if any
        self.plot = {"title": title, "loss_name": "training loss (cross-entropy)", "x": "step"}
        if num_labels == 1 and not multiple_choice:
            self.plot["loss_name"] = "training loss (MSE)"

    def build_model(self):
        model = build_model(
            self.loaded,
            self.num_labels,
            self.cfg,
            multilabel=self.multilabel,
            multiple_choice=self.multiple_choice,
            prompt=self.prompt,
        )
        if self.head_weight is not None:  # the head starts where the classes' descriptions point
            import torch

            with torch.no_grad():
                model.classifier.weight.copy_(torch.from_numpy(self.head_weight))
                model.classifier.bias.zero_()
        return model

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1) -> BatchLoader:
        import torch

        return self.batches(self.train, {"labels": torch.from_numpy(self.train.labels)}, micro, rank, world)

    def batches(
        self, enc: Encoded | EncodedChoices, columns: dict[str, Any], micro: int, rank: int, world: int
    ) -> BatchLoader:
        """Length-bucketed batches of ``enc`` by (seed, epoch), with ``columns`` (labels, targets) per example."""
        return BatchLoader(
            enc,
            self.cfg.batch_size,
            micro,
            rank,
            world,
            seed=self.seed,
            chunk=self.cfg.bucket_chunk,
            pad_id=self.loaded.pad_id,
            with_types=self.loaded.with_types,
            columns=columns,
        )

    def loss(self, model, batch: dict, device):
        inputs = {
            k: (v.to(device, non_blocking=True) if v is not None else None)
            for k, v in batch.items()
            if k not in ("count", "labels")
        }
        loss, _ = model(**inputs, labels=batch["labels"].to(device, non_blocking=True))
        return loss

    def evaluate(self, model, ctx, precision: str) -> dict[str, float] | None:
        """The dev split's loss and metrics (logged in metrics.jsonl and plotted); with keep=best, the model
        is kept when its dev score is the best so far."""
        if self.dev is None:
            return None
        import torch

        task, split, enc = self.dev
        plain = getattr(model, "module", model)  # DDP's module
        logits = predict(
            plain, enc, self.cfg, next(plain.parameters()).device, self.loaded.pad_id, self.loaded.with_types
        )
        preds = logits[:, 0] if task.is_regression else logits
        metrics = task.compute_metrics(preds, enc.labels, task.examples(split))
        score = task.score(metrics)
        out = torch.from_numpy(logits)
        labels = torch.from_numpy(np.asarray(enc.labels))
        if task.is_regression:
            loss = float(torch.nn.functional.mse_loss(out[:, 0], labels.float()))
        else:  # multiple choice: -inf at missing choices is 0 after the softmax
            loss = float(torch.nn.functional.cross_entropy(out, labels.long()))
        if self.cfg.keep == "best" and (self.best is None or rank(score, loss) > rank(*self.best[:2])):
            self._keep_best(plain, score, loss)
        return {"val_loss": loss, "dev_score": score, **{f"dev_{k}": v for k, v in metrics.items()}}

    def _keep_best(self, model, score: float, loss: float) -> None:
        state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        if self.best_dir is None:
            self.best = (score, loss, state)
            return
        from safetensors.torch import save_file

        from cramkit.io import atomic_path, write_json_atomic
        from cramkit.model.loaded import unique_tensors as _unique_tensors

        with atomic_path(self.best_dir / BEST_WEIGHTS) as tmp:
            save_file({k: v.contiguous() for k, v in _unique_tensors(state).items()}, str(tmp))
        write_json_atomic(self.best_dir / BEST_FILE, {"score": score, "loss": loss})
        self.best = (score, loss, None)

    def best_state(self) -> dict | None:
        """The weights with the best dev score (None: nothing kept)."""
        if self.best is not None and self.best[2] is not None:
            return self.best[2]
        if self.best_dir is not None and (self.best_dir / BEST_FILE).is_file():
            from cramkit.model.hf import read_weights

            return read_weights(self.best_dir / BEST_WEIGHTS)
        return None

    def resume_best(self) -> None:
        """A resumed run knows the best dev score its earlier part kept."""
        if self.best_dir is None or not (self.best_dir / BEST_FILE).is_file():
            return
        try:
            kept = json_loads(json_text(self.best_dir / BEST_FILE))
            self.best = (float(kept["score"]), float(kept.get("loss", float("inf"))), None)
        except (OSError, ValueError, KeyError, TypeError):
            self.best = None  # damaged: the next evaluation keeps its model


class SoftTargetObjective(ClassifierObjective):
    """The student for the engine: fine-tuning's objective (its batches, dev evaluations, ``keep=best``) with
    soft targets ``targets`` [rows, classes] for every row (a labelled row's one-hot, a pseudo-labelled row's
    calibrated probabilities) and the KL divergence to them (distillation's soft loss at temperature 1)."""

    targets: np.ndarray

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1):
        import torch

        columns = {"labels": torch.from_numpy(self.train.labels), "targets": torch.from_numpy(self.targets)}
        return self.batches(self.train, columns, micro, rank, world)

    def loss(self, model, batch: dict, device):
        import torch.nn.functional as F

        inputs = {
            k: (v.to(device, non_blocking=True) if v is not None else None)
            for k, v in batch.items()
            if k not in ("count", "labels", "targets")
        }
        _, logits = model(**inputs)
        targets = batch["targets"].to(device, non_blocking=True)
        return F.kl_div(F.log_softmax(logits.float(), -1), targets, reduction="batchmean")
