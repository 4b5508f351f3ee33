"""The model fine-tuning trains and what it reads: a task's rows encoded (one sequence per row, through a prompt's
template, or a pair per choice), the model each method builds on the encoder (a head, the MLM head through a
prompt, deep prompts), its pooling, and its logits for every row (:func:`predict`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cramkit.data.batching import (
    Encoded,
    EncodedChoices,
    encode_choice_examples,
    encode_examples,
    scores_to_choices,
)
from cramkit.errors import CramkitError
from cramkit.loading import LoadedModel
from cramkit.model import forward
from cramkit.model.architectures import pooler_activation
from cramkit.model.pooling import pooling_for, read_pooling
from cramkit.recipes.finetune_config import FinetuneConfig
from cramkit.tasks.registry import Example, Task

if TYPE_CHECKING:
    from cramkit.data.prompts import PromptSpec


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
    # a classifier's pooler keeps its activation; a new one takes the imported family's (exported under it)
    source_head = getattr(loaded.model, "head_cfg", None)
    head = ClassifierConfig(
        pooling=read_pooling(pool.pooling),
        pooler_dense=pool.pooler_dense,
        dropout=cfg.dropout,
        pooler_activation=getattr(source_head, "pooler_activation", pooler_activation(loaded.config.hf_model_type)),
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
    if pooler_state is not None and model.pooler is not None and pool.pooling == "cls":
        with torch.no_grad():
            model.pooler.weight.copy_(pooler_state["weight"])
            model.pooler.bias.copy_(pooler_state["bias"])
    return model


def resolve_pooling(cfg: FinetuneConfig, loaded: LoadedModel) -> FinetuneConfig:
    """``cfg`` with its pooling concrete for ``loaded`` (:func:`~cramkit.model.pooling.pooling_for`): auto is the
    model's own, and a model that declares none pools its first token through BERT's pooler (setfit's sentence
    vectors: their mean). No pooler after auto's mean (it never saw one), nor for setfit."""
    import dataclasses

    setfit = cfg.method == "setfit"
    pooling = pooling_for(loaded, cfg.pooling, undeclared="mean" if setfit else "cls")
    no_pooler = cfg.pooling == "auto" and (setfit or pooling == "mean")
    return dataclasses.replace(cfg, pooling=pooling, pooler_dense=cfg.pooler_dense and not no_pooler)


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
