"""Pipeline parallelism (``parallel.pp``) on CPU processes: step time and bubble against one process.

    python bench/bench_pipeline.py                      # tiny-cpu shape, 2 stages, 2/4/8 micro-batches
    python bench/bench_pipeline.py --micro-batches 4 --stages 2

Each run trains the same model on the same synthetic global batches (``--micro-batches`` micro-batches of
``--micro`` sequences of 128 tokens) through the trainer's own paths: one process (``forward_backward``, as
``cramkit pretrain``), and P processes of one thread each through ``cramkit.train.pipeline.Pipeline`` with the
GPipe, 1F1B and interleaved 1F1B schedules (interleaved: 2 stages per process, so the 4 blocks make 4 stages
of one block). Reported per configuration: the mean optimizer-step time after warm-up, its ratio to one process
with one thread (the baseline, measured in the same invocation), the idle fraction 1 - T1 / (P * Tpp) (the
share of the P processes' time not spent on the one-process work: bubble plus communication), and the
schedule's theoretical bubble, (P - 1) / (M + P - 1), or with V stages per process
((P - 1) / V) / (M + (P - 1) / V) (Narayanan et al. 2021).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from cramkit.model.encoder import ModelConfig
from cramkit.model.heads import IGNORE, MaskedLM
from cramkit.train import distributed as D
from cramkit.train import parallel as P
from cramkit.train.objectives import MLMObjective
from cramkit.train.pipeline import Pipeline
from cramkit.train.trainer import forward_backward

TINY = dict(vocab_size=8192, hidden=256, layers=4, heads=4, intermediate=1024, max_position=128)
LENGTH = 128


def batches(cfg: ModelConfig, n: int, rows: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, cfg.vocab_size, (rows, LENGTH), generator=g)
        labels = torch.where(torch.rand(rows, LENGTH, generator=g) < 0.15, ids, IGNORE)
        out.append({"input_ids": ids, "labels": labels})
    return out


def worker(args: argparse.Namespace) -> None:
    cfg = D.ParallelConfig(pp=int(os.environ.get("WORLD_SIZE", "1")), pp_schedule=args.schedule)
    ctx = D.init_distributed("cpu", cfg)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    mcfg = ModelConfig(**TINY)
    model = MaskedLM(mcfg)
    objective = MLMObjective()
    pipe = Pipeline(model, cfg, ctx, "fp32") if ctx.distributed else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        micro = batches(mcfg, args.micro_batches, args.micro, step)
        t0 = time.perf_counter()
        if pipe is not None:
            loss, _ = pipe.forward_backward(micro, objective.count, objective.tokens)
            pipe.clip_grad_norm(1.0)
        else:
            loss, _ = forward_backward(model, micro, ctx, "fp32", None, objective)
            P.clip_grad_norm(model, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if ctx.distributed:
            torch.distributed.barrier()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    if ctx.is_main:
        print(json.dumps({"step_s": sum(times) / len(times), "losses": losses}))
    D.shutdown(ctx)


def run(nproc: int, schedule: str, args: argparse.Namespace, threads: int = 1) -> dict:
    w = [__file__, "worker", "--schedule", schedule, "--threads", str(threads)]
    w += ["--micro", str(args.micro), "--micro-batches", str(args.micro_batches)]
    w += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    if nproc == 1:
        cmd = [sys.executable, *w]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *w]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"run failed:\n{out.stderr[-4000:]}")
    print(f"  ({nproc} process(es), {schedule}: {time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", default="bench", choices=["bench", "worker"])
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--micro", type=int, default=4, help="sequences per micro-batch")
    ap.add_argument("--micro-batches", type=int, default=0, help="micro-batches per step (default: 2, 4 and 8)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--schedules", default="gpipe,1f1b,interleaved", help="the pipelined runs, comma-separated")
    args = ap.parse_args()
    if args.what == "worker":
        return worker(args)
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}; tiny-cpu "
        f"shape (hidden 256, 4 layers), micro-batch {args.micro} x {LENGTH} tokens, {args.stages} stages, "
        f"{args.steps} timed steps after {args.warmup} warm-up"
    )
    print("| micro-batches M | run | step (s) | ratio to 1 process | idle 1 - T1/(P·Tpp) | theory (P-1)/(M+P-1) |")
    print("|---:|---|---:|---:|---:|---:|")
    p = args.stages
    for m in [args.micro_batches] if args.micro_batches else [2, 4, 8]:
        args.micro_batches = m
        base = run(1, "1f1b", args)
        two = run(1, "1f1b", args, threads=p)
        print(f"| {m} | 1 process, 1 thread (baseline) | {base['step_s']:.3f} | 1.00 | - | - |")
        print(f"| {m} | 1 process, {p} threads | {two['step_s']:.3f} | {two['step_s'] / base['step_s']:.2f} | - | - |")
        for schedule in args.schedules.split(","):
            r = run(p, schedule, args)
            drift = max(abs(a - b) for a, b in zip(r["losses"], base["losses"], strict=True))
            idle = 1 - base["step_s"] / (p * r["step_s"])
            bubble = (p - 1) / (2 if schedule == "interleaved" else 1)
            print(
                f"| {m} | {p} processes, pp={p}, {schedule} | {r['step_s']:.3f} | {r['step_s'] / base['step_s']:.2f} "
                f"| {idle:.2f} | {bubble / (m + bubble):.2f} |"
            )
            assert drift < 1e-4 * max(1.0, abs(base["losses"][0])), f"losses differ from one process by {drift}"
        print(f"load average now {os.getloadavg()[0]:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
