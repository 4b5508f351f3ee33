"""Prompt-based fine-tuning (LM-BFF, Gao et al. 2021) written plainly in Hugging Face transformers, on the very
rows a cramkit few-shot split drew: the reference that ``cramkit finetune --method prompt`` is compared with
(issue 28).

The model is a ``BertForMaskedLM`` folder (``cramkit export RUN --format hf``); each SST-2 sentence becomes
``"{sentence} It was [MASK] ."``; the labels' logits are the MLM head's logits of ``terrible`` and ``great`` at the
mask, trained with cross-entropy (LM-BFF's ``prompt-based fine-tuning``). The recipe is cramkit's defaults
(AdamW, betas 0.9/0.98, eps 1e-6, weight decay 0.01 on matrices, 10% warmup then cosine decay, dropout on), with
``--steps`` steps of ``--batch`` rows drawn epoch by epoch in a shuffled order; the last model is scored on the
872 dev sentences. Prints the accuracy before and after training.

    cramkit finetune --task glue/sst2 --from RUN --few-shot 16 --splits 2 --method prompt \\
        --set batch_size=8 --set min_steps=200 --set epochs=1e-6 --set eval_every=never --out OUT
    cramkit export RUN --format hf --out HF
    python bench/bench_prompt_reference.py --model HF --sample OUT/split-0/fewshot-sample.json \\
        --glue-dir ../shared/data/glue --steps 200 --batch 8

Needs transformers, which cramkit itself does not.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a BertForMaskedLM folder")
    ap.add_argument("--sample", required=True, help="a split's fewshot-sample.json (its training rows)")
    ap.add_argument("--glue-dir", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=4e-5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from transformers import AutoTokenizer, BertForMaskedLM

    from cramkit.tasks.registry import get_task

    torch.manual_seed(args.seed)
    task = get_task("glue/sst2", data_dir=args.glue_dir)
    train, dev = task.examples("train"), task.examples("dev")
    rows = json.loads(Path(args.sample).read_text(encoding="utf-8"))["train"]
    tok = AutoTokenizer.from_pretrained(args.model)
    model = BertForMaskedLM.from_pretrained(args.model)
    words = torch.tensor([tok.convert_tokens_to_ids(w) for w in ("terrible", "great")])

    def scores(texts: list[str]) -> torch.Tensor:
        enc = tok(
            [f"{t} It was {tok.mask_token} ." for t in texts],
            padding=True,
            truncation=True,
            max_length=128,
            return_tensors="pt",
        )
        logits = model(**enc).logits
        at = enc["input_ids"] == tok.mask_token_id
        return logits[at][:, words]  # [rows, labels]: each text has one mask

    def accuracy() -> float:
        model.eval()
        right = 0
        with torch.no_grad():
            for i in range(0, len(dev), 64):
                part = dev[i : i + 64]
                right += int(
                    (scores([e.text_a for e in part]).argmax(-1) == torch.tensor([e.label for e in part])).sum()
                )
        model.train()
        return 100.0 * right / len(dev)

    print(f"before training: {accuracy():.2f}")
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.98),
        eps=1e-6,
    )
    warm = max(1, int(0.1 * args.steps))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    g = torch.Generator().manual_seed(args.seed)
    order: list[int] = []
    model.train()
    for _ in range(args.steps):
        if len(order) < args.batch:
            order += torch.randperm(len(rows), generator=g).tolist()
        batch, order = [rows[i] for i in order[: args.batch]], order[args.batch :]
        loss = F.cross_entropy(scores([train[i].text_a for i in batch]), torch.tensor([train[i].label for i in batch]))
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    print(f"after {args.steps} steps of {args.batch}: {accuracy():.2f}")


if __name__ == "__main__":
    main()
