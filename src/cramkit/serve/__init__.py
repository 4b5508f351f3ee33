"""The HTTP server (``cramkit serve``): FastAPI on uvicorn, a dynamic batcher per model, Prometheus metrics.

Names are imported on first use: the command line reads the request (:mod:`cramkit.serve.request`) without the
[serve] extra."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cramkit.lazy import lazy_names

if TYPE_CHECKING:
    from cramkit.serve.app import create_app
    from cramkit.serve.request import Limits, ServeRequest
    from cramkit.serve.server import build_engines, serve

__all__ = ["Limits", "ServeRequest", "build_engines", "create_app", "serve"]
__getattr__ = lazy_names(
    __name__,
    {
        "Limits": "cramkit.serve.request",
        "ServeRequest": "cramkit.serve.request",
        "create_app": "cramkit.serve.app",
        "build_engines": "cramkit.serve.server",
        "serve": "cramkit.serve.server",
    },
)
