"""`cramkit index build|query|info|add|neighbours|export`: a retrieval index over a corpus with our encoder."""

from __future__ import annotations

import argparse
import json
import sys

from cramkit.commands.checks import add_pass_args
from cramkit.commands.reading import add_reading_args, reading_kwargs
from cramkit.embeddings import BLOCK
from cramkit.index import OVERLAP, PASSAGE_TOKENS, RETRO_CHUNK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "index",
        help="build and query a retrieval index (Faiss) over a corpus; RETRO neighbours of a token store",
        description="Chunk a corpus (text files or a token store), embed the chunks with an encoder, build a "
        "Faiss index tuned to a target recall@10 against exact search, and query it.",
    )
    verbs = p.add_subparsers(dest="index_command", metavar="VERB")
    _add_build_parser(verbs)
    _add_query_parser(verbs)
    _add_info_parser(verbs)
    _add_add_parser(verbs)
    _add_neighbours_parser(verbs)
    _add_export_parser(verbs)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _add_build_parser(verbs: argparse._SubParsersAction) -> None:
    """`index build`: chunk, embed and index a corpus."""
    b = verbs.add_parser("build", help="chunk, embed and index a corpus (resumes an interrupted build)")
    b.add_argument(
        "source",
        metavar="SOURCE_OR_STORE",
        nargs="?",
        default=None,
        help="text files, a directory, a glob, a token store, or a folder of Parquet embeddings (cramkit embed "
        "--format parquet: indexed as they are); none: the built-in corpus",
    )
    b.add_argument("--encoder", required=True, metavar="MODEL", help="a run, model directory or hf:DIR")
    b.add_argument("--out", required=True, metavar="IDX", help="the index directory to write")
    b.add_argument(
        "--mode",
        choices=("passages", "retro"),
        default="passages",
        help="passages (search) or retro (64-token chunks of a token store)",
    )
    b.add_argument(
        "--chunk-tokens",
        type=int,
        default=None,
        help=f"tokens per chunk (default: {PASSAGE_TOKENS} for passages, {RETRO_CHUNK} for retro)",
    )
    b.add_argument(
        "--overlap", type=int, default=None, help=f"tokens shared by consecutive passages (default {OVERLAP})"
    )
    b.add_argument("--memory", default="4GB", help="RAM budget for the index (default %(default)s)")
    b.add_argument(
        "--target-recall",
        type=float,
        default=0.95,
        help="recall@10 against exact search to tune for (default %(default)s)",
    )
    b.add_argument(
        "--kind",
        default="auto",
        choices=("auto", "flat", "hnsw", "ivfsq8", "ivfpq"),
        help="index type (default: chosen from the count and --memory)",
    )
    b.add_argument("--pooling", choices=("mean", "cls"), default=None, help="default: the encoder's")
    b.add_argument(
        "--dimensions",
        type=int,
        default=None,
        metavar="N",
        help="index each vector's first N dimensions, renormalised: one of a Matryoshka encoder's (smaller index, "
        "faster search); queries are cut the same way. Recorded in index.json",
    )
    b.add_argument(
        "--prompt-name",
        default=None,
        metavar="NAME",
        help="the encoder's named prompt the chunks get (default: its prompt named document, passage or corpus, "
        "else its default prompt); queries get its prompt named query (else the default). Recorded in index.json",
    )
    b.add_argument(
        "--on-disk",
        action="store_true",
        default=None,
        help="keep the IVF lists on disk (one memory-mapped .ivfdata file), filled in parts and merged (default: "
        "when the in-RAM index would not fit --memory)",
    )
    b.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="on disk: processes filling the parts at once (default 1)",
    )
    b.add_argument(
        "--shard",
        default=None,
        metavar="i/N",
        help="on disk: fill only shard i of N's parts (runs on several machines sharing --out); the last to "
        "finish merges them",
    )
    b.add_argument("--store-tokenizer", default=None, help="the token store's tokenizer, when not the encoder's")
    b.add_argument("--overwrite", action="store_true", help="replace an index already at --out")
    add_reading_args(b)
    _common(b)
    b.set_defaults(func=run_build)


def _add_query_parser(verbs: argparse._SubParsersAction) -> None:
    """`index query`: the k nearest chunks of a text."""
    q = verbs.add_parser("query", help="the k nearest chunks of a text")
    q.add_argument("index", metavar="IDX")
    q.add_argument("texts", metavar="TEXT", nargs="+")
    q.add_argument("-k", type=int, default=10, help="results per query (default %(default)s)")
    q.add_argument("--encoder", default=None, help="the encoder (default: the index's own copy); must match")
    q.add_argument("--json", action="store_true", help="print JSON lines")
    q.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    q.set_defaults(func=run_query)


def _add_info_parser(verbs: argparse._SubParsersAction) -> None:
    """`index info`: what an index holds and how it was built."""
    i = verbs.add_parser("info", help="size, kind, parameters and measured recall of an index")
    i.add_argument("index", metavar="IDX")
    i.add_argument("--json", action="store_true", help="print the information as JSON")
    i.set_defaults(func=run_info)


def _add_add_parser(verbs: argparse._SubParsersAction) -> None:
    """`index add`: more text into an index."""
    a = verbs.add_parser("add", help="chunk, embed and add more text (or another store) to an index")
    a.add_argument("index", metavar="IDX")
    a.add_argument("source", metavar="SOURCE_OR_STORE")
    a.add_argument("--store-tokenizer", default=None, help="the token store's tokenizer, when not the encoder's")
    add_reading_args(a, doc_split=False)
    _common(a)
    a.set_defaults(func=run_add)


def _add_neighbours_parser(verbs: argparse._SubParsersAction) -> None:
    """`index neighbours`: RETRO neighbours of a token store."""
    n = verbs.add_parser("neighbours", help="RETRO: k nearest chunks (other documents) of every store chunk")
    n.add_argument("index", metavar="IDX")
    n.add_argument("--store", required=True, help="the token store whose 64-token chunks get neighbours")
    n.add_argument("--out", required=True, metavar="DIR", help="directory for neighbours.npy")
    n.add_argument("-k", type=int, default=2, help="neighbours per chunk (default %(default)s)")
    n.add_argument("--store-tokenizer", default=None, help="the token store's tokenizer, when not the encoder's")
    _common(n, batch=False)  # --block: also the chunks searched between commits (a rerun resumes after the last)
    n.set_defaults(func=run_neighbours)


def _add_export_parser(verbs: argparse._SubParsersAction) -> None:
    """`index export`: an index into Parquet, LanceDB or Milvus."""
    e = verbs.add_parser(
        "export",
        help="copy an index's vectors, texts and ids into Parquet, LanceDB or Milvus",
        description="Write every chunk of an index (id, vector, text, doc, source) to a Parquet file or "
        "directory, a LanceDB table (a local directory or s3://...) or a Milvus collection (http://HOST:19530 "
        "or a Milvus Lite file NAME.db), with the index's metric (inner product of normalised vectors).",
    )
    e.add_argument("index", metavar="IDX")
    e.add_argument("--to", required=True, metavar="TARGET", help="parquet, lancedb or milvus")
    e.add_argument(
        "--uri",
        required=True,
        help="parquet: FILE.parquet or a directory; lancedb: a directory or s3://BUCKET/PATH; milvus: "
        "http://HOST:19530 or a Milvus Lite file NAME.db",
    )
    e.add_argument("--name", default=None, help="the table or collection (default: the index directory's name)")
    e.add_argument("--overwrite", action="store_true", help="replace a file, table or collection already there")
    e.add_argument(
        "--db-index",
        default="auto",
        help="the database's vector index: flat (exact), hnsw; auto: flat for an exact index, else hnsw",
    )
    e.add_argument(
        "--batch-rows",
        type=int,
        default=None,
        help="rows per insert / record batch / Parquet row group (default: sized by bytes per system)",
    )
    e.set_defaults(func=run_export)


def _common(p: argparse.ArgumentParser, batch: bool = True) -> None:
    if batch:
        add_pass_args(p)
    else:
        p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument(
        "--block", type=int, default=BLOCK, help="chunks embedded between progress commits (default %(default)s)"
    )


def run_build(args: argparse.Namespace) -> int:
    from cramkit.index import build_index
    from cramkit.io import disk_errors

    with disk_errors(args.out):
        m = build_index(
            args.source,
            args.encoder,
            args.out,
            mode=args.mode,
            chunk_tokens=args.chunk_tokens,
            overlap=args.overlap,
            reading=reading_kwargs(args),
            memory=args.memory,
            target_recall=args.target_recall,
            kind=args.kind,
            pooling=args.pooling,
            store_tokenizer=args.store_tokenizer,
            device=args.device,
            max_batch_tokens=args.max_batch_tokens,
            block=args.block,
            overwrite=args.overwrite,
            prompt_name=args.prompt_name,
            dimensions=args.dimensions,
            on_disk=args.on_disk,
            workers=args.workers,
            shard=args.shard,
        )
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
        f"recall@10 {m['recall']['recall_at_10']:.3f} vs exact -> {args.out}"
    )
    return 0


def _prompt_words(p: dict) -> str:
    return f"{p['name']!r} ({p['text']!r})" if p.get("name") else "none"


def run_query(args: argparse.Namespace) -> int:
    import cramkit.index

    idx = cramkit.index.open(args.index, encoder=args.encoder, device=args.device)
    results, truncated = idx.search_truncated(args.texts, args.k)
    for text, hits, cut in zip(args.texts, results, truncated, strict=True):
        if cut:
            print(
                f"note: the query was cut to the encoder's limit of {idx.engine().max_length} tokens",
                file=sys.stderr,
            )
        if args.json:
            print(json.dumps({"query": text, "truncated": cut, "hits": hits}, ensure_ascii=False))
            continue
        if len(args.texts) > 1:
            print(f"== {text}")
        for r, h in enumerate(hits, 1):
            snippet = " ".join(h["text"].split())
            snippet = snippet if len(snippet) <= 200 else snippet[:197] + "..."
            print(f"{r:3d}. {h['score']:.4f}  [doc {h['doc']}, chunk {h['chunk']}, {h['source']}]  {snippet}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    import cramkit.index

    info = cramkit.index.open(args.index).info()
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
    from cramkit.io import disk_errors

    with disk_errors(args.index):
        m = add_to_index(
            args.index,
            args.source,
            store_tokenizer=args.store_tokenizer,
            reading=reading_kwargs(args),
            device=args.device,
            max_batch_tokens=args.max_batch_tokens,
            block=args.block,
        )
    print(f"index now holds {m['count']} chunks; recall@10 {m['recall']['recall_at_10']:.3f} -> {args.index}")
    return 0


def run_neighbours(args: argparse.Namespace) -> int:
    from cramkit.index import retro_neighbours
    from cramkit.io import disk_errors

    with disk_errors(args.out):
        info = retro_neighbours(
            args.index,
            args.store,
            args.out,
            k=args.k,
            store_tokenizer=args.store_tokenizer,
            device=args.device,
            block=args.block,
        )
    print(
        f"neighbours of {info['chunks']} chunks (k={info['k']}, {info['chunks_per_s']:,.0f} chunks/s"
        + (f", resumed after {info['resumed_after']}" if info["resumed_after"] else "")
        + f") -> {args.out}/neighbours.npy"
        + (f"; {info['missing']} slots empty" if info["missing"] else "")
    )
    return 0


def run_export(args: argparse.Namespace) -> int:
    from cramkit.index import export_index
    from cramkit.io import disk_errors

    with disk_errors(args.uri):
        info = export_index(
            args.index,
            args.to,
            args.uri,
            name=args.name,
            overwrite=args.overwrite,
            rows_per_batch=args.batch_rows,
            db_index=args.db_index,
        )
    where = f"{info['to']} {info['uri']}" + (f" as {info['name']!r}" if info["to"] != "parquet" else "")
    rate = f" ({info['vectors_per_s']:,.0f} vectors/s)" if info["vectors_per_s"] else ""
    print(
        f"exported {info['rows']} vectors (dim {info['dim']}, metric inner product) to {where} in "
        f"{info['seconds']:.1f}s{rate}" + (f"; vector index {info['db_index']}" if info["db_index"] else "")
    )
    return 0
