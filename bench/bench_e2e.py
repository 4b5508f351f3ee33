"""Quality per budget, end to end: pretrain for the same wall-clock budget, then fine-tune SST-2.

Three encoders of the tiny-cpu shape (4 layers, hidden 256, intermediate 1024, our WordPiece vocabulary
trained on the corpus), each fine-tuned on SST-2 with the same recipe (median of 3 seeds, dev accuracy):

- cramkit: ``cramkit pretrain`` (the tiny-cpu recipe) for BUDGET seconds;
- HF: ``transformers.BertForMaskedLM`` of the same shape trained by a run_mlm-style loop (dense MLM head,
  15% masking, AdamW, warmup then linear decay, clipping 1.0) for the same BUDGET seconds;
- none: the same shape, randomly initialised (no pretraining at all).

The two pretraining jobs run at the same time, one thread each, so that both see the same machine
(whatever else runs on it). Validation MLM loss is measured for both on the same held-out masked batches.
Every stage writes into --work and is skipped when rerun, so an interrupted benchmark continues.

    python bench/bench_e2e.py --budget 1200 --work bench/out/e2e
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from _shared_data import SHARED

REPO = Path(__file__).resolve().parents[1]
NOVELS = SHARED / "corpus" / "english-novels-100"
SHAPE = {"layers": 4, "hidden": 256, "heads": 4, "intermediate": 1024}


def prepare(work: Path, corpus: list[str], vocab: int) -> None:
    if (work / "store" / "train.idx").is_file():
        return
    from cramkit.data.build import build_store
    from cramkit.text.sources import iter_documents
    from cramkit.text.tokenizer import save_tokenizer, train_tokenizer

    t0 = time.perf_counter()
    tok = train_tokenizer(lambda: iter_documents(corpus), vocab)
    save_tokenizer(tok, work / "tokenizer")
    build_store(corpus, tok, work / "store", name="train")
    print(f"prepared tokenizer + store in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)


def _data(work: Path):
    from cramkit.data.loader import PretrainData
    from cramkit.data.mlm import DataConfig
    from cramkit.data.tokenstore import TokenStore
    from cramkit.text.tokenizer import load_tokenizer, special_ids

    tok = load_tokenizer(work / "tokenizer")
    store = TokenStore(work / "store")
    vocab = tok.get_vocab_size()
    return PretrainData(store, DataConfig(mask_rate=0.15, validation_fraction=0.05), special_ids(tok), vocab), vocab


def hf_pretrain(work: Path, budget: float, lr: float) -> None:
    """The run_mlm-style baseline, in its own process (one thread)."""
    from transformers import BertConfig, BertForMaskedLM

    torch.set_num_threads(1)
    out = work / "hf"
    if (out / "model.safetensors").is_file():
        return
    data, vocab = _data(work)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=SHAPE["hidden"],
        num_hidden_layers=SHAPE["layers"],
        num_attention_heads=SHAPE["heads"],
        intermediate_size=SHAPE["intermediate"],
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    model = BertForMaskedLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    loader = data.train_loader(32)
    model.train()
    spent, tokens, steps = 0.0, 0, 0
    while spent < budget:
        t0 = time.perf_counter()
        frac, warm = spent / budget, 0.06
        for g in opt.param_groups:
            g["lr"] = lr * (frac / warm if frac < warm else (1 - frac) / (1 - warm))
        b = next(loader)
        loss = model(input_ids=b["input_ids"], labels=b["labels"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens += b["input_ids"].numel()
        steps += 1
        spent += time.perf_counter() - t0
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "vocab.txt"):
        (out / f).write_bytes((work / "tokenizer" / f).read_bytes())
    (out / "bench.json").write_text(json.dumps({"tokens": tokens, "steps": steps, "seconds": spent}))


def ours_pretrain_cmd(work: Path, budget: float) -> list[str]:
    sets = [
        "train.threads=1",
        "train.progress=false",
        "data.validation_fraction=0.05",
        "train.checkpoint_every=5m",
    ]
    cmd = [
        sys.executable,
        "-m",
        "cramkit",
        "pretrain",
        str(work / "store"),
        "--tokenizer",
        str(work / "tokenizer"),
        "--preset",
        "tiny-cpu",
        "--budget",
        f"{budget:.0f}s",
        "--out",
        str(work / "ours"),
    ]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def no_pretraining(work: Path) -> Path:
    """Our tiny-cpu shape, randomly initialised, saved as a model directory."""
    import cramkit
    from cramkit.model import MaskedLM
    from cramkit.text.tokenizer import load_tokenizer
    from cramkit.train.config import resolve_config

    out = work / "none"
    if (out / "cramkit-model.json").is_file():
        return out
    tok = load_tokenizer(work / "tokenizer")
    cfg = resolve_config("tiny-cpu").model.replace(vocab_size=tok.get_vocab_size())
    torch.manual_seed(0)
    cramkit.LoadedModel(MaskedLM(cfg), "mlm", cfg, tok, max_length=128).save(out)
    return out


def val_losses(work: Path) -> dict[str, float]:
    import cramkit

    data, _ = _data(work)
    val = list(data.val_batches(32, 16))
    n_val = sum(int((b["labels"] != -100).sum()) for b in val)
    out = {}
    for name, src in (("cramkit", work / "ours"), ("HF", f"hf:{work / 'hf'}"), ("none", work / "none")):
        model = cramkit.load(src).model
        total = 0.0
        with torch.no_grad():
            for b in val:
                n = int((b["labels"] != -100).sum())
                total += float(model(b["input_ids"], b["labels"]).loss) * n
        out[name] = total / n_val
    return out


def finetune_all(work: Path, glue: Path, n_train: int, epochs: float, seeds: list[int]) -> dict[str, dict]:
    import cramkit

    results = {}
    for name, src in (("cramkit", work / "ours"), ("HF", f"hf:{work / 'hf'}"), ("none", work / "none")):
        file = work / f"sst2-{name}.json"
        if file.is_file():
            results[name] = json.loads(file.read_text())
            continue
        t0 = time.perf_counter()
        res = cramkit.finetune(
            src,
            task="glue/sst2",
            data_dir=glue,
            seeds=seeds,
            epochs=epochs,
            max_train_examples=n_train,
            progress=False,
        )
        keep = {
            "accuracy": res["median"]["dev"]["metrics"]["accuracy"],
            "per_seed": [r["dev"]["dev"]["metrics"]["accuracy"] for r in res["seeds"]],
            "seconds": round(time.perf_counter() - t0, 1),
        }
        file.write_text(json.dumps(keep))
        results[name] = keep
        print(f"fine-tuned {name}: {keep}", file=sys.stderr, flush=True)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=float, default=1200.0, help="pretraining seconds for each (default 1200)")
    p.add_argument("--work", default=str(REPO / "bench" / "out" / "e2e"))
    p.add_argument("--corpus", nargs="+", default=[str(NOVELS)])
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--hf-lr", type=float, default=1e-3)
    p.add_argument("--train-examples", type=int, default=8000, help="SST-2 training examples per fine-tuning run")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--hf-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.hf_only:
        hf_pretrain(work, args.budget, args.hf_lr)
        return
    prepare(work, args.corpus, args.vocab)
    # both pretraining jobs at once, one thread each: the same machine conditions for both
    jobs = []
    if not (work / "ours" / "checkpoints" / "latest").is_file():
        jobs.append(subprocess.Popen(ours_pretrain_cmd(work, args.budget), stdout=subprocess.DEVNULL))
    if not (work / "hf" / "model.safetensors").is_file():
        jobs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--hf-only",
                    "--work",
                    str(work),
                    "--budget",
                    str(args.budget),
                    "--hf-lr",
                    str(args.hf_lr),
                ]
            )
        )
    for j in jobs:
        if j.wait() != 0:
            raise SystemExit(f"a pretraining job failed: {j.args}")
    no_pretraining(work)
    losses = val_losses(work)
    from cramkit.train import checkpoint as ckpt

    ours_tokens = ckpt.read_state(ckpt.find_latest(work / "ours"))["trainer"]["tokens"]
    hf_tokens = json.loads((work / "hf" / "bench.json").read_text())["tokens"]
    seeds = [int(s) for s in args.seeds.split(",")]
    scores = finetune_all(work, SHARED / "glue", args.train_examples, args.epochs, seeds)
    print(
        f"# corpus={args.corpus} vocab={args.vocab} budget={args.budget:.0f}s per pretraining job (1 thread each, "
        f"run concurrently); SST-2: {args.train_examples} train examples, {args.epochs} epochs, seeds {seeds}, "
        f"full dev (872); ln(vocab)={math.log(args.vocab):.2f}"
    )
    print(
        "| encoder | pretraining tokens | validation MLM loss (15% masked) | SST-2 dev accuracy (median) | per seed |"
    )
    print("|---|---:|---:|---:|---|")
    for name, toks in (("cramkit", ours_tokens), ("HF", hf_tokens), ("none", 0)):
        s = scores[name]
        print(
            f"| {name} | {toks:,} | {losses[name]:.3f} | {statistics.median(s['per_seed']):.2f} | "
            f"{', '.join(f'{a:.2f}' for a in s['per_seed'])} |"
        )


if __name__ == "__main__":
    main()
