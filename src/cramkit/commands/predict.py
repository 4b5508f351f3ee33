"""`cramkit predict --from MODEL FILE --out PRED`: batched inference over a file's rows."""

from __future__ import annotations

import argparse

from cramkit.commands.checks import add_offload_args, add_pass_args
from cramkit.commands.reading import add_reading_args, reading_kwargs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="predict the rows of a CSV/TSV/JSONL/text file with a fine-tuned model (or fill [MASK]s)",
        description="Classify (or score) each row of FILE with a fine-tuned model, a distilled student or an HF "
        "classifier; with a multiple-choice model, pick each row's choice; with a pretraining run, fill each "
        "[MASK]. Inputs are batched by length. With a label column in FILE the metric is printed too.",
    )
    p.add_argument("file", metavar="FILE", help=".csv, .tsv, .jsonl (a header / named fields) or .txt (one per line)")
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="MODEL",
        help="a model directory (cramkit finetune --out), a run, a checkpoint or hf:DIR",
    )
    p.add_argument("--out", help="predictions file: .jsonl (default), .csv or .tsv (default: FILE.predictions.jsonl)")
    p.add_argument("--text-a", help="the text column (default: text, sentence, sentence1, ...)")
    p.add_argument("--text-b", help="the second text of a pair (default: text_b or sentence2 when present)")
    p.add_argument(
        "--choices",
        metavar="COL[,COL...]",
        help="multiple-choice model: the choice columns, or one JSONL field holding a list (default: "
        "the columns it was trained on, else choices)",
    )
    p.add_argument(
        "--label",
        default="auto",
        help="gold label column, scored when present, its values checked against the model's labels "
        "first (default: the column the model was trained on, else label; 'none': no scoring)",
    )
    p.add_argument("--task", help="of a model fine-tuned on a mixture: the task whose head predicts")
    p.add_argument(
        "--base",
        metavar="MODEL",
        help="of a deep-prompt directory (finetune --method ptuning): the base model it was trained on",
    )
    p.add_argument("--keep-text", action="store_true", help="copy each row's input text into the predictions")
    p.add_argument("--top-k", type=int, default=5, help="fill-mask: candidates per [MASK] (default %(default)s)")
    add_pass_args(p)
    p.add_argument("--max-length", type=int, default=None, help="cut inputs to this many tokens (default: the model's)")
    add_offload_args(p)
    add_reading_args(p, doc_split=False, text_field=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import cramkit
    from cramkit.commands.tasks import _columns_list

    out = args.out or str(Path(args.file).with_suffix("")) + ".predictions.jsonl"
    label = None if args.label.lower() == "none" else args.label
    res = cramkit.predict(
        args.source,
        args.file,
        out,
        text_a=args.text_a,
        text_b=args.text_b,
        label=label,
        keep_text=args.keep_text,
        top_k=args.top_k,
        device=args.device,
        max_batch_tokens=args.max_batch_tokens,
        max_length=args.max_length,
        task=args.task,
        base=args.base,
        choices=_columns_list(args.choices, "--choices"),
        offload_experts=args.offload_experts,
        expert_cache=args.expert_cache,
        **reading_kwargs(args),
    )
    line = f"predicted {res['rows']} rows in {res['seconds']:.2f}s ({res['examples_per_s']:,.1f} examples/s)"
    if res["truncated"]:
        line += f"; {res['truncated']} inputs truncated to the model's limit"
    print(line + f" -> {res['out']}")
    if res.get("metrics"):
        print("metrics: " + ", ".join(f"{k} {v:.2f}" for k, v in res["metrics"].items()))
    return 0
