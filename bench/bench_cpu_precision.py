"""precision auto on a CPU: bf16 autocast against fp32, in training and in the torch inference path.

1. **pretrain**: ``cramkit pretrain CORPUS --preset tiny-cpu --budget B`` at ``--threads`` threads, once with
   ``train.precision=fp32`` and once with ``auto`` (bf16 on a CPU with AMX or AVX512_BF16), repetitions
   interleaved: tokens/s (second half of the run) and the held-out MLM loss at the same time budget.
2. **embed**: all-MiniLM-L6-v2 through ``Engine`` (torch) on ``--sentences`` lines of the corpus, fp32 and
   bf16 autocast: sentences/s (median of the repetitions) and the cosine of each bf16 vector to its fp32 one.
3. **contrastive**: the contrastive stage on all-MiniLM-L6-v2 (``cramkit finetune --objective contrastive --task
   glue/mrpc``: one epoch over MRPC's 2,474 paraphrase pairs), fp32 and ``auto``, one seed a repetition
   (``--reps``), interleaved: pairs/s and the held-out pairs' recall@1, MRR and loss after training.

4. **distill**: ``cramkit distill`` of all-MiniLM-L6-v2 fine-tuned on 2,000 SST-2 rows (fp32, made once) into
   the BiLSTM and into a 2-layer encoder on 1,500 sentences (n_iter 6, the transfer set and the teacher's logits
   cached once), fp32 and ``auto``, one seed a repetition: the distilled student's training examples/s and its
   SST-2 dev accuracy, with the labels-only student's.

Where the CPU has no native bf16 the ``auto`` rows are fp32 too (the rule's own choice) and the bf16 embed row is
measured on a tenth of the sentences (emulated bf16 is slow). Rows go to stdout and ``--out``/cpu_precision.md.

    python bench/bench_cpu_precision.py --corpus DIR_OR_FILE --minilm DIR [--budget 60s] [--threads 1] [--reps 2]
        [--parts pretrain,embed,contrastive,distill] [--glue ../shared/data/glue]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def pretrain(corpus: list[str], out: Path, precision: str, budget: str, threads: int) -> dict[str, float]:
    from cramkit.train.metrics import read_metrics

    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("CRAMKIT_CPU_BF16", None)  # the rule as a user gets it
    cmd = [sys.executable, "-m", "cramkit", "pretrain", *corpus, "--preset", "tiny-cpu", "--out", str(out)]
    cmd += ["--budget", budget, "--no-progress", "--set", f"train.precision={precision}"]
    cmd += ["--set", f"train.threads={threads}", "--set", "train.checkpoint_every=never", "--set", "train.log_every=5"]
    cmd += ["--set", "train.device=cpu"]  # the CPU's rule, also on a machine with a GPU
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"pretrain {precision} failed: {proc.stderr.strip().splitlines()[-1:]}")
    recs = read_metrics(out)
    train = [r for r in recs if r.get("tokens_per_s")]
    last = max(train, key=lambda r: r["step"])
    half = [r for r in train if r["elapsed"] >= last["elapsed"] / 2] or train
    val = [r["val_loss"] for r in recs if r.get("val_loss") is not None]
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in half),
        "tokens": last["tokens"],
        "val_loss": val[-1] if val else float("nan"),
        "used": last.get("precision", "?"),
    }


def embed(minilm: str, texts: list[str], precision: str, threads: int) -> tuple[float, np.ndarray]:
    import torch

    from cramkit.infer.engine import Engine

    torch.set_num_threads(threads)
    eng = Engine(f"hf:{minilm}", backend="torch", device="cpu", precision=precision)
    eng.embed(texts[:32])
    t0 = time.perf_counter()
    vecs = np.asarray(eng.embed(texts))
    return len(texts) / (time.perf_counter() - t0), vecs


def contrastive(minilm: str, glue: str, out: Path, precision: str, seed: int, threads: int) -> dict[str, float]:
    import json

    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("CRAMKIT_CPU_BF16", None)  # the rule as a user gets it
    cmd = [sys.executable, "-m", "cramkit", "finetune", "--objective", "contrastive", "--from", f"hf:{minilm}"]
    cmd += ["--task", "glue/mrpc", "--data-dir", glue, "--out", str(out), "--no-progress"]
    cmd += ["--set", f"precision={precision}", "--set", f"seed={seed}", "--set", "device=cpu"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"contrastive {precision} failed: {proc.stderr.strip().splitlines()[-1:]}")
    res = json.loads((out / "results.json").read_text())
    used = "bf16" if "precision bf16" in proc.stdout + proc.stderr else "fp32"
    return {"pairs_per_s": res["examples_per_s"], "used": used, **res["after"]}  # type: ignore[dict-item]


def teacher(minilm: str, glue: str, out: Path, threads: int) -> Path:
    """all-MiniLM-L6-v2 fine-tuned on 2,000 SST-2 rows for 2 epochs (fp32), made once in ``out``."""
    if not (out / "cramkit-model.json").is_file():
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        cmd = [sys.executable, "-m", "cramkit", "finetune", "--task", "glue/sst2", "--data-dir", glue]
        cmd += ["--from", f"hf:{minilm}", "--out", str(out), "--no-progress", "--set", "precision=fp32"]
        for kv in ("max_train_examples=2000", "epochs=2", "batch_size=32", "lr=5e-5", "max_length=64", "device=cpu"):
            cmd += ["--set", kv]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"the teacher failed: {proc.stderr.strip().splitlines()[-1:]}")
    return out


def distill(
    teacher_dir: Path, glue: str, cache: Path, out: Path, student: str, precision: str, seed: int, threads: int
) -> dict[str, float | str]:
    """``cramkit distill`` of the SST-2 teacher into ``student`` on 1,500 sentences (n_iter 6): the distilled
    student's training examples/s, its dev accuracy, and the labels-only student's."""
    import json

    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("CRAMKIT_CPU_BF16", None)  # the rule as a user gets it
    cmd = [sys.executable, "-m", "cramkit", "distill", "--teacher", str(teacher_dir), "--task", "glue/sst2"]
    cmd += ["--data-dir", glue, "--cache", str(cache), "--student", student, "--out", str(out), "--no-progress"]
    sets = [f"precision={precision}", f"seed={seed}", "device=cpu", f"threads={threads}", "max_train_examples=1500"]
    sets += ["n_iter=6", "max_length=64", "workers=2", "speed_examples=200", "speed_seconds=1"]
    sets += ["epochs=4"] if student == "bilstm" else ["layers=2", "epochs=0.5", "baseline_epochs=1"]
    for kv in sets:
        cmd += ["--set", kv]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"distill {student} {precision} failed: {proc.stderr.strip().splitlines()[-1:]}")
    rep = json.loads((out / "report.json").read_text())
    used = "bf16" if "precision bf16" in proc.stdout + proc.stderr else "fp32"
    return {
        "examples_per_s": rep["training"]["distilled"]["examples_per_s"],
        "used": used,
        "student": rep["scores"]["student"]["score"],
        "labels_only": rep["scores"]["labels_only"]["score"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", nargs="+", required=True)
    p.add_argument("--minilm", help="all-MiniLM-L6-v2's folder (HF layout): the embed rows")
    p.add_argument("--budget", default="60s")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--out", default="bench/out/cpu_precision")
    p.add_argument(
        "--parts",
        default="pretrain,embed",
        help="which rows: pretrain, embed, contrastive, distill (comma-separated)",
    )
    p.add_argument("--students", default="bilstm,encoder", help="the distill rows' students (comma-separated)")
    p.add_argument("--glue", help="GLUE's folder (MRPC and SST-2 in it): the contrastive and distill rows")
    args = p.parse_args()
    from cramkit import doctor, runtime

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "cpu_precision.md"
    md.write_text("")

    def line(text: str = "") -> None:
        print(text, flush=True)
        with md.open("a") as f:
            f.write(text + "\n")

    flags = [f for f in doctor.FLAGS if f in runtime.cpu_flags()]
    line(f"### precision auto on a CPU: {doctor.cpu_name()}, flags {', '.join(flags)}; {args.threads} thread(s)")
    rows: dict[str, list[dict[str, float]]] = {"fp32": [], "auto": []}
    if "pretrain" in args.parts:
        line(
            f"\n`cramkit pretrain CORPUS --preset tiny-cpu --budget {args.budget}`, {args.reps} interleaved repetitions"
        )
        line("\n| precision asked | used | tokens/s (median, 2nd half) | tokens seen | held-out MLM loss |")
        line("|---|---|---:|---:|---:|")
    for rep in range(args.reps if "pretrain" in args.parts else 0):
        for precision in rows:
            rows[precision].append(
                pretrain(args.corpus, out / f"run-{precision}-{rep}", precision, args.budget, args.threads)
            )
    for precision, rs in rows.items():
        if not rs:
            continue
        tps = statistics.median(r["tokens_per_s"] for r in rs)
        toks = statistics.median(r["tokens"] for r in rs)
        losses = ", ".join(f"{r['val_loss']:.3f}" for r in rs)
        line(f"| {precision} | {rs[0]['used']} | {tps:,.0f} | {toks:,.0f} | {losses} |")
    if args.minilm and "embed" in args.parts:
        corpus = [Path(c) for c in args.corpus]
        files = [f for c in corpus for f in (sorted(c.rglob("*")) if c.is_dir() else [c]) if f.suffix != ".md"]
        texts: list[str] = []
        for f in files:
            texts += [
                t.strip() for t in f.read_text(encoding="utf-8", errors="replace").splitlines() if 20 < len(t) < 400
            ]
            if len(texts) >= args.sentences:
                break
        texts = texts[: args.sentences]
        if not texts:
            raise SystemExit(f"no lines of 20-400 characters in {', '.join(args.corpus)}")
        native = runtime.cpu_bf16() is not None
        sub = texts if native else texts[: max(32, len(texts) // 10)]
        rates: dict[str, list[float]] = {"fp32": [], "bf16": []}
        vecs: dict[str, np.ndarray] = {}
        for _ in range(args.reps):
            for precision in rates:
                r, v = embed(args.minilm, sub, precision, args.threads)
                rates[precision].append(r)
                vecs[precision] = v
        cos = (vecs["fp32"] * vecs["bf16"]).sum(1) / (
            np.linalg.norm(vecs["fp32"], axis=1) * np.linalg.norm(vecs["bf16"], axis=1)
        )
        line(f"\nall-MiniLM-L6-v2 through Engine (torch), {len(sub)} corpus sentences, {args.threads} thread(s)")
        line("\n| precision | sentences/s (median) | vs fp32 | cosine to fp32 (min / mean) |")
        line("|---|---:|---:|---:|")
        base = statistics.median(rates["fp32"])
        for precision, rs in rates.items():
            rate = statistics.median(rs)
            c = "1 / 1" if precision == "fp32" else f"{cos.min():.4f} / {cos.mean():.4f}"
            line(f"| {precision} | {rate:,.1f} | {rate / base:.2f}x | {c} |")

    if args.minilm and args.glue and "contrastive" in args.parts:
        runs: dict[str, list[dict[str, float]]] = {"fp32": [], "auto": []}
        for seed in range(args.reps):
            for precision in runs:
                runs[precision].append(
                    contrastive(
                        args.minilm, args.glue, out / f"contrastive-{precision}-{seed}", precision, seed, args.threads
                    )
                )
        seeds = f"seeds 0-{args.reps - 1}, {args.threads} thread(s)"
        line(f"\nThe contrastive stage on all-MiniLM-L6-v2, MRPC's paraphrase pairs, {seeds}")
        cols = "pairs/s (median) | vs fp32 | dev recall@1 per seed | dev MRR per seed | dev loss per seed"
        line(f"\n| precision asked | used | {cols} |")
        line("|---|---|---:|---:|---|---|---|")
        base = statistics.median(r["pairs_per_s"] for r in runs["fp32"])
        for precision, rs in runs.items():
            rate = statistics.median(r["pairs_per_s"] for r in rs)
            r1 = ", ".join(f"{r['dev_recall_at_1']:.1f}" for r in rs)
            mrr = ", ".join(f"{r['dev_mrr']:.1f}" for r in rs)
            loss = ", ".join(f"{r['val_loss']:.4f}" for r in rs)
            line(f"| {precision} | {rs[0]['used']} | {rate:,.1f} | {rate / base:.2f}x | {r1} | {mrr} | {loss} |")

    if args.minilm and args.glue and "distill" in args.parts:
        t = teacher(args.minilm, args.glue, out / "teacher", args.threads)
        for student in args.students.split(","):
            got: dict[str, list[dict[str, float | str]]] = {"fp32": [], "auto": []}
            for seed in range(args.reps):
                for precision in got:
                    where = out / f"distill-{student}-{precision}-{seed}"
                    got[precision].append(
                        distill(t, args.glue, out / "distill-cache", where, student, precision, seed, args.threads)
                    )
            what = "the BiLSTM" if student == "bilstm" else "the 2-layer encoder"
            line(
                f"\n`cramkit distill` of an SST-2 teacher into {what}, seeds 0-{args.reps - 1}, "
                f"{args.threads} thread(s)"
            )
            line(
                "\n| precision asked | used | training examples/s (median) | vs fp32 | dev acc per seed | labels only |"
            )
            line("|---|---|---:|---:|---|---|")
            base = statistics.median(float(r["examples_per_s"]) for r in got["fp32"])
            for precision, rs in got.items():
                rate = statistics.median(float(r["examples_per_s"]) for r in rs)
                acc = ", ".join(f"{float(r['student']):.2f}" for r in rs)
                lab = ", ".join(f"{float(r['labels_only']):.2f}" for r in rs)
                line(f"| {precision} | {rs[0]['used']} | {rate:,.1f} | {rate / base:.2f}x | {acc} | {lab} |")


if __name__ == "__main__":
    main()
