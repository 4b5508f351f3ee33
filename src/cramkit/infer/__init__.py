"""Fast inference: the batched engine (torch, through ``cramkit.model.forward``), and the ONNX Runtime
(``cramkit.infer.onnx``) and CTranslate2 (``cramkit.infer.ct2``) backends."""

from cramkit.infer.engine import ClassifyResult, Engine
from cramkit.runtime import resolve_device

__all__ = ["ClassifyResult", "Engine", "resolve_device"]
