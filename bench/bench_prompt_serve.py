"""One base model with several tasks' deep prompts against the same tasks fully fine-tuned (issue 28).

Three GLUE tasks (SST-2, CoLA, MRPC) are fine-tuned from all-MiniLM-L6-v2 twice with the real command: fully
(a head on the whole model, every weight stored per task) and with ``--method ptuning`` (the encoder frozen,
prefixes and a head stored per task). Quality is not the point here (``--train-rows`` rows, one epoch): the
same three tasks are served by ``cramkit serve`` as a subprocess, once as three full models and once as three
prompt directories on one ``--base``, and measured the same way:

- resident memory (VmRSS of the server, after the warm-up and after the rounds; peak VmHWM);
- bytes stored per task (the task directory's model.safetensors);
- sentences/s: ``--clients`` threads each send ``--requests`` POST /predict requests of ``--batch`` SST-2 dev
  sentences to the three tasks in turn; both servers run in interleaved rounds (``--rounds``), the other one
  frozen (SIGSTOP) meanwhile; the median over rounds.

    python bench/bench_prompt_serve.py --work runs/bps [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_infer import machine, minilm_dir

TASKS = ("glue/sst2", "glue/cola", "glue/mrpc")


def cramkit(*args: str, env: dict | None = None) -> None:
    proc = subprocess.run([sys.executable, "-m", "cramkit", *args], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"cramkit {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")


def build(work: Path, glue: str, rows: int) -> dict[str, dict[str, Path]]:
    base = f"hf:{minilm_dir()}"
    out: dict[str, dict[str, Path]] = {"full": {}, "ptuning": {}}
    for task in TASKS:
        name = task.split("/")[1]
        for method in ("full", "ptuning"):
            d = work / f"{method}-{name}"
            if not (d / "cramkit-model.json").is_file():
                extra = ["--method", "ptuning"] if method == "ptuning" else []
                cramkit(
                    "finetune",
                    "--task",
                    task,
                    "--from",
                    base,
                    "--data-dir",
                    glue,
                    "--out",
                    str(d),
                    "--set",
                    f"max_train_examples={rows}",
                    "--set",
                    "epochs=1",
                    "--set",
                    "min_steps=0",
                    "--no-progress",
                    *extra,
                )
            out[method][name] = d
    return out


def rss(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    get = lambda key: int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) / 1024  # noqa: E731
    return get("VmRSS"), get("VmHWM")


def start(models: list[str], threads: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cramkit",
            "serve",
            *models,
            *extra,
            "--port",
            "0",
            "--threads",
            str(threads),
            "--max-wait-ms",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines = []
    while True:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit("the server did not start:\n" + "".join(lines))
        lines.append(line)
        m = re.search(r"serving on (http://\S+)", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, m.group(1)


def load(url: str, texts: list[str], clients: int, requests: int, batch: int) -> float:
    """Sentences per second of ``clients`` threads, each sending ``requests`` requests over the three tasks."""
    names = [t.split("/")[1] for t in TASKS]

    def client(c: int) -> int:
        done = 0
        with httpx.Client(base_url=url, timeout=600) as http:
            for r in range(requests):
                start = (c * requests + r) * batch % (len(texts) - batch)
                body = {"inputs": [[t] for t in texts[start : start + batch]], "model": names[(c + r) % 3]}
                resp = http.post("/predict", json=body)
                assert resp.status_code == 200, resp.text
                done += batch
        return done

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        total = sum(pool.map(client, range(clients)))
    return total / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="bench-prompt-serve", help="where the task models are built (kept)")
    ap.add_argument("--glue", default=os.environ.get("CRAMKIT_GLUE_DIR", "../shared/data/glue"))
    ap.add_argument("--train-rows", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    dirs = build(work, args.glue, args.train_rows)
    lines = (Path(args.glue) / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    texts = [line.split("\t")[0] for line in lines]
    servers = {
        "3 full models": start([f"{k}={v}" for k, v in dirs["full"].items()], args.threads, []),
        "1 base + 3 prompt dirs": start(
            [f"{k}={v}" for k, v in dirs["ptuning"].items()], args.threads, ["--base", f"hf:{minilm_dir()}"]
        ),
    }
    rows = {name: {"rate": [], "rss_start": rss(proc.pid)[0]} for name, (proc, _) in servers.items()}
    try:
        for _, url in servers.values():  # warm-up
            load(url, texts, 1, 3, args.batch)
        order = list(servers)
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                for other, (proc, _) in servers.items():
                    os.kill(proc.pid, signal.SIGCONT if other == name else signal.SIGSTOP)
                rows[name]["rate"].append(load(servers[name][1], texts, args.clients, args.requests, args.batch))
        for proc, _ in servers.values():
            os.kill(proc.pid, signal.SIGCONT)
        for name, (proc, _) in servers.items():
            rows[name]["rss_end"], rows[name]["rss_peak"] = rss(proc.pid)
    finally:
        for proc, _ in servers.values():
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            proc.wait(timeout=60)
    stored = {
        m: statistics.mean((d / "model.safetensors").stat().st_size for d in ds.values()) for m, ds in dirs.items()
    }
    trained = {
        m: json.loads((ds["sst2"] / "results.json").read_text()).get("trainable_parameters") for m, ds in dirs.items()
    }
    print(
        f"# {machine()}; {args.threads} threads, {args.clients} clients x {args.requests} requests of {args.batch} "
        f"SST-2 dev sentences, round-robin over 3 tasks; median of {args.rounds} interleaved rounds"
    )
    print(
        "| served | sentences/s | RSS after warm-up (MiB) | RSS after rounds (MiB) | peak (MiB) | stored per task "
        "| trained per task |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        method = "full" if name.startswith("3 full") else "ptuning"
        print(
            f"| {name} | {statistics.median(row['rate']):.1f} | {row['rss_start']:.0f} | {row['rss_end']:.0f} | "
            f"{row['rss_peak']:.0f} | {stored[method] / 2**20:.2f} MiB | {trained[method]:,} |"
        )
    a, b = (statistics.median(r["rate"]) for r in rows.values())
    print(
        f"ratio (prompts / full): {b / a:.2f}x sentences/s; "
        f"memory {rows['1 base + 3 prompt dirs']['rss_end'] / rows['3 full models']['rss_end']:.2f}x"
    )


if __name__ == "__main__":
    main()
