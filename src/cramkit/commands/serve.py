"""`cramkit serve MODEL [MODEL ...]`: an HTTP server for embeddings, classification and fill-mask. Its flags are
:class:`~cramkit.serve.request.ServeRequest`'s."""

from __future__ import annotations

import argparse

from cramkit import request
from cramkit.serve.request import ServeRequest


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
    request.add_arguments(p, ServeRequest, helps={"device": "torch backend: auto, cpu, cuda, cuda:N"})
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cramkit.serve.server import serve

    serve(request.from_args(ServeRequest, args))
    return 0
