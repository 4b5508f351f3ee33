"""Fast inference: the batched engine (torch), and the ONNX Runtime backend (``cramkit.infer.onnx``)."""

from cramkit.infer.engine import ClassifyResult, Engine
from cramkit.runtime import resolve_device

__all__ = ["ClassifyResult", "Engine", "resolve_device"]
