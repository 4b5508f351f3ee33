"""The reader of export directories (``cramkit export --format onnx|ct2``, or a registered format): opened by
their format's backend (``cramkit.backends``) into an :class:`~cramkit.backends.ExportedModel`, and the one
line for whatever needs the torch model an export was made from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from cramkit.backends.base import ExportedModel
from cramkit.errors import CramkitError
from cramkit.io import json_loads, json_text

if TYPE_CHECKING:
    import torch

PathLike = str | os.PathLike


def open_export(
    source: PathLike,
    *,
    step: int | None,
    device: str | torch.device | None,
    task: str | None,
    base: Any,
    threads: int | None,
) -> ExportedModel:
    """The export directory ``source`` opened by its backend; the torch model's options (step, task, base, a
    device other than the CPU) are refused in one line."""
    given = [name for name, value in (("step", step), ("task", task), ("base", base)) if value is not None]
    if given:
        raise CramkitError(f"{source} is an export: {', '.join(given)} applies to the torch model it was exported from")
    if device is not None and str(device) not in ("cpu", "auto"):
        raise CramkitError(f"{source} is an export; it runs on the CPU (device {device} given)")
    from cramkit import backends

    return backends.open_export(source, threads=threads)


def refuse_export(text: str, path: Path, kind: str, purpose: str) -> NoReturn:
    """The line for ``purpose`` (what needs the torch model) given the export directory ``path`` of format
    ``kind``: the model it was exported from, and the commands that run the export itself."""
    from cramkit import backends

    fmt = backends.get(kind)
    raise CramkitError(
        f"{text} is an export in the {fmt.title} format (cramkit export --format {kind}): {purpose} needs "
        f"the torch model it was exported from ({_export_source(path / fmt.marker)}); an export runs with "
        f"`cramkit predict --from {text}`, `cramkit serve {text}`, `cramkit embed` or cramkit.load({text!r})"
    )


def _export_source(manifest: Path) -> str:
    """Where an export says it came from (its manifest's ``source``), for messages."""
    try:
        src = json_loads(json_text(manifest)).get("source")
    except (OSError, ValueError, AttributeError):
        src = None
    return f"it names {src[:200]}" if isinstance(src, str) and src else "its manifest does not say which"
