"""What a directory is, said in one place: :func:`describe` (and :func:`directory_kind`, its kind alone, read
from marker files only). The table of kinds is :data:`DIRECTORY_KINDS` after the export formats' markers
(``cramkit.backends.markers()``: onnx, ct2, and any registered format); a run's ``checkpoints/step-N`` is a
checkpoint. Nothing here raises on a damaged directory: the reader of its kind names what is wrong."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cramkit import rundir
from cramkit.io import json_loads, json_text
from cramkit.model.loaded import MODEL_FILE

PathLike = str | os.PathLike
# what a directory holds, by the file that marks it, tried in this order after the export formats'
# markers (cramkit.backends.markers(): onnx, ct2, and any registered format): the one table of them
DIRECTORY_KINDS: tuple[tuple[str, str], ...] = (
    ("model", MODEL_FILE),  # a fine-tuned model, a student: LoadedModel.save
    ("run", "config.yaml"),  # a pretraining run (cramkit.rundir)
    ("hf", "config.json"),  # a Hugging Face model directory (also cramkit export --format hf)
)


@dataclass(frozen=True)
class Description:
    """What :func:`describe` says of a path.

    kind: an export format's name (onnx, ct2, ...), model, run, checkpoint or hf; None when it is none of them.
    architecture, model_kind: of a model directory (``cramkit-model.json``), its ``architecture`` (encoder,
    prompt, prefix, bilstm, ...) and its ``kind`` (mlm, classifier, ..., multitask); None for other kinds, or
    when the file cannot be read (loading it names why)."""

    kind: str | None
    architecture: str | None = None
    model_kind: str | None = None


def describe(path: PathLike) -> Description:
    """What ``path`` is (``hf:DIR`` is hf), and for a model directory its architecture and kind."""
    kind = directory_kind(path)
    if kind != "model":
        return Description(kind)
    meta = _model_meta(Path(str(path)).expanduser())
    arch = meta.get("architecture", "encoder") if meta is not None else None
    model_kind = meta.get("kind") if meta is not None else None
    return Description(
        kind,
        arch if isinstance(arch, str) else None,
        model_kind if isinstance(model_kind, str) else None,
    )


def directory_kind(path: PathLike) -> str | None:
    """What ``path`` is: an export format's name (onnx, ct2, ...), model, run, checkpoint (a run's step
    directory) or hf (see DIRECTORY_KINDS; ``hf:DIR`` is hf); None when it is none of them. Marker files
    only: :func:`describe` also reads a model directory's description."""
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
    return "checkpoint" if is_checkpoint(path) else None


def is_export(path: PathLike) -> bool:
    """Whether ``path`` is an export directory of a registered format (cramkit export --format onnx|ct2|...)."""
    from cramkit import backends

    return not str(path).startswith("hf:") and backends.kind_of(path) is not None


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a step directory of a run (``RUN/checkpoints/step-N``)."""
    return path.parent.name == "checkpoints" and rundir.is_run_dir(path.parent.parent)


def load_directory_architecture(path: PathLike) -> str | None:
    """The ``architecture`` a model directory records (None: not a model directory, or unreadable)."""
    return describe(path).architecture


def _model_meta(path: Path) -> dict[str, Any] | None:
    """A model directory's ``cramkit-model.json`` as a dict; None when it cannot be read or is not an object."""
    try:
        meta = json_loads(json_text(path / MODEL_FILE))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None
