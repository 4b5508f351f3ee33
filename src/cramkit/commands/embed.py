"""`cramkit embed FILE_OR_STORE --from MODEL --out DIR`: embeddings of every row into a memory map."""

from __future__ import annotations

import argparse

from cramkit.commands.reading import add_reading_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embed",
        help="embed every row of a file (or every sequence/chunk of a token store) into a memory-mapped array",
        description="Writes DIR/embeddings.npy (float32 [rows, hidden]) and DIR/ids.npy (row ids), then "
        "DIR/embed.json when complete. Resumable: rerun the same command after a kill. Under torchrun "
        "the processes share the rows.",
    )
    p.add_argument(
        "source",
        metavar="FILE_OR_STORE",
        help=".txt (one per line), .csv/.tsv/.jsonl (a text column), or a token store",
    )
    p.add_argument("--from", dest="model", required=True, metavar="MODEL", help="a run, model directory or hf:DIR")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for embeddings.npy, ids.npy, embed.json")
    add_reading_args(p, doc_split=False, text_field_help="the text column of a .csv/.tsv/.jsonl/.json file")
    p.add_argument("--text", dest="text_field", help=argparse.SUPPRESS)  # the earlier name of --text-field
    p.add_argument("--pooling", choices=("mean", "cls"), default=None, help="default: the model's")
    p.add_argument("--normalize", action="store_true", default=None, help="L2-normalise (default: the model's)")
    p.add_argument(
        "--chunk-tokens",
        type=int,
        default=None,
        help="token store: embed chunks of this many tokens instead of whole sequences",
    )
    p.add_argument("--store-tokenizer", default=None, help="the token store's tokenizer, when not the model's")
    p.add_argument("--overwrite", action="store_true", help="replace finished embeddings of other inputs in DIR")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--max-batch-tokens", type=int, default=16384, help="padded tokens per forward pass (default 16384)")
    p.add_argument("--block", type=int, default=1024, help="rows embedded between progress commits")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cramkit.index.embed_cli import embed_source
    from cramkit.io import disk_errors

    with disk_errors(args.out):
        rec = embed_source(
            args.source,
            args.model,
            args.out,
            text_col=args.text_field,
            encoding=args.encoding,
            errors=args.errors,
            pooling=args.pooling,
            normalize=args.normalize,
            chunk_tokens=args.chunk_tokens,
            store_tokenizer=args.store_tokenizer,
            overwrite=args.overwrite,
            device=args.device,
            max_batch_tokens=args.max_batch_tokens,
            block=args.block,
        )
    from cramkit.index.embedding import dist_info

    if rec is None or dist_info()[0] != 0:
        return 0
    line = f"embedded {rec['rows']} rows x {rec['dim']} dims"
    if rec.get("examples_per_s"):
        line += f" in {rec['seconds']:.1f}s ({rec['examples_per_s']:,.1f} examples/s)"
    if rec.get("resumed_rows"):
        line += f"; resumed after {rec['resumed_rows']} committed rows"
    if rec.get("truncated"):
        line += f"; {rec['truncated']} inputs truncated to the model's limit"
    print(line + f" -> {args.out}/embeddings.npy")
    return 0
