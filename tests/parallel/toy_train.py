"""A tiny MaskedLM trained on synthetic batches through cramkit.train.distributed, parallel and checkpoint.

Run by the tests under torchrun (or plainly, as one process). Each step's global batch is a function
of the step index only; rank r trains on its slice, so any world size sees the same global batches.
Writes ``losses-rank{r}.json`` (step -> loss) into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from cramkit.model.encoder import ModelConfig
from cramkit.model.heads import IGNORE, MaskedLM
from cramkit.train import checkpoint
from cramkit.train import distributed as D
from cramkit.train import parallel as P

VOCAB, LENGTH, GLOBAL_BATCH, MICRO = 96, 16, 8, 2


def global_batch(step: int, vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(5, vocab, (GLOBAL_BATCH, LENGTH), generator=g)
    labels = torch.where(torch.rand(GLOBAL_BATCH, LENGTH, generator=g) < 0.3, ids, IGNORE)
    return ids, labels


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (parallel.tp)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--bert", action="store_true", help="BERT's layout: biases, post-LN, learned positions, GELU")
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--out", required=True)
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--sync-save", action="store_true")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--die-at", type=int, default=-1, help="rank 1 exits abruptly at this step")
    ap.add_argument("--hang-at", type=int, default=-1, help="rank 1 stops responding at this step")
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cfg = D.ParallelConfig(strategy=args.strategy, timeout=args.timeout, tp=args.tp)
    ctx = D.init_distributed("cpu", cfg)
    torch.manual_seed(0)
    bert = dict(bias=True, norm_position="post", position="learned", activation="gelu") if args.bert else {}
    model = MaskedLM(
        ModelConfig(vocab_size=args.vocab, hidden=32, layers=2, heads=2, intermediate=64, max_position=LENGTH, **bert)
    )
    model = P.parallelize(model, cfg, ctx)
    data = D.data_context(ctx, cfg)  # the ranks of a tensor-parallel group share their batches
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    ckpt = checkpoint.Checkpointer(out, ctx, keep=2, async_save=not args.sync_save)
    start = 0
    if args.resume:
        state = checkpoint.load(out, model, optimizer, process_group=ckpt.pg)
        start = state["next_step"]
    losses: dict[int, float] = {}
    per_rank = GLOBAL_BATCH // data.world
    accum = per_rank // MICRO
    with D.fault_guard(ctx):
        for step in range(start, args.steps):
            if step == args.die_at and ctx.rank == 1:
                os._exit(3)
            if step == args.hang_at and ctx.rank == 1:
                time.sleep(3600)
            ids, labels = global_batch(step, args.vocab)
            n_global = (labels != IGNORE).sum()
            ids, labels = ids[data.rank * per_rank :][:per_rank], labels[data.rank * per_rank :][:per_rank]
            total = torch.zeros(())
            for k in range(accum):
                with P.sync_gradients(model, k == accum - 1):
                    outp = model(ids[k * MICRO : (k + 1) * MICRO], labels[k * MICRO : (k + 1) * MICRO])
                    # token-weighted mean over the global batch; DDP/FSDP average over data ranks, so x world
                    loss = outp.loss * outp.n_predicted / n_global
                    (loss * data.world).backward()
                total += loss.detach()
            D.all_reduce(total, data)
            P.clip_grad_norm(model, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses[step] = total.item()
            if args.save_every and (step + 1) % args.save_every == 0:
                ckpt.save(step + 1, model, optimizer, {"next_step": step + 1})
            if step == args.die_at:
                time.sleep(args.timeout * 3)  # rank 0 would be stuck here if nothing ended the job
        ckpt.close()
    (out / f"losses-rank{ctx.rank}.json").write_text(json.dumps(losses))
    D.shutdown(ctx)


if __name__ == "__main__":
    main()
