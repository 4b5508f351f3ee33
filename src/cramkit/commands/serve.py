"""`cramkit serve MODEL [MODEL ...]`: an HTTP server for embeddings, classification and fill-mask."""

from __future__ import annotations

import argparse
import os

from cramkit.commands.checks import add_offload_args, add_pass_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve models over HTTP (embeddings, classification, fill-mask; TEI-compatible routes)",
        description="Serve one or more models over HTTP with FastAPI on uvicorn: POST /embed, /predict, "
        "/v1/embeddings, /fill-mask (and /search with --index), POST / and /invocations (TEI's and SageMaker's: "
        "the route of the model's kind), GET /info, /health (and /ping), /metrics, /docs. A batcher "
        "merges concurrent requests into token-budgeted batches. MODEL is anything cramkit.load takes or an "
        "ONNX export (cramkit export --format onnx); NAME=MODEL names it (requests pick a model by name).",
    )
    p.add_argument("models", nargs="+", metavar="MODEL", help="a model (or NAME=MODEL); several are served by name")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="port (default %(default)s; 0 picks a free one)")
    p.add_argument(
        "--backend",
        default="auto",
        help="auto (default): ONNX Runtime for an ONNX export, CTranslate2 for a CTranslate2 one, torch "
        "otherwise; torch, onnx, ct2 or a registered format: onnx, ct2, ... export a torch model at "
        "startup",
    )
    add_pass_args(p, device="torch backend: auto, cpu, cuda, cuda:N")
    add_offload_args(p)
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="how long a batch waits for more requests")
    p.add_argument("--max-length", type=int, default=None, help="cut inputs to this many tokens")
    p.add_argument("--max-inputs", type=int, default=1024, help="inputs per request (default %(default)s)")
    p.add_argument("--max-input-chars", type=int, default=50_000, help="characters per input")
    p.add_argument("--max-choices", type=int, default=64, help="choices per input of a multiple-choice model")
    p.add_argument("--max-payload-bytes", type=int, default=2_000_000, help="request body size")
    p.add_argument("--max-queue", type=int, default=8192, help="inputs waiting per model before 429")
    p.add_argument(
        "--max-answer-items",
        type=int,
        default=10_000,
        help="fill-mask candidates (masks x top_k) or search hits (queries x k) per request (413)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=1000,
        help="open connections (kept below ulimit -n); past it the longest-waiting idle one closes",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds for a request's headers to arrive (then the connection closes)",
    )
    p.add_argument("--idle-timeout", type=float, default=5.0, help="seconds a keep-alive connection may idle")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a request may wait for its answer (503)")
    p.add_argument("--body-timeout", type=float, default=10.0, help="seconds to receive a request body (408)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for inference (default: all cores)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' (default: $CRAMKIT_API_KEY if set)",
    )
    p.add_argument("--index", default=None, help="a retrieval index (cramkit index): adds POST /search")
    p.add_argument(
        "--base",
        default=None,
        metavar="MODEL",
        help="the base model of deep-prompt directories (finetune --method ptuning): loaded once, "
        "shared by every task's prefixes",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cramkit.serve import Limits, serve

    limits = Limits(
        max_payload_bytes=args.max_payload_bytes,
        max_inputs=args.max_inputs,
        max_input_chars=args.max_input_chars,
        max_choices=args.max_choices,
        max_queue=args.max_queue,
        max_answer_items=args.max_answer_items,
        request_timeout_s=args.timeout,
        body_timeout_s=args.body_timeout,
        header_timeout_s=args.header_timeout,
        idle_timeout_s=args.idle_timeout,
        max_connections=args.max_connections,
    )
    serve(
        args.models,
        host=args.host,
        port=args.port,
        backend=args.backend,
        device=args.device,
        max_batch_tokens=args.max_batch_tokens,
        max_wait_ms=args.max_wait_ms,
        max_length=args.max_length,
        limits=limits,
        api_key=args.api_key or os.environ.get("CRAMKIT_API_KEY"),
        index=args.index,
        threads=args.threads,
        base=args.base,
        offload_experts=args.offload_experts,
        expert_cache=args.expert_cache,
    )
    return 0
