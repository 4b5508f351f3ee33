"""The contrastive stage (issue 29): what it does to a model's retrieval, and its speed against
sentence-transformers' trainer.

quality: each ``--model`` goes through ``cramkit.train_embeddings`` on MRPC's training paraphrases
(``--steps`` steps of ``--batch`` pairs, in-batch negatives, each ``--seeds``), and is scored before and after
on MRPC's dev split as a retrieval set (``bench/make_beir.py``: each paraphrase pair's first sentence finds its
second among 531 sentences; nDCG@10, recall@1, x100) and as STS (Spearman of the cosine with the 0/1 label,
x100), with ``cramkit.evaluate_retrieval`` / ``cramkit.evaluate_sts``.

speed: all-MiniLM-L6-v2, the same ``--speed-pairs`` pairs, batch, length limit (128), threads and steps:
``cramkit.train_embeddings`` against ``SentenceTransformerTrainer`` with ``MultipleNegativesRankingLoss`` (no
evaluation, no saving); pairs/s of the training alone (cramkit: the engine's examples/s; sentence-transformers:
the trainer's ``train_samples_per_second``), interleaved rounds, the median.

    python bench/bench_contrastive.py --glue ../shared/data/glue --model runs/tiny --model hf:$MINILM
    python bench/bench_contrastive.py --glue ../shared/data/glue --only speed --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_infer import machine, minilm_dir
from make_beir import make_beir, read_mrpc


def positives(glue: Path, split: str) -> list[tuple[str, str, None]]:
    return [(a, b, None) for q, _, _, a, b in read_mrpc(glue / "MRPC" / f"{split}.tsv") if q == 1]


def scores(model, beir: Path, sts: Path) -> dict[str, float]:
    import cramkit

    r = cramkit.evaluate_retrieval(model, beir, None, split="dev", progress=False, device="cpu")
    s = cramkit.evaluate_sts(
        model, sts, None, text_a="#1 String", text_b="#2 String", label="Quality", progress=False, device="cpu"
    )
    m = r["metrics"]
    return {"ndcg@10": m["ndcg@10"], "recall@1": m["recall@1"], "sts_spearman": s["metrics"]["spearman"]}


def quality(args: argparse.Namespace, work: Path) -> list[dict]:
    beir = work / "mrpc-dev"
    if not (beir / "corpus.jsonl").is_file():
        make_beir(Path(args.glue) / "MRPC" / "dev.tsv", beir, "dev")
    sts = Path(args.glue) / "MRPC" / "dev.tsv"
    train = positives(Path(args.glue), "train")
    rows = []
    for model in args.model:
        before = scores(model, beir, sts)
        for seed in [int(s) for s in args.seeds.split(",")]:
            out = work / f"{Path(model).name}-{seed}-{args.steps}"
            t0 = time.time()
            res = _train(model, train, out, seed, args)
            after = scores(out, beir, sts)
            row = {
                "model": model,
                "seed": seed,
                "steps": res["steps"],
                "pairs_per_s": res["examples_per_s"],
                "seconds": round(time.time() - t0, 1),
                "before": before,
                "after": after,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _train(model: str, pairs, out: Path, seed: int, args: argparse.Namespace, dev_fraction: float = 0.0) -> dict:
    from cramkit.recipes import contrastive as con
    from cramkit.recipes.contrastive_config import config_from

    cfg = config_from(
        {
            "budget": f"{args.steps}steps",
            "batch_size": args.batch,
            "seed": seed,
            "dev_fraction": dev_fraction,
            "checkpoint_every": "never",
            "device": "cpu",
            **({"lr": args.lr} if args.lr else {}),
        }
    )
    return con.train_embeddings(model, pairs, cfg, out, progress=False)


def st_train(model_dir: Path, pairs, steps: int, batch: int) -> float:
    """sentence-transformers' trainer, MultipleNegativesRankingLoss, ``steps`` steps: pairs/s of the training."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, losses
    from sentence_transformers.training_args import SentenceTransformerTrainingArguments

    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = 128
    data = Dataset.from_dict({"anchor": [a for a, _, _ in pairs], "positive": [b for _, b, _ in pairs]})
    with tempfile.TemporaryDirectory() as tmp:
        targs = SentenceTransformerTrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=batch,
            max_steps=steps,
            learning_rate=2e-5,
            warmup_ratio=0.1,
            save_strategy="no",
            eval_strategy="no",
            logging_steps=1000,
            report_to="none",
            use_cpu=True,
            dataloader_drop_last=True,
            disable_tqdm=True,
        )
        trainer = SentenceTransformerTrainer(
            model=model, args=targs, train_dataset=data, loss=losses.MultipleNegativesRankingLoss(model)
        )
        out = trainer.train()
    return steps * batch / out.metrics["train_runtime"]


def speed(args: argparse.Namespace, work: Path) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    model = minilm_dir()
    pairs = positives(Path(args.glue), "train")[: args.speed_pairs]
    ours, theirs = [], []
    for r in range(args.rounds):
        timed = argparse.Namespace(**{**vars(args), "lr": None, "steps": args.speed_steps})
        out = work / f"speed-{r}"
        shutil.rmtree(out, ignore_errors=True)  # a finished run there would be resumed, not timed
        res = _train(f"hf:{model}", pairs, out, 0, timed)
        ours.append(res["examples_per_s"])
        theirs.append(st_train(model, pairs, args.speed_steps, args.batch))
        print(f"round {r}: cramkit {ours[-1]:.1f} pairs/s, sentence-transformers {theirs[-1]:.1f}", flush=True)
    return {
        "cramkit": statistics.median(ours),
        "sentence_transformers": statistics.median(theirs),
        "rounds": {"cramkit": ours, "sentence_transformers": theirs},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--glue", required=True)
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=None, help="default: the stage's lr auto")
    ap.add_argument("--only", choices=("quality", "speed"), default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--speed-pairs", type=int, default=256)
    ap.add_argument("--speed-steps", type=int, default=16)
    ap.add_argument("--work", default="bench-contrastive")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"# {machine()}; {args.threads} thread(s); batch {args.batch}, {args.steps} steps", flush=True)
    if args.only != "speed" and args.model:
        rows = quality(args, work)
        print("\n| model | seed | nDCG@10 before -> after | recall@1 | STS Spearman | pairs/s |")
        print("|---|---:|---|---|---|---:|")
        for r in rows:
            b, a = r["before"], r["after"]
            print(
                f"| {Path(r['model']).name} | {r['seed']} | {b['ndcg@10']:.1f} -> {a['ndcg@10']:.1f} | "
                f"{b['recall@1']:.1f} -> {a['recall@1']:.1f} | {b['sts_spearman']:.1f} -> {a['sts_spearman']:.1f} "
                f"| {r['pairs_per_s']:.1f} |"
            )
    if args.only != "quality":
        s = speed(args, work)
        print(
            f"\nspeed (MiniLM, {args.speed_pairs} pairs, batch {args.batch}, {args.speed_steps} steps, {args.threads} "
            f"thread(s)): cramkit {s['cramkit']:.1f} pairs/s, sentence-transformers {s['sentence_transformers']:.1f}"
            f" pairs/s: {s['cramkit'] / s['sentence_transformers']:.2f}x (rounds {s['rounds']})"
        )


if __name__ == "__main__":
    main()
