"""`cramkit predict --from MODEL FILE --out PRED`: batched inference over a file's rows. Its flags are
:class:`~cramkit.infer.requests.PredictRequest`'s."""

from __future__ import annotations

import argparse

from cramkit import request
from cramkit.infer.requests import PredictRequest


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="predict the rows of a CSV/TSV/JSONL/text file with a fine-tuned model (or fill [MASK]s)",
        description="Classify (or score) each row of FILE with a fine-tuned model, a distilled student or an HF "
        "classifier; with a multiple-choice model, pick each row's choice; with a pretraining run, fill each "
        "[MASK]. Inputs are batched by length. With a label column in FILE the metric is printed too.",
    )
    request.add_arguments(p, PredictRequest)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import cramkit

    res = cramkit.predict(request.from_args(PredictRequest, args))
    line = f"predicted {res['rows']} rows in {res['seconds']:.2f}s ({res['examples_per_s']:,.1f} examples/s)"
    if res["truncated"]:
        line += f"; {res['truncated']} inputs truncated to the model's limit"
    print(line + f" -> {res['out']}")
    if res.get("metrics"):
        print("metrics: " + ", ".join(f"{k} {v:.2f}" for k, v in res["metrics"].items()))
    return 0
