"""The server's guard: what a request may ask for and what it is told when it may not.

:class:`Limits` (the command line's ``--max-*`` and timeouts); :class:`Gate`, the ASGI middleware in front of
the app (API key, payload size, slow-body timeout, request metrics); :class:`ServerState` (the engines, their
batchers and the index's search queue, as lanes); admission to a lane (:func:`reserved`, :func:`queued`: a
full queue is 429, a request not answered in time 503); and the error answers: every refusal is JSON
``{"error": "...", "error_type": "..."}``, a 400 or a 5xx logs one rate-limited line, never a traceback.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import json
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from cramkit.backends.finite import NonFiniteOutput
from cramkit.errors import CramkitError
from cramkit.index.checks import DamagedIndex
from cramkit.infer.engine import InputTooLong
from cramkit.serve.batcher import Batcher, Job, Lane, Overloaded, SearchQueue, Stopped
from cramkit.serve.metrics import Metrics
from cramkit.serve.request import Limits

# open without the API key
OPEN_ROUTES = ("/health", "/ping", "/docs", "/openapi.json", "/docs/oauth2-redirect", "/redoc")


class LogLimiter:
    """One line to stderr per kind at most every ``every`` seconds, saying how many like it were left out."""

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self._last: dict[str, float] = {}
        self._skipped: collections.Counter[str] = collections.Counter()

    def __call__(self, kind: str, line: str) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, -self.every) < self.every:
            self._skipped[kind] += 1
            return
        self._last[kind] = now
        skipped = self._skipped.pop(kind, 0)
        more = f" (and {skipped} more like it in the last {self.every:g}s)" if skipped else ""
        print(f"cramkit serve: {line}{more}", file=sys.stderr, flush=True)


LOG = LogLimiter()


class ApiError(Exception):
    """A refusal: its status, its one-line message and its error_type (TEI's), with any extra headers."""

    def __init__(self, status: int, message: str, error_type: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.error_type, self.headers = status, message, error_type, headers or {}


def invalid(message: str, status: int = 422, error_type: str = "Validation") -> ApiError:
    """A request the server will not take: 422 unless said otherwise (413 over a limit, 400 unreadable)."""
    return ApiError(status, message, error_type)


def error_body(message: str, error_type: str) -> bytes:
    return json.dumps({"error": message, "error_type": error_type}).encode()


def _where(exc: BaseException) -> str:
    """file:line of the innermost frame of an exception's traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


# ------------------------------------------------------------------------------------------ state


class ServerState:
    """The engines, their batchers, the index's search queue, the limits and the metrics of one app; ``routes``:
    the paths it serves (the metrics' route label, the 404's list)."""

    def __init__(
        self,
        engines: dict[str, Any],
        *,
        max_wait_ms: float,
        limits: Limits,
        api_key: str | None,
        index: Any,
        index_path: str | None,
        routes: tuple[str, ...] = (),
    ) -> None:
        if not engines:
            raise CramkitError("give at least one model to serve")
        self.engines = engines
        self.default = next(iter(engines))
        self.limits = limits
        self.api_key = api_key or None
        self.index, self.index_path = index, index_path
        self.routes = routes
        self.metrics = Metrics()
        queue: dict[str, Any] = {
            "max_queue": limits.max_queue,
            "timeout_s": limits.request_timeout_s,
            "metrics": self.metrics,
        }
        self.batchers = {name: Batcher(eng, name, max_wait_ms=max_wait_ms, **queue) for name, eng in engines.items()}
        self.lanes: list[Lane] = list(self.batchers.values())
        self.search = SearchQueue(index, **queue) if index is not None else None
        if self.search is not None:
            self.lanes.append(self.search)
        self.started = time.time()
        self.shutting_down = False

    def pick(self, body: dict, request: Any) -> tuple[str, Any, Batcher]:
        """The model a request names (its body's ``model``, else ``?model=``, else the first served): 404 for
        any other."""
        name = body.get("model")
        if name is None:
            name = request.query_params.get("model")
        if name is None:
            name = self.default
        if not isinstance(name, str) or name not in self.engines:
            raise ApiError(
                404, f"unknown model {name!r}; this server has {', '.join(sorted(self.engines))}", "NotFound"
            )
        return name, self.engines[name], self.batchers[name]


def need(ok: bool, name: str, what: str) -> None:
    """422 unless the picked model can do what the route does."""
    if not ok:
        raise invalid(f"model {name!r} cannot do {what}")


# ------------------------------------------------------------------------------------------ the gate


class Gate:
    """ASGI middleware: API key, payload limit, slow-body timeout, request metrics.

    The body of a POST is read here in full (bounded by ``max_payload_bytes`` and ``body_timeout_s``)
    before any route sees it."""

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = self.state
        start = time.perf_counter()
        path = scope.get("path", "")
        route = path if path in state.routes or path in OPEN_ROUTES else "other"
        status = [500]

        async def send_wrapped(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            if state.api_key and path not in OPEN_ROUTES and not self._key_matches(headers):
                state.metrics.rejected.labels("api_key").inc()
                await send_error(
                    send_wrapped, 401, "missing or wrong API key: send 'Authorization: Bearer KEY'", "Unauthorized"
                )
                return
            if scope.get("method") != "POST":
                await self._call(scope, receive, send_wrapped)
                return
            body = await self._body(headers, receive, send_wrapped, status)
            if body is None:
                return
            replayed = False

            async def replay() -> dict:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": bytes(body), "more_body": False}
                return await receive()

            await self._call(scope, replay, send_wrapped)
        finally:
            state.metrics.observe(route, status[0], time.perf_counter() - start)

    def _key_matches(self, headers: dict[str, str]) -> bool:
        """The API key from ``Authorization: Bearer KEY`` or ``X-API-Key``, compared in constant time."""
        given = headers.get("x-api-key") or ""
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        return hmac.compare_digest(given.encode(), (self.state.api_key or "").encode())

    async def _body(self, headers: dict[str, str], receive: Any, send: Any, status: list[int]) -> bytearray | None:
        """The whole body of a POST, or None once the client has been answered (413 over the payload limit,
        408 too slow) or has gone (status 499)."""
        state = self.state
        limit = state.limits.max_payload_bytes
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            state.metrics.rejected.labels("payload").inc()
            await send_error(
                send,
                413,
                f"payload of {declared} bytes is over the limit of {limit} bytes; send fewer or shorter inputs",
                "Validation",
            )
            return None
        body = bytearray()
        more = True
        deadline = time.monotonic() + state.limits.body_timeout_s  # for the whole body
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                state.metrics.rejected.labels("slow_client").inc()
                await send_error(
                    send, 408, f"the request body did not arrive within {state.limits.body_timeout_s:g}s", "Validation"
                )
                return None
            if message["type"] == "http.disconnect":
                status[0] = 499
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                state.metrics.rejected.labels("payload").inc()
                await send_error(
                    send, 413, f"payload over the limit of {limit} bytes; send fewer or shorter inputs", "Validation"
                )
                return None
        return body

    async def _call(self, scope: dict, receive: Any, send: Any) -> None:
        """The app; an exception it lets out (Starlette has answered 500 already) becomes one log line."""
        try:
            await self.app(scope, receive, send)
        except Exception as exc:  # one line, not a traceback; the server keeps serving
            LOG(
                "internal",
                f"500 {scope.get('method')} {scope.get('path')}: {type(exc).__name__}: {exc} (at {_where(exc)})",
            )


async def send_error(send: Any, status: int, message: str, error_type: str, headers: dict | None = None) -> None:
    """An error answer sent on the raw ASGI channel (before the app has a request)."""
    body = error_body(message, error_type)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


# ------------------------------------------------------------------------------------------ admission

SHUTTING_DOWN = "the server is shutting down; retry on another replica"


def _overloaded(state: ServerState, exc: Overloaded) -> ApiError:
    state.metrics.rejected.labels("queue_full").inc()
    return ApiError(429, str(exc), "Overloaded", {"Retry-After": str(exc.retry_after)})


@contextlib.contextmanager
def reserved(state: ServerState, lane: Lane, n: int) -> Iterator[None]:
    """Room in ``lane`` for ``n`` inputs while the request is tokenised; 429 at once if there is none."""
    if state.shutting_down:
        raise ApiError(503, SHUTTING_DOWN, "Unhealthy")
    try:
        with lane.reserve(n):
            yield
    except Overloaded as exc:
        raise _overloaded(state, exc) from None


async def queued(state: ServerState, lane: Lane, req: Any) -> Any:
    """Submit ``req`` to ``lane`` and wait for its answer; each failure becomes its status."""
    if state.shutting_down:
        raise ApiError(503, SHUTTING_DOWN, "Unhealthy")
    try:
        lane.submit(req)
    except Overloaded as exc:
        raise _overloaded(state, exc) from None
    except Stopped:
        raise ApiError(503, SHUTTING_DOWN, "Unhealthy") from None
    try:
        return await asyncio.wait_for(req.future, state.limits.request_timeout_s)
    except TimeoutError:
        state.metrics.rejected.labels("timeout").inc()
        raise ApiError(
            503,
            f"no answer within {state.limits.request_timeout_s:g}s (the server is overloaded); retry later",
            "Overloaded",
            {"Retry-After": "1"},
        ) from None
    except InputTooLong as exc:
        raise invalid(str(exc), 413) from None
    except DamagedIndex as exc:  # the server's index, not the request: 500, and the server keeps serving
        raise ApiError(500, str(exc), "Backend") from None
    except NonFiniteOutput as exc:  # the model, not the request: 500 naming it, and the server keeps serving
        raise ApiError(500, f"model {getattr(lane, 'name', '?')!r} failed: {exc}", "Backend") from None
    except CramkitError as exc:
        raise invalid(str(exc)) from None
    except Exception as exc:  # the model failed: say so, keep serving
        raise ApiError(500, f"the model failed on this input ({type(exc).__name__}: {exc})", "Backend") from None


async def run(state: ServerState, name: str, batcher: Batcher, task: str, enc: Any, top_k: int = 5) -> Any:
    """``task`` ("embed", "classify", "fill_mask") on the tokenised inputs ``enc``, batched with other requests'."""
    loop = asyncio.get_running_loop()
    state.metrics.inputs.labels(name, task).inc(len(enc))
    return await queued(state, batcher, Job.make(task, enc, loop.create_future(), loop, top_k))


def answer_size(what: str, n: int, per: int, per_name: str, limit: int) -> int:
    """``n`` x ``per`` answer items, or 413 beyond ``limit``."""
    if n * per > limit:
        raise invalid(
            f"{what}: {n} x {per_name} {per} = {n * per} answer items; the limit is {limit} per request: "
            f"split the request or ask for a smaller {per_name}",
            413,
        )
    return n * per


# ------------------------------------------------------------------------------------------ error answers


async def api_error(request: Request, exc: ApiError) -> Response:
    if exc.status == 400 or exc.status >= 500:
        LOG(f"status {exc.status}", f"{exc.status} {request.method} {request.url.path}: {exc.message}")
    return Response(error_body(exc.message, exc.error_type), exc.status, exc.headers, "application/json")


async def http_error(request: Request, exc: Any) -> Response:
    """Starlette's own refusals (an unknown route, a wrong method) in the same JSON."""
    kind = "NotFound" if exc.status_code == 404 else "Validation"
    message = f"{request.method} {request.url.path}: {exc.detail}"
    if exc.status_code == 404:
        message += f"; routes: {', '.join(request.app.state.cramkit.routes)}, /docs"
    return Response(error_body(message, kind), exc.status_code, getattr(exc, "headers", None), "application/json")


async def validation_error(request: Request, exc: Any) -> Response:
    return Response(error_body(str(exc.errors())[:500], "Validation"), 422, None, "application/json")


async def internal_error(request: Request, exc: Exception) -> Response:
    return Response(error_body(f"internal error: {type(exc).__name__}", "Backend"), 500, None, "application/json")
