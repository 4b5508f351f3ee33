"""The GPU day in one call: what one lent GPU measures in at most 9 minutes, as bench/RESULTS.md rows.

1. **step**: one training step at the crammed-bert shape (16 x 768, 12 heads, GELU-GLU 3072, vocabulary
   32768, length 128, micro-batch 128 or ``--micro-batch``, the same masked batches), repetitions
   interleaved, median step time: transformers' BertForMaskedLM (SDPA, eager) as the baseline; cramkit's
   MaskedLM as the engine builds it (per-block compile) in bf16, and in fp8 (torchao float8; tensorwise
   scaling, ``--fp8-recipes`` for rowwise too) when the GPU and torchao allow. Tokens/s, MFU (each model's
   own matrix multiplies, 6 FLOPs per MAC, against the dense bf16 peak, as bench_gpu.py counts), peak
   memory, and the loss after the timed steps (all models train on the same batches: fp8's loss is
   checked against bf16's here).
2. **loop**: the real ``cramkit pretrain --preset crammed-bert`` for a fixed number of minutes on the
   corpus given: tokens/s and MFU from its metrics.jsonl (second half), the ratio to the bare step,
   tokens seen, held-out MLM loss.
3. **quality**: that run fine-tuned on MRPC, CoLA and SST-2 (GLUE dev sets; one recipe for all three),
   the first points of a GLUE-vs-GPU-minutes curve.
4. **fewshot**: K=16 per class, 5 LM-BFF splits of SST-2 and MRPC (bench_fewshot.py): a fresh head vs the
   prompt (PET / LM-BFF) vs deep prompts (P-tuning v2), from that run and from all-MiniLM-L6-v2 given an
   MLM head here (``--minilm``; the whole model continued for ``--head-budget``), with each prompt's score
   before training. A CPU session's heads predict the words' frequencies at the mask whatever the sentence
   (bench/RESULTS.md, "Few labels"), so whether prompts pay is a GPU question.

What a device call carries (64 MiB with the repository) is packed by ``--pack DIR``: GLUE's three tasks,
``--corpus-mb`` of the corpus and MiniLM in float16.

Rows go to stdout and to OUT/gpu_day.md as each is measured (a call stopped at its limit keeps what it
has); OUT/gpu_day.jsonl holds the raw figures. A phase that fails prints one line and the next one runs.

    python bench/gpu_day.py --corpus DIR [DIR...] --glue GLUE_DIR [--minutes 2.5] [--out DIR] [--work DIR]
    python bench/gpu_day.py --dry-run --corpus DIR --glue GLUE_DIR   # CPU, tiny shapes, a minute or two
    python bench/gpu_day.py --pack .gpu --corpus DIR --glue GLUE_DIR --minilm MINILM_DIR   # then carry .gpu
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import hf_flops_per_token
from bench_pretrain import hf_model, masked_batch

TASKS = {"glue/mrpc": "MRPC F1", "glue/cola": "CoLA MCC", "glue/sst2": "SST-2 acc"}


class Day:
    """The rows: printed, appended to OUT/gpu_day.md, raw figures to OUT/gpu_day.jsonl."""

    def __init__(self, out: Path, deadline: float) -> None:
        self.out, self.deadline, self.t0 = out, deadline, time.time()
        out.mkdir(parents=True, exist_ok=True)
        self.md, self.raw = out / "gpu_day.md", out / "gpu_day.jsonl"
        self.md.write_text("")
        self.raw.write_text("")

    def line(self, text: str = "") -> None:
        print(text, flush=True)
        with self.md.open("a") as f:
            f.write(text + "\n")

    def record(self, **fields: Any) -> None:
        with self.raw.open("a") as f:
            f.write(json.dumps(fields) + "\n")

    def left(self) -> float:
        return self.deadline - (time.time() - self.t0)

    def phase(self, name: str, need_s: float, fn: Callable[[], None]) -> None:
        """Run one phase unless fewer than ``need_s`` seconds are left; a failure is one line."""
        if self.left() < need_s:
            self.line(f"\n_{name}: skipped, {self.left():.0f} s left of the deadline and it needs ~{need_s:.0f}_")
            return
        t = time.time()
        try:
            fn()
        except Exception as e:  # one phase failing must not cost the others
            traceback.print_exc(file=sys.stderr)
            self.line(f"\n_{name}: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}_")
        print(f"[{name}: {time.time() - t:.0f} s; {time.time() - self.t0:.0f} s in]", file=sys.stderr, flush=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------- 1. the step


def _ours(
    shape: tuple[int, int, int, int],
    vocab: int,
    length: int,
    device: torch.device,
    fp8: str | None,
    whole: bool = False,
):
    """cramkit's MaskedLM as the engine builds it: float8 layers (fp8), per-block compile on CUDA (``whole``:
    the whole model compiled as one, the embedding, the MLM head and its loss in the graph too)."""
    from cramkit.model import MaskedLM
    from cramkit.model.config import flops_per_token
    from cramkit.train import parallel
    from cramkit.train.config import resolve_config
    from cramkit.train.optim import build_optimizer

    cfg = resolve_config("crammed-bert")
    layers, hidden, heads, inter = shape
    mcfg = cfg.model.replace(
        vocab_size=vocab, layers=layers, hidden=hidden, heads=heads, intermediate=inter, max_position=length
    )
    model = MaskedLM(mcfg).to(device)
    if fp8:
        parallel.apply_float8(model, fp8)
    if whole:
        model.compile()
    elif device.type == "cuda":
        parallel.apply_compile(model)
    t = cfg.train
    opt = build_optimizer(model, "adamw", t.lr, t.betas, t.eps, t.weight_decay, device)
    return model, opt, lambda m, i, lab: m(i, lab).loss, flops_per_token(mcfg, length, cfg.data.mask_rate)


def _hf(shape: tuple[int, int, int, int], vocab: int, length: int, device: torch.device):
    model = hf_model(*shape, vocab).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    flops = hf_flops_per_token(shape[0], shape[1], shape[3], vocab, length)
    return model, opt, lambda m, i, lab: m(input_ids=i, labels=lab).loss, flops


def fp8_ready(device: torch.device) -> str | None:
    """Why fp8 cannot run here (None when it can). On the CPU (the dry run) torchao emulates it."""
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        return f"torchao is not importable ({e})"
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        return f"{torch.cuda.get_device_name(device)} has no FP8 tensor cores"
    return None


def step_phase(day: Day, args: argparse.Namespace, device: torch.device) -> None:
    from cramkit.train.metrics import peak_flops

    shape, vocab, length, batch = args.shape, args.vocab, args.length, args.micro_batch
    peak = peak_flops(device)
    torch.backends.cuda.matmul.allow_tf32 = True
    kinds: dict[str, Callable[[], Any]] = {
        "HF BertForMaskedLM (SDPA), eager, bf16": lambda: _hf(shape, vocab, length, device),
        "cramkit MaskedLM, engine, bf16": lambda: _ours(shape, vocab, length, device, None),
    }
    if args.whole_compile:
        kinds["cramkit MaskedLM, whole-model compile, bf16"] = lambda: _ours(shape, vocab, length, device, None, True)
    why_not = fp8_ready(device) if args.fp8_recipes else "not asked for (--fp8-recipes '')"
    if why_not is None:
        for recipe in args.fp8_recipes.split(","):
            kinds[f"cramkit MaskedLM, engine, fp8 {recipe}"] = lambda r=recipe: _ours(shape, vocab, length, device, r)
    ids, labels = masked_batch(batch, length, vocab, rate=0.25)
    ids, labels = ids.to(device), labels.to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    steps, flops, memory, losses = {}, {}, {}, {}
    for name, make in kinds.items():
        torch.manual_seed(0)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        model, opt, loss_of, flops[name] = make()
        model.train()

        def step(model=model, opt=opt, loss_of=loss_of, name=name) -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = loss_of(model, ids, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses[name] = loss.detach()

        t0 = time.perf_counter()
        for _ in range(args.warmup):  # warm-up and compilation
            step()
        sync()
        memory[name] = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
        print(f"{name}: warm-up {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        steps[name] = step
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(args.reps):
        for name, step in steps.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            sync()
            times[name].append((time.perf_counter() - t0) / args.steps)
    base = batch * length / statistics.median(times[next(iter(times))])
    day.line(
        f"\n### The step: {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU (dry run)'}, torch "
        f"{torch.__version__}; shape {shape}, vocabulary {vocab}, length {length}, micro-batch {batch}; median of "
        f"{args.reps} x {args.steps} steps, interleaved; peak {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s "
        "(dense bf16)"
    )
    day.line(
        "\n| model | tokens/s | vs HF | training GFLOP per token | MFU | peak memory GiB | loss after "
        f"{args.warmup + args.reps * args.steps} steps |"
    )
    day.line("|---|---:|---:|---:|---:|---:|---:|")
    for name, ts in times.items():
        tps = batch * length / statistics.median(ts)
        mfu = flops[name] * tps / peak if peak else float("nan")
        loss = float(losses[name])
        day.line(
            f"| {name} | {tps:,.0f} | {tps / base:.2f}x | {flops[name] / 1e9:.2f} | {mfu:.1%} | "
            f"{memory[name]:.1f} | {loss:.4f} |"
        )
        day.record(phase="step", model=name, tokens_per_s=tps, mfu=mfu, memory_gib=memory[name], loss=loss)
    if why_not:
        day.line(f"\nfp8 not measured: {why_not}.")
    day.bare = {name: batch * length / statistics.median(ts) for name, ts in times.items()}  # type: ignore[attr-defined]
    if args.profile:
        name = "cramkit MaskedLM, engine, bf16"
        profile_step(day, steps[name], sync, batch * length / statistics.median(times[name]), batch * length)


# the kernels of a step by kind, from their names (cuBLAS/CUTLASS matrix products, attention, Inductor's fused
# Triton kernels, the optimizer's, the rest)
KERNEL_KINDS = (
    ("matrix products", ("gemm", "cutlass", "nvjet", "sm90_xmma", "cublas", "_mm_")),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("optimizer", ("adam", "foreach", "multi_tensor")),
    ("fused elementwise (Triton)", ("triton",)),
)


def profile_step(day: Day, step: Callable[[], None], sync: Callable[[], Any], tps: float, tokens: int) -> None:
    """Where a step's GPU time goes: torch.profiler over 3 steps, kernels grouped by kind, the busy share."""
    from torch.profiler import ProfilerActivity, profile

    step()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        sync()
    events = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    total = sum(e.self_device_time_total for e in events)  # microseconds over the 3 steps
    if not total:  # the dry run: no GPU kernels to group
        day.line("\n_Where the step goes: no GPU kernels recorded (no GPU)_")
        return
    wall = 3 * tokens / tps * 1e6
    kinds: dict[str, float] = {}
    for e in events:
        low = e.key.lower()
        kind = next((k for k, keys in KERNEL_KINDS if any(x in low for x in keys)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + e.self_device_time_total
    day.line(
        f"\n### Where the engine's step goes (torch.profiler, 3 steps): GPU busy {total / wall:.0%} of the "
        f"step's wall time ({wall / 3e3:.1f} ms a step)"
    )
    day.line("\n| kind | ms per step | share of GPU time |")
    day.line("|---|---:|---:|")
    for kind, t in sorted(kinds.items(), key=lambda kv: -kv[1]):
        day.line(f"| {kind} | {t / 3e3:.2f} | {t / total:.0%} |")
    day.line("\n| top kernels | ms per step | calls per step |")
    day.line("|---|---:|---:|")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:15]:
        day.line(f"| `{e.key[:90]}` | {e.self_device_time_total / 3e3:.2f} | {e.count / 3:.0f} |")
    day.record(phase="profile", kinds={k: v / 3e3 for k, v in kinds.items()}, busy=total / wall)


# ------------------------------------------------------------------------------------------- 0. the doctor


def doctor_phase(day: Day, args: argparse.Namespace, device: torch.device) -> None:
    """``cramkit doctor`` on this machine: its CPU (instruction sets, fp32/bf16/int8 ceilings) and GPU."""
    out = Path(args.out) / "doctor.json"
    cmd = [sys.executable, "-m", "cramkit", "doctor", "--no-save", "--json", str(out), "--seconds", "0.3"]
    proc = subprocess.run(cmd, env=os.environ, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"cramkit doctor failed: {proc.stderr.strip().splitlines()[-1:]}")
    day.line("\n### The machine (`cramkit doctor`)\n\n```\n" + proc.stdout.strip() + "\n```")
    day.record(phase="doctor", **json.loads(out.read_text()))


# ---------------------------------------------------------------------------- 2. the loop, 3. the quality


def loop_phase(day: Day, args: argparse.Namespace, device: torch.device) -> None:
    from cramkit.train.metrics import read_metrics

    run = Path(args.work) / "crammed"
    cmd = [
        sys.executable,
        "-m",
        "cramkit",
        "pretrain",
        *args.corpus,
        "--preset",
        args.preset,
        "--budget",
        args.budget,
        "--out",
        str(run),
        "--no-progress",
        "--set",
        f"train.batch_size={args.batch_size}",
        "--set",
        "train.log_every=10",
        "--set",
        "train.checkpoint_every=never",
        "--set",
        f"train.precision={args.precision}",
        *(x for s in args.set for x in ("--set", s)),
    ]
    print(" ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=os.environ)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"cramkit pretrain failed ({proc.returncode})")
    recs = list(read_metrics(run))
    train = [r for r in recs if r.get("tokens_per_s")]
    last = max(train, key=lambda r: r["step"])
    half = [r for r in train if r["elapsed"] >= last["elapsed"] / 2] or train
    tps = statistics.median(r["tokens_per_s"] for r in half)
    mfus = [r["mfu"] for r in half if r.get("mfu") is not None]
    mfu = statistics.median(mfus) if mfus else float("nan")
    val = [r["val_loss"] for r in recs if r.get("val_loss") is not None]
    micro = _saved_micro_batch(run)
    bare = getattr(day, "bare", {}).get("cramkit MaskedLM, engine, bf16" if args.precision != "fp8" else "")
    day.line(
        f"\n### The loop: `cramkit pretrain --preset {args.preset} --budget {args.budget} --set "
        f"train.batch_size={args.batch_size} --set train.precision={args.precision}` on {args.corpus_note}"
    )
    day.line(
        "\n| micro-batch | steps | tokens seen | tokens/s (second half) | MFU | vs the bare step | held-out MLM loss "
        "| wall s |"
    )
    day.line("|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratio = f"{tps / bare:.0%}" if bare else "n/a"
    vloss = f"{val[-1]:.3f}" if val else "n/a"
    day.line(
        f"| {micro} | {last['step']} | {last['tokens']:,} | {tps:,.0f} | {mfu:.1%} | {ratio} | {vloss} | {wall:.0f} |"
    )
    day.record(
        phase="loop",
        steps=last["step"],
        tokens=last["tokens"],
        tokens_per_s=tps,
        mfu=mfu,
        val_loss=val[-1] if val else None,
        wall_s=wall,
        budget=args.budget,
        precision=args.precision,
        micro_batch=micro,
    )
    day.run = run  # type: ignore[attr-defined]


def _saved_micro_batch(run: Path) -> Any:
    """The micro-batch the run trained with (train.micro_batch=auto resolved), from its saved config."""
    from cramkit.config import load_yaml

    try:
        return load_yaml(run / "config.yaml")["train"]["micro_batch"]
    except Exception:
        return "?"


def quality_phase(day: Day, args: argparse.Namespace, device: torch.device) -> None:
    import cramkit

    run = getattr(day, "run", None)
    if run is None:
        raise RuntimeError("no pretraining run to fine-tune (the loop phase did not finish)")
    recipe: dict[str, Any] = {"epochs": args.epochs, "batch_size": 32, "max_length": 128}
    recipe.update(eval_every="never", checkpoint_every="never")
    if args.max_train:
        recipe["max_train_examples"] = args.max_train
        recipe["min_steps"] = 0
    day.line(
        f"\n### The quality point: that run fine-tuned, one recipe for every task ({args.epochs} epochs, batch 32, "
        "lr auto, at least 500 steps; GLUE dev sets)"
    )
    day.line("\n| task | score | train examples | seconds |")
    day.line("|---|---:|---:|---:|")
    for task, label in TASKS.items():
        if day.left() < 20:
            day.line(f"| {label} | skipped (deadline) | | |")
            continue
        t0 = time.perf_counter()
        try:
            res = cramkit.finetune(run, task=task, data_dir=args.glue, progress=False, **recipe)
        except Exception as e:
            day.line(f"| {label} | failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} | | |")
            continue
        split = next(iter(res["median"]))
        score = res["median"][split]["score"]
        rows = res.get("train_examples", "")
        secs = time.perf_counter() - t0
        day.line(f"| {label} | {score:.1f} | {rows} | {secs:.0f} |")
        day.record(phase="quality", task=task, score=score, seconds=secs)


# -------------------------------------------------------------------------------------------- 4. few labels


def minilm_head(day: Day, args: argparse.Namespace) -> Path:
    """all-MiniLM-L6-v2 given an MLM head here: ``cramkit pretrain CORPUS --from hf:MINILM`` (the continue
    preset, the whole model, at a GPU's batch) for ``--head-minutes``: on a CPU its head learns only the
    words' frequencies in the minutes a session has (bench/RESULTS.md), which no prompt can use."""
    from cramkit.train.metrics import read_metrics

    run = Path(args.work) / "minilm-mlm"
    corpus = args.head_corpus or args.corpus
    cmd = [sys.executable, "-m", "cramkit", "pretrain", *corpus, "--from", f"hf:{args.minilm}", "--out", str(run)]
    cmd += ["--budget", args.head_budget, "--no-progress", "--set", "train.checkpoint_every=never"]
    cmd += [x for s in args.head_set for x in ("--set", s)]
    print(" ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    if subprocess.run(cmd, env=os.environ).returncode:
        raise RuntimeError("cramkit pretrain --from MiniLM failed")
    recs = list(read_metrics(run))
    last = max((r for r in recs if r.get("tokens")), key=lambda r: r["step"])
    val = [r["val_loss"] for r in recs if r.get("val_loss") is not None]
    day.line(
        f"\nMiniLM's MLM head: `cramkit pretrain CORPUS --from hf:all-MiniLM-L6-v2 --budget {args.head_budget}`: "
        f"{last['step']} steps, {last['tokens']:,} tokens, held-out MLM loss {val[-1] if val else float('nan'):.3f}, "
        f"{time.perf_counter() - t0:.0f} s"
    )
    day.record(phase="fewshot-head", steps=last["step"], tokens=last["tokens"], val_loss=val[-1] if val else None)
    return run


def fewshot_phase(day: Day, args: argparse.Namespace, device: torch.device) -> None:
    """K per class, LM-BFF's splits (bench_fewshot.py): a fresh head vs the prompt vs deep prompts, from the
    loop's run and from MiniLM with a head trained here, with each prompt's score before training."""
    from bench_fewshot import run_one, table

    models = []
    if args.minilm:
        try:
            models.append(str(minilm_head(day, args)))
        except Exception as e:  # the loop's run is still worth its rows
            day.line(f"\n_MiniLM's head: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}_")
    if getattr(day, "run", None) is not None:
        models.append(str(day.run))
    if not models:
        raise RuntimeError("no model to try: neither the loop phase's run nor MiniLM with a head is there")
    few = argparse.Namespace(
        k=args.k,
        splits=args.splits,
        steps=args.few_steps,
        batch=8,
        eval_every=args.few_eval_every,
        max_length=128,
        prefix_len=16,
        max_eval_examples=args.few_max_eval,
        work=str(Path(args.work) / "fewshot"),
    )
    methods = ["head", "prompt", "ptuning"]
    day.line(
        f"\n### Few labels: K={args.k} per class, {args.splits} splits, {args.few_steps} steps of batch 8 (the best "
        f"of every {args.few_eval_every} on the split's sampled dev kept), GLUE dev; mean ± sd over splits, %"
    )
    rows: list[dict[str, Any]] = []
    shown = 0
    for task in args.few_tasks.split(","):
        for model in models:
            for method in ("prompt", "head", "ptuning"):  # the prompt first: it is what this phase is for
                if day.left() < 15:
                    day.line(f"\n_{Path(model).name} {task} {method}: skipped (deadline)_")
                    continue
                try:
                    row = run_one(model, task, args.glue, method, few)
                except Exception as e:
                    day.line(f"\n_{Path(model).name} {task} {method}: failed: {type(e).__name__}: {e}_")
                    continue
                rows.append(row)
                day.record(phase="fewshot", **row)
            lines = table(rows, methods)
            if lines[2:] and len(lines) - 2 > shown:
                day.line("\n" + "\n".join(lines) if not shown else "\n".join(lines[2 + shown :]))
                shown = len(lines) - 2


# ------------------------------------------------------------------------------------------------- pack


def pack(args: argparse.Namespace) -> None:
    """What a device call carries (its limit is 64 MiB with the repository): GLUE's CoLA, MRPC and SST-2
    train and dev files, ``--corpus-mb`` of the corpus (whole files, in order), and MiniLM in float16 (45 MB;
    cramkit reads it back as float32)."""
    import shutil

    from safetensors.torch import load_file, save_file

    dst = Path(args.pack)
    if dst.exists():
        shutil.rmtree(dst)
    for task in ("CoLA", "MRPC", "SST-2"):
        (dst / "glue" / task).mkdir(parents=True)
        for split in ("train.tsv", "dev.tsv"):
            shutil.copy(Path(args.glue) / task / split, dst / "glue" / task / split)
    (dst / "corpus").mkdir()
    room = args.corpus_mb * 1e6
    files = [f for c in map(Path, args.corpus) for f in (sorted(c.rglob("*")) if c.is_dir() else [c])]
    files = [f for f in files if f.is_file() and f.suffix != ".md"]  # SOURCE.md and README.md are not text
    for f in files:
        if f.stat().st_size <= room:
            shutil.copy(f, dst / "corpus" / f"{len(list((dst / 'corpus').iterdir())):03d}-{f.name}")
            room -= f.stat().st_size
    if args.minilm:
        src, out = Path(args.minilm), dst / "minilm"
        for f in src.rglob("*"):
            if f.is_file() and f.name != "model.safetensors" and f.suffix in (".json", ".txt"):
                (out / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, out / f.relative_to(src))
        weights = load_file(src / "model.safetensors")
        save_file({k: v.half().contiguous() for k, v in weights.items()}, out / "model.safetensors", {"format": "pt"})
    size = sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())
    print(f"{dst}: {size / 2**20:.1f} MiB (the call carries at most 64 MiB with the repository)")
    print(
        f"run: python bench/gpu_day.py --corpus {dst}/corpus --glue {dst}/glue"
        + (f" --minilm {dst}/minilm" if args.minilm else "")
        + " --phases loop,quality,fewshot --deadline 560"
    )


# ------------------------------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", nargs="+", required=True, help="raw text folders or files to pretrain on")
    p.add_argument("--glue", required=True, help="folder with CoLA/, MRPC/ and SST-2/ (GLUE's TSV layout)")
    p.add_argument("--out", default="bench/out/gpu_day", help="where the rows go")
    p.add_argument("--work", default=None, help="where the pretraining run goes (default: OUT)")
    p.add_argument("--minutes", type=float, default=2.5, help="pretraining budget of the quality point")
    p.add_argument("--batch-size", type=int, default=1024, help="pretraining global batch (sequences)")
    p.add_argument("--precision", default="auto", help="pretraining precision of the loop (auto = bf16)")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--deadline", type=float, default=470, help="seconds: later phases are skipped past it")
    p.add_argument("--phases", default="doctor,step,loop,quality,fewshot")
    p.add_argument("--micro-batch", type=int, default=128, help="sequences per step in the step phase")
    p.add_argument("--fp8-recipes", default="tensorwise", help="torchao float8 scalings to time: tensorwise,rowwise")
    p.add_argument("--whole-compile", action="store_true", help="step: also time the whole model compiled as one")
    p.add_argument("--profile", action="store_true", help="step: where the engine's step spends its GPU time")
    p.add_argument("--set", action="append", default=[], help="more --set KEY=VALUE for the pretraining run")
    p.add_argument("--minilm", default=None, help="all-MiniLM-L6-v2's folder: the fewshot phase gives it a head")
    p.add_argument("--head-corpus", nargs="+", default=None, help="the MiniLM head's text (default: --corpus)")
    p.add_argument("--head-budget", default="90s", help="the MiniLM head's pretraining budget")
    p.add_argument("--head-set", action="append", default=[], help="--set KEY=VALUE for the MiniLM head's run")
    p.add_argument("--few-tasks", default="glue/sst2,glue/mrpc")
    p.add_argument("--k", type=int, default=16, help="examples per class of a few-shot split")
    p.add_argument("--splits", type=int, default=5)
    p.add_argument("--few-steps", type=int, default=300)
    p.add_argument("--few-eval-every", type=int, default=50)
    p.add_argument("--few-max-eval", type=int, default=0, help="dev rows scored (0: all)")
    p.add_argument("--pack", default=None, help="write what a device call carries to this folder, and stop")
    p.add_argument("--corpus-mb", type=float, default=10, help="--pack: megabytes of corpus to carry")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, seconds: the script's own check")
    args = p.parse_args()
    if args.pack:
        return pack(args)
    device = torch.device("cpu" if args.dry_run else "cuda")
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_day.py needs a CUDA GPU (or --dry-run on the CPU)")
    if args.dry_run:
        args.shape, args.vocab, args.length, args.micro_batch = (2, 64, 2, 256), 512, 32, 8
        args.warmup, args.reps, args.steps = 1, 2, 2
        args.preset, args.budget, args.max_train = "tiny-cpu", "12steps", 64
        args.batch_size = min(args.batch_size, 16)
        args.set += ["model.layers=2", "model.hidden=64", "model.heads=2", "model.intermediate=256", "train.device=cpu"]
        args.set += ["train.micro_batch=8", "train.eval_batches=2"]
        args.head_budget, args.few_tasks, args.k, args.splits = "2steps", "glue/sst2", 4, 2
        args.few_steps, args.few_eval_every, args.few_max_eval = 2, 2, 16
        args.head_set += ["train.micro_batch=4", "train.batch_size=4", "data.seq_len=32", "train.device=cpu"]
    else:
        args.shape, args.vocab, args.length = (16, 768, 12, 3072), 32768, 128
        args.warmup, args.reps, args.steps = 3, 3, 10
        args.preset, args.budget, args.max_train = "crammed-bert", f"{round(args.minutes * 60)}s", 0
        args.head_set = ["train.batch_size=128", "train.micro_batch=128", *args.head_set]
    args.work = args.work or args.out
    args.corpus_note = ", ".join(Path(c).name for c in args.corpus)
    day = Day(Path(args.out), args.deadline)
    wanted = set(args.phases.split(","))
    day.line(f"## GPU day, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}{' (dry run)' if args.dry_run else ''}")
    minutes = args.minutes * 60
    if "doctor" in wanted:
        day.phase("doctor", 30, lambda: doctor_phase(day, args, device))
    if "step" in wanted:
        day.phase("step", 60, lambda: step_phase(day, args, device))
    if "loop" in wanted:
        day.phase("loop", 60 if args.dry_run else minutes + 60, lambda: loop_phase(day, args, device))
    if "quality" in wanted:
        day.phase("quality", 20, lambda: quality_phase(day, args, device))
    if "fewshot" in wanted:
        day.phase("fewshot", 30, lambda: fewshot_phase(day, args, device))
    print(f"\nrows: {day.md}  raw: {day.raw}  ({time.time() - day.t0:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
