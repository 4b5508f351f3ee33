"""Batched inference for any model ``cramkit.load`` accepts: embeddings, classification, fill-mask.

Inputs are sorted by length and cut into batches by a token budget (rows x longest row), not a row
count, so memory is the same for short and long inputs; each batch is padded to its own longest member
only; results come back in the caller's order. ``torch.inference_mode`` always; bf16 autocast on CUDA.
Inputs longer than the model's limit are truncated (on by default) and reported in ``truncated``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cramkit.data.batching import Encoded, collate, encode_texts, token_budget_batches
from cramkit.errors import CramkitError
from cramkit.load import LoadedModel

TextOrPair = str | tuple[str, str] | list[str]


@dataclass
class ClassifyResult:
    """Per input: logits; for classifiers probabilities and label names; for regression scores."""

    logits: np.ndarray  # [n, C] float32
    probs: np.ndarray | None  # softmax (classifier) or sigmoid (multilabel) of logits
    labels: list[str] | list[list[str]] | None  # argmax label name; multilabel: names with p >= 0.5
    scores: np.ndarray | None  # regression: the predicted value per input
    truncated: np.ndarray  # bool per input


def resolve_device(name: str | torch.device | None) -> torch.device:
    if name is None or str(name) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise CramkitError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CramkitError("device cuda asked for, but no CUDA device is available; use --device cpu")
    return device


class Engine:
    """Batched inference over a :class:`~cramkit.load.LoadedModel`.

    max_batch_tokens: padded tokens per forward pass (rows x longest row); max_length: cut inputs to this
    many tokens ([CLS]/[SEP] included), default the model's limit.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        device: str | torch.device | None = "auto",
        max_batch_tokens: int = 16384,
        max_length: int | None = None,
        precision: str = "auto",
    ) -> None:
        if max_batch_tokens < 1:
            raise CramkitError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.loaded = loaded
        self.device = resolve_device(device)
        self.model = loaded.model.to(self.device).eval()
        self.max_batch_tokens = int(max_batch_tokens)
        limit = loaded.max_length
        self.max_length = min(int(max_length), limit) if max_length else limit
        if self.max_length < 3:
            raise CramkitError(f"max_length must be at least 3 tokens, got {self.max_length}")
        use_bf16 = precision == "bf16" or (precision == "auto" and self.device.type == "cuda")
        self._amp = (
            (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16))
            if use_bf16
            else contextlib.nullcontext
        )
        self.truncated = np.zeros(0, dtype=bool)

    # ------------------------------------------------------------------------------ tokenisation

    def tokenize(self, inputs: Sequence[TextOrPair], max_length: int | None = None) -> Encoded:
        """Encode texts or (text_a, text_b) pairs; CramkitError naming the first bad input."""
        a: list[str] = []
        b: list[str | None] = []
        for i, x in enumerate(inputs):
            if isinstance(x, str):
                a.append(x)
                b.append(None)
            elif isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(s, str) for s in x):
                a.append(x[0])
                b.append(x[1])
            else:
                raise CramkitError(f"input {i} is a {type(x).__name__}; give a string or a pair of strings")
        enc = encode_texts(self.loaded.tokenizer, a, b, max_length or self.max_length)
        self.truncated = enc.truncated
        return enc

    def _batches(self, enc: Encoded) -> Any:
        with_types = self.loaded.with_types
        pad = self.loaded.pad_id
        for batch in token_budget_batches(enc.lengths, self.max_batch_tokens):
            inputs = collate(enc, batch, pad, with_types)
            yield batch, {k: (v.to(self.device) if v is not None else None) for k, v in inputs.items()}

    # ------------------------------------------------------------------------------ embeddings

    def embed(
        self, texts: Sequence[TextOrPair], pooling: str | None = None, normalize: bool | None = None
    ) -> np.ndarray:
        """Sentence embeddings [n, hidden] (float32): mean of the last hidden states over real tokens,
        or the first ([CLS]) token's; L2-normalised when ``normalize`` (default: the model's own)."""
        encoder = self.loaded.encoder
        if encoder is None:
            raise CramkitError(
                f"{self.loaded.source}: this model ({self.loaded.architecture}) has no transformer encoder to "
                "take embeddings from; use an encoder, a pretraining run or a fine-tuned model"
            )
        pooling = pooling or self.loaded.pooling
        if pooling not in ("mean", "cls"):
            raise CramkitError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        normalize = self.loaded.normalize if normalize is None else normalize
        enc = self.tokenize(texts)
        out = np.zeros((len(enc), encoder.cfg.hidden if hasattr(encoder, "cfg") else 0), dtype=np.float32)
        with torch.inference_mode():
            for batch, x in self._batches(enc):
                with self._amp():
                    hidden = encoder(x["input_ids"], x["attention_mask"], x["token_type_ids"])
                hidden = hidden.float()
                if pooling == "cls":
                    pooled = hidden[:, 0]
                elif x["attention_mask"] is None:
                    pooled = hidden.mean(1)
                else:
                    w = x["attention_mask"].to(hidden.dtype)[..., None]
                    pooled = (hidden * w).sum(1) / w.sum(1).clamp_min(1.0)
                if normalize:
                    pooled = torch.nn.functional.normalize(pooled, dim=-1)
                out[batch] = pooled.cpu().numpy()
        return out

    # ------------------------------------------------------------------------------ classification

    def logits(self, inputs: Sequence[TextOrPair]) -> np.ndarray:
        """The classification/regression head's raw outputs [n, C] for texts or pairs."""
        if self.loaded.kind not in ("classifier", "multilabel", "regression"):
            raise CramkitError(
                f"{self.loaded.source} is a {self.loaded.kind} model without a classification head; fine-tune "
                "it first (cramkit finetune ... --out DIR) and predict with DIR"
            )
        enc = self.tokenize(inputs)
        n_out = self.loaded.num_labels or 1
        out = np.zeros((len(enc), n_out), dtype=np.float32)
        with torch.inference_mode():
            for batch, x in self._batches(enc):
                with self._amp():
                    _, logits = self.model(x["input_ids"], x["attention_mask"], x["token_type_ids"])
                out[batch] = logits.float().cpu().numpy()
        return out

    def classify(self, inputs: Sequence[TextOrPair]) -> ClassifyResult:
        logits = self.logits(inputs)
        kind, names = self.loaded.kind, self.loaded.labels
        if kind == "regression":
            return ClassifyResult(logits, None, None, logits[:, 0].copy(), self.truncated)
        if kind == "multilabel":
            probs = 1.0 / (1.0 + np.exp(-logits))
            labels = [[names[j] if names else str(j) for j in np.flatnonzero(p >= 0.5)] for p in probs]
            return ClassifyResult(logits, probs, labels, None, self.truncated)
        z = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(z)
        probs /= probs.sum(axis=1, keepdims=True)
        top = probs.argmax(axis=1)
        labels = [names[j] if names else str(j) for j in top]
        return ClassifyResult(logits, probs, labels, None, self.truncated)

    # ------------------------------------------------------------------------------ fill-mask

    def fill_mask(self, texts: Sequence[str], top_k: int = 5) -> list[list[list[dict[str, Any]]]]:
        """For each text, for each [MASK] in it, the ``top_k`` tokens with their probabilities."""
        from cramkit.model.heads import MaskedLM

        if not isinstance(self.model, MaskedLM):
            raise CramkitError(
                f"{self.loaded.source} has no masked-LM head; fill-mask needs a pretraining run or an MLM model"
            )
        tok = self.loaded.tokenizer
        mask_id = tok.token_to_id("[MASK]")
        if mask_id is None:
            raise CramkitError(f"{self.loaded.source}: the tokenizer has no [MASK] token")
        enc = self.tokenize(list(texts))
        results: list[list[list[dict[str, Any]]]] = [[] for _ in range(len(enc))]
        k = max(1, min(int(top_k), self.loaded.config.vocab_size))
        with torch.inference_mode():
            for batch, x in self._batches(enc):
                ids = x["input_ids"]
                where = ids == mask_id
                if not bool(where.any()):
                    continue
                with self._amp():
                    hidden = self.model.encoder(ids, x["attention_mask"], x["token_type_ids"])
                    logits = self.model.head(hidden[where])
                probs = logits.float().softmax(-1)
                p, t = probs.topk(k, dim=-1)
                rows = where.nonzero()[:, 0].tolist()
                for row, pr, tk in zip(rows, p.tolist(), t.tolist(), strict=True):
                    results[int(batch[row])].append(
                        [
                            {"token": tok.id_to_token(i), "id": i, "score": s}
                            for s, i in zip(pr, tk, strict=True)
                        ]
                    )
        return results
