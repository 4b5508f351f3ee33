"""`cramkit embed FILE_OR_STORE --from MODEL --out DIR`: embeddings of every row into a memory map, or into
Parquet parts (`--format parquet`, `--shard i/N`, `--join DIR`)."""

from __future__ import annotations

import argparse

from cramkit.commands.checks import add_offload_args, add_pass_args
from cramkit.commands.reading import add_reading_args
from cramkit.embeddings import BLOCK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embed",
        help="embed every row of a file (or every sequence/chunk of a token store) into a memory-mapped array",
        description="Writes DIR/embeddings.npy (float32 [rows, hidden]) and DIR/ids.npy (row ids), then "
        "DIR/embed.json when complete; with --format parquet, DIR/part-KKKKK-of-PPPPP.parquet files (columns id, "
        "vector, text, doc, source) and the manifest DIR/embed.json once every part is there. Resumable: rerun "
        "the same command after a kill. Under torchrun the processes share the rows; --shard i/N splits them "
        "between independent commands (a Slurm array) that share --out.",
    )
    p.add_argument(
        "source",
        metavar="FILE_OR_STORE",
        nargs="?",
        default=None,
        help=".txt (one per line), .csv/.tsv/.jsonl (a text column), or a token store",
    )
    p.add_argument("--from", dest="model", default=None, metavar="MODEL", help="a run, model directory or hf:DIR")
    p.add_argument("--out", default=None, metavar="DIR", help="directory for embeddings.npy, ids.npy, embed.json")
    p.add_argument(
        "--format",
        choices=("npy", "parquet"),
        default="npy",
        help="npy (default): one memory-mapped array; parquet: one Parquet file per part (shard or process)",
    )
    p.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="embed shard I of N (counted from 0) of the rows, with --format parquet; run every shard with the "
        "same --out (a Slurm array: --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)",
    )
    p.add_argument(
        "--join",
        default=None,
        metavar="DIR",
        help="check the Parquet parts in DIR and write its manifest embed.json (or name the part missing)",
    )
    add_reading_args(p, doc_split=False, text_field_help="the text column of a .csv/.tsv/.jsonl/.json file")
    p.add_argument("--text", dest="text_field", help=argparse.SUPPRESS)  # the earlier name of --text-field
    p.add_argument("--pooling", choices=("mean", "cls"), default=None, help="default: the model's")
    p.add_argument("--normalize", action="store_true", default=None, help="L2-normalise (default: the model's)")
    p.add_argument(
        "--dimensions",
        type=int,
        default=None,
        metavar="N",
        help="cut each vector to its first N dimensions, renormalised: one of a Matryoshka model's (finetune "
        "--objective contrastive --set matryoshka=256,128); default: the whole vector",
    )
    p.add_argument(
        "--prompt-name",
        default=None,
        metavar="NAME",
        help="one of the model's named prompts (e.g. query, passage) put before each text; default: the model's "
        "default prompt, if it has one. The prompt's tokens count toward the length limit",
    )
    p.add_argument(
        "--chunk-tokens",
        type=int,
        default=None,
        help="token store: embed chunks of this many tokens instead of whole sequences",
    )
    p.add_argument("--store-tokenizer", default=None, help="the token store's tokenizer, when not the model's")
    p.add_argument("--overwrite", action="store_true", help="replace finished embeddings of other inputs in DIR")
    add_pass_args(p)
    p.add_argument(
        "--block", type=int, default=BLOCK, help="rows embedded between progress commits (default %(default)s)"
    )
    add_offload_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import cramkit
    from cramkit.errors import CramkitError
    from cramkit.io import disk_errors

    if args.join is not None:
        if args.source or args.model or args.out or args.shard:
            raise CramkitError("--join DIR takes no FILE_OR_STORE, --from, --out or --shard: it only joins DIR")
        from cramkit.embeddings.parquet import join

        with disk_errors(args.join):
            m = join(args.join)
        assert m is not None
        print(f"joined {len(m['parts'])} parts: {m['rows']} rows x {m['dim']} dims -> {args.join}/embed.json")
        return 0
    if args.source is None or args.model is None or args.out is None:
        raise CramkitError("cramkit embed needs FILE_OR_STORE, --from MODEL and --out DIR (or --join DIR)")
    rec = cramkit.embed(
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
        format=args.format,
        shard=args.shard,
        prompt_name=args.prompt_name,
        dimensions=args.dimensions,
        offload_experts=args.offload_experts,
        expert_cache=args.expert_cache,
    )
    from cramkit.embeddings.memmap import dist_info

    if rec is None or dist_info()[0] != 0:
        return 0
    if args.format == "parquet":
        return _report_parquet(rec, args.out)
    line = f"embedded {rec['rows']} rows x {rec['dim']} dims"
    if rec.get("prompt"):
        line += f" (prompt {rec.get('prompt_name')!r}: {rec['prompt']!r} before each)"
    if rec.get("examples_per_s"):
        line += f" in {rec['seconds']:.1f}s ({rec['examples_per_s']:,.1f} examples/s)"
    if rec.get("resumed_rows"):
        line += f"; resumed after {rec['resumed_rows']} committed rows"
    if rec.get("truncated"):
        line += f"; {rec['truncated']} inputs truncated to the model's limit"
    print(line + f" -> {args.out}/embeddings.npy")
    return 0


def _report_parquet(rec: dict, out: str) -> int:
    part = rec.get("part_record", rec)
    if "file" not in part:  # the manifest of a finished embedding: nothing was computed
        print(f"already embedded: {rec['rows']} rows x {rec['dim']} dims in {len(rec['parts'])} Parquet parts -> {out}")
        return 0
    line = f"part {part['file']}: {part['rows']} rows"
    if part.get("already"):
        line += " (already there: not computed again)"
    elif part.get("seconds"):
        line += f" in {part['seconds']:.1f}s ({part['rows'] / max(part['seconds'], 1e-9):,.1f} examples/s)"
        if part.get("resumed_rows"):
            line += f"; resumed after {part['resumed_rows']} committed rows"
    print(line)
    if rec.get("waiting") is not None:
        left = rec["waiting"]
        names = ", ".join(left[:3]) + (" ..." if len(left) > 3 else "")
        print(
            f"{len(left)} of {rec['parts']} parts still to come ({names}); "
            f"the last shard to finish writes {out}/embed.json (or: cramkit embed --join {out})"
        )
        return 0
    print(f"embedded {rec['rows']} rows x {rec['dim']} dims in {len(rec['parts'])} Parquet parts -> {out}/embed.json")
    return 0
