"""The HTTP server: FastAPI routes compatible with text-embeddings-inference (TEI) where they overlap.

Routes: ``POST /`` and ``POST /invocations`` (TEI's and SageMaker's: the route of the model's kind, which
huggingface_hub's ``InferenceClient(model=URL)`` calls), ``POST /embed`` (TEI), ``POST /predict`` (TEI; a
multiple-choice model takes ``{"text", "choices"}``), ``POST /v1/embeddings`` (OpenAI-shaped), ``POST
/tokenize`` (TEI), ``POST /rerank`` (TEI), ``POST /fill-mask``, ``POST /search`` (with an index), ``GET /info``,
``GET /health`` (and SageMaker's ``GET /ping``), ``GET /metrics`` (Prometheus), ``/docs`` (OpenAPI). Several
models are served by name: a ``"model"`` field in the body or a ``?model=`` query parameter picks one (default:
the first).

The server is in three rooms: :mod:`~cramkit.serve.guard` (limits, the ASGI gate in front of the app, admission
to the batchers, the error answers), :mod:`~cramkit.serve.bodies` (each request body declared once, on
:mod:`~cramkit.serve.declare`: its reading and its OpenAPI schema derive from that declaration) and
:mod:`~cramkit.serve.routes`; this module puts them together.

Every refusal is JSON ``{"error": "...", "error_type": "..."}`` with a 4xx/5xx status: 400 malformed JSON,
invalid UTF-8 or JSON Python cannot take as text (a lone surrogate escape, nesting too deep, an integer of
thousands of digits), 401 a missing or wrong API key, 404 an unknown model or route, 408 a client that
sends its body too slowly, 413 a payload, input count, input length or answer size over the limits, 422
wrong types or an empty list, 429 a full queue or one that could not answer before the timeout (with
Retry-After), 500 a model that answered NaN or infinity (naming it), 503 a request that waited longer than the
timeout or a server that is shutting down. Statuses
follow the exception's type, never its message. A 400 or a 5xx logs one line (rate-limited), never a
traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from cramkit.serve.guard import (
    LOG,
    ApiError,
    Gate,
    Limits,
    LogLimiter,
    ServerState,
    api_error,
    http_error,
    internal_error,
    validation_error,
)
from cramkit.serve.routes import ROUTES, TABLE

__all__ = ["LOG", "ROUTES", "Limits", "LogLimiter", "create_app"]


def create_app(
    engines: dict[str, Any],
    *,
    max_wait_ms: float = 5.0,
    limits: Limits | None = None,
    api_key: str | None = None,
    index: Any = None,
    index_path: str | None = None,
) -> Any:
    """A FastAPI app serving ``engines`` (name -> :class:`cramkit.infer.Engine`, each batching under its own
    ``max_batch_tokens``) behind its :class:`~cramkit.serve.guard.Gate`; the batchers start with it."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    import cramkit

    state = ServerState(
        engines,
        max_wait_ms=max_wait_ms,
        limits=limits or Limits(),
        api_key=api_key,
        index=index,
        index_path=index_path,
        routes=ROUTES,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        for lane in state.lanes:
            lane.start()
        yield
        state.shutting_down = True
        for lane in state.lanes:  # finish what is queued
            await asyncio.to_thread(lane.stop)

    app = FastAPI(
        title="cramkit serve",
        version=cramkit.__version__,
        description="Embeddings, classification and fill-mask; routes compatible with text-embeddings-inference.",
        lifespan=lifespan,
    )
    app.state.cramkit = state
    app.add_exception_handler(ApiError, api_error)  # type: ignore[arg-type]  # Starlette types handlers for Exception
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, internal_error)
    for route in TABLE:
        if route.body is None:
            app.add_api_route(route.path, route.endpoint, methods=["GET"], summary=route.summary)
        else:
            app.add_api_route(
                route.path, route.endpoint, methods=["POST"], summary=route.summary, openapi_extra=route.body.openapi()
            )
    return Gate(app, state)
