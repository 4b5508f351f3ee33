"""Fast inference: the batched engine (torch, through ``cramkit.model.forward``, or an export through its
format's runtime: ``cramkit.backends``, ONNX Runtime, CTranslate2, any registered one), export, predict.

Names are imported on first use, so that importing a module of this package does not load the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cramkit.infer.engine import ClassifyResult, Engine
    from cramkit.runtime import resolve_device

__all__ = ["ClassifyResult", "Engine", "resolve_device"]


def __getattr__(name: str) -> Any:
    if name in ("ClassifyResult", "Engine"):
        from cramkit.infer import engine

        return getattr(engine, name)
    if name == "resolve_device":
        from cramkit.runtime import resolve_device

        return resolve_device
    raise AttributeError(f"module 'cramkit.infer' has no attribute {name!r}")
