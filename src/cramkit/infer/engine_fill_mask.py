"""The engine's fill-mask (:class:`FillMaskEngine`): per [MASK] of each input, the masked-LM head's most
likely tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cramkit.data.batching import Encoded
from cramkit.errors import CramkitError
from cramkit.infer.engine_core import EngineCore
from cramkit.text.tokenizer import special_id


class FillMaskEngine(EngineCore):
    """Fill-mask over a masked-LM model."""

    @property
    def can_fill_mask(self) -> bool:
        return self.kind == "mlm" and special_id(self.tokenizer, "mask") is not None

    # ------------------------------------------------------------------------------ fill-mask

    def _need_mlm(self) -> int:
        if self.kind != "mlm":
            raise CramkitError(
                f"{self.source} has no masked-LM head; fill-mask needs a pretraining run or an MLM model"
            )
        mask_id = special_id(self.tokenizer, "mask")
        if mask_id is None:
            raise CramkitError(f"{self.source}: the tokenizer has no [MASK] token")
        return int(mask_id)

    def fill_mask_encoded(self, enc: Encoded, top_k: int = 5) -> list[list[list[dict[str, Any]]]]:
        self._need_mlm()
        results: list[list[list[dict[str, Any]]]] = [[] for _ in range(len(enc))]
        for batch in self.batches(enc):
            for i, masks in zip(batch.tolist(), self.fill_mask_pass(enc, batch, top_k), strict=True):
                results[i] = masks
        return results

    def fill_mask_pass(
        self, enc: Encoded, rows: np.ndarray | None = None, top_k: int = 5
    ) -> list[list[list[dict[str, Any]]]]:
        """Per row of ``rows`` (default: all of ``enc``), per [MASK], the ``top_k`` tokens: one forward pass."""
        mask_id = self._need_mlm()
        tok = self.tokenizer
        x: dict[str, Any] = self._pad(enc, rows)  # its input_ids are never None
        results: list[list[list[dict[str, Any]]]] = [[] for _ in range(len(x["input_ids"]))]
        where = x["input_ids"] == mask_id
        if not where.any():
            return results
        k = max(1, min(int(top_k), tok.get_vocab_size(with_added_tokens=True)))
        p, t = self.runner.mask_topk(x, where, k)
        for row, pr, tk in zip(np.nonzero(where)[0].tolist(), p.tolist(), t.tolist(), strict=True):
            results[row].append(
                [{"token": tok.id_to_token(i), "id": i, "score": s} for s, i in zip(pr, tk, strict=True)]
            )
        return results

    def count_masks(self, enc: Encoded) -> int:
        """How many [MASK] tokens the tokenised inputs hold (0 without a [MASK] token)."""
        mask_id = special_id(self.tokenizer, "mask")
        return 0 if mask_id is None else sum(int((np.asarray(a) == mask_id).sum()) for a in enc.ids)

    def fill_mask(
        self, texts: Sequence[str], top_k: int = 5, *, truncate: bool = True
    ) -> list[list[list[dict[str, Any]]]]:
        """For each text, for each [MASK] in it (or the tokenizer's own spelling, RoBERTa's ``<mask>``), the ``top_k``
        tokens with their probabilities."""
        self._need_mlm()
        return self.fill_mask_encoded(self.tokenize(list(texts), truncate=truncate), top_k)
