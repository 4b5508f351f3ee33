"""Training a student through the engine (``cramkit.train.epochs.train_epochs``), as fine-tuning does.

:class:`DistillObjective` is the recipe: the student (for hidden-state matching, wrapped with the learned
projection onto the teacher's width, so both are trained, checkpointed and resumed), length-bucketed
batches of the transfer set (``data.batching.BatchLoader``: seeded by (seed, epoch), resumable) and
the loss of Tang et al.: MSE on the logits (or KL / BCE with a temperature), ``alpha`` times the hard
labels of the original rows, ``hidden_weight`` times the MSE of the projected last hidden states against
the frozen teacher's. Everything else (device, precision, threads, schedule, optimizer, checkpoints and
resume, progress, metrics.jsonl, loss.png) is the engine's.

:func:`train_student` trains one student into a run directory: a run killed midway resumes from its
latest checkpoint; a finished one (``result.json`` beside its final checkpoint) is not trained again.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cramkit.data.batching import BatchLoader, Encoded
from cramkit.errors import CramkitError
from cramkit.loading import LoadedModel
from cramkit.model.heads import classification_loss
from cramkit.train.objectives import ExampleObjective

if TYPE_CHECKING:
    from cramkit.model.encoder import Encoder

RESULT_FILE = "result.json"


class HiddenMatch(nn.Module):
    """The encoder student and a projection of its last hidden states onto the teacher's width; returns
    (logits, projected hidden states)."""

    def __init__(self, student: nn.Module, proj: nn.Linear) -> None:
        super().__init__()
        self.student, self.proj = student, proj

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        s: Any = self.student  # a SequenceClassifier: its encoder, pooling and head
        hidden = s.encoder(input_ids, attention_mask, token_type_ids)
        logits = s.classifier(s.dropout(s.pool(hidden, attention_mask)))
        return logits, self.proj(hidden.float())


class DistillObjective(ExampleObjective):
    """A student for the engine (train/trainer.py), against the teacher's logits ``targets`` mixed by
    ``cfg.alpha`` with ``labels`` where ``labelled``; with targets None, on the labels alone. The loss
    is the mean over the batch's examples (as the loop before the engine computed it)."""

    def __init__(
        self,
        student: LoadedModel,
        enc: Encoded,
        targets: np.ndarray | None,
        labels: np.ndarray,
        labelled: np.ndarray,
        cfg: Any,
        *,
        teacher: LoadedModel | None = None,
        title: str = "student",
        resume_hint: str = "rerun the same command",
    ) -> None:
        self.student, self.enc, self.cfg = student, enc, cfg
        self.title, self.resume_hint = title, resume_hint
        self.flops_per_token = None
        self.columns = {
            "labels": torch.from_numpy(labels),
            "labelled": torch.from_numpy(labelled.astype(bool)),
        }
        if targets is not None:
            self.columns["targets"] = torch.from_numpy(np.array(targets, dtype=np.float32))
        # the frozen teacher, for hidden-state matching only; moved to the training device on first use
        self.teacher = teacher if targets is not None and cfg.hidden_weight > 0 else None
        self._teacher_device: torch.device | None = None

    def build_model(self) -> nn.Module:
        if self.teacher is None:
            return self.student.model
        # hidden matching: an encoder student (core.py refuses a BiLSTM) and a transformer teacher
        student_enc, teacher_enc = cast("Encoder", self.student.encoder), cast("Encoder", self.teacher.encoder)
        proj = nn.Linear(student_enc.cfg.hidden, teacher_enc.cfg.hidden)
        return HiddenMatch(self.student.model, proj)

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1):
        return student_loader(self, micro, rank, world)

    def loss(self, model: nn.Module, batch: dict, device: torch.device) -> torch.Tensor:
        cfg = self.cfg
        x = {
            k: (batch[k].to(device) if batch[k] is not None else None)
            for k in ("input_ids", "attention_mask", "token_type_ids")
        }
        if self.teacher is not None:
            logits, hidden = model(**x)
        else:
            _, logits = model(**x)
        logits = logits.float()
        loss = logits.new_zeros(())
        targets = batch.get("targets")
        if targets is not None:
            loss = loss + (1.0 - cfg.alpha) * self._soft(logits, targets.to(device))
        rows = batch["labelled"].to(device)
        if (targets is None or cfg.alpha > 0) and bool(rows.any()):  # hard labels: original rows only
            weight = 1.0 if targets is None else cfg.alpha
            s = self.student
            y = batch["labels"].to(device)[rows]
            loss = loss + weight * classification_loss(logits[rows], y, s.num_labels or 1, s.kind == "multilabel")
        if self.teacher is not None:
            loss = loss + cfg.hidden_weight * self._hidden_loss(hidden, x, device)
        return loss

    def _soft(self, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        kind, temp = self.student.kind, self.cfg.temperature
        if self.cfg.loss == "mse" or kind == "regression":
            return F.mse_loss(s, t)
        if kind == "multilabel":
            return F.binary_cross_entropy_with_logits(s / temp, (t / temp).sigmoid()) * temp * temp
        return (
            F.kl_div(
                F.log_softmax(s / temp, -1),
                F.log_softmax(t / temp, -1),
                log_target=True,
                reduction="batchmean",
            )
            * temp
            * temp
        )

    def _hidden_loss(self, hidden: torch.Tensor, x: dict, device: torch.device) -> torch.Tensor:
        """MSE of the projected student states against the teacher's, over the real (unpadded) tokens."""
        teacher = self.teacher
        assert teacher is not None  # called only with a teacher (hidden_weight > 0)
        if self._teacher_device != device:
            teacher.model.to(device).eval()
            self._teacher_device = device
        mask = x["attention_mask"]
        with torch.no_grad():
            th = cast("Encoder", teacher.encoder)(x["input_ids"], mask, x["token_type_ids"]).float()
        diff = (hidden.float() - th).pow(2).mean(-1)
        return diff.mean() if mask is None else (diff * mask).sum() / mask.sum()

    def evaluate(self, model: nn.Module, ctx: Any, precision: str) -> None:
        return None  # teacher, student and baseline are scored by distill() on the finished models


def train_config(cfg: Any, steps: int, threads: int, progress: bool | str = False):
    """The engine's TrainConfig for ``steps`` optimizer steps of one student: AdamW (0.9, 0.98, eps 1e-6,
    weight decay on matrices only), ``cfg.schedule`` with its own warmup, no gradient clipping (as
    fine-tuning), one batch per step, checkpoints every ``cfg.checkpoint_every``."""
    from cramkit.train.budget import Budget
    from cramkit.train.config import example_config

    return example_config(
        budget=Budget.of_steps(steps).text,
        lr=cfg.lr,
        eps=1e-6,
        weight_decay=cfg.weight_decay,
        schedule=cfg.schedule,
        batch_size=cfg.batch_size,
        precision=cfg.precision,
        device=cfg.device,
        seed=cfg.seed,
        checkpoint_every=cfg.checkpoint_every,
        log_every=max(1, steps // 200),
        progress=progress,
        threads=threads,
        report_to=getattr(cfg, "report_to", "none"),
    )


def train_student(
    student: LoadedModel,
    enc: Encoded,
    targets: np.ndarray | None,
    labels: np.ndarray,
    labelled: np.ndarray,
    cfg: Any,
    epochs: float,
    run: Path,
    *,
    teacher: LoadedModel | None = None,
    progress: bool = True,
    desc: str = "student",
    ctx: Any = None,
) -> dict[str, Any]:
    """Train ``student.model`` in place for ``epochs`` over ``enc`` through the engine into run directory
    ``run``; returns what the training did (steps, seconds, examples/s, first and last loss). A run with
    a checkpoint resumes from it; a finished one (its ``result.json``) is loaded, not trained again."""
    from cramkit.loading import load_weights
    from cramkit.train import checkpoint as ckpt
    from cramkit.train.epochs import train_epochs

    run = Path(run)
    objective = DistillObjective(
        student,
        enc,
        targets,
        labels,
        labelled,
        cfg,
        teacher=teacher,
        title=desc,
        resume_hint="rerun the same cramkit distill command to continue",
    )
    steps = max(1, math.ceil(epochs * len(enc) / cfg.batch_size))
    # the BiLSTM's steps are too small to split over threads: 1 unless asked (an encoder: PyTorch's default)
    threads = cfg.threads or (1 if student.architecture == "bilstm" else 0)
    tcfg = train_config(cfg, steps, threads, "auto" if progress else False)
    stats = _finished(run)
    before = torch.get_num_threads()
    try:
        if stats is None:
            if ckpt.find_latest(run) is None:  # what an attempt stopped before its first checkpoint left
                (run / RESULT_FILE).unlink(missing_ok=True)
            # trains ``objective.build_model()``: the student itself (with its projection, if any)
            done = train_epochs(objective, tcfg, run, examples=len(enc), batch_size=cfg.batch_size, ctx=ctx)
            stats = _stats(done.losses, done.steps, done.seconds, epochs, len(enc), done.examples_seen)
            if ctx is None or ctx.is_main:
                from cramkit.io import write_json_atomic

                write_json_atomic(run / RESULT_FILE, stats)
        else:
            print(f"cramkit: {desc}: trained earlier in {run}; reusing it", file=sys.stderr)
            final = ckpt.find_latest(run)
            if final is None:
                raise CramkitError(f"{run}: {RESULT_FILE} says it was trained, but it holds no checkpoint; delete it")
            load_weights(objective.build_model(), ckpt.model_weights(final), f"checkpoint {final}")
    finally:
        torch.set_num_threads(before)
        if teacher is not None:
            teacher.model.to("cpu")
    student.model.eval().to("cpu")
    return stats


def _finished(run: Path) -> dict[str, Any] | None:
    """The stats of a finished training in ``run`` whose final checkpoint is still there, else None."""
    from cramkit.rundir import find_latest, finished_result

    if find_latest(run) is None:
        return None
    return finished_result(run / RESULT_FILE)  # damaged: the training resumes from its final checkpoint


def _stats(losses: list[float], steps: int, seconds: float, epochs: float, n: int, seen: int) -> dict[str, Any]:
    return {
        "steps": steps,
        "epochs": epochs,
        "examples": n,
        "examples_seen": seen,
        "seconds": round(seconds, 2),
        "examples_per_s": round(seen / max(seconds, 1e-9), 1),
        "first_loss": losses[0] if losses else None,
        "last_loss": float(np.mean(losses[-max(1, len(losses) // 10) :])) if losses else None,
    }


def student_loader(objective: Any, micro: int, rank: int, world: int) -> BatchLoader:
    """A distillation's batches: the student's encoded rows (``objective.enc``) with their targets
    (``objective.columns``), length-bucketed, in the student's padding; one for the classifier students and the
    embedding student alike."""
    s = objective.student
    return BatchLoader(
        objective.enc,
        objective.cfg.batch_size,
        micro,
        rank,
        world,
        seed=objective.cfg.seed,
        chunk=50,
        pad_id=s.pad_id,
        with_types=s.with_types,
        columns=objective.columns,
    )
