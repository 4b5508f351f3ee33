"""Small students for distillation: Tang et al.'s BiLSTM (arXiv 1903.12136).

Embedding -> one bidirectional LSTM layer -> the forward and backward final states concatenated ->
ReLU hidden layer -> logits. For a sentence pair (``[CLS] a [SEP] b [SEP]``, split at the first
``[SEP]``) both halves go through the same LSTM (siamese) and the classifier reads
``[h1, h2, h1 * h2, |h1 - h2|]``. The forward signature is the sequence classifier's, so the Engine,
``cramkit predict`` and the server feed it exactly like a fine-tuned encoder.

A student reads the same WordPiece ids as its teacher: its embedding can start from the teacher's token
embeddings, and a word the training set never showed is still split into known pieces (a word-level
vocabulary would map it to [UNK]).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cramkit.errors import CramkitError
from cramkit.model.heads import classification_loss


@dataclass
class BiLSTMConfig:
    """The student's shape (Tang et al.: 300-d embeddings, 150 LSTM units per direction, 200 ReLU units
    for single sentences)."""

    vocab_size: int = 30522
    embedding_dim: int = 300
    lstm_hidden: int = 150
    fc_hidden: int = 200
    dropout: float = 0.1
    pairs: bool = False
    pad_token_id: int = 0
    sep_token_id: int = 102

    def validate(self) -> None:
        for name in ("vocab_size", "embedding_dim", "lstm_hidden", "fc_hidden"):
            if getattr(self, name) <= 0:
                raise CramkitError(f"bilstm {name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise CramkitError(f"bilstm dropout must be in [0, 1), got {self.dropout}")


class BiLSTMStudent(nn.Module):
    """Tang et al.'s BiLSTM classifier; ``num_labels == 1`` is regression, ``multilabel`` uses sigmoids."""

    def __init__(self, cfg: BiLSTMConfig, num_labels: int, *, multilabel: bool = False) -> None:
        super().__init__()
        cfg.validate()
        self.cfg, self.num_labels, self.multilabel = cfg, num_labels, multilabel
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.embedding_dim, padding_idx=cfg.pad_token_id)
        # the two directions as two LSTMs over padded batches (the backward one reads each sequence reversed
        # within its length): the same result as a packed bidirectional LSTM, and exportable to ONNX
        self.lstm_fwd = nn.LSTM(cfg.embedding_dim, cfg.lstm_hidden, batch_first=True)
        self.lstm_bwd = nn.LSTM(cfg.embedding_dim, cfg.lstm_hidden, batch_first=True)
        feats = 2 * cfg.lstm_hidden * (4 if cfg.pairs else 1)
        self.dropout = nn.Dropout(cfg.dropout)
        self.hidden = nn.Linear(feats, cfg.fc_hidden)
        self.classifier = nn.Linear(cfg.fc_hidden, num_labels)

    def encode(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """[B, 2 * lstm_hidden]: the forward state after the last real token and the backward state after
        reading back to the first."""
        width = ids.shape[1]
        pos = torch.arange(width, device=ids.device)[None, :]
        last = (lengths.clamp(1, width) - 1)[:, None]
        rev = torch.where(pos <= last, last - pos, pos)
        # the ids are reversed, not the embedded rows: a lookup is ~8x cheaper than a gather of [B, T, D]
        out_f, _ = self.lstm_fwd(self.dropout(self.embedding(ids)))
        out_b, _ = self.lstm_bwd(self.dropout(self.embedding(torch.gather(ids, 1, rev))))
        at = last[..., None].expand(-1, 1, out_f.shape[-1])
        return torch.cat([out_f.gather(1, at).squeeze(1), out_b.gather(1, at).squeeze(1)], dim=-1)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        b, width = input_ids.shape
        if attention_mask is None:
            lengths = torch.full((b,), width, dtype=torch.long, device=input_ids.device)
        else:
            lengths = attention_mask.long().sum(1)
        if not self.cfg.pairs:
            feats = self.encode(input_ids, lengths)
        else:
            # segment A: [CLS] a [SEP] (up to the first [SEP]); segment B: b [SEP] (the rest)
            is_sep = input_ids == self.cfg.sep_token_id
            first = torch.where(is_sep.any(1), is_sep.int().argmax(1), lengths - 1)
            len_a = first + 1
            len_b = (lengths - len_a).clamp_min(1)
            pos = torch.arange(width, device=input_ids.device)[None, :]
            idx_b = (len_a[:, None] + pos).clamp_max(width - 1)
            ids_b = torch.gather(input_ids, 1, idx_b).masked_fill(pos >= len_b[:, None], self.cfg.pad_token_id)
            h = self.encode(torch.cat([input_ids, ids_b]), torch.cat([len_a, len_b]))
            h1, h2 = h[:b], h[b:]
            feats = torch.cat([h1, h2, h1 * h2, (h1 - h2).abs()], dim=-1)
        logits = self.classifier(self.dropout(F.relu(self.hidden(feats))))
        loss = classification_loss(logits, labels, self.num_labels, self.multilabel) if labels is not None else None
        return loss, logits


def bilstm_meta(cfg: BiLSTMConfig) -> dict[str, Any]:
    return asdict(cfg)


def build_from_meta(meta: dict[str, Any]) -> nn.Module:
    """The model ``cramkit-model.json`` describes (architecture ``bilstm``), with fresh weights."""
    from cramkit.config import from_dict

    section = meta.get("model")
    if not isinstance(section, dict):
        raise CramkitError("cramkit-model.json: a bilstm model needs a 'model' section (its shape)")
    cfg = from_dict(BiLSTMConfig, section, "model")
    kind = meta.get("kind")
    if kind not in ("classifier", "multilabel", "regression"):
        raise CramkitError(f"cramkit-model.json: a bilstm student is a classifier or regressor, not {kind!r}")
    n = 1 if kind == "regression" else meta.get("num_labels") or len(meta.get("labels") or [])
    if not isinstance(n, int) or n < 1:
        raise CramkitError("cramkit-model.json: a bilstm classifier needs num_labels or labels")
    return BiLSTMStudent(cfg, n, multilabel=kind == "multilabel")
