"""GPU pretraining throughput at the crammed-bert shape: cramkit against Hugging Face, in one run.

(a) step: one full training step (bf16 autocast forward, backward, clip, fused AdamW) of cramkit's
    MaskedLM (crammed-bert: 16 x 768, 12 heads, GELU-GLU 3072, no biases, pre-LN, sparse prediction of
    the 25% masked tokens) built and compiled by the engine's own ``parallel.parallelize``, against
    transformers.BertForMaskedLM (16 x 768, 12 heads, GELU 3072, SDPA attention, dense MLM head) eager
    and under torch.compile; vocabulary 32768, length 128, micro-batch 128, the same masked batches;
    repetitions interleaved, median step time. MFU = model FLOPs per token (each model's own matrix
    multiplies, 6 FLOPs per MAC-parameter, attention included) x tokens/s / the GPU's peak bf16 FLOP/s.
(b) engine: the real ``cramkit pretrain --preset crammed-bert`` on raw text, tokens/s and MFU as its
    metrics.jsonl reports them (data loading, batch ramp and logging included).

    python bench/bench_gpu.py step [--reps 5] [--steps 20]
    python bench/bench_gpu.py engine CORPUS... [--steps 300] [--work DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pretrain import hf_model, masked_batch

SHAPE = (16, 768, 12, 3072)  # layers, hidden, heads, intermediate (crammed-bert)
VOCAB, LENGTH = 32768, 128


def hf_flops_per_token(layers: int, hidden: int, inter: int, vocab: int, seq: int) -> float:
    """BertForMaskedLM: qkv + out + two MLP matrices per block, attention, the dense head's transform and
    decoder on every position (forward + backward = 3x, 2 FLOPs per MAC)."""
    per_block = 4 * hidden * hidden + 2 * hidden * inter + 2 * seq * hidden
    return 6.0 * (layers * per_block + hidden * hidden + hidden * vocab)


def ours(compile_: bool):
    from cramkit.model import MaskedLM
    from cramkit.model.config import flops_per_token
    from cramkit.train import distributed, parallel
    from cramkit.train.config import resolve_config

    cfg = resolve_config("crammed-bert")
    mcfg = cfg.model.replace(vocab_size=VOCAB)
    ctx = distributed.DistContext(rank=0, world=1, local_rank=0, device=torch.device("cuda"))
    model = MaskedLM(mcfg).cuda()
    train_model = parallel.parallelize(model, cfg.parallel, ctx, "bf16", compile=compile_)
    from cramkit.train.optim import build_optimizer

    t = cfg.train
    opt = build_optimizer(model, "adamw", t.lr, t.betas, t.eps, t.weight_decay, torch.device("cuda"))
    return (
        train_model,
        opt,
        lambda m, i, lab: m(i, lab).loss,
        flops_per_token(mcfg, LENGTH, cfg.data.mask_rate),
    )


def hf(compile_: bool):
    model = hf_model(*SHAPE, VOCAB).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    run = torch.compile(model) if compile_ else model
    flops = hf_flops_per_token(SHAPE[0], SHAPE[1], SHAPE[3], VOCAB, LENGTH)
    return run, opt, lambda m, i, lab: m(input_ids=i, labels=lab).loss, flops


def step_bench(args: argparse.Namespace) -> None:
    from cramkit.train.metrics import peak_flops

    dev = torch.device("cuda")
    peak = peak_flops(dev)
    torch.backends.cuda.matmul.allow_tf32 = True
    ids, labels = masked_batch(args.batch, LENGTH, VOCAB, rate=0.25)
    ids, labels = ids.cuda(), labels.cuda()
    kinds = {
        "HF BertForMaskedLM, eager": (hf, False),
        "HF BertForMaskedLM, torch.compile": (hf, True),
        "cramkit MaskedLM, eager": (ours, False),
        "cramkit MaskedLM, engine (compiled)": (ours, True),
    }
    steps, flops = {}, {}
    for name, (make, comp) in kinds.items():
        torch.manual_seed(0)
        model, opt, loss_of, flops[name] = make(comp)
        model.train()

        def step(model=model, opt=opt, loss_of=loss_of):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_of(model, ids, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        t0 = time.perf_counter()
        for _ in range(3):  # warm-up (and compilation)
            step()
        torch.cuda.synchronize()
        print(f"{name}: warm-up {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        steps[name] = step
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.reps):
        for name, step in steps.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) / args.steps)
    base = args.batch * LENGTH / statistics.median(times["HF BertForMaskedLM, eager"])
    print(
        f"\n# {torch.cuda.get_device_name()} torch {torch.__version__}; crammed-bert shape {SHAPE}, vocab "
        f"{VOCAB}, length {LENGTH}, micro-batch {args.batch}, bf16 autocast, fused AdamW; median of {args.reps} "
        f"x {args.steps} steps; peak {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s"
    )
    print("| model | tokens/s | vs HF eager | training GFLOP per token | MFU |")
    print("|---|---:|---:|---:|---:|")
    for name, ts in times.items():
        tps = args.batch * LENGTH / statistics.median(ts)
        mfu = flops[name] * tps / peak if peak else float("nan")
        print(
            f"| {name} | {tps:,.0f} | {tps / base:.2f}x | {flops[name] / 1e9:.2f} GFLOP | {mfu:.1%} |",
            flush=True,
        )


def engine_bench(args: argparse.Namespace) -> None:
    """One GPU: DDP/FSDP2 need two or more (NCCL refuses two ranks on one device); a world of one trains
    the plain compiled model, which is what this measures."""
    from cramkit.train.metrics import read_metrics

    out = Path(args.work) / "crammed"
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cramkit",
            "pretrain",
            *args.corpus,
            "--preset",
            "crammed-bert",
            "--budget",
            f"{args.steps}steps",
            "--no-progress",
            "--set",
            "train.eval_every=never",
            "--set",
            "train.checkpoint_every=never",
            "--set",
            f"train.batch_size={args.batch_size}",
            "--set",
            "train.log_every=20",
            "--out",
            str(out),
        ],
        env=os.environ,
    )
    if proc.returncode:
        raise SystemExit(f"cramkit pretrain failed ({proc.returncode})")
    wall = time.perf_counter() - t0
    recs = [r for r in read_metrics(out) if r.get("tokens_per_s") and r["step"] > args.steps // 2]
    tps = statistics.median(r["tokens_per_s"] for r in recs)
    mfu = statistics.median(r["mfu"] for r in recs if r.get("mfu") is not None)
    print(
        f"\n# cramkit pretrain --preset crammed-bert --budget {args.steps}steps, batch {args.batch_size}; "
        "median over the second half of the run"
    )
    print("| run | tokens/s | MFU | wall s (with start-up, compile) |\n|---|---:|---:|---:|")
    print(f"| cramkit pretrain, 1 GPU | {tps:,.0f} | {mfu:.1%} | {wall:.0f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("step")
    a.add_argument("--reps", type=int, default=5)
    a.add_argument("--steps", type=int, default=20)
    a.add_argument("--batch", type=int, default=128)
    b = sub.add_parser("engine")
    b.add_argument("corpus", nargs="+")
    b.add_argument("--steps", type=int, default=300)
    b.add_argument("--batch-size", type=int, default=512)
    b.add_argument("--work", default="bench/out/gpu")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py needs a CUDA GPU")
    step_bench(args) if args.what == "step" else engine_bench(args)


if __name__ == "__main__":
    main()
