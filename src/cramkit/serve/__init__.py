"""The HTTP server (``cramkit serve``): FastAPI on uvicorn, a dynamic batcher per model, Prometheus metrics."""

from cramkit.serve.app import Limits, create_app
from cramkit.serve.server import build_engines, serve

__all__ = ["Limits", "build_engines", "create_app", "serve"]
