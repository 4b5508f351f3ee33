"""``cramkit distill``'s settings (``--set key=value``): the transfer set, the students, their training."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from cramkit.errors import CramkitError
from cramkit.train.config import ExampleSettings


@dataclass
class DistillConfig(ExampleSettings):
    """Every setting of ``cramkit distill`` (``--set key=value``); 0 means "the student's default"."""

    # transfer set (Tang et al.)
    augment: bool = True
    p_mask: float = 0.1
    p_pos: float = 0.1
    p_ng: float = 0.25
    n_iter: int = 0  # 0: 20 for single sentences, 10 for pairs
    max_ngram: int = 5
    workers: int = 0  # augmentation processes (0: every core)
    max_unlabelled: int = 0  # --unlabelled: at most N texts (0: every line of a file, 100,000 sentences of a store)
    # losses
    loss: Literal["mse", "kl"] = "mse"
    temperature: float = 1.0
    alpha: float = 0.0  # weight of the hard-label loss (on the original examples only)
    hidden_weight: float = 0.0  # encoder student: weight of last-hidden-state matching
    # training
    epochs: float = 0.0  # bilstm 3, encoder 0.5 (of a transfer set ~13-20x the training set)
    lr: float = 0.0  # bilstm 1e-3, encoder 2e-4
    batch_size: int = 0  # bilstm 64, encoder 128
    schedule: Literal["linear", "one-cycle", "constant", "budget-triangle"] = "linear"
    baseline: bool = True  # also train the student on the labels only
    baseline_epochs: float = 0.0  # 0: bilstm 3x the distillation epochs (the labelled set is ~20x smaller), encoder 2
    seed: int = 0
    threads: int = 0  # torch threads while training (0: 1 for the BiLSTM, whose steps are too small to split)
    speed_seconds: float = 2.0
    speed_examples: int = 0  # examples/s: time on the first N dev inputs (0: all), at least speed_seconds
    # bilstm student
    embedding_dim: int = 0  # 0: 128 when init_embeddings (the teacher's, by PCA), else 300
    lstm_hidden: int = 150
    fc_hidden: int = 200
    init_embeddings: bool = True  # start the embedding from the teacher's token embeddings
    # encoder student
    layers: int = 0  # 0: a third of the teacher's (at least 1); from a pretrained model (init=MODEL), all of its
    hidden: int = 0  # 0: the teacher's (or the init run's)
    layer_map: list[int] = field(default_factory=list)  # teacher layers to copy (default evenly spaced)
    init: str = "teacher"  # teacher | random | a pretrained run / model directory / hf:DIR
    # embedding student (--student layers:N): leading dimensions also trained (default: the teacher's own), and
    # the texts held out to score its agreement with the teacher (0: 5% of them, 20 to 1,000)
    matryoshka: str = ""
    held_out: int = 0
    # and "cpu" / "cpu-serve": the student exported to its fastest path here (cramkit export --target, the race)
    # beside OUT as OUT-cpu, timed against its teacher exported in the same format ("" : not exported)
    export: Literal["", "cpu", "cpu-serve"] = ""

    def validate(self) -> None:
        if self.temperature <= 0:
            raise CramkitError(f"temperature must be positive, got {self.temperature}")
        if not 0.0 <= self.alpha <= 1.0:
            raise CramkitError(f"alpha is a weight in [0, 1], got {self.alpha}")
        for name in ("epochs", "lr", "batch_size", "hidden_weight", "baseline_epochs", "layers", "hidden", "held_out"):
            if getattr(self, name) < 0:
                raise CramkitError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.matryoshka:
            from cramkit.recipes.contrastive_config import matryoshka_dims

            matryoshka_dims(self.matryoshka, None)
        self.check_shared()

    def augment_config(self):
        from cramkit.distillation.augment import AugmentConfig

        return AugmentConfig(self.p_mask, self.p_pos, self.p_ng, self.n_iter, self.max_ngram, self.seed, self.workers)

    def resolved(self, student: str) -> DistillConfig:
        """With the student's defaults filled in."""
        d = asdict(self)
        if student.startswith("layers:"):  # an embedding student (embedding_student.py): bench/RESULTS.md, "An
            # embedding student": 3 epochs at 4e-4 held-out cosine 0.934 to the teacher, 1 at 1e-4 0.883
            d["epochs"] = self.epochs or 3.0
            d["lr"] = self.lr or 4e-4
            d["batch_size"] = self.batch_size or 64
            return DistillConfig(**d)
        bil = student == "bilstm"
        # the defaults measured at full scale on SST-2 (bench/RESULTS.md, "Distillation")
        d["epochs"] = self.epochs or (3.0 if bil else 0.5)
        d["lr"] = self.lr or (1e-3 if bil else 2e-4)
        d["batch_size"] = self.batch_size or (64 if bil else 128)
        d["baseline_epochs"] = self.baseline_epochs or (3 * d["epochs"] if bil else 2.0)
        return DistillConfig(**d)


def config_from(overrides: dict[str, Any] | None = None) -> DistillConfig:
    """A DistillConfig from ``--set`` overrides (unknown keys are errors, with a did-you-mean)."""
    from cramkit.config import from_dict

    return from_dict(DistillConfig, overrides or {}, "distill")
