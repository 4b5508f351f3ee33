"""Fast inference: the batched engine (torch, through ``cramkit.model.forward``, or an export through its
format's runtime: ``cramkit.backends``, ONNX Runtime, CTranslate2, any registered one), export, predict.

Names are imported on first use, so that importing a module of this package does not load the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cramkit.lazy import lazy_names

if TYPE_CHECKING:
    from cramkit.infer.engine import ClassifyResult, Engine
    from cramkit.runtime import resolve_device

# what `cramkit export --target` picks for (cramkit.infer.export.cpu_target): cpu, the fastest for batch work
# (predict, embed, index build over files: long passes); cpu-serve, for a server answering many small requests
# (short passes, every one of another shape). Here, light, for the command's help
TARGETS = ("cpu", "cpu-serve")

__all__ = ["ClassifyResult", "Engine", "resolve_device"]
__getattr__ = lazy_names(
    __name__,
    {"ClassifyResult": "cramkit.infer.engine", "Engine": "cramkit.infer.engine", "resolve_device": "cramkit.runtime"},
)
