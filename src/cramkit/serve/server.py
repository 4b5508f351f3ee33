"""Start the server: engines for the models named on the command line, the app, uvicorn on a socket."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from cramkit.errors import CramkitError


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
    max_batch_tokens: int = 16384,
    max_length: int | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """name -> :class:`cramkit.infer.Engine` for each model (``NAME=MODEL`` or ``MODEL``)."""
    from cramkit.infer import Engine

    engines = {}
    for name, path in model_names(sources).items():
        engines[name] = Engine(
            path, backend=backend, device=device, max_batch_tokens=max_batch_tokens, max_length=max_length,
            threads=threads,
        )  # fmt: skip
    return engines


def open_index(path: str) -> Any:
    """``cramkit.index.open(path)``, imported only when a server is given --index."""
    try:
        from cramkit import index as index_mod
    except ImportError as exc:
        raise CramkitError(
            f"--index {path}: this cramkit has no retrieval index module ({exc}); install a cramkit with "
            "cramkit.index, or start the server without --index"
        ) from None
    return index_mod.open(path)


def serve(
    sources: list[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    backend: str = "auto",
    device: str = "auto",
    max_batch_tokens: int = 16384,
    max_wait_ms: float = 5.0,
    max_length: int | None = None,
    limits: Any = None,
    api_key: str | None = None,
    index: str | None = None,
    threads: int | None = None,
    grace_s: float = 30.0,
) -> None:
    """Serve ``sources`` over HTTP until SIGINT/SIGTERM (then finish in-flight requests, up to ``grace_s``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import uvicorn

    from cramkit.infer.engine import cpu_cores
    from cramkit.serve.app import create_app

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
        sources, backend=backend, device=device, max_batch_tokens=max_batch_tokens, max_length=max_length,
        threads=threads,
    )  # fmt: skip
    app = create_app(
        engines, max_batch_tokens=max_batch_tokens, max_wait_ms=max_wait_ms, limits=limits, api_key=api_key,
        index=idx, index_path=index,
    )  # fmt: skip
    real_port = sock.getsockname()[1]
    for name, eng in engines.items():
        print(
            f"model {name}: {eng.kind}, {eng.backend} ({eng.runner.precision}) on {eng.device}, "
            f"max_length {eng.max_length} <- {eng.source}",
            flush=True,
        )
    print(f"serving on http://{host}:{real_port} (OpenAPI docs: /docs; Ctrl-C stops)", flush=True)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, timeout_graceful_shutdown=grace_s, lifespan="on",
        timeout_keep_alive=30, backlog=2048,
    )  # fmt: skip
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    print("server stopped", file=sys.stderr, flush=True)
