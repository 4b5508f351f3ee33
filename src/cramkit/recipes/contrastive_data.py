"""The contrastive stage's data: pairs (an anchor, its positive, optionally a hard negative) read from a file or a
registered pair task, each text stored once, and batched for in-batch negatives (:class:`PairBatches`: whole
batches, each process's share, and which candidates are the same text as a row's positive)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.errors import CramkitError
from cramkit.recipes.contrastive_config import ContrastiveConfig

PathLike = str | os.PathLike

POSITIVE_LABELS = ("1", "paraphrase", "entailment", "true", "yes", "positive")


def with_prompts(
    rows: Sequence[tuple[str, str, str | None]], cfg: ContrastiveConfig
) -> list[tuple[str, str, str | None]]:
    """Rows with the query prompt before each anchor and the passage prompt before each positive and negative."""
    q, p = cfg.query_prompt, cfg.passage_prompt
    if not q and not p:
        return list(rows)
    return [(q + a, p + b, None if n is None else p + n) for a, b, n in rows]


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


def pad_sequences(seqs: Sequence[np.ndarray], pad_id: int) -> tuple[Any, Any]:
    """Token id sequences as [n, longest] ids (``pad_id`` after each) and their attention mask (torch)."""
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
            batch[f"{name}_ids"], batch[f"{name}_mask"] = pad_sequences([encoded[i] for i in col], pad_id)
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
    """Endless batches of ``cfg.batch_size`` pairs of ``train`` (this rank's share of each), shuffled per epoch by
    (seed, epoch): a resumed run continues with the very batches it would have seen."""

    def __init__(
        self, train: Pairs, encoded: list[np.ndarray], pad_id: int, cfg: ContrastiveConfig, rank: int, world: int
    ) -> None:
        self.train, self.encoded, self.pad_id, self.cfg = train, encoded, pad_id, cfg
        self.rank, self.world = rank, world
        self.epoch, self.pos = 0, 0

    def __iter__(self) -> PairBatches:
        return self

    def __next__(self) -> dict[str, Any]:
        n, size = len(self.train), min(self.cfg.batch_size, len(self.train))
        if self.pos + size > n:  # the last short batch is dropped: a batch's negatives are the whole batch
            self.epoch, self.pos = self.epoch + 1, 0
        order = np.random.default_rng([self.cfg.seed, self.epoch]).permutation(n)
        rows = order[self.pos : self.pos + size]
        self.pos += size
        share = np.array_split(rows, self.world)[self.rank]
        if self.world == 1 or not self.cfg.gather_negatives:
            return collate_pairs(self.train, share, self.encoded, self.pad_id)
        batch = collate_pairs(self.train, share, self.encoded, self.pad_id, whole=rows)
        return batch | {"rank": self.rank, "world": self.world}

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
