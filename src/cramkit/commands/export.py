"""`cramkit export MODEL --out DIR [--format hf|onnx|ct2|...]`: a Hugging Face directory or an export format.

MODEL is anything ``cramkit.load`` takes: a run (its latest checkpoint, or ``--step N``), a checkpoint of
either world size, a fine-tuned model or student directory, a prompt or deep-prompt directory (``--base``), or
``hf:DIR``.
"""

from __future__ import annotations

import argparse

from cramkit.infer import TARGETS


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
    p.add_argument("source", metavar="MODEL", help="a run, a checkpoint, a model directory (finetune --out) or hf:DIR")
    p.add_argument("--out", required=True, help="the directory to write (replaced atomically)")
    p.add_argument("--format", default="hf", help="hf (default), onnx, ct2, openvino or a registered format")
    p.add_argument(
        "--quantize",
        default=None,
        help="--format onnx: int8 (dynamic int8 weights); --format ct2: the stored weight type, "
        "int8, int8_float32, float32 (default) or bfloat16; --format openvino: bf16 (bf16 compute where the CPU "
        "has it; fp32 weights)",
    )
    p.add_argument(
        "--target",
        default=None,
        metavar="|".join(TARGETS),
        help="instead of --format/--quantize, the format and quantization fastest on this machine's CPU, by a "
        "race of the installed formats here (a few seconds of the model's forward, short and long texts, one "
        "thread and all; the fastest whose outputs agree with fp32 torch): cpu for batch work (predict, embed, "
        "index build), cpu-serve for cramkit serve (calls of a few short texts). The race is kept in the "
        "manifest and cached per CPU model; where it cannot run, the CPU flags' rule decides",
    )
    p.add_argument(
        "--race",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --target: --race races again (a cached race is not reused), --no-race takes the CPU flags' "
        "rule without racing (default: $CRAMKIT_RACE, 1 or 0, else a matching cached race or a new one)",
    )
    p.add_argument("--step", type=int, default=None, help="export checkpoint step-N of a run instead of the latest")
    p.add_argument("--task", help="of a model fine-tuned on a mixture: the task whose head to export")
    p.add_argument(
        "--base",
        default=None,
        help="of a deep-prompt directory (finetune --method ptuning): the base model it was trained on "
        "(--format onnx writes one standalone graph of both)",
    )
    p.add_argument("--no-mlm-head", action="store_true", help="export the encoder only (BertModel)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an export of another format in --out (only the files its manifest lists; a directory "
        "an export did not make is never replaced)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cramkit.infer.export import export  # cramkit.export's library function: it returns the summary too

    done = export(
        args.source,
        args.out,
        format=args.format,
        quantize=args.quantize,
        step=args.step,
        mlm_head=not args.no_mlm_head,
        force=args.force,
        task=args.task,
        base=args.base,
        target=args.target,
        race=args.race,
    )
    print(done.summary)
    return 0
