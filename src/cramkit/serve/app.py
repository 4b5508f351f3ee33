"""The HTTP server: FastAPI routes compatible with text-embeddings-inference (TEI) where they overlap.

Routes: ``POST /embed`` (TEI), ``POST /predict`` (TEI; a multiple-choice model takes ``{"text",
"choices"}``), ``POST /v1/embeddings`` (OpenAI-shaped), ``POST /fill-mask``, ``POST /search`` (with an
index), ``GET /info``, ``GET /health``, ``GET /metrics`` (Prometheus), ``/docs`` (OpenAPI). Several models are
served by name: a ``"model"`` field in the body or a ``?model=`` query parameter picks one (default: the
first).

Every refusal is JSON ``{"error": "...", "error_type": "..."}`` with a 4xx/5xx status: 400 malformed JSON,
invalid UTF-8 or JSON Python cannot take as text (a lone surrogate escape, nesting too deep, an integer of
thousands of digits), 401 a missing or wrong API key, 404 an unknown model or route, 408 a client that
sends its body too slowly, 413 a payload, input count, input length or answer size over the limits, 422
wrong types or an empty list, 429 a full queue or one that could not answer before the timeout (with
Retry-After), 503 a request that waited longer than the timeout or a server that is shutting down. Statuses
follow the exception's type, never its message. A 400 or a 5xx logs one line (rate-limited), never a
traceback.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import hmac
import json
import sys
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from cramkit.errors import CramkitError
from cramkit.infer.engine import MIN_CHOICES, Engine, InputTooLong
from cramkit.io import SURROGATE_ESCAPE, lone_surrogate
from cramkit.serve.batcher import Batcher, Job, Lane, Overloaded, Search, SearchQueue, Stopped
from cramkit.serve.metrics import Metrics

ROUTES = (
    "/embed",
    "/predict",
    "/v1/embeddings",
    "/tokenize",
    "/rerank",
    "/fill-mask",
    "/search",
    "/info",
    "/health",
    "/metrics",
)
OPEN_ROUTES = ("/health", "/docs", "/openapi.json", "/docs/oauth2-redirect", "/redoc")
# requests this small are tokenised on the event loop; larger ones in a worker thread
INLINE_CHARS = 4000
# answers with more items than this (floats, candidates, hits) are built and serialised in a worker thread
INLINE_ITEMS = 20_000


@dataclass
class Limits:
    """What one request may ask for, and how long it may take."""

    max_payload_bytes: int = 2_000_000
    max_inputs: int = 1024
    max_input_chars: int = 50_000
    max_choices: int = 64  # choices of one multiple-choice input; beyond: 413
    max_queue: int = 8192  # inputs waiting per model; beyond: 429
    max_answer_items: int = 10_000  # fill-mask candidates (masks x top_k) or search hits (queries x k); 413
    request_timeout_s: float = 30.0  # waiting for the model; beyond: 503 (admission refuses earlier: 429)
    body_timeout_s: float = 10.0  # receiving the whole body; beyond: 408
    header_timeout_s: float = 10.0  # receiving a request's headers (from connecting or the last answer)
    idle_timeout_s: float = 5.0  # a keep-alive connection with no request
    max_connections: int = 1000  # open connections; beyond, the longest-waiting one without a request goes

    def check(self) -> None:
        """Each limit positive: one line naming the flag (``cramkit serve --max-inputs`` is ``max_inputs``)."""
        counts = ("max_inputs", "max_input_chars", "max_choices", "max_payload_bytes", "max_queue")
        for name in (*counts, "max_answer_items", "max_connections"):
            if getattr(self, name) < 1:
                raise CramkitError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        timeouts = (self.request_timeout_s, self.body_timeout_s, self.header_timeout_s, self.idle_timeout_s)
        if any(t <= 0 for t in timeouts):
            raise CramkitError(
                "--timeout, --body-timeout, --header-timeout and --idle-timeout must be positive, --max-wait-ms at "
                "least 0"
            )


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
    def __init__(self, status: int, message: str, error_type: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.error_type, self.headers = status, message, error_type, headers or {}


def _error_body(message: str, error_type: str) -> bytes:
    return json.dumps({"error": message, "error_type": error_type}).encode()


def _where(exc: BaseException) -> str:
    """file:line of the innermost frame of an exception's traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON (orjson: numpy arrays written directly, each float32 as its shortest exact decimal;
    10x json.dumps on a 16 x 384 answer)."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def _floats(a: np.ndarray) -> np.ndarray:
    """float32 rows, as :func:`dumps` writes them."""
    return np.ascontiguousarray(a, dtype=np.float32)


# ------------------------------------------------------------------------------------------ gate


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
        route = path if path in ROUTES or path in OPEN_ROUTES else "other"
        status = [500]

        async def send_wrapped(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            if state.api_key and path not in OPEN_ROUTES:
                given = headers.get("x-api-key") or ""
                auth = headers.get("authorization", "")
                if auth.lower().startswith("bearer "):
                    given = auth[7:].strip()
                if not hmac.compare_digest(given.encode(), state.api_key.encode()):
                    state.metrics.rejected.labels("api_key").inc()
                    await _send_error(
                        send_wrapped,
                        401,
                        "missing or wrong API key: send 'Authorization: Bearer KEY'",
                        "Unauthorized",
                    )
                    return
            if scope.get("method") == "POST":
                limit = state.limits.max_payload_bytes
                declared = headers.get("content-length")
                if declared is not None and (not declared.isdigit() or int(declared) > limit):
                    state.metrics.rejected.labels("payload").inc()
                    await _send_error(
                        send_wrapped,
                        413,
                        f"payload of {declared} bytes is over the limit of {limit} bytes; send fewer or shorter inputs",
                        "Validation",
                    )
                    return
                body = bytearray()
                more = True
                deadline = time.monotonic() + state.limits.body_timeout_s  # for the whole body
                while more:
                    try:
                        message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
                    except TimeoutError:
                        state.metrics.rejected.labels("slow_client").inc()
                        await _send_error(
                            send_wrapped,
                            408,
                            f"the request body did not arrive within {state.limits.body_timeout_s:g}s",
                            "Validation",
                        )
                        return
                    if message["type"] == "http.disconnect":
                        status[0] = 499
                        return
                    body += message.get("body", b"")
                    more = message.get("more_body", False)
                    if len(body) > limit:
                        state.metrics.rejected.labels("payload").inc()
                        await _send_error(
                            send_wrapped,
                            413,
                            f"payload over the limit of {limit} bytes; send fewer or shorter inputs",
                            "Validation",
                        )
                        return
                replayed = False

                async def replay() -> dict:
                    nonlocal replayed
                    if not replayed:
                        replayed = True
                        return {"type": "http.request", "body": bytes(body), "more_body": False}
                    return await receive()

                await self._call(scope, replay, send_wrapped)
            else:
                await self._call(scope, receive, send_wrapped)
        finally:
            state.metrics.observe(route, status[0], time.perf_counter() - start)

    async def _call(self, scope: dict, receive: Any, send: Any) -> None:
        """The app; an exception it lets out (Starlette has answered 500 already) becomes one log line."""
        try:
            await self.app(scope, receive, send)
        except Exception as exc:  # noqa: BLE001 - one line, not a traceback; the server keeps serving
            LOG(
                "internal",
                f"500 {scope.get('method')} {scope.get('path')}: {type(exc).__name__}: {exc} (at {_where(exc)})",
            )


async def _send_error(send: Any, status: int, message: str, error_type: str, headers: dict | None = None) -> None:
    body = _error_body(message, error_type)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


# ------------------------------------------------------------------------------------------ state


class ServerState:
    """The engines, their batchers, the index's search queue, the limits and the metrics of one app."""

    def __init__(
        self,
        engines: dict[str, Any],
        *,
        max_wait_ms: float,
        limits: Limits,
        api_key: str | None,
        index: Any,
        index_path: str | None,
    ) -> None:
        if not engines:
            raise CramkitError("give at least one model to serve")
        self.engines = engines
        self.default = next(iter(engines))
        self.limits = limits
        self.api_key = api_key or None
        self.index, self.index_path = index, index_path
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


def _state(request: Request) -> ServerState:
    return request.app.state.cramkit


# ------------------------------------------------------------------------------------------ parsing


async def _json(request: Any) -> dict:
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the body is not valid UTF-8 (byte {exc.start}); send UTF-8 JSON", "Validation") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON ({exc.msg} at position {exc.pos})", "Validation") from None
    except RecursionError:
        raise ApiError(400, "the body's JSON nests too deep to read; send flat JSON", "Validation") from None
    except ValueError:  # the only other failure of json.loads: an integer over Python's digit limit
        raise ApiError(
            400,
            f"the body holds an integer of over {sys.get_int_max_str_digits()} digits; send ordinary numbers",
            "Validation",
        ) from None
    if SURROGATE_ESCAPE.search(text) and lone_surrogate(body):
        raise ApiError(
            400,
            "the body holds a lone UTF-16 surrogate escape (such as \\ud800), which is not text; send valid Unicode",
            "Validation",
        )
    if not isinstance(body, dict):
        raise ApiError(422, f"the body must be a JSON object, not {type(body).__name__}", "Validation")
    return body


def _inputs(body: dict, limits: Limits, key: str = "inputs", pairs: bool = False) -> list[Any]:
    """``inputs``: a string or a list of them (with ``pairs``: a [a, b] pair, or a list of strings and
    pairs, as TEI's /predict reads it)."""
    if key not in body:
        raise ApiError(422, f"missing field '{key}': give a string or a list of strings", "Validation")
    x = body[key]
    if isinstance(x, str):
        items: list[Any] = [x]
    elif isinstance(x, list):
        if not x:
            raise ApiError(422, f"'{key}' is an empty list; give at least one input", "Empty")
        if pairs and len(x) == 2 and all(isinstance(s, str) for s in x):
            items = [(x[0], x[1])]  # TEI: ["a", "b"] is one pair
        else:
            items = x
    else:
        raise ApiError(422, f"'{key}' must be a string or a list of strings, not {_type(x)}", "Validation")
    if len(items) > limits.max_inputs:
        raise ApiError(
            413,
            f"{len(items)} inputs in one request; the limit is {limits.max_inputs}: split the request",
            "Validation",
        )
    out: list[Any] = []
    for i, it in enumerate(items):
        if isinstance(it, str):
            out.append(it)
        elif pairs and isinstance(it, (list, tuple)) and 1 <= len(it) <= 2 and all(isinstance(s, str) for s in it):
            out.append(it[0] if len(it) == 1 else (it[0], it[1]))
        else:
            want = "a string or a [text, text] pair" if pairs else "a string"
            raise ApiError(422, f"{key}[{i}] is {_type(it)}; each input must be {want}", "Validation")
        chars = len(it) if isinstance(it, str) else sum(len(s) for s in it)
        if chars > limits.max_input_chars:
            raise ApiError(
                413,
                f"{key}[{i}] has {chars} characters; the limit is {limits.max_input_chars} per input",
                "Validation",
            )
    return out


def _type(x: Any) -> str:
    return {
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
    }.get(type(x), "null" if x is None else type(x).__name__)


def _flag(body: dict, key: str, default: bool) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(422, f"'{key}' must be true or false, not {_type(v)}", "Validation")
    return v


def _int(body: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ApiError(422, f"'{key}' must be an integer from {lo} to {hi}", "Validation")
    return v


# ------------------------------------------------------------------------------------------ running


async def _tokenize(engine: Any, items: list[Any], truncate: bool) -> Any:
    chars = sum(len(x) if isinstance(x, str) else len(x[0]) + len(x[1]) for x in items)
    try:
        if chars <= INLINE_CHARS:
            return engine.tokenize(items, truncate=truncate)
        return await run_in_threadpool(lambda: engine.tokenize(items, truncate=truncate))
    except InputTooLong as exc:
        raise ApiError(413, str(exc), "Validation") from None
    except CramkitError as exc:
        raise ApiError(422, str(exc), "Validation") from None


def _overloaded(state: ServerState, exc: Overloaded) -> ApiError:
    state.metrics.rejected.labels("queue_full").inc()
    return ApiError(429, str(exc), "Overloaded", {"Retry-After": str(exc.retry_after)})


@contextlib.contextmanager
def _reserved(state: ServerState, lane: Lane, n: int) -> Iterator[None]:
    """Room in ``lane`` for ``n`` inputs while the request is tokenised; 429 at once if there is none."""
    if state.shutting_down:
        raise ApiError(503, "the server is shutting down; retry on another replica", "Unhealthy")
    try:
        with lane.reserve(n):
            yield
    except Overloaded as exc:
        raise _overloaded(state, exc) from None


async def _queued(state: ServerState, lane: Lane, req: Any) -> Any:
    """Submit ``req`` to ``lane`` and wait for its answer; each failure becomes its status."""
    if state.shutting_down:
        raise ApiError(503, "the server is shutting down; retry on another replica", "Unhealthy")
    try:
        lane.submit(req)
    except Overloaded as exc:
        raise _overloaded(state, exc) from None
    except Stopped:
        raise ApiError(503, "the server is shutting down; retry on another replica", "Unhealthy") from None
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
        raise ApiError(413, str(exc), "Validation") from None
    except CramkitError as exc:
        raise ApiError(422, str(exc), "Validation") from None
    except Exception as exc:  # noqa: BLE001 - the model failed: say so, keep serving
        raise ApiError(500, f"the model failed on this input ({type(exc).__name__}: {exc})", "Backend") from None


async def _run(state: ServerState, name: str, batcher: Batcher, task: str, enc: Any, top_k: int = 5) -> Any:
    loop = asyncio.get_running_loop()
    state.metrics.inputs.labels(name, task).inc(len(enc))
    return await _queued(state, batcher, Job.make(task, enc, loop.create_future(), loop, top_k))


def _answer_size(what: str, n: int, per: int, per_name: str, limit: int) -> int:
    """``n`` x ``per`` answer items, or 413 beyond ``limit``."""
    if n * per > limit:
        raise ApiError(
            413,
            f"{what}: {n} x {per_name} {per} = {n * per} answer items; the limit is {limit} per request: "
            f"split the request or ask for a smaller {per_name}",
            "Validation",
        )
    return n * per


async def _response(build: Any, size: int, truncated: np.ndarray | None = None, status: int = 200) -> Response:
    """JSON of ``build()`` (a payload or a function making one); built and serialised in a worker thread
    when the answer holds more than ``INLINE_ITEMS`` items, so that the event loop keeps answering."""

    def body() -> bytes:
        return dumps(build() if callable(build) else build)

    data = await run_in_threadpool(body) if size > INLINE_ITEMS else body()
    headers = {}
    if truncated is not None and truncated.any():
        idx = np.flatnonzero(truncated)
        headers["x-truncated-inputs"] = ",".join(map(str, idx[:100].tolist()))
    return Response(data, status_code=status, media_type="application/json", headers=headers)


# ------------------------------------------------------------------------------------------ routes


async def embed(request: Request) -> Response:
    state = _state(request)
    body = await _json(request)
    name, engine, batcher = state.pick(body, request)
    _need(engine.can_embed, name, "embeddings")
    items = _inputs(body, state.limits)
    normalize = _flag(body, "normalize", True)
    truncate = _flag(body, "truncate", True)
    pooling = _pooling(engine, body.get("pooling"))
    dims = _dimensions(engine, body)
    items = _with_prompt(engine, body, items)
    with _reserved(state, batcher, len(items)):
        enc = await _tokenize(engine, items, truncate)
    mean, cls = await _run(state, name, batcher, "embed", enc)
    vectors = engine.finish_embeddings(mean if pooling == "mean" else cls, normalize, dims)
    return await _response(lambda: _floats(vectors), vectors.size, enc.truncated)


async def rerank(request: Request) -> Response:
    """TEI's /rerank: a cross-encoder scores (query, text) for every text; the texts from the most relevant,
    ``[{"index", "score"[, "text"]}, ...]``."""
    state = _state(request)
    body = await _json(request)
    name, engine, batcher = state.pick(body, request)
    _need(
        engine.can_rerank,
        name,
        f"reranking (/rerank): a cross-encoder fine-tuned on pairs; it is a {engine.kind} model",
    )
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise ApiError(422, "'query' must be a non-empty string", "Validation")
    texts = _inputs(body, state.limits, key="texts")
    raw = _flag(body, "raw_scores", False)
    with_text = _flag(body, "return_text", False)
    truncate = _flag(body, "truncate", True)
    if len(query) > state.limits.max_input_chars:
        raise ApiError(
            413, f"'query' has {len(query)} characters; the limit is {state.limits.max_input_chars}", "Validation"
        )
    pairs = [(query, t) for t in texts]
    with _reserved(state, batcher, len(pairs)):
        enc = await _tokenize(engine, pairs, truncate)
    logits = await _run(state, name, batcher, "classify", enc)

    def payload() -> Any:
        scores = engine.relevance(logits, raw)
        order = np.argsort(-scores, kind="stable")
        return [
            {"index": int(i), "score": float(scores[i]), **({"text": texts[i]} if with_text else {})} for i in order
        ]

    return await _response(payload, logits.size, enc.truncated)


async def tokenize(request: Request) -> Response:
    """TEI's /tokenize: per input, its tokens as the model reads them (id, text, special, start and stop
    offsets in characters; null for a special token), cut at the model's limit when ``truncate``."""
    state = _state(request)
    body = await _json(request)
    name, engine, _ = state.pick(body, request)
    items = _inputs(body, state.limits)
    special = _flag(body, "add_special_tokens", True)
    truncate = _flag(body, "truncate", True)
    if engine.can_embed:  # the tokens /embed reads: the prompt first
        items = _with_prompt(engine, body, items)
    from cramkit.text.tokenizer import encode_batch

    def run() -> list[list[dict[str, Any]]]:
        out = []
        for enc in encode_batch(engine.tokenizer, items, add_special_tokens=special):
            rows = []
            for tid, tok, (start, stop), sp in zip(
                enc.ids, enc.tokens, enc.offsets, enc.special_tokens_mask, strict=True
            ):
                rows.append(
                    {
                        "id": int(tid),
                        "text": tok,
                        "special": bool(sp),
                        "start": None if sp else int(start),
                        "stop": None if sp else int(stop),
                    }
                )
            if truncate and len(rows) > engine.max_length:
                rows = rows[: engine.max_length - 1] + rows[-1:] if special else rows[: engine.max_length]
            out.append(rows)
        return out

    result = await run_in_threadpool(run)
    return Response(json.dumps(result), 200, None, "application/json")


def _with_prompt(engine: Engine, body: dict[str, Any], items: list[Any]) -> list[Any]:
    """The inputs with the request's ``prompt_name`` (TEI's field; default: the model's default prompt, if
    any) put before each; an unknown name is a 422 naming the model's prompts."""
    name = body.get("prompt_name")
    if name is not None and not isinstance(name, str):
        raise ApiError(422, "'prompt_name' must be a string (one of the model's prompts, /info) or null", "Validation")
    try:
        return engine.with_prompt(items, name)
    except CramkitError as exc:
        raise ApiError(422, f"'prompt_name': {exc}", "Validation") from None


def _dimensions(engine: Engine, body: dict[str, Any]) -> int | None:
    """The request's ``dimensions``: the model's size, or one of its Matryoshka dimensions (else 422)."""
    try:
        return engine.check_dimensions(body.get("dimensions"))
    except CramkitError as exc:
        raise ApiError(422, f"'dimensions': {exc}", "Validation") from None


async def openai_embeddings(request: Request) -> Response:
    state = _state(request)
    body = await _json(request)
    name, engine, batcher = state.pick(body, request)
    _need(engine.can_embed, name, "embeddings")
    items = _inputs(body, state.limits, key="input")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise ApiError(422, "'encoding_format' must be 'float' or 'base64'", "Validation")
    dims = _dimensions(engine, body)
    items = _with_prompt(engine, body, items)
    with _reserved(state, batcher, len(items)):
        enc = await _tokenize(engine, items, True)
    mean, cls = await _run(state, name, batcher, "embed", enc)
    vectors = engine.finish_embeddings(mean if engine.pooling == "mean" else cls, True, dims)
    tokens = int(enc.lengths.sum())

    def payload() -> dict[str, Any]:
        if fmt == "base64":
            rows: Any = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
        else:
            rows = _floats(vectors)
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)],
            "model": name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    return await _response(payload, vectors.size, enc.truncated)


async def predict(request: Request) -> Response:
    state = _state(request)
    body = await _json(request)
    name, engine, batcher = state.pick(body, request)
    if engine.can_choose:
        return await _predict_choices(state, body, name, engine, batcher)
    _need(engine.can_classify, name, "classification (/predict); it is a " + engine.kind + " model")
    single = isinstance(body.get("inputs"), str) or (
        isinstance(body.get("inputs"), list)
        and len(body["inputs"]) == 2
        and all(isinstance(s, str) for s in body["inputs"])
    )
    if single and not isinstance(body["inputs"], str) and engine.trained_inputs == "single":
        raise ApiError(
            422,
            f"model {name} was fine-tuned on single texts, and a flat list of two strings is one text pair (TEI's "
            'convention): send [["first"], ["second"]] for two texts, or [["text", "text b"]] for a pair',
            "Validation",
        )
    items = _inputs(body, state.limits, pairs=True)
    raw = _flag(body, "raw_scores", False)
    truncate = _flag(body, "truncate", True)
    with _reserved(state, batcher, len(items)):
        enc = await _tokenize(engine, items, truncate)
    logits = await _run(state, name, batcher, "classify", enc)

    def payload() -> Any:
        out = _predictions(engine, logits, raw)
        return out[0] if single else out

    return await _response(payload, logits.size, enc.truncated)


def _choice_inputs(body: dict, limits: Limits) -> tuple[bool, list[str], list[list[str]]]:
    """A multiple-choice model's inputs: ``{"text": context, "choices": [...]}`` (the body itself, or its
    ``inputs``) or a list of them -> (single, contexts, choices)."""
    x = body.get("inputs", body if "text" in body or "choices" in body else None)
    if x is None:
        raise ApiError(
            422,
            'missing field \'inputs\': give {"text": context, "choices": [choice, ...]} or a list of them',
            "Validation",
        )
    single = isinstance(x, dict)
    items = [x] if single else x
    if not isinstance(items, list):
        raise ApiError(
            422,
            f"'inputs' must be an object {{text, choices}} or a list of them, not {_type(x)}",
            "Validation",
        )
    if not items:
        raise ApiError(422, "'inputs' is an empty list; give at least one input", "Empty")
    if len(items) > limits.max_inputs:
        raise ApiError(
            413,
            f"{len(items)} inputs in one request; the limit is {limits.max_inputs}: split the request",
            "Validation",
        )
    contexts: list[str] = []
    choices: list[list[str]] = []
    for i, it in enumerate(items):
        where = "the input" if single else f"inputs[{i}]"
        if not isinstance(it, dict) or not isinstance(it.get("text"), str):
            raise ApiError(422, f"{where} must be an object with a 'text' string and a 'choices' list", "Validation")
        cs = it.get("choices")
        if not isinstance(cs, list):
            raise ApiError(422, f"{where}: 'choices' must be a list of strings, not {_type(cs)}", "Validation")
        bad = next((c for c in cs if not isinstance(c, str)), "")
        if not isinstance(bad, str):
            raise ApiError(422, f"{where}: each choice must be a string, not {_type(bad)}", "Validation")
        if len(cs) < MIN_CHOICES:
            raise ApiError(422, f"{where} has {len(cs)} choice(s); give at least {MIN_CHOICES}", "Validation")
        if len(cs) > limits.max_choices:
            raise ApiError(413, f"{where} has {len(cs)} choices; the limit is {limits.max_choices}", "Validation")
        chars = len(it["text"]) + sum(len(c) for c in cs)
        if chars > limits.max_input_chars:
            raise ApiError(
                413,
                f"{where} has {chars} characters; the limit is {limits.max_input_chars} per input",
                "Validation",
            )
        contexts.append(it["text"])
        choices.append(cs)
    rows = sum(len(c) for c in choices)
    if rows > limits.max_inputs:
        raise ApiError(
            413,
            f"{rows} (context, choice) pairs in one request; the limit is {limits.max_inputs}: split the request",
            "Validation",
        )
    return single, contexts, choices


async def _predict_choices(state: ServerState, body: dict, name: str, engine: Any, batcher: Batcher) -> Response:
    """/predict of a multiple-choice model: per input the chosen choice's index, its text, and every choice's
    probability (with ``raw_scores``: their scores too)."""
    single, contexts, choices = _choice_inputs(body, state.limits)
    raw = _flag(body, "raw_scores", False)
    truncate = _flag(body, "truncate", True)
    rows = sum(len(c) for c in choices)
    chars = sum(len(a) * len(cs) + sum(map(len, cs)) for a, cs in zip(contexts, choices, strict=True))

    def tokenize() -> Any:
        return engine.tokenize_choices(contexts, choices, truncate=truncate)

    with _reserved(state, batcher, rows):
        try:
            enc = tokenize() if chars <= INLINE_CHARS else await run_in_threadpool(tokenize)
        except InputTooLong as exc:
            raise ApiError(413, str(exc), "Validation") from None
        except CramkitError as exc:
            raise ApiError(422, str(exc), "Validation") from None
    scores = await _run(state, name, batcher, "classify", enc.pairs)
    res = engine.choice_result(scores, enc)

    def payload() -> Any:
        out = []
        for i, k in enumerate(res.chosen.tolist()):
            item = {"label": k, "answer": choices[i][k], "probabilities": _floats(res.probs[i])}
            if raw:
                item["scores"] = _floats(res.scores[i])
            out.append(item)
        return out[0] if single else out

    return await _response(payload, rows, res.truncated)


async def fill_mask(request: Request) -> Response:
    state = _state(request)
    body = await _json(request)
    name, engine, batcher = state.pick(body, request)
    _need(engine.can_fill_mask, name, "fill-mask (it needs a masked-LM model)")
    items = _inputs(body, state.limits)
    top_k = _int(body, "top_k", 5, 1, 100)
    truncate = _flag(body, "truncate", True)
    with _reserved(state, batcher, len(items)):
        enc = await _tokenize(engine, items, truncate)
    size = _answer_size("fill-mask", engine.count_masks(enc), top_k, "top_k", state.limits.max_answer_items)
    filled = await _run(state, name, batcher, "fill_mask", enc, top_k)

    def payload() -> Any:
        out = [
            [[{"token": c["token"], "id": c["id"], "score": round(float(c["score"]), 7)} for c in m] for m in masks]
            for masks in filled
        ]
        return out[0] if isinstance(body["inputs"], str) else out

    return await _response(payload, size, enc.truncated)


async def search(request: Request) -> Response:
    state = _state(request)
    body = await _json(request)
    if state.search is None:
        raise ApiError(404, "this server has no index; start it with cramkit serve ... --index IDX", "NotFound")
    items = _inputs(body, state.limits)
    k = _int(body, "k", 10, 1, 1000)
    size = _answer_size("search", len(items), k, "k", state.limits.max_answer_items)
    loop = asyncio.get_running_loop()
    req = Search(future=loop.create_future(), loop=loop, n=len(items), cost=len(items), texts=items, k=k)
    hits = await _queued(state, state.search, req)
    return await _response(lambda: hits[0] if isinstance(body["inputs"], str) else hits, size)


async def info(request: Request) -> Response:
    import cramkit

    state = _state(request)
    first = state.engines[state.default]
    model_type: dict[str, Any]
    if first.can_choose:
        model_type = {"multiple_choice": {"max_choices": state.limits.max_choices}}
    elif first.can_classify and first.labels:
        model_type = {
            "classifier": {
                "id2label": dict(enumerate(first.labels)),
                "label2id": {n: i for i, n in enumerate(first.labels)},
            }
        }
    else:
        model_type = {"embedding": {"pooling": first.pooling}}
    payload = {
        "model_id": state.default,
        "model_type": model_type,
        "model_dtype": first.runner.precision,
        "max_input_length": first.max_length,
        "max_batch_tokens": first.max_batch_tokens,
        "max_client_batch_size": state.limits.max_inputs,
        "max_concurrent_requests": state.limits.max_queue,
        "limits": vars(state.limits),
        "version": cramkit.__version__,
        "models": {n: e.info() for n, e in state.engines.items()},
        "index": state.index_path,
    }
    return await _response(payload, 0)


async def health(request: Request) -> Response:
    state = _state(request)
    dead = [lane.name for lane in state.lanes if not lane.alive]
    if dead or state.shutting_down:
        return await _response({"status": "unhealthy", "stopped": dead}, 0, status=503)
    return await _response({"status": "ok", "models": list(state.engines)}, 0)


async def metrics(request: Request) -> Response:
    data, ctype = _state(request).metrics.render()
    return Response(data, media_type=ctype)


async def _api_error(request: Request, exc: ApiError) -> Response:
    if exc.status == 400 or exc.status >= 500:
        LOG(f"status {exc.status}", f"{exc.status} {request.method} {request.url.path}: {exc.message}")
    return Response(_error_body(exc.message, exc.error_type), exc.status, exc.headers, "application/json")


async def _http_error(request: Request, exc: Any) -> Response:
    kind = "NotFound" if exc.status_code == 404 else "Validation"
    message = f"{request.method} {request.url.path}: {exc.detail}"
    if exc.status_code == 404:
        message += f"; routes: {', '.join(ROUTES)}, /docs"
    return Response(_error_body(message, kind), exc.status_code, getattr(exc, "headers", None), "application/json")


async def _validation(request: Request, exc: Any) -> Response:
    return Response(_error_body(str(exc.errors())[:500], "Validation"), 422, None, "application/json")


async def _internal(request: Request, exc: Exception) -> Response:
    return Response(_error_body(f"internal error: {type(exc).__name__}", "Backend"), 500, None, "application/json")


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    body = {"type": "object", "properties": props, "required": required}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}


TEXT_OR_LIST = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
MODEL_FIELD = {"type": "string", "description": "the model's name (default: the first one served)"}
DIMENSIONS_FIELD = {
    "type": "integer",
    "description": "the vector's leading dimensions, renormalised: one of the model's Matryoshka dimensions (/info)",
}

PROMPT_NAME_FIELD = {
    "type": "string",
    "description": "one of the model's named prompts (/info), put before each input (TEI's prompt_name); default: "
    "the model's default prompt, if it has one",
}

POST_ROUTES: list[tuple[str, Any, str, dict[str, Any]]] = [
    (
        "/rerank",
        rerank,
        "Reranking by a cross-encoder (TEI's /rerank): [{index, score[, text]}, ...], the most relevant first",
        _schema(
            {
                "query": {"type": "string"},
                "texts": {"type": "array", "items": {"type": "string"}},
                "raw_scores": {
                    "type": "boolean",
                    "default": False,
                    "description": "the logit margin, not a probability",
                },
                "return_text": {"type": "boolean", "default": False},
                "truncate": {"type": "boolean", "default": True},
                "model": MODEL_FIELD,
            },
            ["query", "texts"],
        ),
    ),
    (
        "/tokenize",
        tokenize,
        "Tokens as the model reads them (TEI's /tokenize): per input, [{id, text, special, start, stop}, ...]",
        _schema(
            {
                "inputs": TEXT_OR_LIST,
                "add_special_tokens": {"type": "boolean", "default": True},
                "truncate": {"type": "boolean", "default": True, "description": "cut at the model's limit"},
                "prompt_name": PROMPT_NAME_FIELD,
                "model": MODEL_FIELD,
            },
            ["inputs"],
        ),
    ),
    (
        "/embed",
        embed,
        "Sentence embeddings (TEI's /embed): [[float, ...], ...] in input order",
        _schema(
            {
                "inputs": TEXT_OR_LIST,
                "normalize": {"type": "boolean", "default": True},
                "truncate": {
                    "type": "boolean",
                    "default": True,
                    "description": "cut inputs to the model's limit",
                },
                "pooling": {"type": "string", "enum": ["mean", "cls"], "description": "default: the model's"},
                "dimensions": DIMENSIONS_FIELD,
                "prompt_name": PROMPT_NAME_FIELD,
                "model": MODEL_FIELD,
            },
            ["inputs"],
        ),
    ),
    (
        "/v1/embeddings",
        openai_embeddings,
        "OpenAI-shaped embeddings",
        _schema(
            {
                "input": TEXT_OR_LIST,
                "dimensions": DIMENSIONS_FIELD,
                "prompt_name": PROMPT_NAME_FIELD,
                "model": MODEL_FIELD,
                "encoding_format": {"type": "string", "enum": ["float", "base64"], "default": "float"},
            },
            ["input"],
        ),
    ),
    (
        "/predict",
        predict,
        "Classification (TEI's /predict): per input, every label with its score, best first; a "
        "multiple-choice model: per {text, choices} input, the chosen index (label), its text (answer) and every "
        "choice's probability",
        _schema(
            {
                "inputs": {
                    "description": "a text, a [text, text] pair, or a list of texts and pairs; multiple choice: "
                    "{text, choices} or a list of them",
                    "oneOf": [{"type": "string"}, {"type": "array"}, {"type": "object"}],
                },
                "raw_scores": {
                    "type": "boolean",
                    "default": False,
                    "description": "logits instead of probabilities",
                },
                "truncate": {"type": "boolean", "default": True},
                "model": MODEL_FIELD,
            },
            ["inputs"],
        ),
    ),
    (
        "/fill-mask",
        fill_mask,
        "For each [MASK] in each input, the top_k tokens with their probabilities",
        _schema(
            {
                "inputs": TEXT_OR_LIST,
                "top_k": {"type": "integer", "default": 5},
                "truncate": {"type": "boolean"},
                "model": MODEL_FIELD,
            },
            ["inputs"],
        ),
    ),
    (
        "/search",
        search,
        "Nearest passages of the index (cramkit serve --index IDX): per query, [{score, text, doc, source}]",
        _schema({"inputs": TEXT_OR_LIST, "k": {"type": "integer", "default": 10}}, ["inputs"]),
    ),
]
GET_ROUTES: list[tuple[str, Any, str]] = [
    ("/info", info, "The models served, their limits and the server's"),
    ("/health", health, "200 while every model's batcher runs"),
    ("/metrics", metrics, "Prometheus metrics"),
]


# ------------------------------------------------------------------------------------------ the app


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
    ``max_batch_tokens``); the batchers start with it."""
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
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]  # Starlette types handlers for Exception
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(Exception, _internal)
    for path, endpoint, summary, extra in POST_ROUTES:
        app.add_api_route(path, endpoint, methods=["POST"], summary=summary, openapi_extra=extra)
    for path, endpoint, summary in GET_ROUTES:
        app.add_api_route(path, endpoint, methods=["GET"], summary=summary)
    return Gate(app, state)


def _need(ok: bool, name: str, what: str) -> None:
    if not ok:
        raise ApiError(422, f"model {name!r} cannot do {what}", "Validation")


def _pooling(engine: Any, value: Any) -> str:
    if value is not None and value not in ("mean", "cls"):
        raise ApiError(422, "'pooling' must be 'mean' or 'cls'", "Validation")
    return value or engine.pooling


def _predictions(engine: Any, logits: np.ndarray, raw: bool) -> list[list[dict[str, Any]]]:
    from cramkit.infer.engine import probabilities

    if engine.kind == "regression":
        return [[{"label": "score", "score": float(v)}] for v in logits[:, 0]]
    scores = logits if raw else cast(np.ndarray, probabilities(engine.kind, logits))  # not None: no regression
    names = engine.labels or [str(j) for j in range(logits.shape[1])]
    out = []
    for row in scores:
        order = np.argsort(-row, kind="stable")
        out.append([{"label": names[j], "score": round(float(row[j]), 7)} for j in order])
    return out
