"""`cramkit index build|query|info|add|neighbours|export`: a retrieval index over a corpus with our encoder."""

from __future__ import annotations

import argparse
import json
import sys

from cramkit import request
from cramkit.index.request import AddRequest, BuildRequest, ExportRequest, InfoRequest, NeighboursRequest, QueryRequest


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "index",
        help="build and query a retrieval index (Faiss) over a corpus; RETRO neighbours of a token store",
        description="Chunk a corpus (text files or a token store), embed the chunks with an encoder, build a "
        "Faiss index tuned to a target recall@10 against exact search, and query it.",
    )
    verbs = p.add_subparsers(dest="index_command", metavar="VERB")
    b = verbs.add_parser("build", help="chunk, embed and index a corpus (resumes an interrupted build)")
    request.add_arguments(b, BuildRequest, skip=("on_disk",))
    b.add_argument(  # a switch alone (a field that defaults to None would get --no-on-disk too)
        "--on-disk",
        action="store_true",
        default=None,
        help="keep the IVF lists on disk (one memory-mapped .ivfdata file), filled in parts and merged (default: "
        "when the in-RAM index would not fit --memory)",
    )
    b.set_defaults(func=run_build)
    q = verbs.add_parser("query", help="the k nearest chunks of a text")
    request.add_arguments(q, QueryRequest)
    q.add_argument("--json", action="store_true", help="print JSON lines")
    q.set_defaults(func=run_query)
    i = verbs.add_parser("info", help="size, kind, parameters and measured recall of an index")
    request.add_arguments(i, InfoRequest)
    i.add_argument("--json", action="store_true", help="print the information as JSON")
    i.set_defaults(func=run_info)
    a = verbs.add_parser("add", help="chunk, embed and add more text (or another store) to an index")
    request.add_arguments(a, AddRequest)
    a.set_defaults(func=run_add)
    n = verbs.add_parser("neighbours", help="RETRO: k nearest chunks (other documents) of every store chunk")
    request.add_arguments(n, NeighboursRequest, skip=("max_batch_tokens",))
    n.set_defaults(func=run_neighbours)
    e = verbs.add_parser(
        "export",
        help="copy an index's vectors, texts and ids into Parquet, LanceDB or Milvus",
        description="Write every chunk of an index (id, vector, text, doc, source) to a Parquet file or "
        "directory, a LanceDB table (a local directory or s3://...) or a Milvus collection (http://HOST:19530 "
        "or a Milvus Lite file NAME.db), with the index's metric (inner product of normalised vectors).",
    )
    request.add_arguments(e, ExportRequest)
    e.set_defaults(func=run_export)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_build(args: argparse.Namespace) -> int:
    from cramkit.index import build_index

    req = request.from_args(BuildRequest, args)
    m = build_index(req)
    if m is None:
        return 0
    b = m["build"]
    pr = m["prompts"]
    if pr["documents"]["name"] or pr["queries"]["name"]:
        print(
            f"prompts: chunks {_prompt_words(pr['documents'])}, queries {_prompt_words(pr['queries'])}",
            file=sys.stderr,
        )
    print(
        f"indexed {m['count']} chunks of {m['documents']} documents in {b['seconds']:.1f}s "
        f"({b['chunks_per_s']:,.1f} chunks/s; embedding {b['embed_seconds']:.1f}s): {m['plan']['kind']}"
        + (f" on disk ({b['parts']} parts)" if m["plan"].get("on_disk") else "")
        + (f" over {m['dim']}-dimension cut vectors" if m["encoder"].get("dimensions") else "")
        + ", "
        f"recall@10 {m['recall']['recall_at_10']:.3f} vs exact -> {req.out}"
    )
    return 0


def _prompt_words(p: dict) -> str:
    return f"{p['name']!r} ({p['text']!r})" if p.get("name") else "none"


def run_query(args: argparse.Namespace) -> int:
    from cramkit.index import query

    answers = query(request.from_args(QueryRequest, args))
    for answer in answers:
        if args.json:
            print(json.dumps(answer, ensure_ascii=False))
            continue
        if len(answers) > 1:
            print(f"== {answer['query']}")
        for r, h in enumerate(answer["hits"], 1):
            snippet = " ".join(h["text"].split())
            snippet = snippet if len(snippet) <= 200 else snippet[:197] + "..."
            print(f"{r:3d}. {h['score']:.4f}  [doc {h['doc']}, chunk {h['chunk']}, {h['source']}]  {snippet}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from cramkit.index import info as index_info

    info = index_info(request.from_args(InfoRequest, args))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    rec = info["recall"] or {}
    print(f"index      {info['path']} ({info['mode']})")
    print(
        f"size       {info['count']} chunks x {info['dim']} dims, {info['documents']} documents, "
        f"{info['bytes_on_disk'] / 2**20:.1f} MiB on disk"
    )
    print(f"kind       {info['kind']}: {info['factory']} ({info['why']})")
    print(
        f"params     {json.dumps(info['params'])}; faiss memory-mapped: {info['faiss_memory_mapped']}"
        + ("; lists on disk" if info["on_disk"] else "")
    )
    if rec.get("exact"):
        print("recall@10  exact search (a flat index compares every query with every chunk; nothing to tune)")
    else:
        print(
            f"recall@10  {rec.get('recall_at_10')} vs exact on {rec.get('queries')} held-out queries "
            f"(target {rec.get('target')}{'' if rec.get('reached', True) else ', NOT reached'})"
        )
    print(f"encoder    {info['encoder']} (pooling {info['pooling']}, vectors L2-normalised)")
    pr = info.get("prompts") or {}
    if any((pr.get(side) or {}).get("name") for side in ("documents", "queries")):
        print(f"prompts    chunks {_prompt_words(pr['documents'])}, queries {_prompt_words(pr['queries'])}")
    print(f"chunking   {json.dumps(info['chunking'])}")
    b = info.get("build") or {}
    print(f"build      {b.get('seconds')}s, {b.get('chunks_per_s')} chunks/s, peak RSS {b.get('peak_rss_mb')} MiB")
    if b.get("parts"):
        print(
            f"parts      {b['parts']} filled in {b.get('part_seconds')}s, peak RSS per process "
            f"{b.get('part_peak_rss_mb')} MiB; merge + tuning {b.get('merge_tune_seconds')}s, "
            f"peak RSS {b.get('merge_peak_rss_mb')} MiB"
        )
    return 0


def run_add(args: argparse.Namespace) -> int:
    from cramkit.index import add_to_index

    req = request.from_args(AddRequest, args)
    m = add_to_index(req)
    print(f"index now holds {m['count']} chunks; recall@10 {m['recall']['recall_at_10']:.3f} -> {req.path}")
    return 0


def run_neighbours(args: argparse.Namespace) -> int:
    from cramkit.index import retro_neighbours

    req = request.from_args(NeighboursRequest, args)
    info = retro_neighbours(req)
    print(
        f"neighbours of {info['chunks']} chunks (k={info['k']}, {info['chunks_per_s']:,.0f} chunks/s"
        + (f", resumed after {info['resumed_after']}" if info["resumed_after"] else "")
        + f") -> {req.out}/neighbours.npy"
        + (f"; {info['missing']} slots empty" if info["missing"] else "")
    )
    return 0


def run_export(args: argparse.Namespace) -> int:
    from cramkit.index import export_index

    info = export_index(request.from_args(ExportRequest, args))
    where = f"{info['to']} {info['uri']}" + (f" as {info['name']!r}" if info["to"] != "parquet" else "")
    rate = f" ({info['vectors_per_s']:,.0f} vectors/s)" if info["vectors_per_s"] else ""
    print(
        f"exported {info['rows']} vectors (dim {info['dim']}, metric inner product) to {where} in "
        f"{info['seconds']:.1f}s{rate}" + (f"; vector index {info['db_index']}" if info["db_index"] else "")
    )
    return 0
