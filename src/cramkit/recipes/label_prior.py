"""The label words' prior (issue 49): what a class is, said in words the backbone already reads, and a head that
starts from it.

Each class of a single-text task gets a description: the task's prompt with its text left out and the mask filled
by the class's label word (SST-2's built-in ``{text_a} It was [MASK] .`` with terrible/great: "It was terrible ." /
"It was great ."), or the user's own (``prior`` ``LABEL=TEXT,...``). A pair task of two classes gets the
similarity of its two texts instead (self-training's teacher only: ``distill/prior.py``).

:func:`head_init` starts fine-tuning's head there: row c of the linear head is the pooled embedding of class c's
description, normalised, less the classes' mean, and scaled by one temperature fitted on the training rows, so
that before any step the head answers what the descriptions' cosines answer (where the head reads the model's own
sentence vector: its mean pooling, or a pooler it was trained with). It is the sentence encoder's counterpart of
LM-BFF's prompt-based fine-tuning, whose head is the MLM head's rows of the label words: on SST-2 at K=16 from
all-MiniLM-L6-v2 the head so started scored 73.1 ± 4.1 over 5 splits against 67.5 ± 4.1 started at random
(bench/RESULTS.md, 2026-11-29).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from cramkit.data.prompts import MASK
from cramkit.errors import CramkitError
from cramkit.loading import LoadedModel
from cramkit.recipes.finetune_config import FinetuneConfig
from cramkit.tasks.registry import Example, Task

CALIBRATION_ROWS = 2000  # labelled rows a temperature (or a slope and an offset) is fitted on, at most
SIMILARITY = "similarity"


@dataclasses.dataclass(frozen=True)
class PriorSpec:
    """What the prior scores a row by: a description of each class (one text), or the similarity of a pair."""

    source: str
    descriptions: dict[str, str] | None = None  # None: the cosine of a pair's two texts

    @property
    def kind(self) -> str:
        return "descriptions" if self.descriptions is not None else SIMILARITY


def prior_spec(task: Task, cfg: FinetuneConfig, pair: bool) -> tuple[PriorSpec | None, str]:
    """The task's prior from the ``prior`` setting, or (None, why there is none); a setting that cannot fit the
    task is one line (CramkitError)."""
    from cramkit.data.prompts import parse_label_words
    from cramkit.tasks.prompts import builtin_prompt

    setting = str(cfg.prior).strip()
    names = [str(x) for x in (task.labels or [])]
    if setting == "none":
        return None, "prior none"
    if setting == SIMILARITY or (setting == "auto" and pair):
        if not pair:
            raise CramkitError(
                f"prior similarity: task {task.name} has one text per row; the similarity prior scores pairs "
                "(give LABEL=TEXT,... to describe its classes)"
            )
        if len(names) != 2:
            if setting == "auto":
                return None, f"task {task.name} pairs two texts in {len(names)} classes; the similarity prior needs 2"
            raise CramkitError(
                f"prior similarity: task {task.name} has {len(names)} classes; the similarity prior tells two "
                "apart (use prior none)"
            )
        return PriorSpec("the two texts' cosine"), ""
    if setting == "auto":
        builtin = builtin_prompt(task.name)
        given = given_label_names(task, cfg)
        if builtin is None:
            words = label_names(given) if given is not None else None  # the names given (label_names) first
            named = dict(zip(names, words.values(), strict=True)) if words is not None else label_names(names)
            if named is None:
                return None, f"task {task.name} has no built-in label words (give prior LABEL=TEXT,...)"
            out, source = named, "the label names"
        else:
            template, words = builtin
            if "{text_b}" in template:
                return None, f"task {task.name}'s prompt reads two texts; the label words' prior describes one"
            out = {label: _fill(template, word) for label, word in words.items()}
            source = "the built-in prompt"
    else:
        if pair:
            raise CramkitError(
                f"prior: task {task.name} pairs two texts; descriptions of its classes score one text (use prior "
                "similarity or none)"
            )
        out = parse_label_words(setting, "prior")
        given = given_label_names(task, cfg)
        if given is not None and set(out) == set(given):  # described by the names given (label_names)
            out = {names[given.index(k)]: v for k, v in out.items()}
        source = "the prior setting"
    if names and set(out) != set(names):
        raise CramkitError(
            f"prior: the descriptions name labels {sorted(out)}, task {task.name} has {names}; give one "
            "LABEL=TEXT per label"
        )
    return PriorSpec(source, {label: out[label] for label in (names or sorted(out))}), ""


def given_label_names(task: Task, cfg: FinetuneConfig) -> list[str] | None:
    """The names ``label_names`` gives the task's labels, in the labels' order (the model saved answers them), or
    None when it is not set; one line (CramkitError) for a setting that does not name each label once."""
    setting = str(cfg.label_names or "").strip()
    if not setting:
        return None
    labels = [str(x) for x in (task.labels or [])]
    if task.kind != "classification" or not labels:
        raise CramkitError(f"label_names names a classifier's labels; task {task.name} is a {task.kind} task")
    if cfg.method == "prompt":
        raise CramkitError(
            "label_names: a prompt model answers its labels through --label-words; leave label_names out"
        )
    items = [x.strip() for x in setting.split(",")]
    hint = f"give one name per label of {task.name} ({', '.join(labels[:8])}), e.g. label_names="
    hint += ",".join(f"{label}=NAME" for label in labels[:3]) + (",..." if len(labels) > 3 else "")
    if any("=" in x for x in items):
        pairs = [x.split("=", 1) for x in items]
        given = {k.strip(): v.strip() for k, v in (p if len(p) == 2 else (p[0], "") for p in pairs)}
        if len(given) != len(items) or set(given) != set(labels):
            raise CramkitError(f"label_names {setting[:200]!r} names labels {sorted(given)[:8]}: {hint}")
        names = [given[label] for label in labels]
    elif len(items) != len(labels):
        raise CramkitError(f"label_names {setting[:200]!r}: {len(items)} names for {len(labels)} labels; {hint}")
    else:
        names = items
    if any(not n or len(n) > 100 for n in names) or len(set(names)) != len(names):
        raise CramkitError(f"label_names {setting[:200]!r}: the names must be distinct and 1 to 100 characters; {hint}")
    return names


def first_lines(task: Task, cfg: FinetuneConfig, unlabelled: bool = False) -> None:
    """What a few-shot or self-training run says first (stderr), before it trains: ``label_names`` checked, and
    labels without words said with the flag that helps (:func:`no_words_line`)."""
    import sys

    from cramkit.recipes.finetune_model import trained_inputs

    given_label_names(task, cfg)
    said = no_words_line(task, cfg, trained_inputs(task) == "pairs", unlabelled)
    if said is not None:
        print(said, file=sys.stderr, flush=True)


def no_words_line(task: Task, cfg: FinetuneConfig, pair: bool, unlabelled: bool = False) -> str | None:
    """The first line of a run whose classes have no words (labels ``0``/``1``, ``prior`` auto): the head starts
    at random and self-training has no prior, and the flag that gives them words, with an example for the task's
    labels; None where the task has words, pairs two texts, or the user chose (``prior``, ``head_init random``)."""
    if str(cfg.prior).strip() != "auto" or pair or task.kind != "classification" or task.is_multiple_choice:
        return None
    if cfg.head_init == "random" and not unlabelled:
        return None
    if prior_spec(task, cfg, pair)[0] is not None:
        return None
    names = [str(x) for x in (task.labels or [])]
    if len(names) == 2:
        example = f'--set "prior={names[0]}=It was terrible.,{names[1]}=It was great."'
        example += f" (a review task whose {names[0]!r} is the negative class)"
        named = f"--set label_names={names[0]}=negative,{names[1]}=positive"
    else:
        example = '--set "prior=' + ",".join(f"{n}=A SENTENCE SAYING WHAT A {n} ROW IS" for n in names[:4])
        example += ',..."' if len(names) > 4 else '"'
        named = "--set label_names=" + ",".join(f"{n}=NAME" for n in names[:4]) + (",..." if len(names) > 4 else "")
    what = "the head starts at random"
    if unlabelled:
        what += " and --unlabelled has no prior to label with (without words for the classes it gained nothing)"
    return (
        f"finetune: the labels {' / '.join(repr(n) for n in names[:6])} of {task.name} are not words: {what}. "
        f"Describe each class, {example}, or name them, {named} (predictions then answer the names): "
        "descriptions started the head 5.6 points higher on SST-2 at K=16 (docs/few-labels.md)"
    )


_NUMBERED = re.compile(r"(label|class|cls|category|cat|c|l)?[\W_]*\d+", re.IGNORECASE)


def label_names(names: list[str]) -> dict[str, str] | None:
    """A task's own label names as its classes' descriptions (``positive``, ``not_spam`` -> "not spam", ``体育``),
    or None where any of them names nothing (``0``, ``LABEL_1``, ``class 3``, ``A``): the head and the prior then start
    from words the backbone reads. Where the names say nothing of the text (``early`` / ``late``), the check on the
    training rows leaves them out."""
    out = {}
    for name in names:
        text = " ".join(re.sub(r"[_\-]+", " ", name).split())
        if not any(ch.isalpha() for ch in text) or _NUMBERED.fullmatch(text) or (len(text) == 1 and text.isascii()):
            return None
        out[name] = text
    return out if len(out) >= 2 else None


def _fill(template: str, word: str) -> str:
    text = re.sub(r"\{[a-z_]+\}", " ", template).replace(MASK, word)
    return " ".join(text.split())


def head_init(
    task: Task, loaded: LoadedModel, cfg: FinetuneConfig, rows: list[Example], max_length: int
) -> tuple[np.ndarray | None, dict[str, Any]]:
    """The head's starting weights [classes, hidden] from the descriptions of ``task``'s classes, or None (and why)
    where there are none (``head_init random``, another method, a pair or multiple-choice or regression task, no
    descriptions) or where they answer the training ``rows`` no better than their largest class."""
    import torch

    from cramkit.model import forward
    from cramkit.recipes.calibrate import fit_temperature
    from cramkit.recipes.finetune_model import build_model, encode_task_examples, resolve_pooling, trained_inputs

    if cfg.head_init == "random":
        return None, {"used": False, "why": "head_init random"}
    if cfg.method != "head" or task.kind != "classification" or task.is_multiple_choice or task.is_regression:
        return None, {"used": False, "why": f"method {cfg.method} on a {task.kind} task"}
    spec, why = prior_spec(task, cfg, trained_inputs(task) == "pairs")
    if spec is None or spec.descriptions is None:
        return None, {"used": False, "why": why or "a pair task: its prior scores pairs, not a head's row"}
    desc = spec.descriptions
    pool = resolve_pooling(cfg, loaded)
    trained_pooler = getattr(loaded.model, "pooler", None) is not None or loaded.pooler_state is not None
    if pool.pooling == "cls" and pool.pooler_dense and not trained_pooler:
        why = f"{loaded.source} has no trained pooler: the head reads a layer fine-tuning starts at random"
        return None, {"used": False, "why": why}
    model = build_model(loaded, len(desc), cfg)
    model.classifier = torch.nn.Identity()  # the pooled vectors, through the model's own pooling
    runner = forward.TorchRunner(model, cfg.device, cfg.precision)
    hidden = int(loaded.config.hidden)
    anchors_rows = [Example(idx=i, text_a=t, text_b=None, label=i) for i, t in enumerate(desc.values())]
    labelled = rows[:CALIBRATION_ROWS]

    def pooled(examples: list[Example]) -> np.ndarray:
        enc = encode_task_examples(task, loaded.tokenizer, examples, max_length)
        batch = forward.default_batch_tokens(runner.device)
        return forward.logits(
            runner,
            enc,
            pad_id=loaded.pad_id,
            with_types=loaded.with_types,
            max_tokens=batch,
            max_rows=cfg.eval_batch_size,
            width=hidden,
        )

    anchors = pooled(anchors_rows)
    anchors /= np.linalg.norm(anchors, axis=1, keepdims=True).clip(1e-12)
    feats = pooled(labelled)
    norms = np.linalg.norm(feats, axis=1, keepdims=True).clip(1e-12)
    cos = (feats / norms) @ anchors.T
    y = np.asarray([int(e.label) for e in labelled])  # type: ignore[arg-type]
    temperature = fit_temperature(cos, y)
    right = float((cos.argmax(1) == y).mean())
    chance = max(1.0 / len(desc), float(np.bincount(y, minlength=len(desc)).max() / max(len(y), 1)))
    info: dict[str, Any] = {
        "descriptions": desc,
        "source": spec.source,
        "temperature": round(temperature, 6),
        "labelled_rows": len(y),
        "labelled_accuracy": round(right, 4),
    }
    if right <= chance:
        why = f"they answer {right:.0%} of the {len(y)} training rows right, no better than their largest class"
        return None, {**info, "used": False, "why": why}
    # logits = the calibrated cosines at the mean norm, less what every class shares (the softmax ignores it; left
    # in, descriptions that are nearly alike would put large equal logits on every class, and float noise with them)
    weight = (anchors - anchors.mean(0, keepdims=True)) / (temperature * float(norms.mean()))
    return weight.astype(np.float32), {**info, "used": True}


def head_init_line(info: dict[str, Any]) -> str:
    """The line a fine-tuning prints when its head starts from the descriptions."""
    words = " / ".join(repr(v) for v in info["descriptions"].values())
    return (
        f"finetune: the head starts from the classes' descriptions ({words}, {info['source']}): "
        f"{info['labelled_accuracy']:.0%} of the {info['labelled_rows']} training rows right before training "
        "(--set head_init=random to start at random)"
    )
