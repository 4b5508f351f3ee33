"""`cramkit embed FILE_OR_STORE --from MODEL --out DIR`: embeddings of every row into a memory map, or into
Parquet parts (`--format parquet`, `--shard i/N`, `--join DIR`)."""

from __future__ import annotations

import argparse

from cramkit import request
from cramkit.embeddings.request import EmbedRequest


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
    request.add_arguments(p, EmbedRequest, skip=("normalize",))
    # a switch alone (a field that defaults to None would get --no-normalize too)
    p.add_argument("--normalize", action="store_true", default=None, help="L2-normalise (default: the model's)")
    p.add_argument(
        "--join",
        default=None,
        metavar="DIR",
        help="check the Parquet parts in DIR and write its manifest embed.json (or name the part missing)",
    )
    p.add_argument("--text", dest="text_field", help=argparse.SUPPRESS)  # the earlier name of --text-field
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cramkit.embeddings.verb import embed_source
    from cramkit.errors import CramkitError

    if args.join is not None:
        if args.source or args.model or args.out or args.shard:
            raise CramkitError("--join DIR takes no FILE_OR_STORE, --from, --out or --shard: it only joins DIR")
        from cramkit.embeddings.parquet import join
        from cramkit.io import disk_errors

        with disk_errors(args.join):
            m = join(args.join)
        assert m is not None
        print(f"joined {len(m['parts'])} parts: {m['rows']} rows x {m['dim']} dims -> {args.join}/embed.json")
        return 0
    req = request.from_args(EmbedRequest, args)
    rec = embed_source(req)
    from cramkit.embeddings.memmap import dist_info

    if rec is None or dist_info()[0] != 0:
        return 0
    if req.format == "parquet":
        return _report_parquet(rec, str(req.out))
    line = f"embedded {rec['rows']} rows x {rec['dim']} dims"
    if rec.get("prompt"):
        line += f" (prompt {rec.get('prompt_name')!r}: {rec['prompt']!r} before each)"
    if rec.get("examples_per_s"):
        line += f" in {rec['seconds']:.1f}s ({rec['examples_per_s']:,.1f} examples/s)"
    if rec.get("resumed_rows"):
        line += f"; resumed after {rec['resumed_rows']} committed rows"
    if rec.get("truncated"):
        line += f"; {rec['truncated']} inputs truncated to the model's limit"
    print(line + f" -> {req.out}/embeddings.npy")
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
