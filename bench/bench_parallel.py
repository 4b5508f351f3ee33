"""Parallel training benchmarks: checkpoint stall (async vs sync) and 2-process scaling.

    python bench/bench_parallel.py stall     # crammed-bert shape (>100M parameters), 1 process, CPU
    python bench/bench_parallel.py scaling   # tokens/s, 1 process vs 2 (DDP, FSDP2) under torchrun
    python bench/bench_parallel.py           # both

Stall: the time the training loop is blocked by a checkpoint of the model and its AdamW state.
The synchronous baseline (the same Checkpointer writing synchronously: shards, weights file, checksums)
is measured in the same run, on the same state, as the asynchronous save (host copy overlapped with
forward/backward, write in a background thread). Scaling: optimizer steps of the same global batch
with 1 process (2 threads) and 2 processes (1 thread each), synthetic batches.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from cramkit.model.encoder import ModelConfig, count_parameters
from cramkit.model.heads import IGNORE, MaskedLM
from cramkit.train import checkpoint as ckpt
from cramkit.train import distributed as D
from cramkit.train import parallel as P

CRAMMED = dict(vocab_size=32768, hidden=768, layers=16, heads=12, intermediate=3072, max_position=128)
TINY = dict(vocab_size=8192, hidden=256, layers=4, heads=4, intermediate=1024, max_position=128)


def batch(cfg: ModelConfig, rows: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, cfg.vocab_size, (rows, length), generator=g)
    labels = torch.where(torch.rand(rows, length, generator=g) < 0.15, ids, IGNORE)
    return ids, labels


# ---------------------------------------------------------------------------------------------- stall


def bench_stall(rounds: int, micro: int, root: Path) -> dict:
    torch.manual_seed(0)
    cfg = ModelConfig(**CRAMMED)
    model = MaskedLM(cfg)
    n_params = count_parameters(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ctx = D.DistContext()
    ids, labels = batch(cfg, micro, 128, 0)

    def fwd_bwd() -> float:
        t0 = time.perf_counter()
        model(ids, labels).loss.backward()
        return time.perf_counter() - t0

    def update() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    fwd_bwd()
    update()  # optimizer state exists from here on
    state_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    state_bytes += sum(
        v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values() if v.dim() > 0
    )

    plain = [fwd_bwd() for _ in range(2)]
    update()
    t_step = min(plain)

    sync = ckpt.Checkpointer(root / "sync", ctx, keep=1, async_save=False)
    sync_times = []
    for r in range(rounds):
        t0 = time.perf_counter()
        sync.save(100 + r, model, optimizer, {"round": r})
        sync_times.append(time.perf_counter() - t0)
    sync.close()

    # async write, host copy on the loop's thread (what a loop that never calls before_update gets)
    plain_async = ckpt.Checkpointer(root / "async-plain", ctx, keep=1, async_save=True, overlap_staging=False)
    copy_stalls = []
    for r in range(rounds):
        t0 = time.perf_counter()
        plain_async.save(300 + r, model, optimizer, {"round": r})
        copy_stalls.append(time.perf_counter() - t0)
        plain_async.wait()
    plain_async.close()

    writer = ckpt.Checkpointer(root / "async", ctx, keep=1, async_save=True, overlap_staging=True)
    stalls, writes, busy_steps = [], [], []
    for r in range(rounds):
        t0 = time.perf_counter()
        writer.save(200 + r, model, optimizer, {"round": r})
        t_call = time.perf_counter() - t0
        t_fb = fwd_bwd()  # training goes on while the state is copied and written
        t1 = time.perf_counter()
        writer.before_update()  # the copy must be complete before the optimizer changes the state
        t_staging_wait = time.perf_counter() - t1
        update()
        busy_steps.append(t_fb)
        stalls.append(t_call + t_staging_wait)
        t2 = time.perf_counter()
        writer.wait()  # (measured apart: the write's remaining time, normally hidden behind training)
        writes.append(time.perf_counter() - t2 + t_fb + t_staging_wait)
    writer.close()
    assert ckpt.find_latest(root / "async").name == f"step-{200 + rounds - 1:06d}"
    best_sync, best_stall = min(sync_times), min(stalls)
    return {
        "parameters": n_params,
        "state_GB": state_bytes / 1e9,
        "sync_save_s": best_sync,
        "async_stall_s": best_stall,
        "stall_ratio": best_stall / best_sync,
        "async_write_s": min(writes),
        "copy_stall_s": min(copy_stalls),
        "fwd_bwd_s": t_step,
        "fwd_bwd_during_write_s": min(busy_steps),
        "all_sync_s": sync_times,
        "all_stall_s": stalls,
    }


# ---------------------------------------------------------------------------------------------- scaling


def scaling_worker(args: argparse.Namespace) -> None:
    ctx = D.init_distributed("cpu", D.ParallelConfig(strategy=args.strategy))
    torch.set_num_threads(args.threads or max(1, 2 // ctx.world))
    torch.manual_seed(0)
    cfg = ModelConfig(**TINY)
    model = P.parallelize(MaskedLM(cfg), D.ParallelConfig(strategy=args.strategy), ctx)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    per_rank = args.global_batch // ctx.world
    accum = max(1, per_rank // args.micro)
    times = []
    for step in range(args.warmup + args.steps):
        ids, labels = batch(cfg, args.global_batch, 128, step)
        ids, labels = ids[ctx.rank * per_rank :][:per_rank], labels[ctx.rank * per_rank :][:per_rank]
        t0 = time.perf_counter()
        for k in range(accum):
            sl = slice(k * args.micro, (k + 1) * args.micro)
            with P.sync_gradients(model, k == accum - 1):
                (model(ids[sl], labels[sl]).loss / accum).backward()
        P.clip_grad_norm(model, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if ctx.distributed:
            torch.distributed.barrier()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    if ctx.is_main:
        tokens = args.global_batch * 128 * len(times)
        print(json.dumps({"tokens_per_s": tokens / sum(times), "step_s": sum(times) / len(times)}))
    D.shutdown(ctx)


def run_scaling(strategy: str, nproc: int, global_batch: int, micro: int, steps: int, threads: int = 0) -> dict:
    worker = [
        __file__,
        "worker",
        "--strategy",
        strategy,
        "--global-batch",
        str(global_batch),
        "--micro",
        str(micro),
        "--steps",
        str(steps),
        "--threads",
        str(threads),
    ]
    if nproc == 1:
        cmd = [sys.executable, *worker]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            *worker,
        ]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads or max(1, 2 // nproc)), PYTHONWARNINGS="ignore")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"scaling run failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", default="all", choices=["all", "stall", "scaling", "worker"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dir", default=None, help="where checkpoints are written (default: a temp dir)")
    args = ap.parse_args()
    if args.what == "worker":
        return scaling_worker(args)

    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPU cores, cuda={torch.cuda.is_available()}, "
        f"load average {os.getloadavg()[0]:.1f} (other jobs share this machine)"
    )
    if args.what in ("all", "stall"):
        root = Path(args.dir or tempfile.mkdtemp(prefix="cramkit-bench-ckpt-"))
        try:
            r = bench_stall(args.rounds, 2, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(
            f"\ncheckpoint stall: crammed-bert shape, {r['parameters'] / 1e6:.1f}M parameters, "
            f"model + AdamW state {r['state_GB']:.2f} GB, 1 process, best of {args.rounds}"
        )
        print("| save | loop blocked (s) | ratio to sync |")
        print("|---|---:|---:|")
        print(f"| synchronous save (baseline) | {r['sync_save_s']:.2f} | 1.00 |")
        print(
            f"| async_save, host copy on the loop thread | {r['copy_stall_s']:.2f} | "
            f"{r['copy_stall_s'] / r['sync_save_s']:.3f} |"
        )
        print(
            f"| async_save, host copy overlapped with forward/backward | {r['async_stall_s']:.2f} | "
            f"{r['stall_ratio']:.3f} |"
        )
        print(
            f"background write finished {r['async_write_s']:.2f} s after the save began; one forward/backward "
            f"(micro-batch 2x128) took {r['fwd_bwd_s']:.2f} s alone and {r['fwd_bwd_during_write_s']:.2f} s "
            "while the checkpoint was being copied and written"
        )
        print(
            "all rounds: sync",
            [round(x, 2) for x in r["all_sync_s"]],
            "async stall",
            [round(x, 2) for x in r["all_stall_s"]],
        )
    if args.what in ("all", "scaling"):
        print(
            f"\nscaling: tiny-cpu shape, global batch {args.global_batch} x 128 tokens, micro-batch "
            f"{args.micro}, {args.steps} timed steps after {args.warmup} warm-up"
        )
        rows = [
            ("1 process, 2 threads", run_scaling("ddp", 1, args.global_batch, args.micro, args.steps, 2)),
            ("1 process, 1 thread", run_scaling("ddp", 1, args.global_batch, args.micro, args.steps, 1)),
        ]
        for strategy in ("ddp", "fsdp"):
            rows.append(
                (
                    f"2 processes x 1 thread, {strategy}",
                    run_scaling(strategy, 2, args.global_batch, args.micro, args.steps),
                )
            )
        # the baseline is the faster single-process setting (on a shared 2-core machine, often 1 thread)
        base = max((r for _, r in rows[:2]), key=lambda r: r["tokens_per_s"])
        print(f"ratios against the faster single-process run ({base['tokens_per_s']:,.0f} tokens/s)")
        print("| run | tokens/s | ratio |")
        print("|---|---:|---:|")
        for name, r in rows:
            print(f"| {name} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f} |")


if __name__ == "__main__":
    main()
