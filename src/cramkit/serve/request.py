"""What ``cramkit serve`` and ``cramkit.serve.serve`` take, declared once (:mod:`cramkit.request`), with the
server's :class:`Limits` (a field group of it). Light: ``cramkit --help`` reads it without the [serve] extra."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import KW_ONLY, dataclass

from cramkit.errors import CramkitError
from cramkit.infer.options import Offload, Passes
from cramkit.request import param

GROUP = "limits of a request and a connection"


@dataclass(kw_only=True)
class Limits:
    """What one request may ask for, and how long it may take."""

    max_payload_bytes: int = param(2_000_000, group=GROUP, metavar="BYTES", help="request body size")
    max_inputs: int = param(1024, group=GROUP, metavar="N", help="inputs per request")
    max_input_chars: int = param(50_000, group=GROUP, metavar="N", help="characters per input")
    max_choices: int = param(64, group=GROUP, metavar="N", help="choices per input of a multiple-choice model (413)")
    max_queue: int = param(8192, group=GROUP, metavar="N", help="inputs waiting per model before 429")
    max_answer_items: int = param(
        10_000,
        group=GROUP,
        metavar="N",
        help="fill-mask candidates (masks x top_k) or search hits (queries x k) per request (413)",
    )
    request_timeout_s: float = param(
        30.0,
        flags=("--timeout",),
        group=GROUP,
        metavar="SECONDS",
        help="seconds a request may wait for its answer (503; admission refuses earlier: 429)",
    )
    body_timeout_s: float = param(
        10.0, flags=("--body-timeout",), group=GROUP, metavar="SECONDS", help="seconds to receive a request body (408)"
    )
    header_timeout_s: float = param(
        10.0,
        flags=("--header-timeout",),
        group=GROUP,
        metavar="SECONDS",
        help="seconds for a request's headers to arrive, from connecting or the last answer (then the connection "
        "closes)",
    )
    idle_timeout_s: float = param(
        5.0, flags=("--idle-timeout",), group=GROUP, metavar="SECONDS", help="seconds a keep-alive connection may idle"
    )
    max_connections: int = param(
        1000,
        group=GROUP,
        metavar="N",
        help="open connections (kept below ulimit -n); past it the longest-waiting idle one closes",
    )

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


@dataclass
class ServeRequest(Limits, Passes, Offload):
    """Models served over HTTP: where, by which backend, within which limits."""

    sources: list[str] = param(
        positional=True, nargs="+", metavar="MODEL", help="a model (or NAME=MODEL); several are served by name"
    )
    _: KW_ONLY
    host: str = param("127.0.0.1", help="address to listen on")
    port: int = param(8080, help="port; 0 picks a free one (default: %(default)s)")
    backend: str = param(
        "auto",
        help="auto (default): ONNX Runtime for an ONNX export, CTranslate2 for a CTranslate2 one, torch "
        "otherwise; torch, onnx, ct2 or a registered format: onnx, ct2, ... export a torch model at startup",
    )
    max_wait_ms: float = param(5.0, help="how long a batch waits for more requests")
    max_length: int | None = param(None, help="cut inputs to this many tokens")
    threads: int | None = param(None, help="CPU threads for inference (default: all cores)")
    api_key: str | None = param(None, help="require 'Authorization: Bearer KEY' (default: $CRAMKIT_API_KEY if set)")
    index: str | None = param(None, help="a retrieval index (cramkit index): adds POST /search")
    base: str | None = param(
        None,
        metavar="MODEL",
        help="the base model of deep-prompt directories (finetune --method ptuning): loaded once, shared by every "
        "task's prefixes",
    )
    grace_s: float = param(30.0, command_line=False, help="seconds in-flight requests may finish after a signal")
    limits: Limits | None = param(
        None, command_line=False, help="the limits as one Limits, instead of its fields (which it then replaces)"
    )

    def __post_init__(self) -> None:
        if isinstance(self.sources, (str, os.PathLike)):
            self.sources = [os.fspath(self.sources)]
        if self.limits is not None:  # one object given for the fields: they take its values
            for f in dataclasses.fields(Limits):
                setattr(self, f.name, getattr(self.limits, f.name))

    def resolved(self) -> ServeRequest:
        """The request checked (a bad limit, port, wait or cache: one line before anything is loaded), with its
        defaults decided: the API key ($CRAMKIT_API_KEY), the threads (every usable core), the limits."""
        from cramkit.infer.offload import check_expert_cache
        from cramkit.runtime import cpu_cores

        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise CramkitError(f"--max-batch-tokens must be positive, got {self.max_batch_tokens}")
        check_expert_cache(self.expert_cache, self.offload_experts)
        self.check()
        if self.max_wait_ms < 0:
            raise CramkitError(
                "--timeout, --body-timeout, --header-timeout and --idle-timeout must be positive, --max-wait-ms at "
                "least 0"
            )
        if not 0 <= self.port < 65536:
            raise CramkitError(f"--port must be 0..65535, got {self.port}")
        if self.threads is not None and self.threads < 0:
            raise CramkitError(f"--threads must be at least 1 (0 or left out: every core), got {self.threads}")
        limits = Limits(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Limits)})
        return dataclasses.replace(
            self,
            api_key=self.api_key or os.environ.get("CRAMKIT_API_KEY"),
            threads=self.threads or cpu_cores(),
            limits=limits,
        )
