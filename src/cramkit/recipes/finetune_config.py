"""Fine-tuning's settings: :class:`FinetuneConfig` (one recipe for every task), the learning rate each method
trains at (:func:`auto_lr`) and the engine's TrainConfig for one run (:func:`train_config`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from cramkit.config import from_dict, to_dict
from cramkit.errors import CramkitError
from cramkit.model.pooling import PoolingSetting
from cramkit.recipes.learning_rate import EMBEDDING_LR, FINETUNE_LR, WIDE_FROM, width_lr
from cramkit.train.config import ExampleSettings

SETTINGS_FILE = "finetune.json"  # a fine-tuning's settings in its output directory (a rerun with others is refused)
AUTO_CANDIDATES = ("head", "setfit", "ptuning", "prompt")  # what method=auto chooses among (recipes/method_auto.py)

METHODS = ("head", "prompt", "ptuning", "setfit", "auto")
DEFAULT_EPOCHS = 5.0  # Cramming's "GLUE-sane" rule: at most 5 epochs
DEFAULT_MIN_STEPS = 500  # the step floor for few labels, when the user sets neither epochs nor min_steps


@dataclass
class FinetuneConfig(ExampleSettings):
    """Fine-tuning hyperparameters; the defaults are one recipe for every task.

    Defaults follow Cramming's GLUE-sane evaluation config: AdamW (lr 4e-5, betas 0.9/0.98, eps 1e-6),
    batch size 16, 5 epochs, linear warmup over the first 10% of steps then cosine decay to 0, no
    gradient clipping, max_length 128, first-token pooling through a dense+tanh pooler, dropout 0.1
    (re-enabled for fine-tuning, as Cramming does). Weight decay 0.01 on matrices only (biases, norms
    and scalars excluded, like Cramming's ``limited_decay_keys`` and the HF Trainer); Cramming's own
    GLUE-sane file sets 0.0, which ``--set weight_decay=0`` reproduces. Two departures, for few labels and small
    models: when neither ``epochs`` nor ``min_steps`` is set, at least 500 optimizer steps (a step count the user
    sets is never overridden: :meth:`steps`), and ``lr="auto"``: 4e-5 from width 384 up, 1e-3 below (a tiny
    model after a short pretraining stays at chance at 4e-5; see :func:`auto_lr`).
    """

    lr: float | Literal["auto"] = "auto"  # auto: by the model's width (auto_lr)
    batch_size: int = 16
    # None: Cramming's "GLUE-sane" rule, 5 epochs (with the step floor below); a number: exactly that many
    epochs: float | None = None
    # at least this many optimizer steps, whatever the data's size: with a few hundred labels, epochs alone
    # give a few dozen steps and a model that has not left chance (LM-BFF trains 1,000 steps on 16 per class).
    # None: 500 when epochs is not set either, else none (the user's epochs win); 0: epochs alone
    min_steps: int | None = None
    warmup: float = 0.1  # fraction of all steps
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    grad_clip: float = 0.0  # 0 = no clipping (Cramming)
    # auto: the model's own pooling when it declares one (a sentence-transformers model's, a classifier's head's;
    # mean without BERT's pooler), else the first token (cls) through the pooler (Cramming); first: cls's older name
    pooling: PoolingSetting = "auto"
    pooler_dense: bool = True
    attention_dropout: float = 0.1
    seeds: list[int] = field(default_factory=lambda: [0])  # several seeds: the median is reported
    # examples per scoring pass at most (each also within the device's token budget)
    eval_batch_size: int = 128
    bucket_chunk: int = 50  # batches per chunk sorted by length (length bucketing); 0 = no bucketing
    max_eval_examples: int = 0  # score only the first N examples of each dev split (0 = all): quicker, rougher
    micro_batch: int = 0  # examples per forward/backward on each process (0: the whole share of a batch)
    compile: bool = False  # torch.compile each block (batches vary in length: recompiles cost)
    eval_every: str = "epoch"  # dev metrics logged during training: 'epoch', a period ('200steps'), 'never'
    keep: Literal["last", "best"] = "last"  # the kept model: the last, or the one with the best dev score
    # how the task meets the encoder: a fresh head on the pooled output; the MLM head scoring label words
    # through a template (PET / LM-BFF); deep prompts on a frozen encoder (P-tuning v2); or the encoder trained
    # on pairs of rows to embed the labels apart, then a logistic-regression head (SetFit); or auto: the one of
    # them that cross-validation on the labelled rows scores best (recipes/method_auto.py)
    method: Literal["head", "prompt", "ptuning", "setfit", "auto"] = "head"
    prompt: str = ""  # method=prompt: the template, e.g. '{text_a} It was [MASK] .' ('': the task's built-in)
    label_words: str = ""  # method=prompt: LABEL=WORD,... ('': the task's built-in)
    # the label words' prior (recipes/label_prior.py): a description of each class (auto: the task's built-in
    # prompt filled with each label word, else its label names where they are words; a pair task: the similarity
    # of its texts), none, similarity, LABEL=TEXT,...
    prior: str = "auto"
    # the labels' names at training time, LABEL=NAME,... or NAME,... in the labels' order (labels 0/1:
    # 0=negative,1=positive): the model saved, predict, serve and the export's id2label answer them ('': the data's)
    label_names: str = ""
    # method=head: auto starts the head from the prior's descriptions where there are some; random as initialised
    head_init: Literal["auto", "random"] = "auto"
    prefix_len: int = 16  # method=ptuning: trainable keys and values per layer
    prefix_lr: float = 2e-2  # method=ptuning: the learning rate of the prefixes and the head
    # method=setfit: positive and negative pairs per labelled row (SetFit's num_iterations); one pass over them,
    # batch_size pairs a step (epochs and min_steps do not apply)
    setfit_pairs: int = 20
    setfit_lr: float | Literal["auto"] = "auto"  # method=setfit: the encoder's rate (auto: 2e-5; 1e-3 below 384)
    # self-training (--unlabelled FILE): the teacher fine-tuned on the labels labels the unlabelled rows; a student
    # learns from the labels and the confident pseudo-labels (distill/selftrain.py)
    self_train_teachers: int = 1  # teachers labelling together (an ensemble of seeds; their mean probabilities)
    self_train_rounds: int = 1  # rounds: the student of one labels again for the next
    # the calibrated probability a pseudo-label needs; auto: the most confident rows of each predicted class
    self_train_threshold: float | Literal["auto"] = "auto"
    self_train_fraction: float = 0.5  # at most this share of the unlabelled rows kept
    # how the kept rows share out among the classes: equal (no class more than the rarest predicted one) or
    # predicted (each class's most confident self_train_fraction of the rows the teacher gives it: its shares kept)
    self_train_balance: Literal["equal", "predicted"] = "equal"
    self_train_epochs: float = 2.0  # the student's epochs over labels + kept rows (at least the step floor)
    self_train_soft: bool = True  # soft targets: the teacher's calibrated probabilities (false: its labels)
    # label spreading over the backbone's embeddings joins the labellers (single texts; weighed on the dev rows)
    self_train_neighbours: bool = True
    self_train_mask: float = 0.0  # noise: each word of a pseudo-labelled row masked with this probability
    # method=auto: stratified folds of the labelled rows; the methods it chooses among (prompt only where the model
    # has an MLM head that reads the context); the fraction of each method's steps (setfit: of its pairs) a
    # cross-validation run trains; the most labelled rows it takes (it is for few labels)
    auto_folds: int = 4
    auto_methods: str = "head,setfit,ptuning,prompt"
    auto_steps: float = 0.25
    auto_max_rows: int = 1000

    def _check_auto(self) -> None:
        """The ``auto_*`` settings (method=auto), one line for a bad one."""
        names = [m.strip() for m in str(self.auto_methods).split(",") if m.strip()]
        unknown = [m for m in names if m not in AUTO_CANDIDATES]
        if not names or unknown:
            raise CramkitError(
                f"finetune.auto_methods is a comma-separated list of {', '.join(AUTO_CANDIDATES)}, got "
                f"{self.auto_methods!r}"
            )
        if not 2 <= self.auto_folds <= 20:
            raise CramkitError(f"finetune.auto_folds is the folds of cross-validation, 2 to 20, got {self.auto_folds}")
        if not 0.0 < self.auto_steps <= 1.0:
            raise CramkitError(
                "finetune.auto_steps is the fraction of each method's steps a cross-validation run trains, in "
                f"(0, 1], got {self.auto_steps}"
            )
        if self.auto_max_rows < 1:
            raise CramkitError(f"finetune.auto_max_rows must be positive, got {self.auto_max_rows}")

    def validate(self) -> None:
        if self.method not in METHODS:
            raise CramkitError(f"finetune.method is one of {', '.join(METHODS)}, got {self.method!r}")
        if (self.prompt or self.label_words) and self.method == "head":
            self.method = "prompt"  # a template or label words given: prompt-based fine-tuning
        if (self.prompt or self.label_words) and self.method not in ("prompt", "auto"):
            raise CramkitError(
                f"--prompt and --label-words apply to prompt-based fine-tuning, not method={self.method}"
            )
        if self.setfit_pairs < 1 or self.setfit_lr != "auto" and not self.setfit_lr > 0:
            raise CramkitError(
                f"finetune.setfit_pairs and setfit_lr must be positive, got {self.setfit_pairs}, {self.setfit_lr}"
            )
        self._check_self_train()
        if self.prefix_len < 1 or self.prefix_lr <= 0:
            raise CramkitError(
                f"finetune.prefix_len and prefix_lr must be positive, got {self.prefix_len}, {self.prefix_lr}"
            )
        from cramkit.model.prompting import check_prefix_len  # (torch: only when a config is checked)

        check_prefix_len(self.prefix_len)
        self._check_auto()
        for name in ("lr", "batch_size", "epochs", "max_length", "eval_batch_size"):
            if getattr(self, name) not in ("auto", None) and getattr(self, name) <= 0:
                raise CramkitError(f"finetune.{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.warmup < 1.0:
            raise CramkitError(f"finetune.warmup is a fraction of the steps in [0, 1), got {self.warmup}")
        if len(self.betas) != 2:
            raise CramkitError(f"finetune.betas needs two numbers, e.g. [0.9, 0.98]; got {self.betas}")
        if not self.seeds:
            raise CramkitError("finetune.seeds is empty; give at least one seed, e.g. --seeds 0")
        if self.min_steps is not None and self.min_steps < 0:
            raise CramkitError(f"finetune.min_steps must be 0 (epochs alone) or positive, got {self.min_steps}")
        if self.micro_batch < 0:
            raise CramkitError(f"finetune.micro_batch must be 0 (whole batch) or positive, got {self.micro_batch}")
        self.check_shared("finetune.")
        from cramkit.train.budget import parse_every

        if self.eval_every != "epoch":
            parse_every(self.eval_every, "finetune.eval_every")
        if self.keep not in ("last", "best"):
            raise CramkitError(f"finetune.keep is 'last' or 'best', got {self.keep!r}")
        if self.keep == "best" and self.eval_every in ("never", "0", "off"):
            raise CramkitError("finetune.keep=best picks among the dev evaluations: set eval_every (e.g. 'epoch')")
        if not 0.0 <= self.attention_dropout < 1.0:
            raise CramkitError(f"finetune.attention_dropout must be in [0, 1), got {self.attention_dropout}")

    def _check_self_train(self) -> None:
        if not 1 <= self.self_train_teachers <= 16 or not 1 <= self.self_train_rounds <= 10:
            raise CramkitError(
                f"finetune.self_train_teachers is 1..16 and self_train_rounds 1..10, got {self.self_train_teachers}, "
                f"{self.self_train_rounds}"
            )
        if self.self_train_threshold != "auto" and not 0.0 <= float(self.self_train_threshold) < 1.0:
            raise CramkitError(
                f"finetune.self_train_threshold is a probability in [0, 1) or auto, got {self.self_train_threshold}"
            )
        if not 0.0 < self.self_train_fraction <= 1.0 or not 0.0 <= self.self_train_mask < 1.0:
            raise CramkitError(
                f"finetune.self_train_fraction is in (0, 1] and self_train_mask in [0, 1), got "
                f"{self.self_train_fraction}, {self.self_train_mask}"
            )
        if not 0.0 < self.self_train_epochs <= 1000:
            raise CramkitError(f"finetune.self_train_epochs must be in (0, 1000], got {self.self_train_epochs}")

    @property
    def epoch_count(self) -> float:
        """The epochs trained over (before the step floor): ``epochs``, or the default 5."""
        return DEFAULT_EPOCHS if self.epochs is None else float(self.epochs)

    @property
    def step_floor(self) -> int:
        """The fewest optimizer steps: ``min_steps`` as set, else 500 when ``epochs`` is not set either, else 0."""
        if self.min_steps is not None:
            return int(self.min_steps)
        return DEFAULT_MIN_STEPS if self.epochs is None else 0

    def steps(self, examples: int) -> tuple[int, str | None]:
        """The optimizer steps of a run over ``examples`` rows, and the rule that chose them when it was the
        step floor (None: the epochs): one line for the user, since it trains more epochs than ``epochs``."""
        from cramkit.train.epochs import epoch_steps

        by_epochs = epoch_steps(examples, self.batch_size, self.epoch_count)
        floor = self.step_floor
        if floor <= by_epochs:
            return by_epochs, None
        per_epoch = epoch_steps(examples, self.batch_size, 1)
        rule = (
            f"the step floor for few labels (min_steps {floor}, the default when neither epochs nor min_steps is set)"
            if self.min_steps is None
            else f"the step floor min_steps={floor}"
        )
        return floor, (
            f"training {floor} steps ({floor / per_epoch:.1f} epochs of {examples} rows), not the {by_epochs} of "
            f"{self.epoch_count:g} epochs: {rule}; --set epochs=N trains exactly N epochs"
        )


def auto_lr(cfg: FinetuneConfig, hidden: int | None) -> float:
    """The peak learning rate of ``cfg.method``: ``prefix_lr`` for deep prompts, the encoder's rate for SetFit
    (``setfit_lr``; "auto": 2e-5, 1e-3 below width 384), else ``cfg.lr`` ("auto": Cramming's 4e-5 from width 384
    up, 1e-3 below; :func:`~cramkit.recipes.learning_rate.width_lr`). A model that declares no width, e.g. a
    student, counts as wide."""
    if cfg.method == "ptuning":
        return cfg.prefix_lr
    if cfg.method == "setfit":
        return width_lr(cfg.setfit_lr, hidden, wide=EMBEDDING_LR, undeclared_width=WIDE_FROM)
    return width_lr(cfg.lr, hidden, wide=FINETUNE_LR, undeclared_width=WIDE_FROM)


def train_config(
    cfg: FinetuneConfig,
    seed: int,
    steps: int,
    progress: bool | str = False,
    steps_per_epoch: int | None = None,
):
    """The engine's TrainConfig for one fine-tuning run of ``steps`` optimizer steps; dev evaluations every
    ``cfg.eval_every`` ('epoch': every ``steps_per_epoch`` steps)."""
    from cramkit.train.budget import Budget
    from cramkit.train.config import example_config

    eval_every = cfg.eval_every
    if eval_every == "epoch":
        eval_every = f"{steps_per_epoch}steps" if steps_per_epoch else "never"
    return example_config(
        budget=Budget.of_steps(steps).text,
        lr=cast(float, cfg.lr),  # the method's rate (auto_lr)
        betas=(cfg.betas[0], cfg.betas[1]),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        schedule=cfg.schedule,
        warmup=cfg.warmup,
        micro_batch=cfg.micro_batch,
        batch_size=cfg.batch_size,
        grad_clip=cfg.grad_clip,
        precision=cfg.precision,
        compile=cfg.compile,
        device=cfg.device,
        seed=seed,
        checkpoint_every=cfg.checkpoint_every,
        eval_every=eval_every,
        progress=progress,
        report_to=cfg.report_to,
    )


def settings_file(path: str | os.PathLike) -> dict[str, Any]:
    """The fine-tuning settings in ``path`` (what ``cramkit finetune --print-config`` writes, ``finetune:`` and its
    fields, or the fields alone): :func:`cramkit.config.section_file`, for ``--config FILE`` and
    ``cramkit.finetune(config=FILE)`` alike."""
    from cramkit.config import section_file

    return section_file(path, "finetune")


def config_from(overrides: dict[str, Any] | None = None, base: FinetuneConfig | None = None) -> FinetuneConfig:
    """A FinetuneConfig from ``--set`` overrides (strict: unknown keys are errors) on top of ``base``."""
    data = to_dict(base) if base is not None else {}
    data.update(overrides or {})
    return from_dict(FinetuneConfig, data, "finetune")
