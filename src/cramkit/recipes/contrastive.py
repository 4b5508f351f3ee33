"""The contrastive stage: an encoder trained to embed (issue 29), on any model ``cramkit.load`` opens.

``cramkit finetune --objective contrastive`` takes pairs (an anchor and its positive: a question and its
answer, two paraphrases, a title and its paragraph), optionally a hard negative per pair, and trains with
in-batch negatives (MultipleNegativesRanking / InfoNCE, van den Oord et al. 2018; Henderson et al. 2017):
each anchor must pick its own positive among every positive and hard negative of the batch, with
cross-entropy over cosine similarities divided by a temperature. ``--objective simcse`` needs only text
(SimCSE, Gao et al. 2021): a sentence is its own positive, the two passes differing by dropout.

- ``symmetric``: the positives pick their anchors too (the mean of both directions, CLIP's loss);
- ``temperature`` fixed (0.05: sentence-transformers' scale 20) or learnt (``learn_temperature``);
- ``matryoshka`` (``"256,128,64"``): the loss is also taken on the leading dimensions of each vector,
  renormalised (Kusupati et al. 2022), so a served vector can be cut to any of them;
- ``micro_batch`` below ``batch_size``: every pair still has the whole batch as negatives, but the encoder
  runs micro-batch by micro-batch under activation checkpointing, so memory holds one micro-batch's
  activations and the batch's vectors (the memory of GradCache, Gao et al. 2021, at one more forward pass);
- duplicates in a batch (the same positive text for two anchors, a frequent case in mined pairs) are not
  taken for negatives: their scores are masked out, so a batch never teaches that a text differs from itself;
- under torchrun (``--nproc N``) each process embeds its share of the batch and the vectors are gathered
  (``torch.distributed.nn.functional.all_gather``, whose backward returns each rank the gradient of its own
  slice), so every anchor still has the whole global batch as negatives and the gradients are those of one
  process with the whole batch (``gather_negatives``, on by default; off: each process's share only).

The model is trained through the one engine (budget, checkpoints, resume, metrics, torchrun); the output is a
model directory of kind ``encoder`` (its pooling, normalised vectors, the Matryoshka dimensions recorded) that
``embed``, ``index``, ``serve /embed`` and ``export`` take. Each evaluation scores the held-out pairs'
retrieval (recall@1 and MRR of each dev anchor's positive among all dev positives), before training too.

Its rooms: the settings (contrastive_config.py), the pairs, their reading and batching (contrastive_data.py), the
loss (contrastive_loss.py); here the objective for the engine and the recipe that runs it.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.config import to_dict
from cramkit.errors import CramkitError
from cramkit.loading import LoadedModel
from cramkit.model.pooling import Pooling, pooling_for
from cramkit.recipes.contrastive_config import ContrastiveConfig, matryoshka_dims
from cramkit.recipes.contrastive_data import PairBatches, Pairs, make_pairs, pad_sequences, with_prompts
from cramkit.recipes.contrastive_loss import gather, info_nce
from cramkit.recipes.learning_rate import EMBEDDING_LR, width_lr
from cramkit.train.objectives import ExampleObjective

PathLike = str | os.PathLike


# ------------------------------------------------------------------------------------------ the objective


def _embedder_class() -> Any:
    import torch
    from torch import nn

    from cramkit.model.heads import pool_hidden

    class Embedder(nn.Module):
        """The encoder, its pooling and the (log) inverse temperature the loss scales scores by."""

        def __init__(self, encoder: nn.Module, pooling: str, temperature: float, learn: bool) -> None:
            super().__init__()
            self.encoder, self.pooling = encoder, pooling
            self.log_scale = nn.Parameter(torch.tensor(math.log(1.0 / temperature)), requires_grad=learn)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.encoder(input_ids, attention_mask, None, unpad=True)
            return pool_hidden(hidden, attention_mask, self.pooling, None).float()

    return Embedder


class ContrastiveObjective(ExampleObjective):
    """The engine's recipe: batches of pairs (whole batches: in-batch negatives need them all), the InfoNCE
    loss over them, and the dev pairs' retrieval at each evaluation."""

    flops_per_token = None
    cfg: ContrastiveConfig  # (the hyperparameters the engine reports)

    def __init__(
        self,
        loaded: LoadedModel,
        cfg: ContrastiveConfig,
        train: Pairs,
        dev: Pairs | None,
        encoded: list[np.ndarray],
        pooling: str,
    ) -> None:
        self.loaded, self.cfg, self.train, self.dev, self.encoded, self.pooling = (
            loaded,
            cfg,
            train,
            dev,
            encoded,
            pooling,
        )
        self.dims = matryoshka_dims(cfg.matryoshka, loaded.hidden)
        self.title = f"{cfg.objective} ({len(train):,} pairs)"
        self.resume_hint = "rerun the same command to continue from the last checkpoint"
        self.lr_scales: dict[str, float] = {}

    def build_model(self) -> Any:
        assert self.loaded.encoder is not None
        from cramkit.model.encoder import Encoder

        cfg = self.loaded.config.replace(
            dropout=self.cfg.dropout, attention_dropout=self.cfg.dropout, gradient_checkpointing=False
        )
        encoder = Encoder(cfg)
        encoder.load_state_dict(self.loaded.encoder.state_dict(), strict=True)
        return _embedder_class()(encoder, self.pooling, self.cfg.temperature, self.cfg.learn_temperature)

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1) -> PairBatches:
        return PairBatches(self.train, self.encoded, self.loaded.pad_id, self.cfg, rank, world)

    def tokens(self, batch: dict) -> int:  # the anchors', positives' and negatives' masks
        return int(sum(int(batch[k].sum()) for k in batch if k.endswith("_mask")))

    def loss(self, model: Any, batch: dict, device: Any) -> Any:
        import torch

        plain = getattr(model, "module", model)
        parts = ["a", "p", *(["n"] if "n_ids" in batch else [])]
        width = max(batch[f"{x}_ids"].shape[1] for x in parts)
        ids = torch.cat(
            [torch.nn.functional.pad(batch[f"{x}_ids"], (0, width - batch[f"{x}_ids"].shape[1])) for x in parts]
        )
        mask = torch.cat(
            [torch.nn.functional.pad(batch[f"{x}_mask"], (0, width - batch[f"{x}_mask"].shape[1])) for x in parts]
        )
        every = self._embed(model, ids.to(device), mask.to(device))
        vecs = dict(zip(parts, every.split(batch["a_ids"].shape[0]), strict=True))
        offset, all_anchors = 0, None
        if int(batch.get("world", 1)) > 1:  # every process's vectors: the global batch's negatives
            offset = int(batch["rank"]) * vecs["a"].shape[0]
            vecs = {k: gather(v) if k != "a" else v for k, v in vecs.items()}
            all_anchors = gather(vecs["a"]) if self.cfg.symmetric else None
        candidates = torch.cat([vecs["p"], vecs["n"]]) if "n" in vecs else vecs["p"]
        same = batch["same"].to(device)
        return info_nce(
            vecs["a"],
            candidates,
            plain.log_scale.exp(),
            same=same,
            symmetric=self.cfg.symmetric,
            dims=self.dims,
            offset=offset,
            all_anchors=all_anchors,
        )

    def _embed(self, model: Any, ids: Any, mask: Any) -> Any:
        """The vectors of every text of the batch (anchors, positives, negatives) in one unpadded pass (the
        encoder's projections and MLP on the real tokens only, attention in groups of texts of similar length);
        under ``micro_batch``, passes of that many texts of similar length with the activations recomputed in
        the backward pass (only the vectors stay in memory)."""
        import torch
        from torch.utils.checkpoint import checkpoint

        if not self.cfg.micro_batch:
            return model(ids, mask)
        lengths = mask.sum(1)
        order = torch.argsort(lengths, descending=True, stable=True)
        outs = []
        for i in range(0, ids.shape[0], self.cfg.micro_batch):
            rows = order[i : i + self.cfg.micro_batch]
            width = int(lengths[rows].max())
            outs.append(checkpoint(model, ids[rows, :width], mask[rows, :width], use_reentrant=False))
        return torch.cat(outs)[torch.argsort(order)]

    def evaluate(self, model: Any, ctx: Any, precision: str) -> dict[str, float] | None:
        if self.dev is None or not len(self.dev):
            return None
        plain = getattr(model, "module", model)
        return dev_scores(plain, self.dev, self.encoded, self.loaded.pad_id, float(plain.log_scale.detach().exp()))


def dev_scores(model: Any, dev: Pairs, encoded: list[np.ndarray], pad_id: int, scale: float) -> dict[str, float]:
    """Each dev anchor's positive retrieved among every dev positive: recall@1, MRR (x100), and the loss."""
    import torch
    import torch.nn.functional as F

    was = model.training
    model.eval()
    device = next(model.parameters()).device

    def embed(col: np.ndarray) -> Any:
        out = []
        with torch.inference_mode():
            for i in range(0, len(col), 64):
                ids, mask = pad_sequences([encoded[j] for j in col[i : i + 64]], pad_id)
                out.append(model(ids.to(device), mask.to(device)).float().cpu())
        return F.normalize(torch.cat(out), dim=-1)

    a, p = embed(dev.anchor), embed(dev.positive)
    model.train(was)
    scores = a @ p.T
    # the same positive text for two anchors: both columns are right answers
    right = torch.from_numpy(dev.positive[:, None] == dev.positive[None, :])
    best_wrong = scores.masked_fill(right, float("-inf")).max(1).values
    own = scores.diagonal()
    rank = 1 + (scores.masked_fill(right, float("-inf")) > own[:, None]).sum(1)
    loss = F.cross_entropy(
        (scores * scale).masked_fill(right & ~torch.eye(len(own), dtype=torch.bool), -1e4), torch.arange(len(own))
    )
    return {
        "val_loss": float(loss),
        "dev_recall_at_1": float((own > best_wrong).float().mean() * 100),
        "dev_mrr": float((1.0 / rank.float()).mean() * 100),
    }


# -------------------------------------------------------------------------------------------- the recipe

RESULTS = "results.json"


def train_embeddings(
    source: PathLike | LoadedModel,
    rows: Sequence[tuple[str, str, str | None]],
    cfg: ContrastiveConfig,
    out: PathLike,
    *,
    dev_rows: Sequence[tuple[str, str, str | None]] | None = None,
    progress: bool = True,
    skipped: int = 0,
) -> dict[str, Any]:
    """The contrastive stage on ``rows`` (anchor, positive, negative|None) into the model directory ``out``
    (its run: out/run, where a killed run resumes); returns the results (also out/results.json)."""
    from cramkit.io import check_out, dir_lock, disk_errors
    from cramkit.model.loaded import MODEL_FILE
    from cramkit.rundir import finished_result

    out = Path(out)
    own = {RESULTS: ("steps", "config"), "run/checkpoints/step-*/state.json": ("format",)}  # its results, its run
    writes = (RESULTS, "model.safetensors", MODEL_FILE, "tokenizer", "run")
    check_out(out, inputs=[source], own=own, writes=writes, command="the contrastive training")
    done = finished_result(out / RESULTS, needs=(out / MODEL_FILE,), key="steps")
    given = str(getattr(source, "source", source))
    if done is not None and done.get("config") == to_dict(cfg) and done.get("from") == given:
        print(f"cramkit: {out} holds this finished run; its results are reused", file=sys.stderr)
        return done
    if done is not None:
        raise CramkitError(
            f"{out} holds an embedding model trained from {done.get('from')} with other settings; give another "
            "--out, or delete it"
        )
    import contextlib

    from cramkit.runtime import torchrun

    main = torchrun().is_main  # under torchrun: rank 0 holds the lock and writes; every rank trains
    with disk_errors(out), dir_lock(out, "--out") if main else contextlib.nullcontext():
        results = _train(source, rows, cfg, out, dev_rows, progress, skipped)
        results["from"] = given
        from cramkit.io import write_json_atomic

        if main:
            write_json_atomic(out / RESULTS, results)
        return results


def _train(source, rows, cfg, out: Path, dev_rows, progress: bool, skipped: int) -> dict[str, Any]:
    import time

    from cramkit.runtime import torchrun
    from cramkit.train.budget import Budget
    from cramkit.train.distributed import init_distributed, shutdown
    from cramkit.train.epochs import train_epochs

    loaded = _encoder_model(source)
    if cfg.max_train_examples:
        rows = list(rows)[: cfg.max_train_examples]
    pooling = pooling_for(loaded, cfg.pooling)  # auto: the model's own, mean when it declares none
    rows, dev_rows = _hold_out(rows, dev_rows, cfg)
    train, dev, encoded, max_length = _encode(rows, dev_rows, cfg, loaded)
    objective = ContrastiveObjective(loaded, cfg, train, dev, encoded, pooling)
    batch = min(cfg.batch_size, len(train))
    steps_per_epoch = max(1, len(train) // batch)
    budget = cfg.budget or Budget.of_steps(max(1, math.ceil(cfg.epochs * steps_per_epoch))).text
    world, main = torchrun().world, torchrun().is_main
    if world > 1 and batch % world:
        raise CramkitError(
            f"batch_size {batch} does not divide over {world} processes; give a multiple of {world} (each process "
            "embeds an equal share of every batch)"
        )
    before = None
    if dev is not None and main:
        before = _score_before(objective, dev, progress)
    lr = width_lr(cfg.lr, loaded.hidden, wide=EMBEDDING_LR, undeclared_width=0)  # a model of no width: narrow
    tcfg = _train_config(cfg, budget, batch, lr, progress)
    ctx = init_distributed(cfg.device)
    t0 = time.time()
    try:
        done = train_epochs(objective, tcfg, out / "run", examples=len(train), batch_size=batch, ctx=ctx)
    finally:
        shutdown(ctx)
    model: Any = done.model
    after = (
        dev_scores(model, dev, encoded, loaded.pad_id, float(model.log_scale.detach().exp()))
        if dev is not None and main
        else None
    )
    trained = _embedding_model(loaded, model.encoder.eval(), cfg, pooling, max_length, len(train))
    if main:
        trained.save(out)
    gathered = world > 1 and cfg.gather_negatives
    per_process = batch // world
    results = {
        "objective": cfg.objective,
        "source": loaded.source,
        "config": to_dict(cfg),
        "pairs": len(train),
        "dev_pairs": len(dev) if dev is not None else 0,
        "skipped_rows": skipped,
        "steps": done.steps,
        "examples_seen": done.examples_seen,
        "examples_per_s": round(done.examples_per_s, 2),
        "seconds": round(time.time() - t0, 1),
        "lr": lr,
        "temperature": round(1.0 / float(model.log_scale.detach().exp()), 5),
        "pooling": trained.pooling,
        "matryoshka": trained.extra.get("matryoshka"),
        "prompts": trained.extra.get("prompts"),
        "default_prompt_name": trained.extra.get("default_prompt_name"),
        "processes": world,
        # each anchor's candidates are its positive and these: the batch's other positives and hard negatives
        # (every process's when gathered, else its own share's)
        "negatives_per_anchor": (batch if gathered else per_process) * (1 + (train.negative is not None)) - 1,
        "gather_negatives": gathered,
        "before": before,
        "after": after,
        "scale": "recall@1 and MRR are x100; each dev anchor ranks every dev positive",
        "loss_curve": done.losses[:: max(1, len(done.losses) // 100)],
    }
    import shutil

    from cramkit.io import write_json_atomic

    if main:
        write_json_atomic(out / RESULTS, results)
        # the model is saved: the checkpoints (weights and optimizer state, 3x the model) go; the loss curve stays
        shutil.rmtree(out / "run" / "checkpoints", ignore_errors=True)
    return results


def _encoder_model(source: PathLike | LoadedModel) -> LoadedModel:
    """``source`` loaded (unless it is already), refused in one line when it has no transformer encoder."""
    from cramkit.loading import load_torch

    loaded = source if isinstance(source, LoadedModel) else load_torch(source, purpose="contrastive training")
    if loaded.encoder is None:
        raise CramkitError(
            f"--from {loaded.source}: a {loaded.architecture} model has no transformer encoder to train to embed"
        )
    return loaded


def _hold_out(rows: Sequence, dev_rows: Sequence | None, cfg: ContrastiveConfig) -> tuple[Sequence, Sequence | None]:
    """(training rows, held-out rows): without given dev rows, ``cfg.dev_fraction`` of 20 or more contrastive pairs
    (at most ``cfg.max_dev``), drawn by the seed; refused when fewer than 2 training pairs are left."""
    rng = np.random.default_rng([cfg.seed, 7])
    if dev_rows is None and cfg.dev_fraction > 0 and cfg.objective == "contrastive" and len(rows) >= 20:
        order = rng.permutation(len(rows))
        n_dev = min(cfg.max_dev, max(2, int(len(rows) * cfg.dev_fraction)))
        dev_rows = [rows[i] for i in order[:n_dev]]
        rows = [rows[i] for i in order[n_dev:]]
    if len(rows) < 2:
        raise CramkitError(f"the contrastive stage needs at least 2 training pairs, got {len(rows)}")
    return rows, dev_rows


def _encode(
    rows: Sequence, dev_rows: Sequence | None, cfg: ContrastiveConfig, loaded: LoadedModel
) -> tuple[Pairs, Pairs | None, list[np.ndarray], int]:
    """The rows with their prompts as (training pairs, dev pairs or None, every text's token ids, max_length)."""
    from cramkit.data.batching import encode_texts

    rows, dev_rows = with_prompts(rows, cfg), with_prompts(dev_rows, cfg) if dev_rows else dev_rows
    pairs = make_pairs(list(rows) + list(dev_rows or []))
    train = pairs.take(np.arange(len(rows)))
    dev = pairs.take(np.arange(len(rows), len(rows) + len(dev_rows or []))) if dev_rows else None
    max_length = min(cfg.max_length, loaded.max_length)
    encoded = encode_texts(loaded.tokenizer, pairs.texts, None, max_length).ids
    return train, dev, encoded, max_length


def _score_before(objective: ContrastiveObjective, dev: Pairs, progress: bool) -> dict[str, float]:
    """The dev pairs' retrieval by the model before training (said on stderr with ``progress``)."""
    cfg, loaded = objective.cfg, objective.loaded
    before = dev_scores(objective.build_model(), dev, objective.encoded, loaded.pad_id, 1.0 / cfg.temperature)
    if progress:
        print(
            f"cramkit: before training: dev recall@1 {before['dev_recall_at_1']:.1f}, MRR "
            f"{before['dev_mrr']:.1f} ({len(dev):,} held-out pairs)",
            file=sys.stderr,
        )
    return before


def _train_config(cfg: ContrastiveConfig, budget: str, batch: int, lr: float, progress: bool) -> Any:
    """The engine's TrainConfig of the stage: ``budget``, whole batches of ``batch`` pairs at peak ``lr``, linear
    decay after the warmup."""
    from cramkit.train.config import example_config

    return example_config(
        budget=budget,
        lr=lr,
        weight_decay=cfg.weight_decay,
        schedule="linear",
        warmup=cfg.warmup,
        batch_size=batch,  # the whole batch in one loss: in-batch negatives (micro_batch: checkpointed chunks)
        grad_clip=cfg.grad_clip,
        precision=cfg.precision,
        compile="auto",
        device=cfg.device,
        seed=cfg.seed,
        checkpoint_every=cfg.checkpoint_every,
        eval_every=cfg.eval_every,
        log_every=10,
        progress="auto" if progress else False,
        report_to=cfg.report_to,
    )


def _embedding_model(
    loaded: LoadedModel, encoder: Any, cfg: ContrastiveConfig, pooling: Pooling, max_length: int, pairs: int
) -> LoadedModel:
    """The trained ``encoder`` as a model directory of kind ``encoder``: its pooling, normalised vectors, the
    Matryoshka dimensions and the named prompts recorded."""
    dims = matryoshka_dims(cfg.matryoshka, loaded.hidden)
    return loaded.as_encoder(
        encoder,
        pooling=pooling,
        normalize=True,
        max_length=max_length,
        extra={
            **{k: v for k, v in loaded.extra.items() if k in ("st_pooling", "tokenizer")},
            "st_pooling": pooling,
            "contrastive": {"objective": cfg.objective, "pairs": pairs, "source": loaded.source},
            **({"matryoshka": [loaded.hidden, *dims]} if dims else {}),
            **({"prompts": cfg.prompts()} if cfg.prompts() else {}),
            **({"default_prompt_name": cfg.default_prompt_name} if cfg.default_prompt_name else {}),
        },
    )
