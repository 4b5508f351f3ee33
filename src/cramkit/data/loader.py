"""Packed, masked MLM batches from a token store: seeded, sharded by rank, resumable.

Order: each epoch visits the packed training sequences in a seeded pseudo-random permutation (a
Feistel network over the sequence indices with cycle-walking: O(1) memory, computed per batch).
Each step consumes ``micro_batch * world`` sequences of that order; rank r takes the r-th slice of
``micro_batch``. The loader's state (epoch, position) is global, so a run resumed with the same or a
different world size sees exactly the sequences it would have seen, masked the same way.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import numpy as np

from cramkit.data.mlm import DataConfig, PackedSequences, mask_tokens, splitmix64
from cramkit.data.stage import cached_index, open_store
from cramkit.data.tokenstore import TokenStore
from cramkit.errors import CramkitError
from cramkit.text.tokenizer import SpecialIds
from cramkit.text.words import WordBoundaries

_SPLIT_SALT = 0xC0FFEE5EED  # the validation split does not depend on the training seed
_VAL_SALT = 0x7A11DA7E
_MUL, _MUL2, _S32 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(32)


@functools.lru_cache(maxsize=8)
def _round_keys(seed: int, epoch: int, rounds: int = 4) -> tuple[np.uint64, ...]:
    base = np.array([(seed * 1_000_003 + epoch) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    return tuple(splitmix64(splitmix64(base) + np.arange(1, rounds + 1, dtype=np.uint64)))


def permute(i: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """The seeded permutation of range(n) for ``epoch``, evaluated at positions ``i`` (vectorised).

    An unbalanced 4-round Feistel network on ceil(log2 n) bits, cycle-walking back into [0, n).
    """
    i = np.asarray(i, dtype=np.uint64)
    if n <= 1:
        return i.astype(np.int64)
    bits = max(2, math.ceil(math.log2(n)))
    widths = (bits - bits // 2, bits // 2)  # of the left and right halves
    keys = _round_keys(seed, epoch)

    def feistel(x: np.ndarray) -> np.ndarray:
        wl, wr = widths
        left, right = x >> np.uint64(wr), x & np.uint64((1 << wr) - 1)
        for k in keys:  # round function: top wl bits of a multiply-xorshift-multiply of (right ^ key)
            t = (right ^ k) * _MUL
            t ^= t >> _S32
            t *= _MUL2
            left, right = right, left ^ (t >> np.uint64(64 - wl))
            wl, wr = wr, wl
        return (left << np.uint64(wr)) | right

    y = feistel(i)
    out_of_range = y >= np.uint64(n)
    while out_of_range.any():  # cycle-walking: the domain is < 2n, so a few rounds at most
        y[out_of_range] = feistel(y[out_of_range])
        out_of_range = y >= np.uint64(n)
    return y.astype(np.int64)


class EpochOrder:
    """``permute`` evaluated a chunk of positions at a time and cached (constant memory, low overhead)."""

    CHUNK = 8192

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def _chunk(self, epoch: int, c: int) -> np.ndarray:
        arr = self._cache.get((epoch, c))
        if arr is None:
            lo = c * self.CHUNK
            arr = permute(np.arange(lo, min(lo + self.CHUNK, self.n)), self.n, self.seed, epoch)
            if len(self._cache) >= 4:
                self._cache.pop(next(iter(self._cache)))
            self._cache[(epoch, c)] = arr
        return arr

    def __call__(self, epoch: int, i: np.ndarray) -> np.ndarray:
        c = i // self.CHUNK
        if c[0] == c[-1] and (len(c) < 3 or c.min() == c.max()):
            return self._chunk(epoch, int(c[0]))[i - c[0] * self.CHUNK]
        out = np.empty(len(i), dtype=np.int64)
        for ck in np.unique(c):
            sel = c == ck
            out[sel] = self._chunk(epoch, int(ck))[i[sel] - ck * self.CHUNK]
        return out


def document_spans(store: TokenStore) -> tuple[np.ndarray, np.ndarray]:
    """(token start, token length) of each document of the store (documents may span sequences)."""
    sizes = np.asarray(store.sizes, dtype=np.int64)
    csum = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=csum[1:])
    doc_idx = np.asarray(store.doc_idx, dtype=np.int64)
    if len(doc_idx) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    start = csum[doc_idx[:-1]]
    return start, csum[doc_idx[1:]] - start


class PretrainData:
    """A token store as packed train/validation sequences (validation split by document, before packing)."""

    def __init__(
        self,
        store: TokenStore,
        cfg: DataConfig,
        special: SpecialIds,
        vocab_size: int,
        words: WordBoundaries | None = None,
    ):
        self.cfg = cfg.validate()
        store = open_store(
            store, stage_to=cfg.stage, stage_dir=cfg.stage_dir, max_size=cfg.stage_max_size, mmap=cfg.mmap
        )
        self.store = store
        self.special = special
        self.vocab_size = int(vocab_size)
        store.check_ids(self.vocab_size)
        self.words = words if cfg.masking == "whole_word" else None
        if cfg.masking == "whole_word":
            if words is None:
                raise CramkitError("data.masking=whole_word needs the tokenizer's word boundaries")
            if words.needs_segmenter(np.asarray(store.tokens[: 1 << 20])):  # Chinese text: jieba, now
                words.require_segmenter()
        split = cached_index(store, _split_key(cfg), lambda: _split_documents(store, cfg))
        start, length, is_val = split["start"], split["length"], split["is_val"]
        n_docs, n_val = len(length), int(is_val.sum())
        cls = special.cls if cfg.add_cls else None
        tokens = np.asarray(store.tokens) if isinstance(store.tokens, np.ndarray) else store.tokens
        check = store.check_intact
        self.train = PackedSequences(tokens, start[~is_val], length[~is_val], cfg.seq_len, special.sep, cls, check)
        self.val = PackedSequences(tokens, start[is_val], length[is_val], cfg.seq_len, special.sep, cls, check)
        self.num_train_documents, self.num_val_documents = int(n_docs - n_val), int(n_val)
        if self.train.num_sequences == 0:
            raise CramkitError(
                f"token store {store.prefix} holds {self.train.num_tokens} training tokens, fewer than one "
                f"sequence of {cfg.seq_len}; add text or lower data.seq_len"
            )

    @property
    def num_train_sequences(self) -> int:
        return self.train.num_sequences

    @property
    def num_val_sequences(self) -> int:
        return self.val.num_sequences

    @property
    def tokens_per_sequence(self) -> int:
        return self.cfg.seq_len

    def masked(self, packed: PackedSequences, seq_ids: np.ndarray, seed: int, offsets: np.ndarray) -> dict:
        import torch

        ids, segments = packed.gather_with_segments(seq_ids)
        inp, labels = mask_tokens(
            ids,
            seed=seed,
            offsets=offsets,
            cfg=self.cfg,
            special=self.special,
            vocab_size=self.vocab_size,
            word_start=self.words.starts(ids) if self.words is not None else None,
        )
        batch = {"input_ids": torch.from_numpy(inp), "labels": torch.from_numpy(labels)}
        if self.cfg.doc_mask:
            batch["segments"] = torch.from_numpy(segments)
        return batch

    def train_loader(self, micro_batch: int, *, rank: int = 0, world: int = 1) -> MLMLoader:
        return MLMLoader(self, micro_batch, rank=rank, world=world)

    def val_batches(
        self, micro_batch: int, max_batches: int | None = None, *, rank: int = 0, world: int = 1
    ) -> Iterator[dict]:
        """Validation batches, masked the same way on every call.

        The validation sequences in order, micro_batch*world per global batch, rank r the r-th slice.
        With world > 1 the last partial global batch is split evenly (dropped if a rank would get none),
        so every rank yields the same number of batches.
        """
        _check_shard(micro_batch, rank, world)
        n = self.val.num_sequences
        step = micro_batch * world
        seed = (self.cfg.seed ^ _VAL_SALT) & 0x7FFFFFFFFFFFFFFF
        b, start = 0, 0
        while start < n and (max_batches is None or b < max_batches):
            if start + step <= n:
                lo = start + rank * micro_batch
                ids = np.arange(lo, lo + micro_batch)
            else:
                parts = np.array_split(np.arange(start, n), world)
                if any(len(p) == 0 for p in parts):
                    return
                ids = parts[rank]
            yield self.masked(self.val, ids, seed, ids)
            b, start = b + 1, start + step


def _split_key(cfg: DataConfig) -> dict:
    """The settings the document split depends on."""
    return {f: getattr(cfg, f) for f in ("validation_fraction", "min_validation_docs", "seq_len", "add_cls")}


def _split_documents(store: TokenStore, cfg: DataConfig) -> dict[str, np.ndarray]:
    """The non-empty documents' token starts and lengths, and which are held out for validation."""
    start, length = document_spans(store)
    keep = length > 0
    start, length = start[keep], length[keep]
    n_docs = len(length)
    n_val = 0
    if cfg.validation_fraction > 0:
        n_val = max(cfg.min_validation_docs, round(cfg.validation_fraction * n_docs))
    if n_docs == 0 or n_val >= n_docs:
        raise CramkitError(
            f"token store {store.prefix} has {n_docs} non-empty documents, too few for a validation "
            f"split of {n_val}; add text or set data.validation_fraction=0"
        )
    is_val = np.zeros(n_docs, dtype=bool)
    if n_val:
        score = splitmix64(np.arange(n_docs, dtype=np.uint64) ^ np.uint64(_SPLIT_SALT))
        is_val[np.argpartition(score, n_val - 1)[:n_val]] = True
        content = cfg.seq_len - int(cfg.add_cls)
        if int((length[is_val] + 1).sum()) < content:
            # too short for one packed sequence (no validation loss at all): take more documents, in
            # the same order, up to a tenth of the corpus
            _enlarge_validation(is_val, score, length, content, max(n_val, n_docs // 10))
    return {"start": start, "length": length, "is_val": is_val}


def _enlarge_validation(is_val: np.ndarray, score: np.ndarray, length: np.ndarray, content: int, cap: int) -> None:
    """Mark validation documents in ``score`` order until they fill one sequence (or ``cap`` is reached)."""
    order = np.argsort(score, kind="stable")[:cap]
    need = np.searchsorted(np.cumsum(length[order] + 1), content) + 1  # documents to fill one sequence
    n_val = int(min(need, cap))
    is_val[:] = False
    is_val[order[:n_val]] = True
    if _is_main():
        filled = int((length[is_val] + 1).sum()) >= content
        print(
            f"cramkit: note: the validation split was enlarged to {n_val} documents to fill one sequence of "
            f"{content} tokens"
            if filled
            else f"cramkit: note: the corpus is too small for a validation split of one {content}-token sequence "
            "(within a tenth of the documents): no validation loss will be reported; add text, lower "
            "data.seq_len, or set data.validation_fraction=0"
        )


def _is_main() -> bool:
    from cramkit.runtime import torchrun

    return torchrun().is_main


def _check_shard(micro_batch: int, rank: int, world: int) -> None:
    if not isinstance(micro_batch, (int, np.integer)) or micro_batch < 1:
        raise CramkitError(f"micro batch size {micro_batch!r} must be a positive integer")
    if not (isinstance(world, (int, np.integer)) and world >= 1 and 0 <= rank < world):
        raise CramkitError(f"rank {rank} / world size {world}: need 0 <= rank < world")


class MLMLoader:
    """An endless iterator of this rank's micro-batches: dict(input_ids, labels), LongTensor [B, L]."""

    def __init__(self, data: PretrainData, micro_batch: int, *, rank: int = 0, world: int = 1):
        _check_shard(micro_batch, rank, world)
        self.data = data
        self.micro_batch, self.rank, self.world = int(micro_batch), int(rank), int(world)
        self.seed = data.cfg.seed
        self.num_sequences = data.train.num_sequences
        if self.micro_batch * self.world > self.num_sequences:
            raise CramkitError(
                f"the training split has {self.num_sequences} sequences of {data.cfg.seq_len} tokens, fewer "
                f"than one global batch ({self.micro_batch} x {self.world} ranks); use more text or a smaller batch"
            )
        self.epoch = 0
        self.position = 0  # global sequences consumed in this epoch
        self._order = EpochOrder(self.num_sequences, self.seed)

    def __iter__(self) -> MLMLoader:
        return self

    def next_indices(self) -> tuple[np.ndarray, np.ndarray]:
        """Advance one step; (sequence ids, global sample indices) of this rank's micro-batch."""
        step = self.micro_batch * self.world
        if self.position + step > self.num_sequences:  # drop the epoch's tail, reshuffle
            self.epoch += 1
            self.position = 0
        i = self.position + self.rank * self.micro_batch + np.arange(self.micro_batch, dtype=np.int64)
        self.position += step
        return self._order(self.epoch, i), self.epoch * self.num_sequences + i

    def __next__(self) -> dict:
        seq, sample = self.next_indices()
        return self.data.masked(self.data.train, seq, self.seed, sample)

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_sequences": self.num_sequences,
        }

    def load_state_dict(self, state: dict) -> None:
        try:
            epoch, position = int(state["epoch"]), int(state["position"])
        except (KeyError, TypeError, ValueError):
            raise CramkitError(
                f"loader state {state!r} lacks epoch/position; is it from a cramkit checkpoint?"
            ) from None
        if int(state.get("seed", self.seed)) != self.seed:
            raise CramkitError(
                f"the checkpoint's data seed {state['seed']} differs from this run's {self.seed}; "
                "resume with the same data.seed"
            )
        n = state.get("num_sequences")
        if n is not None and int(n) != self.num_sequences:
            raise CramkitError(
                f"the checkpoint was taken on {n} training sequences, this data has {self.num_sequences}; resume "
                "with the same token store and data settings (seq_len, add_cls, validation_fraction)"
            )
        if epoch < 0 or not 0 <= position <= self.num_sequences:
            raise CramkitError(f"loader state epoch={epoch} position={position} is out of range for this data")
        self.epoch, self.position = epoch, position
