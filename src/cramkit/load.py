"""``cramkit.load``: the one door every later stage comes through.

    m = cramkit.load("runs/tiny")            # a pretraining run: its latest checkpoint (any world size)
    m = cramkit.load("runs/tiny/checkpoints/step-000300")
    m = cramkit.load("out/sst2")             # a fine-tuned model (cramkit finetune --out), a student, ...
    m = cramkit.load("hf:path/to/bert")      # a Hugging Face BERT directory (safetensors only)
    m = cramkit.load("exported/onnx")        # an export (ONNX, CTranslate2, any registered format)

The result carries the model (eval mode, on the CPU), its tokenizer, config and head: masked-LM,
classification (label names in logit order), multi-label, regression, multiple choice (a score per
(context, choice) pair), or a bare encoder. An export directory is opened by its format's backend
(``cramkit.backends``) into an :class:`~cramkit.backends.ExportedModel` with the same
description (kind, labels, tokenizer, limits, pooling) and ``runner()``: inference runs either the same way.
What needs the torch model (fine-tuning, distillation, export) calls :func:`load_torch`, which names the
model an export was made from instead.

A *model directory* is what :meth:`LoadedModel.save` writes and what fine-tuning and distillation
produce: ``cramkit-model.json`` (what to build, labels, task, limits; written last, so its presence means
the directory is complete; with the weights' SHA-256), ``model.safetensors`` and ``tokenizer/``.
Nothing here executes code found in a directory: weights are safetensors, metadata JSON, and the model
class comes from a fixed table, never from the file.
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cramkit import rundir
from cramkit.backends.base import KINDS as KINDS
from cramkit.backends.base import LOGIT_KINDS as LOGIT_KINDS
from cramkit.backends.base import ExportedModel
from cramkit.errors import CramkitError
from cramkit.io import json_loads, read_json
from cramkit.model.loaded import MODEL_FILE as MODEL_FILE
from cramkit.model.loaded import MODEL_FORMAT as MODEL_FORMAT
from cramkit.model.loaded import LoadedModel as LoadedModel

if TYPE_CHECKING:  # torch is imported by the functions that need it: `cramkit --help` stays instant
    import torch
    from torch import nn

    from cramkit.model.multitask import MultiTaskModel
    from cramkit.model.prompting import PrefixClassifier

POOLER_FILE = "pooler.safetensors"  # a run continued from a model with BERT's pooler keeps it here
# what a directory holds, by the file that marks it, tried in this order after the export formats'
# markers (cramkit.backends.markers(): onnx, ct2, and any registered format): the one table of them
DIRECTORY_KINDS: tuple[tuple[str, str], ...] = (
    ("model", MODEL_FILE),  # a fine-tuned model, a student: LoadedModel.save
    ("run", "config.yaml"),  # a pretraining run (cramkit.rundir)
    ("hf", "config.json"),  # a Hugging Face model directory (also cramkit export --format hf)
)
# architecture name -> "module:function(meta) -> nn.Module"; a fixed table, never read from a file
ARCHITECTURES = {"bilstm": "cramkit.model.students:build_from_meta"}
# cramkit's own encoder models: a head on the encoder, a prompt through the MLM head, deep prompts on a base
OWN_ARCHITECTURES = ("encoder", "prompt", "prefix")

PathLike = str | os.PathLike
# the fields of cramkit-model.json and their types: a crafted file gets one line, never a traceback
META_FIELDS = {
    "architecture": str,
    "model": dict,
    "head": dict,
    "num_labels": int,
    "labels": list,
    "task": str,
    "max_length": int,
    "pooling": ("mean", "cls"),
    "normalize": bool,
    "with_types": bool,
    "extra": dict,
    "sha256": dict,
}


# ---------------------------------------------------------------------------------------------------


def check_source(source: str, flag: str = "--from") -> None:
    """Fail before any data is read when the model cannot be had: a path that does not exist, or an ``hf:``
    hub id that cannot be downloaded (resolved, and cached, as :func:`load` resolves it). Every verb that
    takes a model checks it here, so the command line and Python give the same line."""
    if source.startswith("hf:"):
        from cramkit.model.hf import _resolve

        _resolve(source)
    elif not Path(source).expanduser().exists():
        raise CramkitError(
            f"{flag} {source}: no such directory; give a cramkit run directory (with config.yaml and "
            "checkpoints/), a model directory, a Hugging Face directory or hf:ORG/NAME (a hub id)"
        )


def directory_kind(path: PathLike) -> str | None:
    """What ``path`` is: an export format's name (onnx, ct2, ...), model, run, checkpoint (a run's step
    directory) or hf (see DIRECTORY_KINDS; ``hf:DIR`` is hf); None when it is none of them."""
    from cramkit import backends

    text = str(path)
    if text.startswith("hf:"):
        return "hf"
    path = Path(text).expanduser()
    if not path.is_dir():
        return None
    for kind, marker in (*backends.markers(), *DIRECTORY_KINDS):
        if (path / marker).is_file():
            return kind
    return "checkpoint" if _is_checkpoint(path) else None


def is_export(path: PathLike) -> bool:
    """Whether ``path`` is an export directory of a registered format (cramkit export --format onnx|ct2|...)."""
    from cramkit import backends

    return not str(path).startswith("hf:") and backends.kind_of(path) is not None


def load(
    source: PathLike,
    *,
    step: int | None = None,
    device: str | torch.device | None = None,
    task: str | None = None,
    base: PathLike | LoadedModel | None = None,
    threads: int | None = None,
) -> LoadedModel | ExportedModel:
    """Load any model cramkit knows: a run, a checkpoint, a model directory, ``hf:DIR`` or an export.

    An export directory (``cramkit export --format onnx|ct2``, or a registered format) is opened by its
    backend (threads: the runtime's CPU threads, default every core this process may use); the rest as
    :func:`load_torch` does (``threads`` applies to exports only)."""
    if is_export(source):
        given = [name for name, value in (("step", step), ("task", task), ("base", base)) if value is not None]
        if given:
            raise CramkitError(
                f"{source} is an export: {', '.join(given)} applies to the torch model it was exported from"
            )
        if device is not None and str(device) not in ("cpu", "auto"):
            raise CramkitError(f"{source} is an export; it runs on the CPU (device {device} given)")
        from cramkit import backends

        return backends.open_export(source, threads=threads)
    return load_torch(source, step=step, device=device, task=task, base=base)


def load_torch(
    source: PathLike,
    *,
    step: int | None = None,
    device: str | torch.device | None = None,
    task: str | None = None,
    base: PathLike | LoadedModel | None = None,
    purpose: str = "this",
) -> LoadedModel:
    """The torch model of a run, a checkpoint, a model directory or ``hf:DIR``; an export directory is
    refused in one line naming ``purpose`` (what needs the torch model) and the model to give instead.

    step: with a run directory, that checkpoint (``step-N``) instead of the latest. task: of a model
    trained on a mixture (one head per task), that task's model (a plain classifier sharing the encoder);
    of a single-task model, a check that it is the one it was trained on. base: of a deep-prompt directory
    (``finetune --method ptuning``), the base model it was trained on (a path, or a loaded model whose
    encoder is then shared, not copied); its encoder must have the checksum the directory records.
    """
    text = str(source)
    if text.startswith("hf:"):
        loaded = _load_hf(text[3:], text)
    else:
        path = Path(text).expanduser()
        if not path.exists():
            raise CramkitError(
                f"{text}: no such file or directory; give a run directory, a checkpoint, a model directory "
                "(cramkit finetune --out) or hf:DIR"
            )
        if not path.is_dir():
            raise CramkitError(f"{text} is a file; give the directory that holds it")
        kind = directory_kind(path)
        from cramkit import backends

        if kind in backends.names():
            fmt = backends.get(str(kind))
            raise CramkitError(
                f"{text} is an export in the {fmt.title} format (cramkit export --format {kind}): {purpose} needs "
                f"the torch model it was exported from ({_export_source(path / fmt.marker)}); an export runs with "
                f"`cramkit predict --from {text}`, `cramkit serve {text}`, `cramkit embed` or cramkit.load({text!r})"
            )
        if kind == "model":
            loaded = _load_model_dir(path, base)
        elif kind in ("run", "checkpoint"):
            loaded = _load_run(path, step)
        elif kind == "hf":
            loaded = _load_hf(text, text)
        else:
            raise CramkitError(
                f"{text}: not a cramkit run (config.yaml), model directory ({MODEL_FILE}) nor a Hugging Face "
                "directory (config.json); give the directory `cramkit pretrain --out` or `cramkit finetune --out` "
                "wrote, or hf:DIR"
            )
        if step is not None and kind != "run":
            raise CramkitError(f"--step applies to a run directory; {text} is not one")
    if base is not None and loaded.architecture != "prefix":
        raise CramkitError(f"--base applies to a deep-prompt directory (finetune --method ptuning); {text} is not one")
    loaded.source = text
    _check_vocab(loaded)
    loaded.tokenizer.no_truncation()
    loaded.tokenizer.no_padding()
    loaded.model.eval()
    if task is not None:
        loaded = for_task(loaded, task)
    if device is not None:
        loaded.to(device)
    return loaded


def _export_source(manifest: Path) -> str:
    """Where an export says it came from (its manifest's ``source``), for messages."""
    try:
        src = json_loads(manifest.read_text(encoding="utf-8")).get("source")
    except (OSError, ValueError, AttributeError):
        src = None
    return f"it names {src[:200]}" if isinstance(src, str) and src else "its manifest does not say which"


def load_directory_architecture(path: PathLike) -> str | None:
    """The ``architecture`` a model directory records (None: not a model directory, or unreadable)."""
    file = Path(str(path)) / MODEL_FILE
    try:
        meta = json_loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = meta.get("architecture", "encoder") if isinstance(meta, dict) else None
    return value if isinstance(value, str) else None


# ------------------------------------------------------------------------------------------ runs


def _is_checkpoint(path: Path) -> bool:
    return path.parent.name == "checkpoints" and rundir.is_run_dir(path.parent.parent)


def resolve_run_checkpoint(path: Path, step: int | None = None) -> tuple[Path, Path]:
    """(run directory, checkpoint directory) for a run (its latest, or ``step``) or a checkpoint path."""
    if _is_checkpoint(path):
        if step is not None:
            raise CramkitError(f"--step applies to a run directory; {path} is already a checkpoint")
        if not rundir.is_complete(path):
            raise CramkitError(f"{path} is an incomplete checkpoint; use a complete step-* directory")
        return path.parent.parent, path
    run = path
    found: Path | None
    if step is not None:
        found = rundir.checkpoints_dir(run) / rundir.step_dir_name(step)
        if not (found.is_dir() and rundir.is_complete(found)):
            have = [p.name for p in rundir.list_checkpoints(run)]
            raise CramkitError(
                f"{run}: no complete checkpoint for --step {step}; available: {', '.join(have) or 'none'}"
            )
        return run, found
    found = rundir.find_latest(run)
    if found is None:
        raise CramkitError(
            f"{run}: the run has no complete checkpoint yet; pretrain until one is saved "
            "(train.checkpoint_every) or give a checkpoint directory"
        )
    return run, found


def _checkpoint_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model's weights of a checkpoint (any world size): its model.safetensors, checksum verified."""
    return rundir.model_weights(checkpoint)


def _load_run(path: Path, step: int | None) -> LoadedModel:
    from cramkit.config import from_dict, load_yaml
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import MaskedLM

    run, checkpoint = resolve_run_checkpoint(path, step)
    try:
        section = load_yaml(run / "config.yaml").get("model")
    except CramkitError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt YAML file
        raise CramkitError(f"{run / 'config.yaml'} is not valid YAML ({exc}); restore the run's config") from None
    if not isinstance(section, dict):
        raise CramkitError(f"{run / 'config.yaml'} has no 'model:' section; is it a cramkit run?")
    cfg = from_dict(ModelConfig, section, "model")
    _check_size(cfg, run / "config.yaml")
    state = _checkpoint_weights(checkpoint)
    state = {k.replace("_orig_mod.", "").removeprefix("module."): v for k, v in state.items()}
    model = MaskedLM(cfg.replace(gradient_checkpointing=False))
    load_weights(model, state, f"checkpoint {checkpoint}", tied=cfg.tie_embeddings)
    from cramkit.text.tokenizer import load_tokenizer

    if not (run / "tokenizer").is_dir():
        raise CramkitError(f"{run}: no tokenizer/ directory; the run is incomplete")
    from cramkit.io import read_json_object

    # a run continued from a model with BERT's pooler (pretrain --from) keeps it: fine-tuning starts from it
    info = read_json_object(run / "run.json", "the run directory is damaged") if (run / "run.json").is_file() else {}
    pooler = load_pooler(run, info, cfg.hidden)
    return LoadedModel(
        model=model,
        kind="mlm",
        config=cfg,
        tokenizer=load_tokenizer(run / "tokenizer"),
        max_length=_max_length(cfg),
        pooling="mean",
        with_types=cfg.type_vocab_size > 0,
        extra={"run": str(run), "checkpoint": checkpoint.name, **_run_pooling(run)},
        pooler_state=pooler,
    )


def load_pooler(run: Path, info: dict[str, Any], hidden: int) -> dict[str, torch.Tensor] | None:
    """A continued run's kept pooler (``save_pooler``), its checksum verified; None when the run has none."""
    from cramkit.io import sha256_file
    from cramkit.model.hf import read_weights

    entry = info.get("pooler")
    file = run / POOLER_FILE
    if not entry:
        return None
    if not file.is_file():
        raise CramkitError(f"{run}: {POOLER_FILE} is missing (run.json records a kept pooler); the run is damaged")
    if not isinstance(entry, dict) or sha256_file(file) != entry.get("sha256"):
        raise CramkitError(
            f"{file} is corrupt (its SHA-256 differs from the one recorded in run.json); copy the run again"
        )
    state = read_weights(file)
    weight, bias = state.get("pooler.weight"), state.get("pooler.bias")
    if weight is None or bias is None or tuple(weight.shape) != (hidden, hidden) or tuple(bias.shape) != (hidden,):
        raise CramkitError(f"{file}: not a pooler of this run's model (hidden {hidden}); the run is damaged")
    return {"weight": weight, "bias": bias}


def _run_pooling(run: Path) -> dict[str, str]:
    """``{"st_pooling": ...}`` of a run continued from a sentence-transformers model (run.json records the
    model's own pooling; fine-tuning pools as it did), else nothing."""
    try:
        info = json_loads((run / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    value = info.get("pooling") if isinstance(info, dict) else None
    return {"st_pooling": value} if value in ("mean", "cls") else {}


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], what: str, *, tied: bool = False) -> None:
    """Load ``state`` into ``model``, or a CramkitError naming ``what`` when they do not fit each other;
    with ``tied``, tied MLM weights stored under one name only are found under either."""
    if tied:  # tied weights may be stored under either name only
        word, decoder = "encoder.embeddings.word.weight", "head.decoder.weight"
        if decoder not in state and word in state:
            state[decoder] = state[word]
        elif word not in state and decoder in state:
            state[word] = state[decoder]
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise CramkitError(
            f"{what}: the weights do not fit the model its config describes (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}); the weights and the config come from different models"
        )
    for k, ref in expected.items():
        if tuple(state[k].shape) != tuple(ref.shape):
            raise CramkitError(
                f"{what}: weight {k} has shape {tuple(state[k].shape)} but the config implies {tuple(ref.shape)}; "
                "the weights and the config come from different models"
            )
    model.load_state_dict(state, strict=True)


def _check_size(cfg: Any, file: Path) -> None:
    """Refuse, before allocating, a model (its config, or a module built on the meta device) too big for
    this machine's RAM to hold even its fp32 weights: a config read from a file (``cramkit-model.json``, a
    run's config.yaml, an HF config.json) may ask for any size. The parameter count is pretraining's."""
    from cramkit.model.encoder import config_parameters
    from cramkit.runtime import machine_memory

    params = config_parameters(cfg) if not hasattr(cfg, "parameters") else sum(p.numel() for p in cfg.parameters())
    have, where = machine_memory("cpu")
    if have is not None and params * 4 > have:
        raise CramkitError(
            f"{file} describes a model of about {params / 1e9:,.1f} billion parameters, needing at least "
            f"{params * 4 / 2**30:,.1f} GiB to load, but this machine has {have / 2**30:,.1f} GiB of {where}; the "
            "file is damaged or crafted, or the model is too big for this machine"
        )


def _max_length(cfg: Any) -> int:
    return 512 if cfg.position == "rope" else int(cfg.max_position)


# ------------------------------------------------------------------------------------ model dirs


def _load_model_dir(path: Path, base: PathLike | LoadedModel | None = None) -> LoadedModel:
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
        model, cfg, base_loaded = _build_prefix_model(meta, file, base, labels)
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
            _check_size(builder(meta), file)
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
    _check_size(cfg, file)
    model = PromptClassifier(cfg, spec.label_ids, spec.mask_id)
    model.spec = spec
    return model, cfg


def _build_prefix_model(
    meta: dict[str, Any], file: Path, base: PathLike | LoadedModel | None, labels: Any
) -> tuple[PrefixClassifier, Any, LoadedModel]:
    """A PrefixClassifier on ``base``'s encoder (shared), after checking that it is the base the directory
    names by checksum."""
    from cramkit.config import from_dict
    from cramkit.model.heads import ClassifierConfig
    from cramkit.model.prompting import PrefixClassifier, encoder_digest

    info = (meta.get("extra") or {}).get("base")
    if not (
        isinstance(info, dict)
        and isinstance(info.get("sha256"), str)
        and isinstance(info.get("prefix_len"), int)
        and 1 <= info["prefix_len"] <= 100_000
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
    base_loaded = base if isinstance(base, LoadedModel) else load_torch(base, purpose="--base")
    if base_loaded.encoder is None:
        raise CramkitError(f"--base {base_loaded.source}: it has no transformer encoder")
    if encoder_digest(base_loaded.encoder) != info["sha256"]:
        raise CramkitError(
            f"--base {base_loaded.source} is not the model {file.parent}'s prompts were trained on (its encoder's "
            f"checksum differs from {info['sha256'][:12]}, {named}); give that model"
        )
    head = from_dict(ClassifierConfig, meta.get("head") or {}, "head")
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
    from cramkit.config import from_dict
    from cramkit.model.encoder import Encoder, ModelConfig
    from cramkit.model.heads import ClassifierConfig, MaskedLM, MultipleChoice, SequenceClassifier

    cfg = from_dict(ModelConfig, meta.get("model") or {}, "model")
    _check_size(cfg, file)
    kind = meta["kind"]
    if kind == "mlm":
        return MaskedLM(cfg), cfg
    if kind == "encoder":
        return Encoder(cfg), cfg
    head = from_dict(ClassifierConfig, meta.get("head") or {}, "head")
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


# ------------------------------------------------------------------------------------- Hugging Face


# the module config names sentence-transformers has used for its Transformer module, newest first
ST_CONFIG_FILES = (
    "sentence_bert_config.json",
    "sentence_roberta_config.json",
    "sentence_distilbert_config.json",
    "sentence_camembert_config.json",
    "sentence_albert_config.json",
    "sentence_xlm-roberta_config.json",
)


def _st_pooling(root: Path) -> tuple[str | None, bool, int | None]:
    """sentence-transformers' pooling ("mean"/"cls"), whether it normalises, its max_seq_length.

    Both layouts are read: before v5 the pooling is a set of ``pooling_mode_*_tokens`` flags and the
    length ``max_seq_length`` in ``sentence_bert_config.json``; from v5 the pooling is ``pooling_mode``
    (a name) and the length the tokenizer's ``model_max_length`` (``tokenizer_config.json``). A pooling
    cramkit does not compute (max, last token, weighted mean, several at once) is one clear error, never a
    silently different embedding."""
    from cramkit.io import folder_file, read_json

    pooling, normalize, max_len = None, False, None
    modules = folder_file(root, "modules.json")
    if not modules.is_file():
        return pooling, normalize, max_len
    fix = "re-download the sentence-transformers model"
    try:
        for mod in read_json(modules, fix):
            kind = str(mod.get("type", ""))
            if kind.endswith("Pooling"):
                conf = folder_file(root, str(Path(str(mod.get("path", ""))) / "config.json"))
                if conf.is_file():
                    pooling = _st_pooling_mode(read_json(conf, fix), conf)
            elif kind.endswith("Normalize"):
                normalize = True
        for name in ST_CONFIG_FILES:
            if folder_file(root, name).is_file():
                max_len = int(read_json(root / name, fix).get("max_seq_length") or 0) or None
                break
        tok_conf = folder_file(root, "tokenizer_config.json")
        if max_len is None and tok_conf.is_file():
            value = read_json(tok_conf, fix).get("model_max_length")
            if isinstance(value, int) and 0 < value < 1_000_000:  # transformers writes 1e30 for "no limit"
                max_len = value
    except (ValueError, OSError, TypeError, AttributeError) as exc:
        raise CramkitError(f"{root}: sentence-transformers files are malformed ({exc})") from None
    return pooling, normalize, max_len


def _st_prompts(root: Path) -> dict[str, Any]:
    """``{"prompts": ..., "default_prompt_name": ...}`` of a sentence-transformers folder whose
    ``config_sentence_transformers.json`` names prompts (``query: ``); {} without any. Malformed: one line."""
    from cramkit.io import folder_file, read_json
    from cramkit.model import embedding_prompts

    conf = folder_file(root, "config_sentence_transformers.json")
    if not conf.is_file():
        return {}
    data = read_json(conf, "re-download the sentence-transformers model")
    prompts = data.get("prompts") if isinstance(data, dict) else None
    if not prompts:
        return {}
    default = data.get("default_prompt_name") or None
    embedding_prompts.check(prompts, default, str(conf))
    return {"prompts": dict(prompts), **({"default_prompt_name": default} if default else {})}


def _st_pooling_mode(conf: dict[str, Any], file: Path) -> str | None:
    mode = conf.get("pooling_mode")
    if mode is None:  # before v5: one flag per mode
        modes = [
            m
            for m in (
                "cls_token",
                "mean_tokens",
                "max_tokens",
                "mean_sqrt_len_tokens",
                "weightedmean_tokens",
                "lasttoken",
            )
            if conf.get(f"pooling_mode_{m}")
        ]
        mode = [m.removesuffix("_tokens").replace("cls_token", "cls") for m in modes]
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if mode == []:
        return None
    if mode in ("cls", "mean"):
        return mode
    raise CramkitError(
        f"{file}: sentence-transformers pooling {mode!r} is not one cramkit computes (cls or mean); its embeddings "
        "would differ from the model's own"
    )


def _hf_labels(hf: dict[str, Any], state: dict[str, Any]) -> tuple[str, int, list[str] | None]:
    """(kind, number of outputs, label names in logit order) of a Hugging Face sequence classifier."""
    problem = hf.get("problem_type")
    id2label = hf.get("id2label") or {}
    n = int(hf.get("num_labels") or len(id2label) or state["classifier.weight"].shape[0])
    kind = "regression" if problem == "regression" or n == 1 else "classifier"
    if problem == "multi_label_classification":
        kind = "multilabel"
    labels = None
    if kind != "regression":
        labels = [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(n)]
    return kind, n, labels


def _load_hf(name: str, text: str) -> LoadedModel:
    from cramkit.model.encoder import Encoder
    from cramkit.model.heads import ClassifierConfig, MaskedLM, MultipleChoice, SequenceClassifier
    from cramkit.model.hf import _read_hf_config, _resolve, load_hf_config, load_hf_encoder_state
    from cramkit.text.tokenizer import load_tokenizer

    root = _resolve(name)
    _, hf = _read_hf_config(root)
    if hf.get("model_type") == "cramkit":  # cramkit export --format hf of a non-BERT architecture
        return _load_cramkit_export(root, hf)
    cfg = load_hf_config(root)
    _check_size(cfg, root / "config.json")
    state = load_hf_encoder_state(root, cfg)
    enc_state = {k: v for k, v in state.items() if not k.startswith(("head.", "pooler.", "classifier."))}
    arch = (hf.get("architectures") or ["BertModel"])[0]
    labels = None
    head = None
    model: nn.Module
    if arch in ("BertForSequenceClassification", "BertForMultipleChoice") or "classifier.weight" in state:
        dropout = hf.get("classifier_dropout")
        head_cfg = ClassifierConfig(pooling="first", pooler_dense=True, dropout=float(dropout or cfg.dropout))
        if arch == "BertForMultipleChoice":
            kind, model = "multiple_choice", MultipleChoice(cfg, head_cfg)
        else:
            kind, n, labels = _hf_labels(hf, state)
            model = SequenceClassifier(cfg, n, head_cfg, multilabel=kind == "multilabel")
        if "classifier.weight" not in state or "pooler.weight" not in state:
            raise CramkitError(f"hf:{root}: a sequence classifier without classifier/pooler weights")
        full = {f"encoder.{k}": v for k, v in enc_state.items()}
        full |= {k: v for k, v in state.items() if k.startswith(("pooler.", "classifier."))}
        load_weights(model, full, f"hf:{root}")
        head = {"pooling": "first", "pooler_dense": True, "dropout": head_cfg.dropout}
    elif any(k.startswith("head.") for k in state) and "head.transform.0.weight" in state:
        kind = "mlm"
        model = MaskedLM(cfg)
        full = {f"encoder.{k}": v for k, v in enc_state.items()}
        full |= {k: v for k, v in state.items() if k.startswith("head.")}
        load_weights(model, full, f"hf:{root}", tied=cfg.tie_embeddings)
    else:
        kind = "encoder"
        model = Encoder(cfg)
        load_weights(model, dict(enc_state), f"hf:{root}")
    if not any((root / f).is_file() for f in ("tokenizer.json", "vocab.txt")):
        raise CramkitError(f"hf:{root}: no tokenizer.json or vocab.txt beside the weights")
    pooling, normalize, st_max = _st_pooling(root)
    max_length = _max_length(cfg)
    if st_max:
        max_length = min(max_length, st_max)
    return LoadedModel(
        model=model,
        kind=kind,
        config=cfg,
        tokenizer=load_tokenizer(root),
        labels=labels,
        max_length=max_length,
        pooling=pooling or ("cls" if kind in ("classifier", "multiple_choice") else "mean"),
        normalize=normalize,
        with_types=cfg.type_vocab_size > 0,
        head=head,
        extra={"hf_architecture": arch, **({"st_pooling": pooling} if pooling else {}), **_st_prompts(root)},
        weights_file=_single_weights_file(root),
        pooler_state=None
        if isinstance(model, SequenceClassifier) or "pooler.weight" not in state
        else {"weight": state["pooler.weight"], "bias": state["pooler.bias"]},
    )


def _single_weights_file(root: Path) -> Path | None:
    from cramkit.io import folder_file

    file = folder_file(root, "model.safetensors")
    return file if file.is_file() else None


def _load_cramkit_export(root: Path, hf: dict[str, Any]) -> LoadedModel:
    """A Hugging Face directory cramkit wrote with ``model_type: cramkit`` (its architecture has no BERT
    equivalent): the config's fields are ModelConfig's and the weights carry cramkit's own names. Its
    ``modeling_cramkit.py`` is never run."""
    import dataclasses

    from cramkit.config import from_dict
    from cramkit.model.encoder import Encoder, ModelConfig
    from cramkit.model.heads import ClassifierConfig, MaskedLM, SequenceClassifier
    from cramkit.model.hf import _weight_files, read_weights
    from cramkit.text.tokenizer import load_tokenizer

    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    values = dict(hf, tie_embeddings=hf.get("tie_word_embeddings", True))
    cfg = from_dict(ModelConfig, {k: v for k, v in values.items() if k in fields}, f"hf:{root} config.json")
    _check_size(cfg, root / "config.json")
    state: dict[str, Any] = {}
    for file in _weight_files(root):
        state.update(read_weights(file))
    arch = (hf.get("architectures") or ["CramkitModel"])[0]
    labels, head, what = None, None, f"hf:{root}"
    if arch == "CramkitForSequenceClassification":
        kind, n, labels = _hf_labels(hf, state)
        head_cfg = ClassifierConfig(
            pooling=hf.get("classifier_pooling", "first"),
            pooler_dense=bool(hf.get("classifier_pooler_dense", True)),
            dropout=cfg.dropout,
        )
        model: nn.Module = SequenceClassifier(cfg, n, head_cfg, multilabel=kind == "multilabel")
        load_weights(model, state, what)
        head = {
            "pooling": head_cfg.pooling,
            "pooler_dense": head_cfg.pooler_dense,
            "dropout": head_cfg.dropout,
        }
    elif arch == "CramkitForMaskedLM":
        kind, model = "mlm", MaskedLM(cfg)
        load_weights(model, state, what, tied=cfg.tie_embeddings)
    else:
        kind, model = "encoder", Encoder(cfg)
        load_weights(model, {k.removeprefix("encoder."): v for k, v in state.items()}, what)
    if not any((root / f).is_file() for f in ("tokenizer.json", "vocab.txt")):
        raise CramkitError(f"hf:{root}: no tokenizer.json or vocab.txt beside the weights")
    return LoadedModel(
        model=model,
        kind=kind,
        config=cfg,
        tokenizer=load_tokenizer(root),
        labels=labels,
        max_length=_max_length(cfg),
        pooling="cls" if head and head["pooling"] == "first" else "mean",
        with_types=cfg.type_vocab_size > 0,
        head=head,
        extra={"hf_architecture": arch, **_st_prompts(root)},
        weights_file=_single_weights_file(root),
    )


# ------------------------------------------------------------------------------------------ checks


def _check_vocab(loaded: LoadedModel) -> None:
    cfg = loaded.config
    rows = getattr(cfg, "vocab_size", None)
    if rows is None:
        return
    vocab = loaded.tokenizer.get_vocab_size(with_added_tokens=True)
    # equal sizes, or model rows padded up to a multiple of 64 for speed (fewer than 128 extra rows)
    if not (vocab == rows or (vocab < rows < vocab + 128 and rows % 64 == 0)):
        raise CramkitError(
            f"{loaded.source}: the tokenizer has {vocab} tokens but the model's embedding has {rows} rows; "
            "the tokenizer and weights come from different vocabularies. Keep the tokenizer saved with them"
        )
    for token in ("[CLS]", "[SEP]"):
        tid = loaded.tokenizer.token_to_id(token)
        if tid is None or tid >= rows:
            raise CramkitError(
                f"{loaded.source}: the tokenizer has no usable {token} token; cramkit needs a BERT-style "
                "vocabulary with [CLS], [SEP] and [PAD]"
            )


def remove_model_files(out: Path) -> None:
    """Delete what :meth:`LoadedModel.save` wrote in ``out`` (for an aborted save)."""
    for name in (MODEL_FILE, "model.safetensors"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "tokenizer", ignore_errors=True)
