"""Packing documents into fixed-length sequences, and masked-language-model masking.

Both are vectorised numpy. Masking is counter-based: the random numbers for a token are a splitmix64
hash of (seed, global sample index, position), so a sample is masked the same way whatever the batch
size, the number of ranks, or where a run was resumed. Whole-word masking (``masking=whole_word``)
takes the "predicted" draw of a word's first token for all of its tokens, so a word is predicted whole
or not at all; how each chosen token is corrupted (80/10/10) stays a per-token draw, as in BERT's wwm.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from cramkit.errors import CramkitError
from cramkit.text.tokenizer import SpecialIds

_G = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32)
_U32 = float(1 << 32)


@dataclass
class DataConfig:
    """How the token store becomes training batches."""

    seq_len: int = 128
    mask_rate: float = 0.25  # fraction of (non-special) tokens predicted
    mask_token_frac: float = 0.8  # of those: replaced by [MASK]
    random_token_frac: float = 0.1  # of those: replaced by a random token (the rest stay unchanged)
    add_cls: bool = False  # put [CLS] first in each packed sequence (Cramming: no)
    # wordpiece: each token is chosen on its own; whole_word: all pieces of a word together (words from
    # WordPiece's "##" continuations; Chinese words from jieba, as Chinese-BERT-wwm)
    masking: Literal["wordpiece", "whole_word"] = "wordpiece"
    validation_fraction: float = 0.01  # of documents, chosen deterministically, before packing
    min_validation_docs: int = 1
    seed: int = 0
    # on a shared file system (Lustre, Ceph, NFS): local copies the store once per node to stage_dir
    # (checksummed, reused by later runs) and trains on the copy; none reads it where it lies
    stage: Literal["none", "local"] = "none"
    stage_dir: str = ""  # node-local cache; "" is $CRAMKIT_STAGE_DIR, else ~/.cache/cramkit/stage
    stage_max_size: str = ""  # e.g. 500GB: older staged stores are removed beyond it ("" = the disk's room)
    mmap: bool = True  # false: read the store with pread into buffers instead of memory-map page faults
    # attention stays inside each document of a packed sequence (a block-diagonal mask; NeoBERT's ablation:
    # packing without it lowered GLUE); off: every token sees the whole sequence (Cramming)
    doc_mask: bool = False

    def validate(self) -> DataConfig:
        def bad(field: str, why: str) -> CramkitError:
            return CramkitError(f"data.{field} = {getattr(self, field)!r}: {why}")

        if not isinstance(self.seq_len, int) or self.seq_len < 2 + int(self.add_cls):
            raise bad("seq_len", "must be an integer of at least 2 (128 is usual)")
        if not 0.0 < self.mask_rate < 1.0:
            raise bad("mask_rate", "must be between 0 and 1 (0.15 BERT, 0.25 Cramming)")
        for f in ("mask_token_frac", "random_token_frac"):
            if not 0.0 <= getattr(self, f) <= 1.0:
                raise bad(f, "must be between 0 and 1")
        if self.mask_token_frac + self.random_token_frac > 1.0 + 1e-9:
            raise bad("random_token_frac", f"plus mask_token_frac ({self.mask_token_frac}) must be at most 1")
        if self.masking not in ("wordpiece", "whole_word"):
            raise bad("masking", "must be wordpiece or whole_word")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise bad("validation_fraction", "must be in [0, 1) (0.01 is usual; 0 means no validation split)")
        if not isinstance(self.min_validation_docs, int) or self.min_validation_docs < 0:
            raise bad("min_validation_docs", "must be a non-negative integer")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise bad("seed", "must be a non-negative integer")
        if self.stage not in ("none", "local"):
            raise bad("stage", "must be none (read the store where it lies) or local (copy it to data.stage_dir)")
        if self.stage_max_size:
            from cramkit.data.stage import parse_size

            parse_size(self.stage_max_size, "data.stage_max_size")
        return self


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on a uint64 array (wrapping arithmetic): a fast, well-mixed hash."""
    z = np.asarray(x, dtype=np.uint64) + _G  # array arithmetic wraps silently
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def row_keys(seed: int, offsets: np.ndarray) -> np.ndarray:
    """One 64-bit key per sample from (seed, global sample index)."""
    s = splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    return splitmix64(s ^ np.asarray(offsets, dtype=np.uint64))


@functools.lru_cache(maxsize=16)
def _tables(special: SpecialIds, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    size = max(vocab_size, max(special.all()) + 1)
    not_special = np.ones(size, dtype=bool)
    not_special[list(special.all())] = False
    candidates = np.flatnonzero(not_special[:vocab_size]).astype(np.int64)
    if len(candidates) == 0:
        raise CramkitError(f"vocab_size {vocab_size} leaves no ordinary tokens for random replacement")
    return not_special, candidates


def mask_tokens(
    input_ids: np.ndarray,
    *,
    seed: int,
    offsets: np.ndarray,
    cfg: DataConfig,
    special: SpecialIds,
    vocab_size: int,
    word_start: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mask a [B, L] batch -> (masked input int64, labels int64 with -100 where nothing is predicted).

    offsets[b] is row b's global sample index. Each non-special token is chosen with probability
    cfg.mask_rate; a chosen token becomes [MASK] (mask_token_frac), a random non-special token
    (random_token_frac) or stays; special tokens are never chosen. With ``word_start`` ([B, L] bool, True
    where a word begins), a token is chosen when its word's first token is: whole words are predicted,
    and the expected share of predicted tokens is still mask_rate.
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {ids.shape}")
    B, L = ids.shape
    not_special, candidates = _tables(special, vocab_size)
    keys = row_keys(seed, offsets).reshape(B, 1)
    h = splitmix64(keys + _positions(L))
    hi = (h >> _S32).astype(np.uint32)  # decides "predicted"
    if word_start is not None:  # every token takes the draw of its word's first token
        first = np.where(np.asarray(word_start, dtype=bool), np.arange(L), 0)
        np.maximum.accumulate(first, axis=1, out=first)
        hi = np.take_along_axis(hi, first, axis=1)
    lo = h.astype(np.uint32)  # decides how the input is corrupted
    chosen = hi < np.uint32(min(cfg.mask_rate * _U32, _U32 - 1))
    chosen &= not_special.take(ids, mode="clip")
    out = ids.astype(np.int64)
    labels = np.where(chosen, out, np.int64(-100))
    t_mask = np.uint32(min(round(cfg.mask_token_frac * _U32), _U32 - 1))
    t_rand = np.uint32(min(round((cfg.mask_token_frac + cfg.random_token_frac) * _U32), _U32 - 1))
    if cfg.mask_token_frac >= 1.0:
        out[chosen] = special.mask
        return out, labels
    out[chosen & (lo < t_mask)] = special.mask
    rand = chosen & (lo >= t_mask) & (lo < t_rand)
    if cfg.mask_token_frac + cfg.random_token_frac >= 1.0:
        rand = chosen & (lo >= t_mask)
    if rand.any():
        r = splitmix64(h[rand]) >> _S32
        out[rand] = candidates[(r * np.uint64(len(candidates))) >> _S32]
    return out, labels


@functools.lru_cache(maxsize=8)
def _positions(length: int) -> np.ndarray:
    return (np.arange(length, dtype=np.uint64) * _G)[None, :]


class PackedSequences:
    """Documents laid back to back, each followed by [SEP], cut into sequences of ``seq_len`` tokens.

    Nothing is materialised: a sequence is gathered from the token memmap on demand through the
    documents' start offsets (O(documents) memory). With ``cls`` set, each sequence is [CLS] followed
    by seq_len - 1 stream tokens. The tail shorter than one sequence is dropped (no padding).
    """

    def __init__(
        self,
        tokens: np.ndarray,
        doc_start: np.ndarray,
        doc_len: np.ndarray,
        seq_len: int,
        sep: int,
        cls: int | None = None,
        check: Callable[[], None] | None = None,
    ):
        self.tokens = tokens
        self.check = check  # called before each read (TokenStore.check_intact: a file truncated under the job)
        self.doc_start = np.asarray(doc_start, dtype=np.int64)
        self.doc_len = np.asarray(doc_len, dtype=np.int64)
        self.seq_len = seq_len
        self.sep = sep
        self.cls = cls
        self.content = seq_len - (cls is not None)
        self.stream_off = np.zeros(len(self.doc_len) + 1, dtype=np.int64)
        np.cumsum(self.doc_len + 1, out=self.stream_off[1:])
        self.num_tokens = int(self.stream_off[-1])
        self.num_sequences = self.num_tokens // self.content
        self._ar = np.arange(self.content, dtype=np.int64)

    def __len__(self) -> int:
        return self.num_sequences

    def gather(self, seq_ids: np.ndarray) -> np.ndarray:
        """[len(seq_ids), seq_len] token ids (the store's dtype) of the given packed sequences."""
        return self.gather_with_segments(seq_ids)[0]

    def gather_with_segments(self, seq_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The token ids (as :meth:`gather`) and each position's document within its row, [B, seq_len] int32
        from 0 (a document's [SEP] is its own; a leading [CLS] belongs to the first document)."""
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        B, C = len(seq_ids), self.content
        start = seq_ids * C
        # the document at each row's first and last position; positions in between step through the
        # documents whose stream offsets fall inside the row (few: documents are usually long)
        first = np.searchsorted(self.stream_off, start, side="right") - 1
        last = np.searchsorted(self.stream_off, start + (C - 1), side="right") - 1
        step = np.zeros((B, C), dtype=np.int64)
        n_cross = last - first
        if n_cross.any():
            rows = np.repeat(np.arange(B), n_cross)
            docs = np.repeat(first - np.cumsum(n_cross) + n_cross, n_cross) + np.arange(1, int(n_cross.sum()) + 1)
            step[rows, self.stream_off[docs] - start[rows]] = 1
            np.cumsum(step, axis=1, out=step)
        doc = step
        doc += first[:, None]
        k = (start[:, None] + self._ar[None, :]) - self.stream_off[doc]
        is_sep = k == self.doc_len[doc]
        k += self.doc_start[doc]
        k[is_sep] = 0
        if self.check is not None:
            self.check()
        out = self.tokens[k] if len(self.tokens) else np.zeros(k.shape, dtype=np.int64)
        out[is_sep] = self.sep
        segments = (doc - first[:, None]).astype(np.int32)
        if self.cls is not None:
            out = np.concatenate([np.full((B, 1), self.cls, dtype=out.dtype), out], axis=1)
            segments = np.concatenate([np.zeros((B, 1), dtype=np.int32), segments], axis=1)
        return out, segments
