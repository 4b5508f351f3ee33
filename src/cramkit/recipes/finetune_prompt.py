"""Prompt-based fine-tuning (``--method prompt``: PET / LM-BFF): the template and label words resolved for a task
and a model (:func:`resolve_prompt`, which also checks that the other methods fit the task), and the prompt's score
before any training (LM-BFF's zero-shot row: :func:`zero_shot`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from cramkit.errors import CramkitError
from cramkit.loading import LoadedModel
from cramkit.recipes.finetune_config import FinetuneConfig
from cramkit.recipes.finetune_model import build_model, encode_task_examples, predict, task_columns, trained_inputs
from cramkit.tasks.registry import Task

if TYPE_CHECKING:
    from cramkit.data.prompts import PromptSpec


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
        check_prefix_memory(loaded, cfg)
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


PREFIX_MEMORY_SHARE = 0.8  # of this machine's memory (the GPU's, or the RAM) deep prompts may take


def prefix_bytes(loaded: LoadedModel, cfg: FinetuneConfig, prefix_len: int) -> int:
    """Bytes deep prompts of ``prefix_len`` take at least, at fp32: the prefixes with their gradients and Adam's
    two moments, and the larger of a training step (every layer keeps, for the backward pass, its keys and
    values with the prefix in front and its attention weights over them, for ``batch_size`` rows) and a scoring
    pass (one layer's of those at a time, for ``eval_batch_size`` rows)."""
    m = loaded.config
    layers, hidden, heads = int(m.layers), int(m.hidden), int(m.heads)
    length = min(cfg.max_length, loaded.max_length)
    keys = length + prefix_len  # what every query attends to

    def one_layer(rows: int) -> int:
        return 4 * rows * keys * (2 * hidden + 2 * heads * length)  # keys and values; attention weights, softmax

    params = 4 * 4 * layers * 2 * prefix_len * hidden
    return params + max(layers * one_layer(cfg.batch_size), one_layer(cfg.eval_batch_size))


def check_prefix_memory(loaded: LoadedModel, cfg: FinetuneConfig) -> None:
    """One CramkitError line, before anything is allocated, when deep prompts of ``cfg.prefix_len`` need more
    than PREFIX_MEMORY_SHARE of this machine's memory (:func:`prefix_bytes`), naming the most that fits."""
    from cramkit.runtime import machine_memory

    have, what = machine_memory(cfg.device)
    need = prefix_bytes(loaded, cfg, cfg.prefix_len)
    if have is None or need <= PREFIX_MEMORY_SHARE * have:
        return
    base, step = prefix_bytes(loaded, cfg, 0), prefix_bytes(loaded, cfg, 1) - prefix_bytes(loaded, cfg, 0)
    most = int((PREFIX_MEMORY_SHARE * have - base) // max(step, 1))
    room = f"at most {most:,} fits here" if most >= 1 else "none fits at this batch_size: lower it too"
    raise CramkitError(
        f"--prefix-len {cfg.prefix_len:,}: deep prompts that long need about {need / 2**30:,.1f} GiB (each of the "
        f"{loaded.config.layers} layers' attention reads the {cfg.prefix_len:,} prefix keys for every row of a batch), "
        f"more than this machine's {have / 2**30:,.1f} GiB of {what} can hold; give a smaller --prefix-len (16 to "
        f"128 is usual; {room})"
    )


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
