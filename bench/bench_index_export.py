"""`cramkit index export`: vectors/s into each target and top-10 agreement of its search with cramkit's exact
search, on the engines that run here (Parquet through pyarrow, LanceDB embedded, Milvus Lite in-process).

    python bench/bench_index_export.py --part real [--chars 300000]        # MiniLM on real news text
    python bench/bench_index_export.py --part synthetic [--n 200000] [--dim 384]
    python bench/bench_index_export.py --part synthetic --n 200000 --hnsw  # also the HNSW indexes

``real``: the first ``--chars`` characters of NLTK's ABC science news (../shared/data) indexed by
``cramkit index build --kind flat`` with all-MiniLM-L6-v2 (384 dimensions); the queries are the first 200
first-sentences of GLUE MRPC dev, embedded by the index's encoder.

``synthetic`` (labelled as such in the output): N unit vectors from bench_index.py's generator (clustered,
low-rank like sentence embeddings), written as a cramkit index directory (exact kind, texts
"synthetic chunk I"), queried with 200 fresh draws of the same process.

Each target: ``cramkit.index.export_index`` timed in-process (what ``cramkit index export`` runs, without the
interpreter's start; the client packages imported before), vectors/s = rows / seconds (opening the index,
connecting, writing, flushing and building the target's vector index); then the target is opened as its
users would and searched with the same query vectors (LanceDB ``distance_type("dot")``, Milvus
``metric_type IP``, Parquet: numpy over the file's ``vector`` column); agreement = mean over queries of
|its top 10 & exact top 10| / 10.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _shared_data import SHARED

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def machine() -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, {when}"


def agreement(got: list[list[int]], want: np.ndarray) -> float:
    return float(np.mean([len(set(g) & set(w.tolist())) / len(w) for g, w in zip(got, want, strict=True)]))


def real_index(args: argparse.Namespace, work: Path) -> tuple[Path, np.ndarray]:
    import cramkit.index
    from bench_index import minilm

    text = (SHARED / "corpus" / "nltk-abc" / "science.txt").read_text(encoding="utf-8", errors="replace")
    corpus = work / "abc.txt"
    corpus.write_text(text[: args.chars], encoding="utf-8")
    out = work / "abc_idx"
    cmd = [sys.executable, "-m", "cramkit", "index", "build", str(corpus), "--encoder", minilm(), "--out", str(out)]
    subprocess.run([*cmd, "--kind", "flat", "--device", "cpu"], check=True)
    queries = []
    with open(SHARED / "glue" / "MRPC" / "dev.tsv", encoding="utf-8-sig", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            queries.append(row["#1 String"].strip())
    return out, cramkit.index.open(out).embed(queries[:200])


def synthetic_index(args: argparse.Namespace, work: Path) -> tuple[Path, np.ndarray]:
    """A cramkit index directory (exact kind) over N synthetic vectors, written file by file."""
    from bench_index import synthetic

    out = work / "synthetic_idx"
    data = out / "data-000"
    data.mkdir(parents=True)
    n, d = args.n, args.dim
    synthetic(n, d, seed=0, out=data / "vectors.npy")
    docs = np.arange(n, dtype=np.int64) // 4
    table = np.stack([docs, docs, np.zeros(n), np.full(n, 8), np.zeros(n), -np.ones(n), -np.ones(n)], 1)
    np.save(data / "chunks.npy", table.astype(np.int64))
    texts = [f"synthetic chunk {i}".encode() for i in range(n)]
    np.save(data / "text_offsets.npy", np.concatenate([[0], np.cumsum([len(t) for t in texts])]).astype(np.int64))
    (data / "texts.bin").write_bytes(b"".join(texts))
    np.save(data / "doc_hash.npy", np.zeros(int(docs[-1]) + 1, dtype=np.uint64))
    manifest = {
        "format": "cramkit-index-1",
        "mode": "passages",
        "data": "data-000",
        "count": n,
        "dim": d,
        "documents": int(docs[-1]) + 1,
        "sources": ["synthetic"],
        "encoder": {"dir": "encoder", "source": "none (synthetic vectors)", "fingerprint": None, "pooling": "mean"},
        "plan": {"kind": "flat", "why": "synthetic", "dim": d},
        "params": {},
        "files": {p.name: p.stat().st_size for p in data.iterdir()},
    }
    (out / "index.json").write_text(json.dumps(manifest), encoding="utf-8")
    return out, synthetic(200, d, seed=7)


def search_parquet(path: Path, q: np.ndarray) -> list[list[int]]:
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=["id", "vector"])
    vec = t.column("vector").combine_chunks().flatten().to_numpy().reshape(len(t), -1)
    ids = t.column("id").to_numpy()
    return ids[np.argsort(-(q @ vec.T), axis=1, kind="stable")[:, :10]].tolist()


def search_lancedb(uri: Path, name: str, q: np.ndarray) -> list[list[int]]:
    import lancedb

    table = lancedb.connect(str(uri)).open_table(name)
    out = []
    for v in q:
        s = table.search(v, vector_column_name="vector").distance_type("dot").limit(10)
        out.append(s.to_arrow()["id"].to_pylist())
    return out


def search_milvus(client: object, name: str, q: np.ndarray) -> list[list[int]]:
    client.load_collection(name)  # type: ignore[attr-defined]
    out: list[list[int]] = []
    for a in range(0, len(q), 50):
        res = client.search(  # type: ignore[attr-defined]
            name, data=[v.tolist() for v in q[a : a + 50]], limit=10, search_params={"metric_type": "IP"}
        )
        out += [[h["id"] for h in row] for row in res]
    return out


def run(args: argparse.Namespace) -> None:
    import lancedb  # noqa: F401  imported before the clocks start: an import is not export time
    import pyarrow.parquet  # noqa: F401
    import pymilvus  # noqa: F401

    import cramkit.index

    work = Path(tempfile.mkdtemp(prefix="bench-export-", dir=args.work))
    try:
        t0 = time.perf_counter()
        idx_dir, q = real_index(args, work) if args.part == "real" else synthetic_index(args, work)
        idx = cramkit.index.open(idx_dir)
        _, truth = idx.search_vectors(q, 10)
        label = "real (all-MiniLM-L6-v2, ABC science news)" if args.part == "real" else "SYNTHETIC vectors"
        print(f"{machine()}; {label}: {len(idx)} x {idx.manifest['dim']} ({time.perf_counter() - t0:.0f}s setup)")
        rows = []
        kinds = ["flat", "hnsw"] if args.hnsw else ["flat"]

        def one(target: str, uri: Path, db_index: str, search) -> None:
            info = cramkit.index.export_index(idx_dir, target, str(uri), db_index=db_index, log=lambda s: None)
            agree = agreement(search(), truth)
            rows.append((target, info.get("db_index") or "-", info["seconds"], info["vectors_per_s"], agree))
            print(f"  {rows[-1]}", flush=True)

        one("parquet", work / "out.parquet", "flat", lambda: search_parquet(work / "out.parquet", q))
        for kind in kinds:
            uri = work / f"lance-{kind}"
            one("lancedb", uri, kind, lambda uri=uri: search_lancedb(uri, idx_dir.name, q))
        from pymilvus import MilvusClient

        for kind in kinds:
            db = work / f"milvus-{kind}.db"
            one("milvus", db, kind, lambda db=db: search_milvus(MilvusClient(str(db)), idx_dir.name, q))
        print(f"\n{label}: {len(idx)} x {idx.manifest['dim']}, {len(q)} queries, top-10 agreement with exact search\n")
        print("| target | vector index in the target | seconds | vectors/s | top-10 agreement |")
        print("|---|---|---:|---:|---:|")
        for t, k, s, v, a in rows:
            print(f"| {t} | {k} | {s:.2f} | {v:,.0f} | {a:.4f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("real", "synthetic"), default="real")
    ap.add_argument("--chars", type=int, default=300_000, help="characters of real text to index (real)")
    ap.add_argument("--n", type=int, default=200_000, help="synthetic vectors")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--hnsw", action="store_true", help="also export with --db-index hnsw")
    ap.add_argument("--work", default=tempfile.gettempdir())
    run(ap.parse_args())


if __name__ == "__main__":
    main()
