"""Fine-tuning an encoder on a task: load, tokenise, bucket, train, evaluate, report.

One set of hyperparameters for every task by default: Cramming's "GLUE-sane" recipe (Geiping &
Goldstein 2023, ``cramming/config/eval/GLUE_sane.yaml``), see :class:`FinetuneConfig`. Batches are
padded only to their longest member, and examples of similar length are batched together (length
bucketing), so almost no compute is spent on padding; evaluation runs on length-sorted batches.

    results = finetune(get_task("glue/sst2", data_dir="glue"), "runs/tiny", FinetuneConfig(), "out/sst2")
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from cramkit.config import from_dict, to_dict
from cramkit.data.batching import (
    BatchLoader,
    Encoded,
    EncodedChoices,
    encode_choice_examples,
    encode_examples,
    scores_to_choices,
)
from cramkit.errors import CramkitError
from cramkit.io import json_loads
from cramkit.load import LoadedModel
from cramkit.model import forward
from cramkit.runtime import torchrun
from cramkit.tasks.registry import Example, Task
from cramkit.train.config import ExampleSettings
from cramkit.train.objectives import ExampleObjective

if TYPE_CHECKING:
    from cramkit.data.prompts import PromptSpec
    from cramkit.model.encoder import Encoder

PathLike = str | os.PathLike
# lr "auto": Cramming's 4e-5 from MiniLM's width (384) up; narrower models (cramkit's tiny presets, 256) sit
# at chance with it after a short pretraining and learn at 1e-3 (bench/RESULTS.md "Few labels: the rate")
AUTO_LR = {384: 4e-5, 0: 1e-3}


def auto_lr(cfg: FinetuneConfig, hidden: int | None) -> float:
    """The peak learning rate of ``cfg.method``: ``prefix_lr`` for deep prompts, the encoder's rate for SetFit
    (``setfit.body_lr``), else ``cfg.lr``, or for "auto" AUTO_LR's rate of the widest width <= ``hidden`` (a
    model that declares no width, e.g. a student: Cramming's 4e-5)."""
    if cfg.method == "ptuning":
        return cfg.prefix_lr
    if cfg.method == "setfit":
        from cramkit.recipes.setfit import body_lr

        return body_lr(cfg.setfit_lr, hidden)
    if cfg.lr != "auto":
        return float(cfg.lr)
    width = 384 if hidden is None else int(hidden)
    return AUTO_LR[max(w for w in AUTO_LR if w <= width)]


METHODS = ("head", "prompt", "ptuning", "setfit")


@dataclass
class FinetuneConfig(ExampleSettings):
    """Fine-tuning hyperparameters; the defaults are one recipe for every task.

    Defaults follow Cramming's GLUE-sane evaluation config: AdamW (lr 4e-5, betas 0.9/0.98, eps 1e-6),
    batch size 16, 5 epochs, linear warmup over the first 10% of steps then cosine decay to 0, no
    gradient clipping, max_length 128, first-token pooling through a dense+tanh pooler, dropout 0.1
    (re-enabled for fine-tuning, as Cramming does). Weight decay 0.01 on matrices only (biases, norms
    and scalars excluded, like Cramming's ``limited_decay_keys`` and the HF Trainer); Cramming's own
    GLUE-sane file sets 0.0, which ``--set weight_decay=0`` reproduces. Two departures, for few labels and small
    models: at least ``min_steps`` optimizer steps, and ``lr="auto"``: 4e-5 from width 384 up, 1e-3 below (a
    tiny model after a short pretraining stays at chance at 4e-5; see :func:`auto_lr`).
    """

    lr: float | Literal["auto"] = "auto"  # auto: by the model's width (auto_lr)
    batch_size: int = 16
    epochs: float = 5.0  # Cramming's "GLUE-sane" rule: at most 5 epochs
    # at least this many optimizer steps, whatever the data's size: with a few hundred labels, epochs alone
    # give a few dozen steps and a model that has not left chance (LM-BFF trains 1,000 steps on 16 per class)
    min_steps: int = 500
    warmup: float = 0.1  # fraction of all steps
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    grad_clip: float = 0.0  # 0 = no clipping (Cramming)
    # auto: the model's own pooling when it declares one (a sentence-transformers model: its mean or cls,
    # mean without BERT's pooler), else the first token through the pooler (Cramming)
    pooling: Literal["auto", "first", "mean"] = "auto"
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
    # on pairs of rows to embed the labels apart, then a logistic-regression head (SetFit)
    method: Literal["head", "prompt", "ptuning", "setfit"] = "head"
    prompt: str = ""  # method=prompt: the template, e.g. '{text_a} It was [MASK] .' ('': the task's built-in)
    label_words: str = ""  # method=prompt: LABEL=WORD,... ('': the task's built-in)
    prefix_len: int = 16  # method=ptuning: trainable keys and values per layer
    prefix_lr: float = 2e-2  # method=ptuning: the learning rate of the prefixes and the head
    # method=setfit: positive and negative pairs per labelled row (SetFit's num_iterations); one pass over them,
    # batch_size pairs a step (epochs and min_steps do not apply)
    setfit_pairs: int = 20
    setfit_lr: float | Literal["auto"] = "auto"  # method=setfit: the encoder's rate (auto: 2e-5; 1e-3 below 384)

    def validate(self) -> None:
        if self.method not in METHODS:
            raise CramkitError(f"finetune.method is one of {', '.join(METHODS)}, got {self.method!r}")
        if (self.prompt or self.label_words) and self.method == "head":
            self.method = "prompt"  # a template or label words given: prompt-based fine-tuning
        if (self.prompt or self.label_words) and self.method != "prompt":
            raise CramkitError(
                f"--prompt and --label-words apply to prompt-based fine-tuning, not method={self.method}"
            )
        if self.setfit_pairs < 1 or self.setfit_lr != "auto" and not self.setfit_lr > 0:
            raise CramkitError(
                f"finetune.setfit_pairs and setfit_lr must be positive, got {self.setfit_pairs}, {self.setfit_lr}"
            )
        if self.prefix_len < 1 or self.prefix_lr <= 0:
            raise CramkitError(
                f"finetune.prefix_len and prefix_lr must be positive, got {self.prefix_len}, {self.prefix_lr}"
            )
        for name in ("lr", "batch_size", "epochs", "max_length", "eval_batch_size"):
            if getattr(self, name) != "auto" and getattr(self, name) <= 0:
                raise CramkitError(f"finetune.{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.warmup < 1.0:
            raise CramkitError(f"finetune.warmup is a fraction of the steps in [0, 1), got {self.warmup}")
        if len(self.betas) != 2:
            raise CramkitError(f"finetune.betas needs two numbers, e.g. [0.9, 0.98]; got {self.betas}")
        if not self.seeds:
            raise CramkitError("finetune.seeds is empty; give at least one seed, e.g. --seeds 0")
        if self.min_steps < 0:
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


# ---------------------------------------------------------------------------------------------------
# Training and evaluation


def encode_task_examples(
    task: Task, tokenizer: Any, rows: Sequence[Example], max_length: int, prompt: PromptSpec | None = None
):
    """A task's rows as the model takes them: ``Encoded`` (one sequence per row; with ``prompt``, the
    template around the texts) or, for a multiple-choice task, ``EncodedChoices`` (a pair row per choice)."""
    if prompt is not None:
        from cramkit.data.prompts import encode_prompts

        labels = None
        if rows and all(e.label is not None for e in rows):
            labels = np.asarray([e.label for e in rows], dtype=np.int64)
        idx = np.asarray([e.idx for e in rows], dtype=np.int64)
        return encode_prompts(
            tokenizer,
            prompt,
            [e.text_a for e in rows],
            [e.text_b for e in rows],
            max_length,
            labels=labels,
            idx=idx,
        )
    if task.is_multiple_choice:
        return encode_choice_examples(tokenizer, rows, max_length)
    return encode_examples(tokenizer, rows, max_length, regression=task.is_regression)


def build_model(
    loaded: LoadedModel,
    num_labels: int,
    cfg: FinetuneConfig,
    *,
    multilabel: bool = False,
    multiple_choice: bool = False,
    prompt: PromptSpec | None = None,
):
    """The model ``cfg.method`` trains on the loaded model's encoder: a SequenceClassifier (a MultipleChoice
    scorer with ``multiple_choice``; BERT's pooler when the model has one), a PromptClassifier (its MLM
    head and ``prompt``) or a PrefixClassifier (the encoder frozen, ``cfg.prefix_len`` prefixes)."""
    import torch

    from cramkit.model.heads import ClassifierConfig, MultipleChoice, SequenceClassifier
    from cramkit.model.prompting import PrefixClassifier, PromptClassifier

    encoder = loaded.encoder
    if encoder is None:
        raise CramkitError(
            f"--from {loaded.source}: a {loaded.architecture} model has no transformer encoder to fine-tune"
        )
    model_cfg = loaded.config.replace(
        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, gradient_checkpointing=False
    )
    model: PromptClassifier | PrefixClassifier | SequenceClassifier
    if cfg.method == "prompt":
        if prompt is None:
            raise ValueError("method=prompt needs the resolved prompt (resolve_prompt)")
        model = PromptClassifier(model_cfg, prompt.label_ids, prompt.mask_id)
        model.spec = prompt
        state = loaded.model.state_dict()
        model.load_state_dict({k: v for k, v in state.items() if k.startswith(("encoder.", "head."))}, strict=True)
        return model
    pool = resolve_pooling(cfg, loaded)  # pooling=auto: the model's own
    head = ClassifierConfig(
        pooling=cast(Literal["first", "mean"], pool.pooling), pooler_dense=pool.pooler_dense, dropout=cfg.dropout
    )
    if cfg.method == "ptuning":
        model = PrefixClassifier(model_cfg, num_labels, head, cfg.prefix_len)
    elif multiple_choice:
        model = MultipleChoice(model_cfg, head)
    else:
        model = SequenceClassifier(model_cfg, num_labels, head, multilabel=multilabel)
    model.encoder.load_state_dict(encoder.state_dict(), strict=True)
    pooler = getattr(loaded.model, "pooler", None)
    pooler_state = pooler.state_dict() if pooler is not None else loaded.pooler_state
    if pooler_state is not None and model.pooler is not None and pool.pooling == "first":
        with torch.no_grad():
            model.pooler.weight.copy_(pooler_state["weight"])
            model.pooler.bias.copy_(pooler_state["bias"])
    return model


def resolve_pooling(cfg: FinetuneConfig, loaded: LoadedModel) -> FinetuneConfig:
    """``cfg`` with ``pooling="auto"`` made concrete for ``loaded``: a sentence-transformers model's own pooling
    (mean: without BERT's pooler, which never saw a mean), else the first token (and ``pooler_dense``)."""
    if cfg.pooling != "auto":
        return cfg
    import dataclasses

    if cfg.method == "setfit":  # sentence vectors: the model's own pooling, mean when it declares none
        first = loaded.extra.get("st_pooling") == "cls"
        return dataclasses.replace(cfg, pooling="first" if first else "mean", pooler_dense=False)
    if loaded.extra.get("st_pooling") == "mean":
        return dataclasses.replace(cfg, pooling="mean", pooler_dense=False)
    return dataclasses.replace(cfg, pooling="first")


def resolve_prompt(task: Task, loaded: LoadedModel, cfg: FinetuneConfig) -> PromptSpec | None:
    """Check that ``cfg.method`` fits the task and the model; for method=prompt, the template and label
    words (the user's, else the task's built-in ones) checked against the task's labels and the model's
    vocabulary. One CramkitError line for each thing that does not fit."""
    if cfg.method == "head":
        return None
    if cfg.method == "setfit":
        if task.kind != "classification" or task.labels is None or task.is_multiple_choice:
            raise CramkitError(
                f"--method setfit: task {task.name} is {task.kind}; SetFit fits a classifier on sentence "
                "vectors, so it needs a classification task: leave out --method for this task"
            )
        return None
    if cfg.method == "ptuning":
        if task.is_multiple_choice or task.kind != "classification" and not task.is_regression:
            raise CramkitError(
                f"--method ptuning: task {task.name} is {task.kind}; deep prompts train a classification or "
                "regression head: leave out --method for this task"
            )
        return None
    from cramkit.data.prompts import prompt_spec
    from cramkit.model.heads import MLMHead
    from cramkit.tasks.prompts import builtin_label_words, builtin_prompt

    if task.kind != "classification" or task.labels is None:
        raise CramkitError(
            f"--prompt: task {task.name} is {task.kind}; a prompt scores one word per label, so it needs a "
            "classification task: leave out --prompt for this task"
        )
    if not isinstance(getattr(loaded.model, "head", None), MLMHead):
        src = loaded.source
        raise CramkitError(
            f"--from {src} has no masked-LM head, which a prompt scores its label words with; give it one by "
            f"continuing the whole model on text like the task's (`cramkit pretrain TEXT --from {src} --budget 30m "
            "--set train.keep_vectors=1 --out runs/with-head`, which also keeps its sentence vectors; a head "
            "trained for minutes, or with train.head_only, predicts word frequencies whatever the sentence), "
            "then fine-tune --from runs/with-head"
        )
    words: str | dict[str, str]  # LABEL=WORD,... or the built-in prompt's {label: word}
    template, words = cfg.prompt, cfg.label_words
    builtin = builtin_prompt(task.name)
    if not (template and words):
        if builtin is None:
            raise CramkitError(
                f"task {task.name} has no built-in prompt; give --prompt TEMPLATE (e.g. '{{text_a}} It was "
                f"[MASK] .') and --label-words with a word for each of its labels: {', '.join(task.labels)}"
            )
        template = template or builtin[0]
    cols = task_columns(task).get("columns", {})
    fields = {cols[k]: k for k in ("text_a", "text_b") if cols.get(k)}
    # the user's words, else the built-in ones and then their fallbacks: the first that fits the vocabulary
    choices: list[str | dict[str, str]] = [words] if words else list(builtin_label_words(task.name))
    first: CramkitError | None = None
    for choice in choices:
        try:
            spec = prompt_spec(template, choice, task.labels, loaded.tokenizer, fields=fields)
            break
        except CramkitError as exc:
            first = first or exc
    else:
        if words:  # the user's own words are never replaced: what is wrong with them
            raise cast(CramkitError, first)
        tried = "; ".join(",".join(f"{k}={v}" for k, v in c.items()) for c in choices if isinstance(c, dict))
        raise CramkitError(
            f"task {task.name}'s built-in label words ({tried}) are not single tokens (or equally long) in the "
            f"vocabulary of {loaded.source}: give --label-words LABEL=WORD,... with words it holds whole "
            f"({first})"
        )
    if "text_b" in spec.fields and trained_inputs(task) == "single":
        raise CramkitError(
            f"--prompt {template!r} names the second text, but task {task.name} has one text per example"
        )
    return spec


def predict(
    model, enc: Encoded | EncodedChoices, cfg: FinetuneConfig, device, pad_id: int, with_types: bool
) -> np.ndarray:
    """Logits for every example (in the given order) through ``cramkit.model.forward``, the passes
    ``cramkit.infer.Engine`` runs: length-sorted, within the device's token budget and at most
    ``eval_batch_size`` examples each; multiple choice: [examples, most choices] scores, -inf where an
    example has fewer choices."""
    if isinstance(enc, EncodedChoices):
        return scores_to_choices(predict(model, enc.pairs, cfg, device, pad_id, with_types), enc.offsets)
    runner = forward.TorchRunner(model, device, cfg.precision)
    return forward.logits(
        runner,
        enc,
        pad_id=pad_id,
        with_types=with_types,
        max_tokens=forward.default_batch_tokens(runner.device),
        max_rows=cfg.eval_batch_size,
        width=model.num_labels,
    )


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
        self.best: tuple[float, dict | None] | None = None  # (dev score, weights when kept in memory)
        self.plot = {"title": title, "loss_name": "training loss (cross-entropy)", "x": "step"}
        if num_labels == 1 and not multiple_choice:
            self.plot["loss_name"] = "training loss (MSE)"

    def build_model(self):
        return build_model(
            self.loaded,
            self.num_labels,
            self.cfg,
            multilabel=self.multilabel,
            multiple_choice=self.multiple_choice,
            prompt=self.prompt,
        )

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
        if self.cfg.keep == "best" and (self.best is None or score > self.best[0]):
            self._keep_best(plain, score)
        return {"val_loss": loss, "dev_score": score, **{f"dev_{k}": v for k, v in metrics.items()}}

    def _keep_best(self, model, score: float) -> None:
        state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        if self.best_dir is None:
            self.best = (score, state)
            return
        from safetensors.torch import save_file

        from cramkit.io import atomic_path, write_json_atomic
        from cramkit.model.loaded import unique_tensors as _unique_tensors

        with atomic_path(self.best_dir / BEST_WEIGHTS) as tmp:
            save_file({k: v.contiguous() for k, v in _unique_tensors(state).items()}, str(tmp))
        write_json_atomic(self.best_dir / BEST_FILE, {"score": score})
        self.best = (score, None)

    def best_state(self) -> dict | None:
        """The weights with the best dev score (None: nothing kept)."""
        if self.best is not None and self.best[1] is not None:
            return self.best[1]
        if self.best_dir is not None and (self.best_dir / BEST_FILE).is_file():
            from cramkit.model.hf import read_weights

            return read_weights(self.best_dir / BEST_WEIGHTS)
        return None

    def resume_best(self) -> None:
        """A resumed run knows the best dev score its earlier part kept."""
        if self.best_dir is None or not (self.best_dir / BEST_FILE).is_file():
            return
        try:
            self.best = (
                float(json_loads((self.best_dir / BEST_FILE).read_text(encoding="utf-8"))["score"]),
                None,
            )
        except (OSError, ValueError, KeyError, TypeError):
            self.best = None  # damaged: the next evaluation keeps its model


class SetFitObjective(ClassifierObjective):
    """``--method setfit`` (``recipes/setfit.py``) for the engine, the body: batches of pairs, the squared error
    of their cosine; each evaluation fits the head first (then scores the dev split as fine-tuning does)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from cramkit.recipes import setfit

        super().__init__(*args, **kwargs)
        assert self.train.labels is not None and isinstance(self.train, Encoded)  # checked by the caller
        pairs, targets = setfit.make_pairs(self.train.labels, self.cfg.setfit_pairs, self.seed)
        self.pairs = setfit.pair_rows(self.train, pairs, targets)
        self.title = f"{self.title} (setfit, {len(pairs):,} pairs)"
        self.plot = {**self.plot, "loss_name": "training loss (squared error of the pairs' cosine)"}

    def build_model(self):
        from cramkit.recipes import setfit

        plain = super().build_model()
        model = setfit.classifier_class()(plain.cfg, plain.num_labels, plain.head_cfg)
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
        from cramkit.recipes.setfit import fit_head, pooled_view

        plain = getattr(model, "module", model)
        device, loaded = next(plain.parameters()).device, self.loaded
        vectors = predict(pooled_view(plain), self.train, self.cfg, device, loaded.pad_id, loaded.with_types)
        fit_head(plain, vectors, cast(np.ndarray, self.train.labels))
        return super().evaluate(model, ctx, precision)


BEST_FILE, BEST_WEIGHTS = "best.json", "best.safetensors"


def eval_period(cfg: FinetuneConfig, examples: int, steps: int) -> int:
    """Steps between the 'epoch' dev evaluations: an epoch, or when the step floor stretches the run past
    ``cfg.epochs`` epochs, ``steps / ceil(epochs)`` (as many evaluations as the epochs would give)."""
    from cramkit.train.epochs import epoch_steps

    per_epoch = epoch_steps(examples, cfg.batch_size, 1)
    if steps <= epoch_steps(examples, cfg.batch_size, cfg.epochs):
        return per_epoch
    return max(per_epoch, math.ceil(steps / max(1, math.ceil(cfg.epochs))))


def train_config(
    cfg: FinetuneConfig,
    seed: int,
    steps: int,
    progress: bool | str = False,
    steps_per_epoch: int | None = None,
):
    """The engine's TrainConfig for one fine-tuning run of ``steps`` optimizer steps; dev evaluations every
    ``cfg.eval_every`` ('epoch': every ``steps_per_epoch`` steps)."""
    from cramkit.train.config import example_config

    eval_every = cfg.eval_every
    if eval_every == "epoch":
        eval_every = f"{steps_per_epoch}steps" if steps_per_epoch else "never"
    return example_config(
        budget=f"{steps}steps",
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


def train_one_seed(
    loaded: LoadedModel,
    train: Encoded | EncodedChoices,
    num_labels: int,
    cfg: FinetuneConfig,
    seed: int,
    *,
    progress: bool = True,
    desc: str = "finetune",
    run: PathLike | None = None,
    multilabel: bool = False,
    multiple_choice: bool = False,
    resume_hint: str = "rerun the same command to continue",
    ctx: Any = None,
    dev: tuple[Task, str, Encoded | EncodedChoices] | None = None,
    prompt: PromptSpec | None = None,
):
    """Train a fresh classifier on ``train`` with ``seed`` through the training engine; returns (model,
    stats). With ``run`` (a directory) checkpoints go there and a run killed midway resumes from them.
    dev: (task, split, encoded) scored at every evaluation (``cfg.eval_every``); with ``cfg.keep == "best"``
    the model returned is the one with the best dev score."""
    from cramkit.train.epochs import epoch_steps, train_epochs

    cfg = dataclasses.replace(cfg, lr=auto_lr(cfg, getattr(loaded, "hidden", None)))
    kind: type[ClassifierObjective] = ClassifierObjective
    steps = max(epoch_steps(len(train), cfg.batch_size, cfg.epochs), cfg.min_steps)
    if cfg.method == "setfit":
        from cramkit.recipes import setfit

        kind, steps = SetFitObjective, setfit.steps(cfg.setfit_pairs, len(train), cfg.batch_size)
    objective = kind(loaded, train, num_labels, cfg, seed, desc, resume_hint, multilabel, multiple_choice, prompt)
    objective.dev = dev
    if run is not None:
        objective.best_dir = Path(run)
        Path(run).mkdir(parents=True, exist_ok=True)
        objective.resume_best()
    per_epoch = eval_period(cfg, len(train), steps)
    tcfg = train_config(cfg, seed, steps, progress="auto" if progress else False, steps_per_epoch=per_epoch)
    done = train_epochs(objective, tcfg, run, examples=len(train), batch_size=cfg.batch_size, ctx=ctx)
    if cfg.keep == "best":
        best = objective.best_state()
        if best is not None:
            done.model.load_state_dict(best)
    losses = done.losses
    stats = {
        "seed": seed,
        "steps": done.steps,
        "lr": cfg.lr,
        "examples_seen": done.examples_seen,
        "train_seconds": round(done.seconds, 3),
        "examples_per_s": round(done.examples_per_s, 2),
        "loss_curve": curve(losses),
        "first_loss": losses[0] if losses else float("nan"),
        "dev_curve": done.evals,
        "last_loss": float(np.mean(losses[-max(1, len(losses) // 10) :])) if losses else float("nan"),
        "trainable_parameters": sum(p.numel() for p in done.model.parameters() if p.requires_grad),
    }
    if cfg.keep == "best" and done.evals:
        stats["best_step"] = max(done.evals, key=lambda r: r.get("dev_score", float("-inf")))["step"]
    return done.model, stats


ZERO_SHOT_ROWS = 512  # rows of the scored split the prompt is tried on before training


def zero_shot(
    task: Task, loaded: LoadedModel, cfg: FinetuneConfig, prompt: PromptSpec, max_length: int, device: Any
) -> dict[str, Any]:
    """The prompt before any training (LM-BFF's zero-shot row): its score on at most ZERO_SHOT_ROWS rows of
    the task's first scored split (evenly spaced), and how many of the labels it predicts at all. One label
    for every row means the MLM head does not read the context at the mask: a head trained for minutes
    predicts the words' frequencies, whatever the sentence, and the prompt then starts no better than a
    fresh classifier."""
    rows, labels, logits = zero_shot_logits(task, loaded, cfg, prompt, max_length, device)
    return {
        "split": task.scored_splits[0],
        "examples": len(rows),
        "score": task.score(task.compute_metrics(logits, labels, rows)),
        "labels_predicted": len(set(logits.argmax(1).tolist())),
    }


def zero_shot_logits(
    task: Task, loaded: LoadedModel, cfg: FinetuneConfig, prompt: PromptSpec, max_length: int, device: Any
) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """:func:`zero_shot`'s rows (at most ZERO_SHOT_ROWS of the first scored split, evenly spaced), their labels
    and the prompt's logits for them before training."""
    rows = task.examples(task.scored_splits[0])
    rows = rows[:: max(1, -(-len(rows) // ZERO_SHOT_ROWS))]
    enc = encode_task_examples(task, loaded.tokenizer, rows, max_length, prompt)
    model = build_model(loaded, task.num_labels, cfg, prompt=prompt)
    return rows, enc.labels, predict(model, enc, cfg, device, loaded.pad_id, loaded.with_types)


def zero_shot_line(before: dict[str, Any], task: Task, source: str) -> str:
    """One line for the user: the prompt's score before training, and what a one-label answer means."""
    line = (
        f"cramkit: the prompt before training: {task.main_metric} {before['score']:.1f} on {before['examples']} "
        f"{before['split']} rows"
    )
    if before["labels_predicted"] > 1 or task.num_labels < 2:
        return line
    return (
        f"{line}, the same label for every row: the MLM head of {source} does not read the context at the mask "
        "yet (a head trained for minutes predicts word frequencies), so the prompt starts no better than a "
        f"fresh classifier (--method head); continuing the whole model longer on text like the task's "
        f"(`cramkit pretrain TEXT --from {source} --budget 30m --set train.keep_vectors=1`) gives it one"
    )


def curve(losses: list[float], points: int = 100) -> list[float]:
    """The loss averaged over (at most) ``points`` equal slices of training."""
    if len(losses) <= points:
        return [round(v, 5) for v in losses]
    return [round(float(np.mean(part)), 5) for part in np.array_split(np.asarray(losses), points)]


def finetune(
    task: Task,
    source: PathLike | LoadedModel,
    cfg: FinetuneConfig | None = None,
    out_dir: PathLike | None = None,
    *,
    progress: bool = True,
    predict_also: Sequence[Task] = (),
) -> dict[str, Any]:
    """Fine-tune ``source`` on ``task`` once per seed; evaluate on the dev split(s); write results.

    Returns (and writes to out_dir/results.json) per-seed metrics on each dev split and their median,
    with the task's main score; test-set predictions (leaderboard format) from the seed with the
    median dev score go to out_dir/predictions/. predict_also: test-only tasks with the same labels
    predicted by the same model (GLUE's diagnostic set AX by the MNLI model). ``out_dir`` follows the rule of
    every output (``cramkit.io.check_out``: never into its input, never over another product), checked
    before anything is read; a full disk gets one line.
    """
    cfg = cfg or FinetuneConfig()
    from cramkit.io import check_out, disk_errors

    if out_dir is None:
        return _finetune(task, source, cfg, None, progress, predict_also)
    check_out(out_dir, inputs=[source], own=[SETTINGS_FILE])
    with disk_errors(out_dir):
        return _finetune(task, source, cfg, out_dir, progress, predict_also)


def _finetune(
    task: Task,
    source: PathLike | LoadedModel,
    cfg: FinetuneConfig,
    out_dir: PathLike | None,
    progress: bool,
    predict_also: Sequence[Task],
) -> dict[str, Any]:
    from cramkit.load import load_torch

    loaded = source if isinstance(source, LoadedModel) else load_torch(source, purpose="fine-tuning")
    max_length = min(cfg.max_length, loaded.max_length)
    tok = loaded.tokenizer

    if cfg.max_eval_examples:
        from cramkit.tasks.registry import cap_dev

        task = cap_dev(task, cfg.max_eval_examples)
    prompt = resolve_prompt(task, loaded, cfg)
    train_rows = task.examples(task.train_split)
    if cfg.max_train_examples:
        train_rows = train_rows[: cfg.max_train_examples]
    if not train_rows:
        raise CramkitError(f"task {task.name}: the {task.train_split} split is empty; nothing to fine-tune on")
    if torchrun().is_main:  # under torchrun: once
        from cramkit.text.coverage import unk_report

        texts = [t for e in train_rows for t in (e.text_a, e.text_b, *(e.choices or ())) if t]
        unk_report(tok, texts, str(loaded.source), verbose=progress)
    train = encode_task_examples(task, tok, train_rows, max_length, prompt)
    if train.labels is None:
        raise CramkitError(f"task {task.name}: some {task.train_split} examples have no label")
    dev = {s: encode_task_examples(task, tok, task.examples(s), max_length, prompt) for s in task.dev_splits}
    for split, enc in dev.items():
        if enc.labels is None:
            raise CramkitError(f"task {task.name}: the {split} split has unlabelled examples; it cannot be scored")
    tests = encode_test_splits(task, tok, max_length, prompt)
    for other in predict_also:
        if other.labels != task.labels or other.kind != task.kind:
            raise CramkitError(f"task {other.name} has labels {other.labels}, not {task.name}'s {task.labels}")
        tests.update(encode_test_splits(other, tok, max_length, prompt))

    from cramkit.train.distributed import fault_guard, init_distributed, shutdown

    ctx = init_distributed(cfg.device)  # under torchrun: one process group for every seed
    if ctx.distributed and out_dir is None:
        raise CramkitError("under torchrun give --out DIR: every process must write into the same directory")
    from cramkit.io import dir_lock

    lock = dir_lock(out_dir, "--out") if out_dir is not None and ctx.is_main else contextlib.nullcontext()
    try:
        with lock, fault_guard(ctx):
            return _finetune_seeds(task, loaded, cfg, out_dir, ctx, train, dev, tests, predict_also, progress, prompt)
    finally:
        shutdown(ctx)


def _finetune_seeds(
    task, loaded, cfg, out_dir, ctx, train, dev, tests, predict_also, progress, prompt=None
) -> dict[str, Any]:
    from cramkit.train.distributed import main_first

    max_length = min(cfg.max_length, loaded.max_length)
    regression = task.is_regression
    device = ctx.device
    pad_id, with_types = loaded.pad_id, loaded.with_types
    seeds_dir = None
    if out_dir is not None:
        with main_first(ctx, "checking --out"):
            seeds_dir = _claim(Path(out_dir), task, loaded, cfg) if ctx.is_main else Path(out_dir) / "seeds"
    hint = "rerun the same command to continue (finished seeds are kept; this one resumes from its checkpoint)"
    before = None
    if prompt is not None and ctx.is_main:
        before = zero_shot(task, loaded, cfg, prompt, max_length, device)
        if progress:
            print(zero_shot_line(before, task, loaded.source), file=sys.stderr)
    states: list[dict[str, Any] | None]
    logits: Any  # a finished seed's test logits (by split), or one split's array
    per_seed, test_logits, states = [], [], []
    for seed in cfg.seeds:
        run = seeds_dir / f"seed-{seed}" if seeds_dir is not None else None
        done = _finished_seed(run, tests) if run is not None else None
        if done is not None:  # finished by an earlier, interrupted invocation
            stats, logits, state = done
            per_seed.append(stats)
            test_logits.append(logits)
            states.append(state)
            continue
        model, stats = train_one_seed(
            loaded,
            train,
            task.num_labels,
            cfg,
            seed,
            progress=progress,
            desc=f"{task.name} seed {seed}",
            run=run,
            resume_hint=hint,
            ctx=ctx,
            multiple_choice=task.is_multiple_choice,
            dev=(task, task.selection_splits[0], dev[task.selection_splits[0]]) if dev else None,
            prompt=prompt,
        )
        if not ctx.is_main:  # rank 0 scores and writes; the others go on to the next seed's training
            continue
        stats["dev"] = {}
        for split, enc in dev.items():
            logits = predict(model, enc, cfg, device, pad_id, with_types)
            preds = logits[:, 0] if regression else logits
            metrics = task.compute_metrics(preds, enc.labels, task.examples(split))
            stats["dev"][split] = {"metrics": metrics, "score": task.score(metrics)}
        logits = {s: predict(model, enc, cfg, device, pad_id, with_types) for s, enc in tests.items()}
        for (name, split), enc in tests.items():  # a test file with labels is scored too
            if name == task.name and enc.labels is not None:
                preds = logits[(name, split)][:, 0] if regression else logits[(name, split)]
                metrics = task.compute_metrics(preds, enc.labels, task.examples(split))
                stats.setdefault("test", {})[split] = {"metrics": metrics, "score": task.score(metrics)}
        test_logits.append(logits)
        per_seed.append(stats)
        if run is not None:
            _finish_seed(run, stats, logits)
            states.append(None)  # its weights stay in its final checkpoint until the median is known
        else:
            states.append({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
        del model

    if not ctx.is_main:
        return {}
    results: dict[str, Any] = {
        "task": task.name,
        "source": loaded.source,
        "config": to_dict(cfg),
        "max_length": max_length,
        "train_examples": len(train),
        "dev_examples": {s: len(e) for s, e in dev.items()},
        "main_metric": task.main_metric,
        "method": cfg.method,
        **({"prompt": prompt.meta()} if prompt is not None else {}),
        **({"zero_shot": before} if before is not None else {}),
        "seeds": per_seed,
        "median": {},
    }
    for split in dev:
        metrics = {m: statistics.median(r["dev"][split]["metrics"][m] for r in per_seed) for m in task.metrics}
        results["median"][split] = {
            "metrics": metrics,
            "score": statistics.median(r["dev"][split]["score"] for r in per_seed),
        }
    scored = task.scored_splits  # dev holds every dev split
    results["score"] = float(np.mean([results["median"][s]["score"] for s in scored])) if scored else None
    scored_tests = sorted({s for r in per_seed for s in r.get("test", {})})
    for split in scored_tests:  # labelled test files: scored like the dev splits (median over seeds)
        rows = [r["test"][split] for r in per_seed if split in r.get("test", {})]
        results.setdefault("test", {})[split] = {
            "metrics": {m: statistics.median(x["metrics"][m] for x in rows) for m in task.metrics},
            "score": statistics.median(x["score"] for x in rows),
        }
    skipped = {s: n for s, n in task.skipped.items() if n}
    if skipped:
        results["skipped_rows"] = skipped

    # the seed whose dev score is the (lower) median: its model is kept, its test predictions written
    chosen = task.selection_splits
    scores = [float(np.mean([r["dev"][s]["score"] for s in chosen])) if chosen else 0.0 for r in per_seed]
    pick = sorted(range(len(scores)), key=lambda i: scores[i])[(len(scores) - 1) // 2]
    results["kept_seed"] = cfg.seeds[pick]
    if out_dir is not None:
        assert seeds_dir is not None  # claimed with out_dir
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = states[pick]
        if state is None:
            from cramkit.load import MODEL_FILE
            from cramkit.train import checkpoint as ckpt

            seed_dir = seeds_dir / f"seed-{cfg.seeds[pick]}"
            found = ckpt.find_latest(seed_dir)
            if cfg.keep == "best" and (seed_dir / BEST_WEIGHTS).is_file():  # the best dev score's weights
                from cramkit.model.hf import read_weights

                state = read_weights(seed_dir / BEST_WEIGHTS)
            elif found is not None:
                state = ckpt.model_weights(found)
            elif not (out / MODEL_FILE).is_file():
                raise CramkitError(
                    f"{out}: seed {cfg.seeds[pick]} finished earlier but neither its checkpoint nor the kept model "
                    f"is there any more; delete {out} and fine-tune again"
                )
        if state is not None:  # (else: every seed was reused and the kept model is already saved)
            _save_model(loaded, task, cfg, max_length, state, cfg.seeds[pick], out, prompt)
        if tests and dev:
            results["test_predictions"] = {"seed": cfg.seeds[pick], "files": {}}
            owners = {t.name: t for t in [task, *predict_also]}
            for (name, split), enc in tests.items():
                owner = owners[name]
                logits = test_logits[pick][(name, split)]
                preds = logits[:, 0] if regression else logits.argmax(-1)
                path = owner.write_predictions(
                    split, zip(enc.idx.tolist(), preds.tolist(), strict=True), out / "predictions"
                )
                key = split if owner is task else f"{owner.name}:{split}"
                results["test_predictions"]["files"][key] = str(path)
        results["trainable_parameters"] = per_seed[pick].get("trainable_parameters")
        results["stored_bytes"] = (out / "model.safetensors").stat().st_size
        write_json(out / "results.json", results)
        for seed in cfg.seeds:  # the kept model is saved: the seeds' checkpoints are no longer needed
            shutil.rmtree(seeds_dir / f"seed-{seed}" / "checkpoints", ignore_errors=True)
            (seeds_dir / f"seed-{seed}" / BEST_WEIGHTS).unlink(missing_ok=True)
    return results


SETTINGS_FILE = "finetune.json"


def _claim(out: Path, task: Task, loaded: LoadedModel, cfg: FinetuneConfig) -> Path:
    """``out/seeds``, after checking that ``out`` holds no fine-tuning with other settings."""
    from cramkit.io import claim_dir

    settings = {"task": task.name, "source": loaded.source, "config": to_dict(cfg)}
    claim_dir(out, SETTINGS_FILE, settings, "a fine-tuning")
    return out / "seeds"


def _finish_seed(run: Path, stats: dict[str, Any], logits: dict[tuple[str, str], np.ndarray]) -> None:
    """A finished seed's results (its test logits as .npy), written last so a rerun can reuse them."""
    from cramkit.io import write_json_atomic

    files = {}
    for i, ((name, split), values) in enumerate(sorted(logits.items())):
        files[f"{name}|{split}"] = f"test-{i}.npy"
        np.save(run / f"test-{i}.npy", values, allow_pickle=False)
    write_json_atomic(run / "result.json", {"stats": stats, "test_logits": files})


def _finished_seed(run: Path, tests: dict) -> tuple[dict, dict, None] | None:
    from cramkit.rundir import finished_result

    data = finished_result(run / "result.json", key="stats")
    if data is None:
        return None
    try:
        logits = {}
        for key, name in data["test_logits"].items():
            task_name, split = key.split("|", 1)
            if "/" in name or "\\" in name or not name.endswith(".npy"):
                raise ValueError(f"bad file name {name!r}")
            logits[(task_name, split)] = np.load(run / name, allow_pickle=False)
        if set(logits) != set(tests):
            return None
        return data["stats"], logits, None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # damaged: train this seed again


def _save_model(
    loaded: LoadedModel,
    task: Task,
    cfg: FinetuneConfig,
    max_length: int,
    state: dict,
    seed: int,
    out: Path,
    prompt: PromptSpec | None = None,
) -> None:
    """The fine-tuned model as a model directory (``cramkit.load(out)``); with method=ptuning only the
    prefixes and the head, and the base model named by the checksum of its encoder."""
    from cramkit.load import LoadedModel as Saved
    from cramkit.load import load_weights
    from cramkit.model.prompting import encoder_digest

    model = build_model(loaded, task.num_labels, cfg, multiple_choice=task.is_multiple_choice, prompt=prompt)
    # a checkpoint stores tied weights (the MLM decoder of a prompt model) under one name
    load_weights(model, dict(state), f"{out}: the kept seed's weights", tied=cfg.method == "prompt")
    kind = {"regression": "regression", "multiple_choice": "multiple_choice"}.get(task.kind, "classifier")
    extra = {
        "finetuned_from": loaded.source,
        "seed": seed,
        "trained_inputs": trained_inputs(task),
        **task_columns(task),
    }
    architecture, head = "encoder", getattr(model, "head_cfg", None)
    if cfg.method == "prompt":
        architecture, head = "prompt", None
        extra["prompt"] = cast("PromptSpec", prompt).meta()  # build_model refused method=prompt without one
    elif cfg.method == "ptuning":
        architecture = "prefix"
        extra["base"] = {
            "source": str(loaded.source),
            "sha256": encoder_digest(cast("Encoder", loaded.encoder)),  # build_model refused models without one
            "prefix_len": cfg.prefix_len,
        }
    Saved(
        model=model,
        kind=kind,
        config=model.cfg,
        tokenizer=loaded.tokenizer,
        labels=[str(x) for x in task.labels] if task.labels is not None else None,
        task=task.name,
        max_length=max_length,
        pooling="cls" if resolve_pooling(cfg, loaded).pooling == "first" else "mean",
        with_types=loaded.with_types,
        head=to_dict(head) if head is not None else None,
        architecture=architecture,
        extra=extra,
    ).save(out)


def trained_inputs(task: Task) -> str:
    """What a task's model reads: "choices" (multiple choice), "pairs" (text pairs) or "single" (one text);
    recorded with the model, so a server can tell a pair from two texts."""
    if task.is_multiple_choice:
        return "choices"
    rows = task.examples(task.train_split)
    return "pairs" if any(e.text_b is not None for e in rows) else "single"


def task_columns(task: Task) -> dict[str, Any]:
    """The columns of a task from files (``predict`` reads the same ones by default), else nothing."""
    cols = getattr(task.splits.get(task.train_split), "columns", None)
    if not cols:
        return {}
    columns = dict(zip(("text_a", "text_b", "label"), cols[:3], strict=True))
    choices = getattr(task.splits.get(task.train_split), "choices", None)
    return {"columns": columns | ({"choices": list(choices)} if choices else {})}


def encode_test_splits(
    task: Task, tok, max_length: int, prompt: PromptSpec | None = None
) -> dict[tuple[str, str], Encoded | EncodedChoices]:
    """Encoded test splits that are present, keyed (task, split); an absent test file is not an error."""
    out = {}
    for split in task.test_splits:
        if split not in task.splits:
            continue
        source = task.source(split)
        if not source.startswith("hf:") and not Path(source).exists():
            continue
        rows = task.examples(split)
        if rows:
            out[(task.name, split)] = encode_task_examples(task, tok, rows, max_length, prompt)
    return out


def write_json(path: Path, data: Any) -> None:
    """Write JSON to a temporary name, then rename (a crash never leaves half a file)."""
    from cramkit.io import write_json_atomic

    write_json_atomic(path, data)


def config_from(overrides: dict[str, Any] | None = None, base: FinetuneConfig | None = None) -> FinetuneConfig:
    """A FinetuneConfig from ``--set`` overrides (strict: unknown keys are errors) on top of ``base``."""
    data = to_dict(base) if base is not None else {}
    data.update(overrides or {})
    return from_dict(FinetuneConfig, data, "finetune")
