"""The reader of a cramkit model directory: what :meth:`LoadedModel.save` writes and what fine-tuning and
distillation produce. ``cramkit-model.json`` (what to build, labels, task, limits; written last, so its
presence means the directory is complete; with the weights' SHA-256), ``model.safetensors`` and
``tokenizer/``. The model class comes from a fixed table (:data:`OWN_ARCHITECTURES`, :data:`ARCHITECTURES`),
never from the file. Also: a multitask model's heads (:func:`task_heads`) and one task's model of it
(:func:`for_task`)."""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cramkit.backends.base import KINDS
from cramkit.errors import CramkitError
from cramkit.io import read_json
from cramkit.loading.common import check_size, load_weights
from cramkit.model.loaded import MODEL_FILE, MODEL_FORMAT, LoadedModel
from cramkit.model.pooling import POOLINGS, read_head

if TYPE_CHECKING:  # torch is imported by the functions that need it: `cramkit --help` stays instant
    from torch import nn

    from cramkit.model.multitask import MultiTaskModel
    from cramkit.model.prompting import PrefixClassifier

PathLike = str | os.PathLike
OpenBase = Callable[[PathLike], LoadedModel]  # a deep-prompt directory's base, given as a path, opened
# architecture name -> "module:function(meta) -> nn.Module"; a fixed table, never read from a file
ARCHITECTURES = {"bilstm": "cramkit.model.students:build_from_meta"}
# cramkit's own encoder models: a head on the encoder, a prompt through the MLM head, deep prompts on a base
OWN_ARCHITECTURES = ("encoder", "prompt", "prefix")
# the fields of cramkit-model.json and their types: a crafted file gets one line, never a traceback
META_FIELDS = {
    "architecture": str,
    "model": dict,
    "head": dict,
    "num_labels": int,
    "labels": list,
    "task": str,
    "max_length": int,
    "pooling": POOLINGS,
    "normalize": bool,
    "with_types": bool,
    "extra": dict,
    "sha256": dict,
}


def load_model_dir(path: Path, base: PathLike | LoadedModel | None, open_base: OpenBase) -> LoadedModel:
    """The model a model directory holds (``cramkit-model.json``, ``model.safetensors``, ``tokenizer/``),
    built from the fixed table of architectures. base: of a deep-prompt directory, its base model (a loaded
    one, or a path that ``open_base`` opens as a torch model)."""
    from cramkit.io import check_fields, inside, sha256_file
    from cramkit.model.hf import read_weights
    from cramkit.text.tokenizer import load_tokenizer

    file = path / MODEL_FILE
    meta = read_json(file, "the model directory is damaged: write it again")
    if not isinstance(meta, dict) or meta.get("format") != MODEL_FORMAT:
        raise CramkitError(f"{file}: not a cramkit model description (format {MODEL_FORMAT} expected)")
    check_fields(meta, META_FIELDS, file, "the model directory is damaged or crafted: write it again")
    kind, arch = meta.get("kind"), meta.get("architecture", "encoder")
    if kind not in KINDS:
        raise CramkitError(f"{file}: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    if arch not in OWN_ARCHITECTURES and arch not in ARCHITECTURES:
        raise CramkitError(
            f"{file}: unknown architecture {arch!r}; known: {', '.join([*OWN_ARCHITECTURES, *sorted(ARCHITECTURES)])}"
        )
    try:  # the directory's files stay inside it: no link may make it read elsewhere
        weights, tok_dir = inside(path, "model.safetensors"), inside(path, "tokenizer")
    except ValueError as exc:
        raise CramkitError(f"{path}: {exc}; refusing to read it (a model directory's files stay inside it)") from None
    if not weights.is_file():
        raise CramkitError(f"{path}: model.safetensors is missing; the model directory is incomplete")
    want = (meta.get("sha256") or {}).get("model.safetensors")
    if want and sha256_file(weights) != want:
        raise CramkitError(
            f"{weights} is corrupt (its SHA-256 differs from the one recorded in {MODEL_FILE}); "
            "copy or write the model directory again"
        )
    state = read_weights(weights)
    labels = meta.get("labels")
    if labels is not None and not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
        raise CramkitError(f"{file}: 'labels' must be a list of strings")
    missing_tok = CramkitError(f"{path}: tokenizer/ is missing; the model directory is incomplete")
    tokenizer = None
    if arch == "encoder":
        model, cfg = _build_encoder_model(meta, file)
        load_weights(model, state, str(weights), tied=kind == "mlm" and cfg.tie_embeddings)
    elif arch == "prompt":  # its label words are read with its tokenizer
        if not tok_dir.is_dir():
            raise missing_tok
        tokenizer = load_tokenizer(tok_dir)
        model, cfg = _build_prompt_model(meta, file, tokenizer, labels)
        load_weights(model, state, str(weights), tied=cfg.tie_embeddings)
    elif arch == "prefix":
        model, cfg, base_loaded = _build_prefix_model(meta, file, base, labels, open_base)
        own = model.own_state()
        _check_own_weights(own, state, str(weights))
        model.load_state_dict(state, strict=False)
        tokenizer = base_loaded.tokenizer
    elif arch in ARCHITECTURES:
        module, func = ARCHITECTURES[arch].split(":")
        try:
            builder = getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError):
            raise CramkitError(f"{file}: architecture {arch!r} is not available in this cramkit") from None
        import torch

        with torch.device("meta"):  # its size first, allocating nothing
            check_size(builder(meta), file)
        model = builder(meta)
        cfg = meta.get("model")
        load_weights(model, state, str(weights))
    else:
        raise CramkitError(f"{file}: unknown architecture {arch!r}; known: encoder, {', '.join(sorted(ARCHITECTURES))}")
    if tokenizer is None:
        if not tok_dir.is_dir():
            raise missing_tok
        tokenizer = load_tokenizer(tok_dir)
    return LoadedModel(
        model=model,
        kind=kind,
        config=cfg,
        tokenizer=tokenizer,
        labels=labels,
        task=meta.get("task"),
        max_length=int(meta.get("max_length") or 512),
        pooling=meta.get("pooling") or "mean",
        normalize=bool(meta.get("normalize", False)),
        with_types=bool(meta.get("with_types", False)),
        architecture=arch,
        head=meta.get("head"),
        extra=meta.get("extra") or {},
        weights_file=weights,
        weights_sha256=want or None,
    )


def _build_prompt_model(meta: dict[str, Any], file: Path, tokenizer: Any, labels: Any) -> tuple[nn.Module, Any]:
    """A PromptClassifier from ``extra.prompt`` (template, label words), checked against the labels and the
    directory's own tokenizer."""
    from cramkit.config import from_dict
    from cramkit.data.prompts import prompt_from_meta
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.prompting import PromptClassifier

    prompt = (meta.get("extra") or {}).get("prompt")
    spec = prompt_from_meta(prompt, labels, tokenizer, file, "write the model directory again")
    cfg = from_dict(ModelConfig, meta.get("model") or {}, "model")
    check_size(cfg, file)
    model = PromptClassifier(cfg, spec.label_ids, spec.mask_id)
    model.spec = spec
    return model, cfg


def _build_prefix_model(
    meta: dict[str, Any], file: Path, base: PathLike | LoadedModel | None, labels: Any, open_base: OpenBase
) -> tuple[PrefixClassifier, Any, LoadedModel]:
    """A PrefixClassifier on ``base``'s encoder (shared), after checking that it is the base the directory
    names by checksum."""
    from cramkit.config import from_dict
    from cramkit.model.heads import ClassifierConfig
    from cramkit.model.prompting import MAX_PREFIX_LEN, PrefixClassifier, encoder_digest

    info = (meta.get("extra") or {}).get("base")
    if not (
        isinstance(info, dict)
        and isinstance(info.get("sha256"), str)
        and isinstance(info.get("prefix_len"), int)
        and 1 <= info["prefix_len"] <= MAX_PREFIX_LEN
    ):
        raise CramkitError(
            f"{file}: a deep-prompt directory needs extra.base (sha256, prefix_len); it is damaged "
            "or crafted: write it again"
        )
    named = str(info.get("source", "?"))
    if base is None:
        raise CramkitError(
            f"{file.parent} holds deep prompts for the base model {named} (encoder sha256 {info['sha256'][:12]}); "
            f"name the base: --base {named} (Python: cramkit.load(dir, base=...))"
        )
    base_loaded = base if isinstance(base, LoadedModel) else open_base(base)
    if base_loaded.encoder is None:
        raise CramkitError(f"--base {base_loaded.source}: it has no transformer encoder")
    if encoder_digest(base_loaded.encoder) != info["sha256"]:
        raise CramkitError(
            f"--base {base_loaded.source} is not the model {file.parent}'s prompts were trained on (its encoder's "
            f"checksum differs from {info['sha256'][:12]}, {named}); give that model"
        )
    head = from_dict(ClassifierConfig, read_head(meta.get("head")), "head")
    n = 1 if meta.get("kind") == "regression" else len(labels or [])
    if n < 1:
        raise CramkitError(f"{file}: a deep-prompt classifier needs labels")
    model = PrefixClassifier(base_loaded.config, n, head, info["prefix_len"], encoder=base_loaded.encoder)
    return model, base_loaded.config, base_loaded


def _check_own_weights(own: dict[str, Any], state: dict[str, Any], what: str) -> None:
    """A deep-prompt directory's weights are exactly the model's own (prefixes and head), shape for shape."""
    if set(own) != set(state):
        raise CramkitError(
            f"{what}: the weights do not fit the deep-prompt model its config describes (expected "
            f"{sorted(own)[:4]}, found {sorted(state)[:4]}); the directory is damaged or crafted"
        )
    for k, ref in own.items():
        if tuple(state[k].shape) != tuple(ref.shape):
            raise CramkitError(
                f"{what}: weight {k} has shape {tuple(state[k].shape)} but the config implies {tuple(ref.shape)}"
            )


def _build_encoder_model(meta: dict[str, Any], file: Path) -> tuple[nn.Module, Any]:
    """An encoder model (masked-LM, bare encoder, classifier, multiple choice, multitask) from its config."""
    from cramkit.config import from_dict
    from cramkit.model.encoder import Encoder, ModelConfig
    from cramkit.model.heads import ClassifierConfig, MaskedLM, MultipleChoice, SequenceClassifier

    cfg = from_dict(ModelConfig, meta.get("model") or {}, "model")
    check_size(cfg, file)
    kind = meta["kind"]
    if kind == "mlm":
        return MaskedLM(cfg), cfg
    if kind == "encoder":
        return Encoder(cfg), cfg
    head = from_dict(ClassifierConfig, read_head(meta.get("head")), "head")
    if kind == "multitask":
        from cramkit.model.multitask import MultiTaskModel

        heads = task_heads(meta, file)
        return MultiTaskModel(cfg, [h["num_labels"] for h in heads], head, [h["kind"] for h in heads]), cfg
    if kind == "multiple_choice":
        return MultipleChoice(cfg, head), cfg
    n = meta.get("num_labels") or len(meta.get("labels") or [])
    if kind == "regression":
        n = 1
    if not isinstance(n, int) or n < 1:
        raise CramkitError(f"{file}: a {kind} model needs num_labels or labels")
    return SequenceClassifier(cfg, n, head, multilabel=kind == "multilabel"), cfg


def task_heads(meta: dict[str, Any], file: PathLike) -> list[dict[str, Any]]:
    """A multitask model's heads (``extra.tasks``: name, kind, num_labels, labels), checked: a crafted file
    gets one line, never a traceback."""
    heads = (meta.get("extra") or {}).get("tasks")
    bad = CramkitError(
        f"{file}: 'extra.tasks' must list the heads (name, kind, num_labels, labels); the model "
        "directory is damaged or crafted: write it again"
    )
    if not isinstance(heads, list) or not heads:
        raise bad
    for h in heads:
        if not (
            isinstance(h, dict)
            and isinstance(h.get("name"), str)
            and h.get("kind") in ("classification", "regression", "multiple_choice")
            and isinstance(h.get("num_labels"), int)
            and 1 <= h["num_labels"] <= 1_000_000
        ):
            raise bad
        labels = h.get("labels")
        if labels is not None and not (
            isinstance(labels, list) and all(isinstance(x, str) for x in labels) and len(labels) == h["num_labels"]
        ):
            raise bad
    if len({h["name"] for h in heads}) != len(heads):
        raise bad
    return heads


def for_task(loaded: LoadedModel, task: str | None) -> LoadedModel:
    """The model of one task: a multitask model's head ``task`` as a plain classifier (sharing the weights),
    or ``loaded`` itself when it is a single model (``task``, when given, must be the one it was trained on)."""
    if loaded.kind != "multitask":
        if task is not None and loaded.task is not None and task != loaded.task:
            raise CramkitError(
                f"--task {task}: {loaded.source} is a model of {loaded.task}, not of {task}; leave out --task"
            )
        return loaded
    heads = task_heads(loaded.meta(), loaded.source)
    names = [h["name"] for h in heads]
    if task is None:
        raise CramkitError(f"{loaded.source} holds one head per task ({', '.join(names)}); choose one with --task NAME")
    short = {n.split("/")[-1]: n for n in names}
    name = task if task in names else short.get(task)
    if name is None:
        import difflib

        close = difflib.get_close_matches(task, names, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise CramkitError(f"--task {task}: {loaded.source} has no head for it{hint}; its tasks: {', '.join(names)}")
    i = names.index(name)
    h = heads[i]
    extra = {k: v for k, v in loaded.extra.items() if k != "tasks"}
    extra.update({k: h[k] for k in ("columns", "trained_inputs") if k in h})
    return LoadedModel(
        model=cast("MultiTaskModel", loaded.model).single(i).eval(),
        kind={"classification": "classifier"}.get(h["kind"], h["kind"]),
        config=loaded.config,
        tokenizer=loaded.tokenizer,
        labels=h.get("labels"),
        task=name,
        max_length=loaded.max_length,
        pooling=loaded.pooling,
        normalize=loaded.normalize,
        with_types=loaded.with_types,
        source=loaded.source,
        architecture=loaded.architecture,
        head=loaded.head,
        extra=extra,
    )


def copy_model(src: Path, out: Path) -> Path:
    """Copy the model directory ``src`` (what :meth:`LoadedModel.save` wrote) into ``out``, other files there kept:
    ``cramkit-model.json`` first out and last in, as a save does (a few-shot run's best split into its folder)."""
    from cramkit.io import atomic_path

    if not (src / MODEL_FILE).is_file():
        raise CramkitError(f"{src} holds no model ({MODEL_FILE}); run the command again to make it")
    (out / MODEL_FILE).unlink(missing_ok=True)
    with atomic_path(out / "model.safetensors") as tmp:
        shutil.copyfile(src / "model.safetensors", tmp)
    with atomic_path(out / "tokenizer") as tmp:
        shutil.copytree(src / "tokenizer", tmp)
    with atomic_path(out / MODEL_FILE) as tmp:
        shutil.copyfile(src / MODEL_FILE, tmp)
    return out


def remove_model_files(out: Path) -> None:
    """Delete what :meth:`LoadedModel.save` wrote in ``out`` (for an aborted save)."""
    for name in (MODEL_FILE, "model.safetensors"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "tokenizer", ignore_errors=True)
