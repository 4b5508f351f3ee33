"""Two ways to meet a task with few labels, both with the ``(loss, logits)`` interface of a classifier:

- :class:`PromptClassifier` (PET / LM-BFF): the masked-LM head scores each label's word at the template's
  mask(s); those scores are the labels' logits, trained with cross-entropy. No new parameters: the head the
  model was pretrained with is the classifier.
- :class:`PrefixClassifier` (P-tuning v2, Liu et al. 2022; CPM-2's prompt tuning): the encoder frozen,
  trainable keys and values (``prefix_len`` of them) in front of every layer's attention, and a small head.
  Only the prefixes and the head are a task's own: many tasks share one base encoder in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from cramkit.errors import CramkitError
from cramkit.model.encoder import Encoder, ModelConfig, init_weights
from cramkit.model.heads import ClassifierConfig, MLMHead, classification_loss, pool_hidden

if TYPE_CHECKING:
    from cramkit.data.prompts import PromptSpec

# the most prefix keys/values per layer a deep-prompt model may have: what training accepts and what a
# deep-prompt directory may record (cramkit.load refuses more); 16-128 is usual
MAX_PREFIX_LEN = 100_000


def check_prefix_len(prefix_len: object, cfg: ModelConfig | None = None) -> int:
    """``prefix_len`` when it is an integer from 1 to :data:`MAX_PREFIX_LEN`; else one CramkitError naming
    ``--prefix-len`` (``finetune.prefix_len``) and the fix, before anything is sized from it."""
    if isinstance(prefix_len, bool) or not isinstance(prefix_len, int) or not 1 <= prefix_len <= MAX_PREFIX_LEN:
        raise CramkitError(
            f"--prefix-len (finetune.prefix_len) must be an integer from 1 to {MAX_PREFIX_LEN:,}, got "
            f"{str(prefix_len)[:40]}; deep prompts of 16 to 128 per layer are usual"
        )
    return prefix_len


class PromptClassifier(nn.Module):
    """Encoder + MLM head; the logit of label c is the mean over the masks of log p(its word's j-th token at
    mask j). Inputs carry exactly ``len(label_ids[0])`` masks each (``cramkit.data.prompts``). The state
    dict is a ``MaskedLM``'s (``encoder.*``, ``head.*``)."""

    words: torch.Tensor  # a buffer (register_buffer)
    spec: PromptSpec  # the prompt it was built from, set by whoever builds it (load, finetune)

    def __init__(self, cfg: ModelConfig, label_ids: Sequence[Sequence[int]], mask_id: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.head = MLMHead(cfg, self.encoder.embeddings.word)
        init_weights(self, cfg)
        self.num_labels = len(label_ids)
        self.mask_id = int(mask_id)
        # [masks, labels]: the token of each label's word at each mask
        self.register_buffer("words", torch.tensor(label_ids, dtype=torch.long).t().contiguous(), persistent=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        keep = input_ids == self.mask_id
        masks, n_labels = self.words.shape
        batch = input_ids.shape[0]
        # sparse prediction: the last block and the vocabulary projection only at the masks
        hidden = self.encoder(input_ids, attention_mask, token_type_ids, select=keep)
        logp = self.head(hidden).float().log_softmax(-1).view(batch, masks, -1)
        scores = logp.gather(2, self.words[None].expand(batch, masks, n_labels)).mean(1)
        loss = F.cross_entropy(scores, labels.long()) if labels is not None else None
        return loss, scores


class PrefixClassifier(nn.Module):
    """A frozen encoder with trainable per-layer prefix keys/values and a classifier head (pooling, BERT's
    pooler when ``head.pooler_dense``, dropout, linear). ``encoder``: an existing one to share (a served
    base); else a new one."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_labels: int,
        head: ClassifierConfig,
        prefix_len: int,
        encoder: Encoder | None = None,
    ) -> None:
        super().__init__()
        self.cfg, self.head_cfg, self.num_labels, self.prefix_len = cfg, head, num_labels, prefix_len
        self.multilabel = False
        self.pooler = nn.Linear(cfg.hidden, cfg.hidden) if head.pooler_dense else None
        self.dropout = nn.Dropout(head.dropout)
        self.classifier = nn.Linear(cfg.hidden, num_labels)
        init_weights(self, cfg)
        # small at first: the prefixes draw little attention until trained (the frozen model's own outputs)
        check_prefix_len(prefix_len)
        try:
            self.prefix = nn.Parameter(torch.randn(cfg.layers, 2, prefix_len, cfg.hidden) * cfg.init_std)
        except (RuntimeError, MemoryError):  # torch's "can't allocate memory"
            need = cfg.layers * 2 * prefix_len * cfg.hidden * 4 / 2**30
            raise CramkitError(
                f"--prefix-len {prefix_len}: the prefixes alone need {need:,.1f} GiB ({cfg.layers} layers x 2 x "
                f"{prefix_len} x {cfg.hidden}), more than this machine has; give a smaller --prefix-len (16 to 128 "
                "is usual)"
            ) from None
        self.encoder = encoder if encoder is not None else Encoder(cfg)
        self.encoder.requires_grad_(False)

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """One vector per sequence for the head (the pooling, then BERT's pooler when there is one)."""
        return pool_hidden(hidden, attention_mask, self.head_cfg.pooling, self.pooler, self.head_cfg.pooler_activation)

    def own_state(self) -> dict[str, torch.Tensor]:
        """What a task stores: the prefixes and the head (no encoder weight)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("encoder.")}

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        hidden = self.encoder(input_ids, attention_mask, token_type_ids, prefix=self.prefix)
        logits = self.classifier(self.dropout(self.pool(hidden, attention_mask)))
        loss = classification_loss(logits, labels, self.num_labels, False) if labels is not None else None
        return loss, logits


def encoder_digest(encoder: nn.Module) -> str:
    """SHA-256 over an encoder's weights (names, dtypes, shapes and bytes, in name order): what a prefix
    directory names its base model by, whatever file the base was read from."""
    import hashlib

    digest = hashlib.sha256()
    for name, t in sorted(encoder.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()
