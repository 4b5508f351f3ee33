"""autofaiss on the vectors of bench_ondisk.py (issue 31): build with its own choices under the same memory
budget, then recall@10 against exact search and query latency on the same fresh queries.

Runs in a separate virtual environment that has autofaiss (it pins numpy 1.x), started by
``bench_ondisk.py --autofaiss PYTHON``; it does not import cramkit. Prints one JSON line.

    python -m venv /tmp/af && /tmp/af/bin/pip install autofaiss
    /tmp/af/bin/python bench/autofaiss_step.py --work WORK --memory 4GB
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import time
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, help="bench_ondisk.py's WORK (vectors.npy, queries.npy, truth.npy)")
    p.add_argument("--memory", default="4GB", help="current_memory_available: what the build may use")
    p.add_argument("--index-memory", default=None, help="max_index_memory_usage (default: half of --memory)")
    p.add_argument("--cores", type=int, default=os.cpu_count())
    p.add_argument("--index-key", default=None, help="a Faiss factory string (default: autofaiss chooses)")
    p.add_argument(
        "--metric",
        default="ip",
        choices=["ip", "l2"],
        help="l2 for SQ indexes, which autofaiss refuses with ip "
        "(the bench's vectors are unit-length: the same neighbours)",
    )
    args = p.parse_args()
    import faiss
    from autofaiss import build_index

    work = Path(args.work)
    emb = work / "autofaiss-emb"  # autofaiss reads a folder of .npy files
    emb.mkdir(exist_ok=True)
    if not (emb / "vectors.npy").exists():
        (emb / "vectors.npy").symlink_to(work / "vectors.npy")
    mem = args.memory.upper().removesuffix("B")  # autofaiss spells 4GB "4G"
    index_mem = (args.index_memory or f"{float(mem[:-1]) / 2:g}{mem[-1]}").upper().removesuffix("B")
    t0 = time.perf_counter()
    _, infos = build_index(
        embeddings=str(emb),
        index_path=str(work / "autofaiss.index"),
        index_infos_path=str(work / "autofaiss-infos.json"),
        max_index_memory_usage=index_mem,
        current_memory_available=mem,
        index_key=args.index_key,
        max_index_query_time_ms=10.0,
        metric_type=args.metric,
        nb_cores=args.cores,
        verbose=logging.WARNING,
    )
    build_s = time.perf_counter() - t0
    if not (work / "autofaiss.index").is_file():
        raise SystemExit(f"autofaiss wrote no index (memory {mem}, index memory {index_mem}): see its log above")
    hwm_build = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    # the index as written, with the search parameters autofaiss tuned for 10 ms a query (they are serialised)
    index = faiss.read_index(str(work / "autofaiss.index"))
    q = np.load(work / "queries.npy")
    truth = np.load(work / "truth.npy")
    t0 = time.perf_counter()
    _, ids = index.search(q, 10)
    batch = time.perf_counter() - t0
    lat = []
    for i in range(200):
        t1 = time.perf_counter()
        index.search(q[i : i + 1], 10)
        lat.append(time.perf_counter() - t1)
    recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids.tolist(), truth.tolist(), strict=True)]))
    out = {
        "seconds": round(build_s, 1),
        "index_key": (infos or {}).get("index_key"),
        "max_index_memory_usage": index_mem,
        "current_memory_available": mem,
        "infos": infos,
        "index_bytes": (work / "autofaiss.index").stat().st_size,
        "vmhwm_build_mib": hwm_build,
        "recall_at_10": round(recall, 4),
        "batch_qps": round(len(q) / batch),
        "single_ms_p50": round(1000 * float(np.median(lat)), 2),
        "single_ms_p90": round(1000 * float(np.percentile(lat, 90)), 2),
        "faiss": faiss.__version__,
    }
    print(json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
