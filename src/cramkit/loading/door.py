"""The door: :func:`load` (``cramkit.load``) opens anything cramkit knows, :func:`load_torch` its torch model.

A path is told apart by :func:`~cramkit.loading.kinds.directory_kind` and read by the reader of its kind: an
export (``exports.py``), a cramkit model directory (``model_dir.py``), a run or one of its checkpoints
(``run.py``), a Hugging Face directory or ``hf:DIR`` (``hf.py``). Every torch model then gets the same
finish: its source, the tokenizer checked against the embedding, no truncation or padding set on the
tokenizer, eval mode, one task's head (``task``), the device."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from cramkit.backends.base import ExportedModel
from cramkit.errors import CramkitError
from cramkit.loading.common import check_vocab
from cramkit.loading.exports import open_export, refuse_export
from cramkit.loading.hf import load_hf
from cramkit.loading.kinds import directory_kind, is_export
from cramkit.loading.model_dir import for_task, load_model_dir
from cramkit.loading.run import load_run
from cramkit.model.loaded import MODEL_FILE, LoadedModel

if TYPE_CHECKING:  # torch is imported by the functions that need it: `cramkit --help` stays instant
    import torch

PathLike = str | os.PathLike


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
        return open_export(source, step=step, device=device, task=task, base=base, threads=threads)
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
        loaded = load_hf(text[3:], text)
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
            refuse_export(text, path, str(kind), purpose)
        if kind == "model":
            loaded = load_model_dir(path, base, _open_base)
        elif kind in ("run", "checkpoint"):
            loaded = load_run(path, step)
        elif kind == "hf":
            loaded = load_hf(text, text)
        else:
            _refuse_splits(text, path)
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
    check_vocab(loaded)
    loaded.tokenizer.no_truncation()
    loaded.tokenizer.no_padding()
    loaded.model.eval()
    if task is not None:
        loaded = for_task(loaded, task)
    if device is not None:
        loaded.to(device)
    return loaded


def _refuse_splits(text: str, path: Path) -> None:
    """A few-shot run's folder written before it held a model itself: one line naming its splits' models."""
    splits = sorted(p.name for p in path.glob("split-*") if (p / MODEL_FILE).is_file())
    if splits:
        names = ", ".join(f"{text}/{name}" for name in splits[:8]) + (", ..." if len(splits) > 8 else "")
        raise CramkitError(
            f"{text} is a few-shot run (cramkit finetune --few-shot) whose models are in its split folders: give one "
            f"of {names} (results.json scores each), or run the command again to keep the best one in {text}"
        )


def _open_base(base: PathLike) -> LoadedModel:
    """A deep-prompt directory's base model, given as a path: its torch model."""
    return load_torch(base, purpose="--base")
