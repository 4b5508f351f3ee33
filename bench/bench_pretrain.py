"""Pretraining benchmarks: cramkit against Hugging Face transformers, side by side in one run.

(a) throughput: tokens/s of a full training step (forward, backward, AdamW) of cramkit's MaskedLM
    (sparse prediction, no biases, GELU-GLU, pre-LN: the tiny-cpu / crammed-bert choices) against
    transformers.BertForMaskedLM (dense MLM head, biases, GELU, post-LN, its default dropout) at the same
    shape (layers, hidden, heads, intermediate, vocabulary 32768, length 128, batch 32), the same threads,
    the same masked batches; repetitions interleaved; median step time per model.
(b) quality per budget: the same token store, tokenizer and wall-clock budget; cramkit's trainer
    (tiny-cpu recipe) against a plain Hugging Face loop (dense MLM 15%, AdamW, linear decay, as run_mlm);
    validation MLM loss on the same held-out masked batches.

    python bench/bench_pretrain.py throughput [--reps 3] [--compile] [--precisions fp32,bf16,default]
       (fp32 / bf16: both sides at that precision, bf16 as torch.autocast as `cramkit pretrain` runs it;
        default: each side as its own defaults leave it, cramkit's `precision auto` against transformers' fp32)
    python bench/bench_pretrain.py quality [--budget 150] [--corpus FILE ...]  (default: WikiText-2 valid+test)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from _shared_data import SHARED

REPO = Path(__file__).resolve().parents[1]


def hf_model(layers: int, hidden: int, heads: int, inter: int, vocab: int, dropout: bool = True):
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inter,
        max_position_embeddings=512,
        attn_implementation="sdpa",
        **({} if dropout else {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}),
    )
    return BertForMaskedLM(cfg)


def ours_model(layers: int, hidden: int, heads: int, inter: int, vocab: int):
    from cramkit.model import MaskedLM
    from cramkit.train.config import resolve_config

    cfg = resolve_config("tiny-cpu").model.replace(
        vocab_size=vocab, layers=layers, hidden=hidden, heads=heads, intermediate=inter, max_position=128
    )
    return MaskedLM(cfg)


def masked_batch(batch: int, length: int, vocab: int, rate: float = 0.25, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, length), generator=g)
    chosen = torch.rand(batch, length, generator=g) < rate
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return ids.masked_fill(chosen, 4), labels


def make_step(kind: str, shape: tuple[int, int, int, int], vocab: int, compile_: bool = False, precision: str = "fp32"):
    from cramkit.runtime import autocast
    from cramkit.train.optim import build_optimizer

    torch.manual_seed(0)
    if kind == "hf":
        model = hf_model(*shape, vocab)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def loss_of(ids, labels):
            return model(input_ids=ids, labels=labels).loss
    else:
        model = ours_model(*shape, vocab)
        if compile_:
            for block in model.encoder.layers:
                block.compile()
        # what `cramkit pretrain` runs on CPU: AdamW (foreach), decay groups, fp32
        opt = build_optimizer(model, "adamw", 1e-3, (0.9, 0.98), 1e-12, 0.01, torch.device("cpu"))

        def loss_of(ids, labels):
            return model(ids, labels).loss

    model.train()

    def step(ids, labels):
        with autocast(precision, torch.device("cpu")):
            loss = loss_of(ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def side_precisions(which: str) -> dict[str, str]:
    """Each side's precision in one row of the table: both the same, or each its own default."""
    from cramkit.runtime import resolve_precision

    if which == "default":
        ours = resolve_precision("auto", torch.device("cpu"))
        return {"hf": "fp32", "ours": ours}
    return {"hf": which, "ours": which}


def throughput(args: argparse.Namespace) -> None:
    from cramkit.runtime import cpu_flags

    torch.set_num_threads(args.threads)
    vocab, length, batch = 32768, 128, 32
    shapes = [(4, 256, 4, 1024), (2, 512, 8, 2048), (6, 384, 6, 1536)]
    kinds = ["hf", "ours"] + (["ours+compile"] if args.compile else [])
    ids, labels = masked_batch(batch, length, vocab)
    isa = " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in cpu_flags())
    print(
        f"# threads={torch.get_num_threads()} torch={torch.__version__} vocab={vocab} length={length} batch={batch} "
        f"flags: {isa or 'no AVX2'}"
    )
    print(
        "| shape (L x H, heads, inter) | precision (HF / cramkit) | HF tokens/s | cramkit tokens/s | ratio |"
        + (" compiled | ratio |" if args.compile else "")
    )
    print("|---|---|---:|---:|---:|" + ("---:|---:|" if args.compile else ""))
    for shape in shapes:
        for which in args.precisions.split(","):
            prec = side_precisions(which)
            steps = {k: make_step(k.split("+")[0], shape, vocab, "compile" in k, prec[k.split("+")[0]]) for k in kinds}
            for k in kinds:  # warm up (and compile)
                for _ in range(2):
                    steps[k](ids, labels)
            times: dict[str, list[float]] = {k: [] for k in kinds}
            for _ in range(args.reps):
                for k in kinds:  # interleaved repetitions
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        steps[k](ids, labels)
                    times[k].append((time.perf_counter() - t0) / args.steps)
            tps = {k: batch * length / statistics.median(v) for k, v in times.items()}
            ratio = tps["ours"] / tps["hf"]
            row = f"| {shape[0]} x {shape[1]}, {shape[2]}, {shape[3]} | {prec['hf']} / {prec['ours']}"
            row += f"{' (each its default)' if which == 'default' else ''} | {tps['hf']:,.0f} | "
            row += f"{tps['ours']:,.0f} | {ratio:.2f}x |"
            if args.compile:
                row += f" {tps['ours+compile']:,.0f} | {tps['ours+compile'] / tps['hf']:.2f}x |"
            print(row, flush=True)
            del steps


def quality(args: argparse.Namespace) -> None:
    """Same store, tokenizer, wall-clock budget; validation MLM loss on the same held-out batches."""
    import cramkit
    from cramkit.data.build import build_store
    from cramkit.data.loader import PretrainData
    from cramkit.data.mlm import DataConfig
    from cramkit.data.tokenstore import TokenStore
    from cramkit.model import MaskedLM
    from cramkit.text.sources import iter_documents
    from cramkit.text.tokenizer import load_tokenizer, save_tokenizer, special_ids, train_tokenizer
    from cramkit.train.checkpoint import find_latest, model_weights, read_state
    from cramkit.train.config import resolve_config

    torch.set_num_threads(args.threads)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-quality-"))
    store_dir = work / "store"
    if not (store_dir / "train.idx").is_file():
        tok = train_tokenizer(iter_documents(args.corpus), 8192)
        save_tokenizer(tok, work / "tokenizer")
        build_store(args.corpus, tok, store_dir, name="train")
    tok = load_tokenizer(work / "tokenizer")
    store = TokenStore(store_dir)
    vocab, special = tok.get_vocab_size(), special_ids(tok)
    cfg = resolve_config("tiny-cpu")
    # the same held-out batches for both: BERT's 15% masking on the validation documents
    val_data = PretrainData(store, DataConfig(mask_rate=0.15, validation_fraction=0.05), special, vocab)
    val = list(val_data.val_batches(32, 16))
    n_val = sum(int((b["labels"] != -100).sum()) for b in val)

    def val_loss(forward) -> float:
        total = 0.0
        with torch.no_grad():
            for b in val:
                n = int((b["labels"] != -100).sum())
                total += float(forward(b["input_ids"], b["labels"])) * n
        return total / n_val

    results = {}
    for rep in range(args.reps):
        # cramkit: the tiny-cpu recipe, the wall-clock budget
        run = work / f"ours-{rep}"
        cramkit.pretrain(
            str(store_dir),
            budget=f"{args.budget}s",
            out=run,
            overrides=[
                f"train.threads={args.threads}",
                "train.progress=false",
                "train.eval_every=never",
                "data.validation_fraction=0.05",
                "train.checkpoint_every=never",
            ],
        )
        model = MaskedLM(resolve_config(base=__import__("yaml").safe_load((run / "config.yaml").read_text())).model)
        sd, state = model_weights(find_latest(run)), read_state(find_latest(run))["trainer"]
        model.load_state_dict(sd, strict=False)
        model.eval()
        results.setdefault("ours", []).append(
            (val_loss(lambda i, lab, model=model: model(i, lab).loss), state["tokens"])
        )

        # Hugging Face: BertForMaskedLM, dense head, 15% masking, AdamW + linear decay over the same time
        torch.manual_seed(0)
        m = cfg.model
        hf = hf_model(m.layers, m.hidden, m.heads, m.intermediate, vocab)
        opt = torch.optim.AdamW(hf.parameters(), lr=args.hf_lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        loader = PretrainData(store, DataConfig(mask_rate=0.15, validation_fraction=0.05), special, vocab).train_loader(
            32
        )
        hf.train()
        spent, tokens = 0.0, 0
        while spent < args.budget:
            t0 = time.perf_counter()
            frac = spent / args.budget
            warm = 0.06
            for g in opt.param_groups:
                g["lr"] = args.hf_lr * (frac / warm if frac < warm else (1 - frac) / (1 - warm))
            b = next(loader)
            loss = hf(input_ids=b["input_ids"], labels=b["labels"]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            tokens += b["input_ids"].numel()
            spent += time.perf_counter() - t0
        hf.eval()
        results.setdefault("hf", []).append((val_loss(lambda i, lab, hf=hf: hf(input_ids=i, labels=lab).loss), tokens))
        print(f"rep {rep}: ours {results['ours'][-1]}, hf {results['hf'][-1]}", file=sys.stderr, flush=True)

    print(
        f"# corpus={args.corpus} vocab={vocab} budget={args.budget}s threads={args.threads} "
        f"val: {len(val)} batches, {n_val} masked tokens (15%); ln(vocab)={math.log(vocab):.3f}"
    )
    print("| trainer | validation MLM loss (median) | tokens seen (median) |")
    print("|---|---:|---:|")
    for k, name in (("hf", "HF BertForMaskedLM, dense MLM, linear"), ("ours", "cramkit tiny-cpu")):
        print(
            f"| {name} | {statistics.median(v for v, _ in results[k]):.3f} | "
            f"{statistics.median(t for _, t in results[k]):,.0f} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("throughput")
    a.add_argument("--reps", type=int, default=3)
    a.add_argument("--steps", type=int, default=2)
    a.add_argument("--threads", type=int, default=2)
    a.add_argument("--compile", action="store_true", help="also cramkit with torch.compile on CPU")
    a.add_argument(
        "--precisions",
        default="fp32",
        help="comma-separated rows per shape: fp32, bf16 (both sides the same) or default (each side its own)",
    )
    b = sub.add_parser("quality")
    b.add_argument("--budget", type=float, default=150.0, help="seconds of training each")
    b.add_argument(
        "--corpus",
        nargs="+",
        default=[str(SHARED / "wikitext-2" / f"wiki.{s}.tokens") for s in ("valid", "test")],
    )
    b.add_argument("--reps", type=int, default=1)
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--hf-lr", type=float, default=1e-3)
    b.add_argument("--work", help="directory for the store and runs (default: a temporary one)")
    args = p.parse_args()
    throughput(args) if args.what == "throughput" else quality(args)


if __name__ == "__main__":
    main()
