"""Batches for tasks and inference: [CLS] a [SEP] (b [SEP]) encoding, length bucketing, token budgets.

Pretraining packs sequences (``cramkit.data.mlm``); here every example is its own sequence, so batches
are padded to their longest member only, and examples of similar length are batched together. A
multiple-choice example is its C pair rows ``[CLS] context [SEP] choice_i [SEP]`` (:class:`EncodedChoices`);
batches hold whole examples, and a batch's rows are the real choices only (no padding rows): a
``choice_mask`` [examples, most choices] says where each row's score goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cramkit.text.tokenizer import encode_prefixes, special_id


@dataclass
class Encoded:
    """Tokenised examples: ids per example (with [CLS]/[SEP]), where segment B starts, labels, idx."""

    ids: list[np.ndarray]
    b_start: np.ndarray  # first position of segment B (== length when single sentence)
    lengths: np.ndarray
    labels: np.ndarray | None
    idx: np.ndarray
    truncated: np.ndarray  # bool per example: cut to max_length

    def __len__(self) -> int:
        return len(self.ids)


def truncate_pair(la: int, lb: int, budget: int) -> tuple[int, int]:
    """Longest-first truncation of two segments to at most ``budget`` tokens together."""
    if la + lb <= budget:
        return la, lb
    half = budget // 2
    if la <= half:
        return la, budget - la
    if lb <= half:
        return budget - lb, lb
    return budget - half, half


def encode_texts(
    tokenizer: Any,
    texts_a: Sequence[str],
    texts_b: Sequence[str | None] | None = None,
    max_length: int = 128,
    *,
    labels: np.ndarray | None = None,
    idx: np.ndarray | None = None,
) -> Encoded:
    """``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` per example (RoBERTa's ``<s> a </s></s> b </s>`` where the
    tokenizer's own template joins a pair so), cut longest-first to max_length."""
    cls_id, sep_id = special_id(tokenizer, "cls"), special_id(tokenizer, "sep")
    joint = [sep_id] * pair_separators(tokenizer)
    # each text tokenised only as far as the model reads it (a 49 MB line is not tokenised whole)
    enc_a = encode_prefixes(tokenizer, [t or "" for t in texts_a], max_length, add_special_tokens=False)
    pair_pos = [i for i, t in enumerate(texts_b or []) if t is not None]
    enc_b = {}
    if pair_pos:
        got = encode_prefixes(
            tokenizer, [t for t in texts_b or [] if t is not None], max_length, add_special_tokens=False
        )
        enc_b = dict(zip(pair_pos, got, strict=True))
    ids, b_start = [], np.empty(len(enc_a), dtype=np.int64)
    truncated = np.zeros(len(enc_a), dtype=bool)
    for i, ea in enumerate(enc_a):
        a = ea.ids
        if i in enc_b:
            b = enc_b[i].ids
            na, nb = truncate_pair(len(a), len(b), max_length - 2 - len(joint))
            seq = [cls_id, *a[:na], *joint, *b[:nb], sep_id]
            b_start[i] = na + 1 + len(joint)
            truncated[i] = na < len(a) or nb < len(b)
        else:
            seq = [cls_id, *a[: max_length - 2], sep_id]
            b_start[i] = len(seq)
            truncated[i] = len(a) > max_length - 2
        ids.append(np.asarray(seq, dtype=np.int64))
    return Encoded(
        ids=ids,
        b_start=b_start,
        lengths=np.asarray([len(s) for s in ids], dtype=np.int64),
        labels=labels,
        idx=idx if idx is not None else np.arange(len(ids), dtype=np.int64),
        truncated=truncated,
    )


def pair_separators(tokenizer: Any) -> int:
    """How many separators stand between a pair's two texts: RoBERTa's template (``</s></s>``) two, BERT's one."""
    processor = getattr(tokenizer, "post_processor", None)
    try:
        added = processor.num_special_tokens_to_add(True) if processor is not None else 3
    except Exception:  # a processor without the count: BERT's layout
        added = 3
    return 2 if added == 4 else 1


def encode_examples(tokenizer: Any, examples: Sequence[Any], max_length: int, *, regression: bool = False) -> Encoded:
    """:func:`encode_texts` over task examples (``text_a``, ``text_b``, ``label``, ``idx``)."""
    labels = None
    if examples and all(e.label is not None for e in examples):
        labels = np.asarray([e.label for e in examples], dtype=np.float32 if regression else np.int64)
    return encode_texts(
        tokenizer,
        [e.text_a or "" for e in examples],
        [e.text_b for e in examples],
        max_length,
        labels=labels,
        idx=np.asarray([e.idx for e in examples], dtype=np.int64),
    )


@dataclass
class EncodedChoices:
    """Multiple-choice examples: example i's choices are the pair rows ``pairs[offsets[i]:offsets[i + 1]]``
    (context, choice_j) in choice order; labels (the right choice's index) and idx are per example."""

    pairs: Encoded
    offsets: np.ndarray  # [n + 1] int64
    labels: np.ndarray | None
    idx: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_choices(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def lengths(self) -> np.ndarray:
        """Per example, its longest row (what its rows are padded to): the length that buckets it."""
        if not len(self):
            return np.zeros(0, dtype=np.int64)
        return np.maximum.reduceat(self.pairs.lengths, self.offsets[:-1])

    @property
    def truncated(self) -> np.ndarray:
        """Per example: any of its rows cut to max_length."""
        if not len(self):
            return np.zeros(0, dtype=bool)
        return np.logical_or.reduceat(self.pairs.truncated, self.offsets[:-1])

    def rows(self, batch: np.ndarray) -> np.ndarray:
        """The pair rows of the examples ``batch``, example after example."""
        return np.concatenate([np.arange(self.offsets[i], self.offsets[i + 1]) for i in batch])

    def choice_mask(self, batch: np.ndarray) -> np.ndarray:
        """[len(batch), most choices] bool: True where an example has a choice (its rows, in order)."""
        n = self.num_choices[batch]
        return np.arange(int(n.max()))[None, :] < n[:, None]


def encode_choices(
    tokenizer: Any,
    contexts: Sequence[str],
    choices: Sequence[Sequence[str]],
    max_length: int,
    *,
    labels: np.ndarray | None = None,
    idx: np.ndarray | None = None,
) -> EncodedChoices:
    """Each context paired with each of its choices (:func:`encode_texts` on the pairs)."""
    counts = np.asarray([len(c) for c in choices], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    pairs = encode_texts(
        tokenizer,
        [a or "" for a, cs in zip(contexts, choices, strict=True) for _ in cs],
        [c for cs in choices for c in cs],
        max_length,
    )
    return EncodedChoices(pairs, offsets, labels, idx if idx is not None else np.arange(len(counts), dtype=np.int64))


def encode_choice_examples(tokenizer: Any, examples: Sequence[Any], max_length: int) -> EncodedChoices:
    """:func:`encode_choices` over multiple-choice task examples (``text_a``, ``choices``, ``label``, ``idx``)."""
    labels = None
    if examples and all(e.label is not None for e in examples):
        labels = np.asarray([e.label for e in examples], dtype=np.int64)
    return encode_choices(
        tokenizer,
        [e.text_a or "" for e in examples],
        [e.choices or () for e in examples],
        max_length,
        labels=labels,
        idx=np.asarray([e.idx for e in examples], dtype=np.int64),
    )


def scores_to_choices(scores: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Pair scores [rows] (or [rows, 1]) -> [examples, most choices], -inf where an example has no choice."""
    scores = np.asarray(scores, dtype=np.float32).reshape(-1)
    counts = np.diff(offsets)
    out = np.full((len(counts), int(counts.max()) if len(counts) else 0), -np.inf, dtype=np.float32)
    out[np.arange(out.shape[1])[None, :] < counts[:, None]] = scores
    return out


def choice_probabilities(grid: np.ndarray) -> np.ndarray:
    """Softmax over each example's choices (the -inf padding gets 0)."""
    if grid.size == 0:
        return grid.copy()
    z = np.exp(grid - grid.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def bucketed_batches(lengths: np.ndarray, batch_size: int, chunk: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch of batches: shuffle, sort by length within chunks of ``chunk`` batches, shuffle batches.

    Examples of similar length land in the same batch (little padding) while the order stays random.
    chunk=0 turns bucketing off (plain shuffled batches).
    """
    order = rng.permutation(len(lengths))
    if chunk > 0:
        span = batch_size * chunk
        parts = []
        for s in range(0, len(order), span):
            part = order[s : s + span]
            parts.append(part[np.argsort(lengths[part], kind="stable")])
        order = np.concatenate(parts) if parts else order
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    if chunk > 0:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def token_budget_batches(lengths: np.ndarray, max_tokens: int, max_rows: int = 1024) -> list[np.ndarray]:
    """Length-sorted batches whose padded size (rows x longest) stays within ``max_tokens``.

    Inference batches: a count cap alone lets one batch of long inputs take all memory; a token cap keeps
    every batch's memory the same whatever the lengths. A single input longer than the budget is a batch
    of its own.
    """
    order = np.argsort(lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    n = len(order)
    while start < n:
        end = start + 1
        while end < n and end - start < max_rows and (end - start + 1) * int(lengths[order[end]]) <= max_tokens:
            end += 1
        batches.append(order[start:end])
        start = end
    return batches


def collate(enc: Encoded | EncodedChoices, batch: np.ndarray, pad_id: int, with_types: bool) -> dict[str, Any]:
    """Pad a batch to its longest member: input_ids, attention_mask (None if nothing is padded), types.
    Multiple choice: the batch's examples' pair rows, and ``choice_mask`` (:meth:`EncodedChoices.choice_mask`)."""
    import torch

    if isinstance(enc, EncodedChoices):
        out = collate(enc.pairs, enc.rows(batch), pad_id, with_types)
        out["choice_mask"] = torch.from_numpy(enc.choice_mask(batch))
        return out
    lengths = enc.lengths[batch]
    width = int(lengths.max())
    ids = np.full((len(batch), width), pad_id, dtype=np.int64)
    for row, i in enumerate(batch):
        ids[row, : lengths[row]] = enc.ids[i]
    out = {"input_ids": torch.from_numpy(ids), "attention_mask": None, "token_type_ids": None}
    if (lengths != width).any():
        out["attention_mask"] = torch.from_numpy(np.arange(width)[None, :] < lengths[:, None])
    if with_types:
        positions = np.arange(width)[None, :]
        types = (positions >= enc.b_start[batch][:, None]) & (positions < lengths[:, None])
        out["token_type_ids"] = torch.from_numpy(types.astype(np.int64))
    return out


class BatchLoader:
    """Micro-batches of one process, endlessly, epoch after epoch; resumable from its state_dict.
    Its unit is the example (a multiple-choice example's rows stay together).

    One epoch is ``enc`` in length-bucketed batches of ``batch_size`` (``bucketed_batches`` with ``chunk``)
    in an order that is a function of (seed, epoch), so a resumed run continues with the very batches it
    would have seen. Every batch is split evenly over the ``world`` processes, then into the same number of
    micro-batches of at most ``micro`` (the engine's) on each. A micro-batch is the collated inputs, ``count`` (its
    examples) and each of ``columns`` (per-example tensors: labels, targets) at its examples."""

    def __init__(
        self,
        enc: Encoded | EncodedChoices,
        batch_size: int,
        micro: int,
        rank: int,
        world: int,
        *,
        seed: int,
        chunk: int,
        pad_id: int,
        with_types: bool,
        columns: dict[str, Any],
    ) -> None:
        self.enc, self.batch_size, self.rank, self.world = enc, batch_size, rank, world
        self.seed, self.chunk, self.columns = seed, chunk, columns
        self.pad_id, self.with_types = pad_id, with_types
        # the engine gives each process micro-batches that split its share evenly
        # (``train.schedule.split_batch``): the share's number of micro-batches follows
        self.accum = -(-(batch_size // world) // micro)
        self.epoch, self.index, self.part = 0, 0, 0
        self._batches: list[np.ndarray] | None = None

    def _epoch_batches(self) -> list[np.ndarray]:
        if self._batches is None:
            rng = np.random.default_rng([self.seed, self.epoch])
            self._batches = bucketed_batches(self.enc.lengths, self.batch_size, self.chunk, rng)
        return self._batches

    def __iter__(self) -> BatchLoader:
        return self

    def __next__(self) -> dict:
        batches = self._epoch_batches()
        batch = batches[self.index]
        share = np.array_split(batch, self.world)[self.rank]
        part = np.array_split(share, self.accum)[self.part]
        count = len(part)
        if count == 0:  # an uneven last batch: a stand-in row whose loss is weighted by 0
            part = share[:1] if len(share) else batch[:1]
        out = dict(collate(self.enc, part, self.pad_id, self.with_types))
        out.update({name: column[part] for name, column in self.columns.items()})
        out["count"] = count
        self.part += 1
        if self.part == self.accum:
            self.part, self.index = 0, self.index + 1
            if self.index == len(batches):
                self.epoch, self.index, self._batches = self.epoch + 1, 0, None
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "part": self.part}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index, self.part = int(state["epoch"]), int(state["index"]), int(state["part"])
        self._batches = None
