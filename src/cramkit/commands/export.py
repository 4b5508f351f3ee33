"""`cramkit export MODEL --out DIR [--format hf|onnx|ct2|...]`: a Hugging Face directory or an export format.
Its flags are :class:`~cramkit.infer.requests.ExportRequest`'s.

MODEL is anything ``cramkit.load`` takes: a run (its latest checkpoint, or ``--step N``), a checkpoint of
either world size, a fine-tuned model or student directory, a prompt or deep-prompt directory (``--base``), or
``hf:DIR``.
"""

from __future__ import annotations

import argparse

from cramkit import request
from cramkit.infer.requests import ExportRequest


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a model as a Hugging Face directory (or ONNX for ONNX Runtime)",
        description="Write a model as a Hugging Face directory. BERT-shaped models (post-LN, learned positions, "
        "biases, GELU; e.g. --preset bert-base, or any hf: import) become plain BertForMaskedLM / BertModel / "
        "BertForSequenceClassification that transformers loads with no custom code; other architectures ship "
        "modeling_cramkit.py and load with trust_remote_code=True. --format onnx writes an ONNX Runtime model, "
        "--format ct2 a CTranslate2 encoder (ctranslate2.Encoder), --format openvino an OpenVINO IR; --target cpu "
        "picks the fastest for this CPU; an installed package may add formats "
        "(entry points 'cramkit.backends').",
    )
    request.add_arguments(p, ExportRequest)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cramkit.infer.export import export  # cramkit.export's library function: it returns the summary too

    print(export(request.from_args(ExportRequest, args)).summary)
    return 0
