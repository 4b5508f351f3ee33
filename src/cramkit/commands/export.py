"""`cramkit export MODEL --out DIR [--format hf|onnx]`: a Hugging Face (or ONNX) model directory.

MODEL is anything ``cramkit.load`` takes: a run (its latest checkpoint, or ``--step N``), a checkpoint of
either world size, a fine-tuned model or student directory, or ``hf:DIR``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cramkit.errors import CramkitError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a model as a Hugging Face directory (or ONNX for ONNX Runtime)",
        description="Write a model as a Hugging Face directory. BERT-shaped models (post-LN, learned positions, "
        "biases, GELU; e.g. --preset bert-base, or any hf: import) become plain BertForMaskedLM / BertModel / "
        "BertForSequenceClassification that transformers loads with no custom code; other architectures ship "
        "modeling_cramkit.py and load with trust_remote_code=True. --format onnx writes an ONNX Runtime model.",
    )
    p.add_argument(
        "source", metavar="MODEL", help="a run, a checkpoint, a model directory (finetune --out) or hf:DIR"
    )
    p.add_argument("--out", required=True, help="the directory to write (replaced atomically)")
    p.add_argument("--format", choices=["hf", "onnx"], default="hf", help="hf (default) or onnx")
    p.add_argument(
        "--quantize", choices=["int8"], default=None, help="with --format onnx: dynamic int8 weights"
    )
    p.add_argument(
        "--step", type=int, default=None, help="export checkpoint step-N of a run instead of the latest"
    )
    p.add_argument("--no-mlm-head", action="store_true", help="export the encoder only (BertModel)")
    p.add_argument("--force", action="store_true", help="replace --out even if it is not a previous export")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    import tempfile

    from cramkit.infer.onnx import MANIFEST
    from cramkit.io import check_out, disk_errors
    from cramkit.load import load
    from cramkit.model.hf import EXPORT_MARKER

    out = Path(args.out)
    marker = MANIFEST if args.format == "onnx" else EXPORT_MARKER
    removed = check_out(out, inputs=[args.source], own=[marker], replace=True, force=args.force)
    if removed:
        shown = ", ".join(removed[:20]) + (f" and {len(removed) - 20} more" if len(removed) > 20 else "")
        print(f"cramkit: --force: {out} will be replaced; removing its {len(removed)} entries: {shown}",
              file=sys.stderr)  # fmt: skip
    if args.quantize and args.format != "onnx":
        raise CramkitError("--quantize int8 applies to --format onnx")
    loaded = load(args.source, step=args.step)
    if args.format == "onnx":
        try:
            from cramkit.infer.onnx import export_onnx
        except ImportError as exc:
            raise CramkitError(
                f"ONNX export needs onnx and onnxruntime ({exc}): pip install 'cramkit[onnx]'"
            ) from None
        with disk_errors(out):
            done = export_onnx(loaded, out, args.quantize, args.force)
        print(
            f"exported {loaded.source} -> {done} (ONNX{' int8' if args.quantize else ''}; cramkit serve {done} --backend onnx)"
        )
        return 0
    if loaded.encoder is None:
        raise CramkitError(
            f"{loaded.source}: a {loaded.architecture} model has no Hugging Face equivalent; use --format onnx"
        )
    from cramkit.model.hf import export_hf
    from cramkit.text.tokenizer import save_tokenizer

    with tempfile.TemporaryDirectory() as tmp, disk_errors(out):
        tok_dir = save_tokenizer(loaded.tokenizer, Path(tmp) / "tokenizer")
        done = export_hf(
            loaded.model,
            loaded.config,
            out,
            tokenizer_dir=tok_dir,
            mlm_head=not args.no_mlm_head,
            force=args.force,
            labels=loaded.labels,
        )
    fmt = json.loads((done / "cramkit_export.json").read_text(encoding="utf-8"))
    arch = fmt["architecture"]
    auto = (
        "AutoModelForSequenceClassification"
        if "Classification" in arch
        else "AutoModelForMaskedLM"
        if arch.endswith("ForMaskedLM")
        else "AutoModel"
    )
    how = f"transformers.{auto}.from_pretrained(DIR)"
    if fmt["format"] == "cramkit":  # transformers' AutoTokenizer would prompt for the remote-code config
        how = (
            f"transformers.{auto}.from_pretrained(DIR, trust_remote_code=True); its tokenizer (plain BERT): "
            "BertTokenizerFast.from_pretrained(DIR)"
        )
    which = f" ({loaded.extra['checkpoint']})" if loaded.extra.get("checkpoint") else ""
    print(f"exported {loaded.source}{which} -> {done} ({fmt['architecture']}; load with {how})")
    return 0
