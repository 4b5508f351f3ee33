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


def build_engines(
    sources: list[str],
    *,
    backend: str = "auto",
    device: str = "auto",
    max_batch_tokens: int | None = None,
    max_length: int | None = None,
    threads: int | None = None,
    base: str | None = None,
    offload_experts: bool = False,
    expert_cache: int | None = None,
) -> dict[str, Any]:
    """name -> :class:`cramkit.infer.Engine` for each model (``NAME=MODEL`` or ``MODEL``). A model trained
    on a mixture is served once per task, as NAME-TASK (e.g. mix-mrpc), its heads sharing one encoder.
    Deep-prompt directories (finetune --method ptuning) are loaded on ``base``, read once: every task's
    prefixes share its encoder in memory. offload_experts, expert_cache: a mixture-of-experts model's experts
    brought in as its routers pick them (:class:`~cramkit.infer.Engine`)."""
    from cramkit.infer import Engine
    from cramkit.loading import describe, for_task, load, task_heads

    engines = {}
    base_loaded: LoadedModel | None = None
    for name, path in model_names(sources).items():
        models: dict[str, Any] = {name: path}
        what = describe(path)
        if what.kind == "model" and what.architecture == "prefix":
            if base is not None and base_loaded is None:
                base_loaded = cast("LoadedModel", load(base))  # the base of a prefix model: a torch model
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
                backend=backend,
                device=device,
                max_batch_tokens=max_batch_tokens,
                max_length=max_length,
                threads=threads,
                offload_experts=offload_experts,
                expert_cache=expert_cache,
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


def serve(
    sources: list[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    backend: str = "auto",
    device: str = "auto",
    max_batch_tokens: int | None = None,
    max_wait_ms: float = 5.0,
    max_length: int | None = None,
    limits: Any = None,
    api_key: str | None = None,
    index: str | None = None,
    threads: int | None = None,
    grace_s: float = 30.0,
    base: str | None = None,
    offload_experts: bool = False,
    expert_cache: int | None = None,
) -> None:
    """Serve ``sources`` over HTTP until SIGINT/SIGTERM (then finish in-flight requests, up to ``grace_s``).
    The same as ``cramkit serve MODEL...``; a bad limit, port or wait is one line before anything is loaded."""
    from cramkit.serve.app import Limits, create_app

    limits = limits or Limits()
    if max_batch_tokens is not None and max_batch_tokens < 1:
        raise CramkitError(f"--max-batch-tokens must be positive, got {max_batch_tokens}")
    from cramkit.infer.engine import check_expert_cache

    check_expert_cache(expert_cache, offload_experts)
    limits.check()
    if max_wait_ms < 0:
        raise CramkitError(
            "--timeout, --body-timeout, --header-timeout and --idle-timeout must be positive, --max-wait-ms at least 0"
        )
    if not 0 <= port < 65536:
        raise CramkitError(f"--port must be 0..65535, got {port}")
    if threads is not None and threads < 0:
        raise CramkitError(f"--threads must be at least 1 (0 or left out: every core), got {threads}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import uvicorn

    from cramkit.runtime import cpu_cores

    threads = threads or cpu_cores()
    torch.set_num_threads(threads)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CramkitError(
            f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port or --host"
        ) from None
    idx = open_index(index) if index else None
    engines = build_engines(
        sources,
        backend=backend,
        device=device,
        max_batch_tokens=max_batch_tokens,
        max_length=max_length,
        threads=threads,
        base=base,
        offload_experts=offload_experts,
        expert_cache=expert_cache,
    )
    app = create_app(engines, max_wait_ms=max_wait_ms, limits=limits, api_key=api_key, index=idx, index_path=index)
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
        timeout_graceful_shutdown=grace_s,  # type: ignore[arg-type]  # uvicorn annotates int; it takes a float
        lifespan="on",
        timeout_keep_alive=limits.idle_timeout_s,
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
