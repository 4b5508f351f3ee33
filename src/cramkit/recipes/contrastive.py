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
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cramkit.config import from_dict, to_dict
from cramkit.errors import CramkitError
from cramkit.load import LoadedModel
from cramkit.train.objectives import ExampleObjective

PathLike = str | os.PathLike

POSITIVE_LABELS = ("1", "paraphrase", "entailment", "true", "yes", "positive")


@dataclass
class ContrastiveConfig:
    """``cramkit finetune --objective contrastive|simcse`` (``--set KEY=VALUE``)."""

    objective: Literal["contrastive", "simcse"] = "contrastive"
    budget: str = ""  # '' : ``epochs`` epochs over the pairs; else the engine's ('10m', '2000steps', '5e6tok')
    epochs: float = 1.0
    batch_size: int = 64  # pairs per step: each anchor's negatives are the batch's other positives
    micro_batch: int = 0  # 0: the batch at once; smaller: cached negatives (activation checkpointing)
    gather_negatives: bool = True  # under torchrun: every process's vectors are each anchor's negatives
    lr: float | Literal["auto"] = "auto"  # auto: 2e-5 from width 384 up (sentence-transformers'), 1e-3 below
    warmup: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    temperature: float = 0.05
    learn_temperature: bool = False
    symmetric: bool = False
    matryoshka: str = ""  # e.g. "256,128,64": leading dimensions trained too
    pooling: Literal["auto", "mean", "first"] = "auto"  # auto: the model's own
    max_length: int = 128
    dropout: float = 0.1  # simcse's noise; the model's dropout otherwise too
    dev_fraction: float = 0.05  # of the pairs held out (at most max_dev) when no --dev is given
    max_dev: int = 1000
    max_train_examples: int = 0
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"
    eval_every: str = "never"  # the engine's: '200steps', '5m'; the end is always scored
    checkpoint_every: str = "5m"
    report_to: str = "none"  # experiment trackers that also get metrics.jsonl's records (--report-to)
    # named prompts (E5's "query: " / "passage: "): anchors get query_prompt, positives and negatives
    # passage_prompt; recorded in the model (extra.prompts: query, passage) for embed/serve/index
    query_prompt: str = ""
    passage_prompt: str = ""
    default_prompt_name: str = ""  # '', 'query' or 'passage': the prompt an input gets when none is named

    def validate(self) -> None:
        if self.objective not in ("contrastive", "simcse"):
            raise CramkitError(f"--objective is contrastive or simcse, got {self.objective!r}")
        if self.batch_size < 2:
            raise CramkitError(f"contrastive batch_size must be at least 2 (in-batch negatives), got {self.batch_size}")
        if self.micro_batch < 0 or self.micro_batch > self.batch_size:
            raise CramkitError(f"micro_batch must be 0 or 1..batch_size ({self.batch_size}), got {self.micro_batch}")
        if not 0 < self.temperature <= 10:
            raise CramkitError(f"temperature must be in (0, 10], got {self.temperature}")
        if self.lr != "auto" and (not isinstance(self.lr, (int, float)) or self.lr <= 0) or self.epochs <= 0:
            raise CramkitError(f"lr and epochs must be positive, got {self.lr}, {self.epochs}")
        if not 0 <= self.dev_fraction < 1:
            raise CramkitError(f"dev_fraction must be in [0, 1), got {self.dev_fraction}")
        matryoshka_dims(self.matryoshka, None)
        if (self.query_prompt or self.passage_prompt) and self.objective == "simcse":
            raise CramkitError(
                "--query-prompt/--passage-prompt apply to --objective contrastive (an anchor and its positive); "
                "simcse's two views are the same text"
            )
        named = self.prompts()
        if self.default_prompt_name and self.default_prompt_name not in named:
            raise CramkitError(
                f"--default-prompt-name {self.default_prompt_name!r}: give one of the prompts set "
                f"({', '.join(named) or 'none: add --query-prompt TEXT or --passage-prompt TEXT'})"
            )
        from cramkit.train.report import report_to_setting, require_trackers

        self.report_to = report_to_setting(require_trackers(self.report_to))

    def prompts(self) -> dict[str, str]:
        """The named prompts the model records: {"query": ..., "passage": ...} (the ones set)."""
        return {k: v for k, v in (("query", self.query_prompt), ("passage", self.passage_prompt)) if v}


def with_prompts(
    rows: Sequence[tuple[str, str, str | None]], cfg: ContrastiveConfig
) -> list[tuple[str, str, str | None]]:
    """Rows with the query prompt before each anchor and the passage prompt before each positive and negative."""
    q, p = cfg.query_prompt, cfg.passage_prompt
    if not q and not p:
        return list(rows)
    return [(q + a, p + b, None if n is None else p + n) for a, b, n in rows]


def config_from(overrides: dict[str, Any] | None = None) -> ContrastiveConfig:
    """A ContrastiveConfig from ``--set`` overrides (unknown keys are errors)."""
    cfg = from_dict(ContrastiveConfig, dict(overrides or {}), "contrastive")
    cfg.validate()
    return cfg


def matryoshka_dims(text: str, hidden: int | None) -> list[int]:
    """``"256,128,64"`` -> [256, 128, 64] (each positive, below ``hidden`` when known)."""
    if not text:
        return []
    try:
        dims = sorted({int(x) for x in str(text).split(",") if x.strip()}, reverse=True)
    except ValueError:
        raise CramkitError(f"matryoshka {text!r}: give dimensions separated by commas, e.g. 256,128,64") from None
    if any(d < 1 for d in dims) or (hidden is not None and any(d > hidden for d in dims)):
        raise CramkitError(f"matryoshka {text!r}: each dimension must be in 1..{hidden or 'the hidden size'}")
    return [d for d in dims if hidden is None or d < hidden]


# ------------------------------------------------------------------------------------------------ data


@dataclass
class Pairs:
    """Anchors, positives and (optionally) hard negatives, as indices into ``texts`` (each text once)."""

    texts: list[str]
    anchor: np.ndarray
    positive: np.ndarray
    negative: np.ndarray | None

    def __len__(self) -> int:
        return len(self.anchor)

    def take(self, rows: np.ndarray) -> Pairs:
        neg = self.negative[rows] if self.negative is not None else None
        return Pairs(self.texts, self.anchor[rows], self.positive[rows], neg)


def make_pairs(rows: Sequence[tuple[str, str, str | None]]) -> Pairs:
    """Pairs from (anchor, positive, negative or None) strings; a text that occurs twice is stored once."""
    index: dict[str, int] = {}

    def at(t: str) -> int:
        return index.setdefault(t, len(index))

    anchor = np.asarray([at(a) for a, _, _ in rows], dtype=np.int64)
    positive = np.asarray([at(p) for _, p, _ in rows], dtype=np.int64)
    has_neg = any(n is not None for _, _, n in rows)
    negative = np.asarray([at(n or "") for _, _, n in rows], dtype=np.int64) if has_neg else None
    return Pairs(list(index), anchor, positive, negative)


def read_pairs(
    path: PathLike,
    text_a: str | None,
    text_b: str | None,
    negative: str | None,
    *,
    objective: str,
    skip_bad_rows: bool = False,
) -> tuple[list[tuple[str, str, str | None]], int]:
    """Rows of a CSV/TSV/JSONL file (or, for simcse, a plain text file: one text per line) as (anchor,
    positive, negative) strings; skipped rows counted (an empty text; malformed rows with skip_bad_rows)."""
    from cramkit.text.tables import guess_text_columns, records, table_format

    path = Path(path)
    if not path.is_file():
        raise CramkitError(f"{path}: no such file; give the pairs as a .csv, .tsv or .jsonl file")
    if objective == "simcse" and path.suffix.lower() not in (".csv", ".tsv", ".tab", ".jsonl", ".ndjson", ".json"):
        from cramkit.text.encoding import open_binary

        with open_binary(str(path)) as raw:
            data = raw.read()
        if b"\0" in data[:8192]:
            raise CramkitError(f"{path} is a binary file, not text; give one sentence or paragraph per line")
        try:
            lines = [line.strip() for line in data.decode("utf-8-sig").splitlines()]
        except UnicodeDecodeError:
            raise CramkitError(f"{path} is not valid UTF-8; convert it, e.g. iconv -f latin1 -t utf-8") from None
        texts = [t for t in lines if t]
        if not texts:
            raise CramkitError(f"{path} holds no text; give one sentence or paragraph per line")
        return [(t, t, None) for t in texts], len(lines) - len(texts)
    fmt = table_format(path, None)
    if text_a is None:
        text_a, guessed_b, _ = guess_text_columns(path)
        text_b = text_b or guessed_b
    out: list[tuple[str, str, str | None]] = []
    skipped = 0
    header: list[str] | None = None
    for lineno, rec, problem in records(path, fmt, None):
        if rec is not None and "__header__" in rec:
            header = rec["__header__"]
            continue
        if rec is None:
            if not skip_bad_rows:
                raise CramkitError(f"{path}, line {lineno}: {problem}; fix the row or pass --skip-bad-rows")
            skipped += 1
            continue
        cols = header or list(rec)
        if not text_a:
            raise CramkitError(
                f"{path}: which column holds the texts? name it with --text-a (and the pair's second with "
                f"--text-b); its columns: {', '.join(map(str, cols))}"
            )
        need = [c for c in (text_a, text_b if objective == "contrastive" else None, negative) if c]
        missing = [c for c in need if c not in rec]
        if missing:
            raise CramkitError(
                f"{path}: no column {', '.join(map(repr, missing))}; its columns: "
                f"{', '.join(map(str, cols))}; name them with --text-a and --text-b (and --negative)"
            )
        if objective == "contrastive" and not text_b:
            raise CramkitError(
                f"{path}: --objective contrastive needs pairs: name the second text's column with --text-b "
                f"(its columns: {', '.join(map(str, cols))}), or train on single texts with --objective simcse"
            )
        a = str(rec[text_a] or "").strip()
        b = str(rec[text_b] or "").strip() if objective == "contrastive" and text_b else a
        n = str(rec[negative] or "").strip() if negative else None
        if not a or not b or (negative and not n):
            skipped += 1
            continue
        out.append((a, b, n))
    if not out:
        raise CramkitError(f"{path} holds no usable pair (every row has an empty text); check --text-a/--text-b")
    return out, skipped


def task_pairs(task: Any, split: str) -> list[tuple[str, str, str | None]]:
    """A registered pair task's positive pairs (MRPC's paraphrases, an NLI task's entailments)."""
    rows = task.examples(split)
    if task.kind != "classification" or task.labels is None or not any(r.text_b for r in rows):
        raise CramkitError(
            f"task {task.name} has no pairs with a positive label; --objective contrastive takes a pair "
            "classification task (glue/mrpc) or your pairs (--train FILE --text-a COL --text-b COL)"
        )
    positive = [i for i, name in enumerate(task.labels) if str(name).lower() in POSITIVE_LABELS]
    if not positive:
        raise CramkitError(
            f"task {task.name}: none of its labels ({', '.join(task.labels)}) means 'a positive pair'; give your "
            "pairs with --train FILE --text-a COL --text-b COL"
        )
    return [(r.text_a, r.text_b, None) for r in rows if r.text_b and r.label is not None and int(r.label) in positive]


def training_rows(
    cfg: ContrastiveConfig,
    *,
    train: PathLike | None = None,
    dev: PathLike | None = None,
    task: Any = None,
    text_a: str | None = None,
    text_b: str | None = None,
    negative: str | None = None,
    skip_bad_rows: bool = False,
) -> tuple[list[tuple[str, str, str | None]], list[tuple[str, str, str | None]] | None, int]:
    """(training rows, held-out rows or None, rows skipped) from a file (``train``, optional ``dev``) or a
    registered pair ``task`` (its positive pairs; simcse: each of their texts once): the one reading of the
    command line and of ``cramkit.train_embeddings``."""
    if negative and cfg.objective == "simcse":
        raise CramkitError("--negative applies to --objective contrastive (pairs); simcse takes single texts")
    if train is not None:
        rows, skipped = read_pairs(
            train, text_a, text_b, negative, objective=cfg.objective, skip_bad_rows=skip_bad_rows
        )
        dev_rows = None
        if dev is not None:
            dev_rows, _ = read_pairs(
                dev, text_a, text_b, negative, objective=cfg.objective, skip_bad_rows=skip_bad_rows
            )
        return rows, dev_rows, skipped
    if task is not None:
        rows = task_pairs(task, task.train_split)
        if cfg.objective == "simcse":
            return [(t, t, None) for t in dict.fromkeys(x for a, b, _ in rows for x in (a, b))], None, 0
        return rows, task_pairs(task, task.dev_splits[0]) if task.dev_splits else None, 0
    raise CramkitError(f"--objective {cfg.objective} needs --train FILE (or --task with pairs, e.g. glue/mrpc)")


# ------------------------------------------------------------------------------------------ the objective


def info_nce(
    anchors: Any,
    candidates: Any,
    scale: Any,
    *,
    same: Any | None = None,
    symmetric: bool = False,
    dims: Sequence[int] = (),
    offset: int = 0,
    all_anchors: Any | None = None,
) -> Any:
    """In-batch negatives: anchors [B, d] against candidates [B + N, d] (the B positives first, then any hard
    negatives); row i's target is column i. ``same`` [B, B + N] bool: candidates that are the same text as
    row i's positive (other than column i itself) are masked out. ``symmetric``: the positives also pick
    their anchors among the batch's anchors. ``dims``: the loss is the mean over the full vectors and each
    leading-dimension cut (renormalised).

    Gathered across processes: ``candidates`` are every process's positives then every process's negatives,
    ``anchors`` this process's rows, whose own positives start at column ``offset``; ``same`` is the whole
    batch's mask [all anchors, candidates]; ``all_anchors`` every process's anchors (what the positives pick
    from when ``symmetric``)."""
    import torch
    import torch.nn.functional as F

    batch = anchors.shape[0]
    target = torch.arange(offset, offset + batch, device=anchors.device)
    every = anchors if all_anchors is None else all_anchors
    losses = []
    for d in (None, *dims):
        a = F.normalize(anchors[:, :d] if d else anchors, dim=-1)
        c = F.normalize(candidates[:, :d] if d else candidates, dim=-1)
        scores = (a @ c.T) * scale
        if same is not None:
            scores = scores.masked_fill(same[offset : offset + batch], float("-inf"))
        loss = F.cross_entropy(scores, target)
        if symmetric:
            e = F.normalize(every[:, :d] if d else every, dim=-1)
            back = (c[offset : offset + batch] @ e.T) * scale
            if same is not None:
                back = back.masked_fill(same[:, offset : offset + batch].T, float("-inf"))
            loss = (loss + F.cross_entropy(back, target)) / 2
        losses.append(loss)
    return torch.stack(losses).mean()


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
        return PairBatches(self, rank, world)

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


def gather(local: Any) -> Any:
    """Every process's rows of ``local`` [n, d] in rank order [world * n, d]; the gradient of this process's
    slice comes back to it in the backward pass (the other processes' slices send theirs to them), so the
    loss over the gathered rows trains every process's encoder as one process with the whole batch."""
    import torch
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(local.contiguous()))


def _pad(seqs: Sequence[np.ndarray], pad_id: int) -> tuple[Any, Any]:
    import torch

    width = max(len(s) for s in seqs)
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


def collate_pairs(
    pairs: Pairs,
    rows: np.ndarray,
    encoded: list[np.ndarray],
    pad_id: int,
    *,
    whole: np.ndarray | None = None,
) -> dict[str, Any]:
    """A batch of pairs: ids and masks of anchors (a), positives (p), negatives (n), and ``same``: which
    candidates are the same text as a row's positive (masked out of its negatives). ``whole``: the global
    batch ``rows`` is one process's share of (gathered negatives): ``same`` is then the whole batch's."""
    import torch

    sub = pairs.take(rows)
    batch: dict[str, Any] = {"count": len(rows)}
    for name, col in (("a", sub.anchor), ("p", sub.positive), ("n", sub.negative)):
        if col is not None:
            batch[f"{name}_ids"], batch[f"{name}_mask"] = _pad([encoded[i] for i in col], pad_id)
    batch["same"] = torch.from_numpy(same_text(pairs.take(whole if whole is not None else rows)))
    return batch


def same_text(sub: Pairs) -> np.ndarray:
    """[rows, candidates] bool: the candidates (positives, then negatives) that are the same text as a row's
    positive or as its anchor, other than the row's own positive."""
    cand = np.concatenate([sub.positive, sub.negative]) if sub.negative is not None else sub.positive
    same = sub.positive[:, None] == cand[None, :]
    same |= sub.anchor[:, None] == cand[None, :]  # a candidate that is the anchor's own text
    np.fill_diagonal(same[:, : len(sub)], False)
    return same


class PairBatches:
    """Endless batches of ``batch_size`` pairs (this rank's share of each), shuffled per epoch by (seed,
    epoch): a resumed run continues with the very batches it would have seen."""

    def __init__(self, objective: ContrastiveObjective, rank: int, world: int) -> None:
        self.o, self.rank, self.world = objective, rank, world
        self.epoch, self.pos = 0, 0

    def __iter__(self) -> PairBatches:
        return self

    def __next__(self) -> dict[str, Any]:
        n, size = len(self.o.train), min(self.o.cfg.batch_size, len(self.o.train))
        if self.pos + size > n:  # the last short batch is dropped: a batch's negatives are the whole batch
            self.epoch, self.pos = self.epoch + 1, 0
        order = np.random.default_rng([self.o.cfg.seed, self.epoch]).permutation(n)
        rows = order[self.pos : self.pos + size]
        self.pos += size
        share = np.array_split(rows, self.world)[self.rank]
        if self.world == 1 or not self.o.cfg.gather_negatives:
            return collate_pairs(self.o.train, share, self.o.encoded, self.o.loaded.pad_id)
        batch = collate_pairs(self.o.train, share, self.o.encoded, self.o.loaded.pad_id, whole=rows)
        return batch | {"rank": self.rank, "world": self.world}

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])


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
                ids, mask = _pad([encoded[j] for j in col[i : i + 64]], pad_id)
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
    check_out(out, inputs=[source], own=[RESULTS])
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

    from cramkit.load import load_torch
    from cramkit.train.distributed import init_distributed, shutdown
    from cramkit.train.epochs import train_epochs

    loaded = source if isinstance(source, LoadedModel) else load_torch(source, purpose="contrastive training")
    if loaded.encoder is None:
        raise CramkitError(
            f"--from {loaded.source}: a {loaded.architecture} model has no transformer encoder to train to embed"
        )
    if cfg.max_train_examples:
        rows = list(rows)[: cfg.max_train_examples]
    pooling = cfg.pooling
    if pooling == "auto":
        pooling = "mean" if loaded.pooling == "mean" or loaded.extra.get("st_pooling") == "mean" else "first"
    rng = np.random.default_rng([cfg.seed, 7])
    if dev_rows is None and cfg.dev_fraction > 0 and cfg.objective == "contrastive" and len(rows) >= 20:
        order = rng.permutation(len(rows))
        n_dev = min(cfg.max_dev, max(2, int(len(rows) * cfg.dev_fraction)))
        dev_rows = [rows[i] for i in order[:n_dev]]
        rows = [rows[i] for i in order[n_dev:]]
    if len(rows) < 2:
        raise CramkitError(f"the contrastive stage needs at least 2 training pairs, got {len(rows)}")
    rows, dev_rows = with_prompts(rows, cfg), with_prompts(dev_rows, cfg) if dev_rows else dev_rows
    pairs = make_pairs(list(rows) + list(dev_rows or []))
    train = pairs.take(np.arange(len(rows)))
    dev = pairs.take(np.arange(len(rows), len(rows) + len(dev_rows or []))) if dev_rows else None
    from cramkit.data.batching import encode_texts

    max_length = min(cfg.max_length, loaded.max_length)
    encoded = encode_texts(loaded.tokenizer, pairs.texts, None, max_length).ids
    objective = ContrastiveObjective(loaded, cfg, train, dev, encoded, pooling)
    batch = min(cfg.batch_size, len(train))
    steps_per_epoch = max(1, len(train) // batch)
    budget = cfg.budget or f"{max(1, math.ceil(cfg.epochs * steps_per_epoch))}steps"
    from cramkit.runtime import torchrun

    world, main = torchrun().world, torchrun().is_main
    if world > 1 and batch % world:
        raise CramkitError(
            f"batch_size {batch} does not divide over {world} processes; give a multiple of {world} (each process "
            "embeds an equal share of every batch)"
        )
    before = None
    if dev is not None and main:
        before = dev_scores(objective.build_model(), dev, encoded, loaded.pad_id, 1.0 / cfg.temperature)
        if progress:
            print(
                f"cramkit: before training: dev recall@1 {before['dev_recall_at_1']:.1f}, MRR "
                f"{before['dev_mrr']:.1f} ({len(dev):,} held-out pairs)",
                file=sys.stderr,
            )
    from cramkit.train.config import example_config

    lr = float(cfg.lr) if cfg.lr != "auto" else (2e-5 if (loaded.hidden or 0) >= 384 else 1e-3)
    tcfg = example_config(
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
    dims = matryoshka_dims(cfg.matryoshka, loaded.hidden)
    trained = dataclasses.replace(
        loaded,
        model=model.encoder.eval(),
        kind="encoder",
        architecture="encoder",
        pooling="mean" if pooling == "mean" else "cls",
        normalize=True,
        labels=None,
        task=None,
        head=None,
        max_length=max_length,
        pooler_state=None,
        weights_file=None,
        weights_sha256=None,
        extra={
            **{k: v for k, v in loaded.extra.items() if k in ("st_pooling", "tokenizer")},
            "st_pooling": "mean" if pooling == "mean" else "cls",
            "contrastive": {"objective": cfg.objective, "pairs": len(train), "source": loaded.source},
            **({"matryoshka": [loaded.hidden, *dims]} if dims else {}),
            **({"prompts": cfg.prompts()} if cfg.prompts() else {}),
            **({"default_prompt_name": cfg.default_prompt_name} if cfg.default_prompt_name else {}),
        },
    )
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
