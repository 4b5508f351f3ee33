"""Start the server: engines for the models named on the command line, the app, uvicorn on a socket.

Connections are guarded below the app (:func:`guarded_protocol`): each request's headers must arrive within
``header_timeout_s`` of connecting or of the previous answer (slowloris), an idle keep-alive connection is
closed after ``idle_timeout_s``, and at most ``max_connections`` are open (kept below the open-file limit):
a new one past it closes the longest-waiting connection that has no request in progress, or, if every one
has, itself. Errors of the event loop (such as accept() out of file descriptors) and uvicorn's warnings
are logged one line per kind per second.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cramkit.errors import CramkitError
from cramkit.request import verb
from cramkit.serve.request import Limits, ServeRequest

if TYPE_CHECKING:
    from cramkit.loading import LoadedModel

FD_RESERVE = 64  # file descriptors kept for the model, the log and the threads
BACKLOG = 2048  # connections waiting to be accepted


def model_names(sources: list[str]) -> dict[str, str]:
    """``NAME=MODEL`` or ``MODEL`` (named after its directory) -> {name: model}; names must differ."""
    out: dict[str, str] = {}
    for src in sources:
        name, sep, path = src.partition("=")
        if not sep or "/" in name or not name:
            path = src
            name = Path(src[3:] if src.startswith("hf:") else src).expanduser().resolve().name or "model"
        if name in out:
            raise CramkitError(
                f"two models are named {name!r}; name them on the command line: NAME=MODEL (e.g. sst2={path})"
            )
        out[name] = path
    return out


@verb(ServeRequest)
def build_engines(request: ServeRequest) -> dict[str, Any]:
    """name -> :class:`cramkit.infer.Engine` for each of the request's models (``NAME=MODEL`` or ``MODEL``), on
    its backend, device, passes and threads. A model trained on a mixture is served once per task, as NAME-TASK
    (e.g. mix-mrpc), its heads sharing one encoder. Deep-prompt directories (finetune --method ptuning) are loaded
    on ``base``, read once: every task's prefixes share its encoder in memory. offload_experts, expert_cache: a
    mixture-of-experts model's experts brought in as its routers pick them (:class:`~cramkit.infer.Engine`)."""
    from cramkit.infer import Engine
    from cramkit.loading import describe, for_task, load, task_heads

    engines = {}
    base_loaded: LoadedModel | None = None
    r = request
    for name, path in model_names(r.sources).items():
        models: dict[str, Any] = {name: path}
        what = describe(path)
        if what.kind == "model" and what.architecture == "prefix":
            if r.base is not None and base_loaded is None:
                base_loaded = cast("LoadedModel", load(r.base))  # the base of a prefix model: a torch model
            models = {name: load(path, base=base_loaded)}  # without --base: one line naming the base
        elif what.kind == "model" and what.model_kind == "multitask":
            loaded = cast("LoadedModel", load(path))  # a model directory: a torch model
            heads = [h["name"] for h in task_heads(loaded.meta(), path)]
            models = {f"{name}-{h.split('/')[-1]}": for_task(loaded, h) for h in heads}
        for key, model in models.items():
            if key in engines:
                raise CramkitError(f"two models are named {key!r}; name them on the command line: NAME=MODEL")
            engines[key] = Engine(
                model,
                backend=r.backend,
                device=r.device,
                max_batch_tokens=r.max_batch_tokens,
                max_length=r.max_length,
                threads=r.threads,
                offload_experts=r.offload_experts,
                expert_cache=None if r.expert_cache is None else int(r.expert_cache),  # checked: a number
            )
    return engines


def open_index(path: str) -> Any:
    """``cramkit.index.open(path)``, imported only when a server is given --index."""
    from cramkit import index as index_mod

    return index_mod.open(path)


def connection_limits(wanted: int) -> tuple[int, int]:
    """(connections, backlog) that fit the open-file limit (raised to its hard maximum first): asyncio
    accepts up to ``backlog`` connections at a time before any is closed, so both must fit together."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted, BACKLOG
    backlog = min(BACKLOG, max(16, (soft - FD_RESERVE) // 4))
    return max(1, min(wanted, soft - FD_RESERVE - backlog)), backlog


def guarded_protocol(header_timeout_s: float, max_connections: int) -> type:
    """uvicorn's h11 protocol with a deadline for each request's headers and a cap on connections."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Guarded(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._deadline: asyncio.TimerHandle | None = None
            self._seen: Any = None  # the request cycle whose headers arrived last
            self.waiting_since: float | None = None  # no request in progress since then
            self._wait(header_timeout_s)
            if len(self.connections) > max_connections:
                idle = [c for c in self.connections if c is not self and getattr(c, "waiting_since", None)]
                victim = min(idle, key=lambda c: c.waiting_since) if idle else self  # type: ignore[union-attr]  # uvicorn's protocol union
                victim.transport.close()

        def _wait(self, seconds: float) -> None:
            """No request in progress: its headers must arrive within ``seconds``."""
            self.waiting_since = time.monotonic()
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(seconds, self._expire)

        def _expire(self) -> None:
            if self.waiting_since is not None and not self.transport.is_closing():
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and self.cycle is not self._seen:  # headers are in: a request runs
                self._seen = self.cycle
                self.waiting_since = None
                if self._deadline is not None:
                    self._deadline.cancel()

        def on_response_complete(self) -> None:
            seen = self._seen
            super().on_response_complete()
            if self._seen is seen and not self.transport.is_closing():  # no pipelined request started
                self._wait(self.timeout_keep_alive + header_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self.waiting_since = None
            super().connection_lost(exc)

    return Guarded


class _ThroughLog(logging.Filter):
    """Sends uvicorn's records to :data:`cramkit.serve.app.LOG` (one line per kind per second, no traceback)
    instead of its own handlers."""

    def filter(self, record: logging.LogRecord) -> bool:
        from cramkit.serve.app import LOG

        LOG(f"uvicorn {record.msg}", record.getMessage())
        return False


def _loop_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's error handler: one line per kind per second instead of a traceback each."""
    from cramkit.serve.app import LOG

    exc = context.get("exception")
    message = context.get("message", "event loop error")
    LOG(f"loop {message}", f"{message}" + (f": {type(exc).__name__}: {exc}" if exc else ""))


@verb(ServeRequest)
def serve(request: ServeRequest) -> None:
    """Serve the request's models over HTTP until SIGINT/SIGTERM (then finish in-flight requests, up to
    ``grace_s``). Takes a :class:`~cramkit.serve.request.ServeRequest` or its fields (``limits``: a
    :class:`~cramkit.serve.request.Limits` for its fields); the same as ``cramkit serve MODEL...``. A bad limit,
    port or wait is one line before anything is loaded."""
    r = request.resolved()
    limits = cast(Limits, r.limits)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import uvicorn

    from cramkit.serve.app import create_app

    torch.set_num_threads(cast(int, r.threads))
    host, port = r.host, r.port
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CramkitError(
            f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port or --host"
        ) from None
    idx = open_index(r.index) if r.index else None
    engines = build_engines(r)
    app = create_app(
        engines, max_wait_ms=r.max_wait_ms, limits=limits, api_key=r.api_key, index=idx, index_path=r.index
    )
    connections, backlog = connection_limits(limits.max_connections)
    if connections < limits.max_connections:
        print(f"at most {connections} connections (the open-file limit, ulimit -n, allows no more)", flush=True)
    real_port = sock.getsockname()[1]
    for name, eng in engines.items():
        print(
            f"model {name}: {eng.kind}, {eng.backend} ({eng.runner.precision}) on {eng.device}, "
            f"max_length {eng.max_length}, {eng.max_batch_tokens} tokens per forward pass"
            + (f", experts offloaded (cache {eng.offload['cache']} per layer)" if eng.offload else "")
            + f" <- {eng.source}",
            flush=True,
        )
    print(f"serving on http://{host}:{real_port} (OpenAPI docs: /docs; Ctrl-C stops)", flush=True)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=r.grace_s,  # type: ignore[arg-type]  # uvicorn annotates int; it takes a float
        lifespan="on",
        timeout_keep_alive=limits.idle_timeout_s,  # type: ignore[arg-type]  # an int to uvicorn's types; a float works
        backlog=backlog,
        http=guarded_protocol(limits.header_timeout_s, connections),
    )
    logging.getLogger("uvicorn.error").addFilter(_ThroughLog())
    server = uvicorn.Server(config)

    factory = config.get_loop_factory()
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.get_loop().set_exception_handler(_loop_errors)
            runner.run(server.serve(sockets=[sock]))
    else:  # Python 3.10 has no asyncio.Runner: the same loop, made and closed by hand
        loop = factory() if factory is not None else asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(_loop_errors)
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
    print("server stopped", file=sys.stderr, flush=True)
