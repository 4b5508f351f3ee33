"""SetFit as sentence-transformers and scikit-learn run it, on the very rows a cramkit few-shot split drew: the
reference that ``cramkit finetune --method setfit`` is compared with (issue 28).

The body: sentence-transformers' ``CosineSimilarityLoss`` through ``model.fit`` (batch 16, one epoch, 10% warmup) on
SetFit's pairs (per round and row, one of the same label and one of another); the head: scikit-learn's
``LogisticRegression()`` on the model's own (normalised) embeddings. Prints the dev accuracy before and after.

    python bench/bench_setfit_reference.py --model MINILM_DIR --sample OUT/split-0/fewshot-sample.json \\
        --glue-dir ../shared/data/glue --lr 2e-5 --pairs 20

(``OUT`` from ``cramkit finetune --task glue/sst2 --few-shot 16 --method setfit --out OUT``.) Needs
sentence-transformers and scikit-learn, which cramkit itself does not.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a sentence-transformers folder (all-MiniLM-L6-v2)")
    ap.add_argument("--sample", required=True, help="a split's fewshot-sample.json (its training rows)")
    ap.add_argument("--glue-dir", required=True)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--pairs", type=int, default=20, help="rounds of one positive and one negative pair per row")
    args = ap.parse_args()

    import torch
    from sentence_transformers import InputExample, SentenceTransformer, losses
    from sklearn.linear_model import LogisticRegression
    from torch.utils.data import DataLoader

    from cramkit.tasks.registry import get_task

    task = get_task("glue/sst2", data_dir=args.glue_dir)
    train, dev = task.examples("train"), task.examples("dev")
    rows = json.loads(Path(args.sample).read_text(encoding="utf-8"))["train"]
    texts = [train[i].text_a for i in rows]
    y = np.array([train[i].label for i in rows])
    rng = np.random.default_rng(0)
    random.seed(0)
    torch.manual_seed(0)
    examples = []
    for _ in range(args.pairs):
        for i in range(len(y)):
            same = [j for j in range(len(y)) if y[j] == y[i] and j != i]
            other = [j for j in range(len(y)) if y[j] != y[i]]
            examples.append(InputExample(texts=[texts[i], texts[same[rng.integers(len(same))]]], label=1.0))
            examples.append(InputExample(texts=[texts[i], texts[other[rng.integers(len(other))]]], label=0.0))
    model = SentenceTransformer(args.model, device="cpu")
    dev_texts, dev_y = [e.text_a for e in dev], np.array([e.label for e in dev])

    def score(tag: str) -> None:
        clf = LogisticRegression().fit(model.encode(texts), y)
        acc = (clf.predict(model.encode(dev_texts, batch_size=128)) == dev_y).mean()
        print(f"{tag}: dev accuracy {100 * acc:.2f} ({len(dev_y)} rows)", flush=True)

    score("frozen encoder + logistic regression")
    loader = DataLoader(examples, shuffle=True, batch_size=16)
    model.fit(
        train_objectives=[(loader, losses.CosineSimilarityLoss(model))],
        epochs=1,
        warmup_steps=int(0.1 * len(loader)),
        optimizer_params={"lr": args.lr},
        show_progress_bar=False,
    )
    score(f"SetFit (body lr {args.lr}, {len(examples)} pairs) + logistic regression")


if __name__ == "__main__":
    main()
