"""Task heads on top of the encoder: masked-LM with sparse prediction, sequence classification, multiple
choice."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from cramkit.model.encoder import Encoder, ModelConfig, activation_fn, init_weights, make_norm
from cramkit.model.pooling import Pooling

IGNORE = -100  # label of positions that are not predicted


class MLMOutput(NamedTuple):
    loss: torch.Tensor  # mean cross-entropy over the predicted positions
    logits: torch.Tensor  # [n_predicted, vocab] (sparse) or [B, L, vocab] (dense, labels=None)
    n_predicted: torch.Tensor  # number of predicted positions (0-dim tensor)
    hidden: torch.Tensor | None = None  # [B, L, hidden]: every position's last hidden state (hidden=True)


class MLMHead(nn.Module):
    def __init__(self, cfg: ModelConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.transform: nn.Module
        width = cfg.embedding_width  # ELECTRA's generator: back to the embeddings' width, the decoder tied to them
        if cfg.head_transform:
            self.transform = nn.Sequential(
                nn.Linear(cfg.hidden, width, bias=cfg.bias),
                activation_fn("relu" if cfg.activation == "relu" else "gelu"),
                make_norm(cfg, width),
            )
        elif width != cfg.hidden:
            raise ValueError("an MLM head without its transform needs embedding_size equal to hidden")
        else:
            self.transform = nn.Identity()
        self.decoder = nn.Linear(width, cfg.vocab_size, bias=cfg.bias or cfg.decoder_bias)
        if cfg.tie_embeddings:
            self.decoder.weight = word_embeddings.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden))


class MaskedLM(nn.Module):
    """Encoder + MLM head. With labels, vocabulary logits are computed only where labels != -100."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.head = MLMHead(cfg, self.encoder.embeddings.word)
        init_weights(self, cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
        hidden: bool = False,
    ) -> MLMOutput:
        """``segments`` [B, L]: each position's document in a packed sequence; attention stays inside it.
        ``hidden``: also return every position's last hidden state (the whole last block is computed)."""
        if labels is None:
            logits = self.head(self.encoder(input_ids, attention_mask, token_type_ids, segments=segments))
            return MLMOutput(logits.new_zeros(()), logits, logits.new_zeros((), dtype=torch.long))
        # sparse prediction: never compute what is thrown away; the last block and the vocabulary
        # logits only at the predicted positions
        keep = labels.reshape(input_ids.shape) != IGNORE
        if hidden:
            states = self.encoder(input_ids, attention_mask, token_type_ids, segments=segments)
            targets = labels.reshape(-1)[keep.reshape(-1)]
            logits = self.head(states[keep])
            loss = F.cross_entropy(logits.float(), targets, reduction="mean")
            return MLMOutput(loss, logits, keep.sum(), states)
        if bool(keep.any()):
            hidden = self.encoder(input_ids, attention_mask, token_type_ids, select=keep, segments=segments)
        else:  # nothing predicted: empty logits (the loss is NaN, as a mean over nothing)
            hidden = self.encoder(input_ids, attention_mask, token_type_ids, segments=segments)[keep]
        targets = labels.reshape(-1)[keep.reshape(-1)]
        logits = self.head(hidden)
        loss = F.cross_entropy(logits.float(), targets, reduction="mean")
        return MLMOutput(loss, logits, keep.sum())


@dataclass
class ClassifierConfig:
    """The fine-tuning head: pooling of the encoder output and a linear classifier (or regressor)."""

    pooling: Pooling = "cls"
    pooler_dense: bool = True  # dense + activation on the pooled vector (BERT's pooler)
    dropout: float = 0.1
    # the pooler's activation: tanh (BERT, RoBERTa, MPNet), relu (DistilBERT's pre_classifier), gelu (ELECTRA)
    pooler_activation: Literal["tanh", "relu", "gelu"] = "tanh"


_POOLER_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "relu": F.relu,
    "gelu": F.gelu,
}


def pool_hidden(
    hidden: torch.Tensor,
    attention_mask: torch.Tensor | None,
    pooling: str,
    pooler: nn.Module | None,
    activation: str = "tanh",
) -> torch.Tensor:
    """One vector per sequence: the first token's or the mean over real tokens, then the pooler (dense +
    ``activation``: BERT's tanh) when there is one."""
    if pooling == "mean":
        if attention_mask is None:
            pooled = hidden.mean(dim=1)
        else:
            weights = attention_mask.to(hidden.dtype)[..., None]
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)
    else:
        pooled = hidden[:, 0]
    return _POOLER_ACTIVATIONS[activation](pooler(pooled)) if pooler is not None else pooled


class SequenceClassifier(nn.Module):
    """Encoder + pooling + classifier; ``num_labels == 1`` means regression (MSE loss); ``multilabel``:
    independent sigmoid per label (BCE loss, labels a 0/1 matrix)."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_labels: int,
        head: ClassifierConfig | None = None,
        *,
        multilabel: bool = False,
    ) -> None:
        super().__init__()
        self.cfg, self.head_cfg, self.num_labels = cfg, head or ClassifierConfig(), num_labels
        self.multilabel = multilabel
        self.encoder = Encoder(cfg)
        self.pooler = nn.Linear(cfg.hidden, cfg.hidden) if self.head_cfg.pooler_dense else None
        self.dropout = nn.Dropout(self.head_cfg.dropout)
        self.classifier = nn.Linear(cfg.hidden, num_labels)
        init_weights(self, cfg)

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return pool_hidden(hidden, attention_mask, self.head_cfg.pooling, self.pooler, self.head_cfg.pooler_activation)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        hidden = self.encoder(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(self.dropout(self.pool(hidden, attention_mask)))
        loss = classification_loss(logits, labels, self.num_labels, self.multilabel) if labels is not None else None
        return loss, logits


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, num_labels: int, multilabel: bool) -> torch.Tensor:
    """MSE for one output (regression), BCE for multi-label, else cross-entropy; computed in fp32."""
    if num_labels == 1:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    if multilabel:
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    return F.cross_entropy(logits.float(), labels.long())


class MultipleChoice(SequenceClassifier):
    """Encoder + pooling + a 1-output scorer of each (context, choice) pair, softmax over an example's
    choices. The parameters are a ``SequenceClassifier`` with one output (HF's ``BertForMultipleChoice``
    layout). Inputs are the pair rows of whole examples, example after example; ``choice_mask`` [examples,
    most choices] marks each example's choices: the scores come back in that shape, -inf at padding.
    Without ``choice_mask`` the scores are per row ([rows, 1]): the inference engine regroups them."""

    def __init__(self, cfg: ModelConfig, head: ClassifierConfig | None = None) -> None:
        super().__init__(cfg, 1, head)

    def forward(  # type: ignore[override]  # choice_mask before labels (HF's layout); labels go by keyword
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        choice_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        _, scores = super().forward(input_ids, attention_mask, token_type_ids)
        if choice_mask is None:
            if labels is not None:
                raise ValueError("multiple choice: a loss needs the choice_mask of the rows' examples")
            return None, scores
        grid = choice_grid(scores, choice_mask)
        return (choice_loss(grid, labels) if labels is not None else None), grid


def choice_grid(scores: torch.Tensor, choice_mask: torch.Tensor) -> torch.Tensor:
    """Pair scores [rows] or [rows, 1] (examples' choices in order) -> [examples, most choices], with -inf
    where ``choice_mask`` is False (an example with fewer choices): nothing there after the softmax."""
    grid = scores.new_full(choice_mask.shape, float("-inf"))
    grid[choice_mask] = scores.reshape(-1)
    return grid


def choice_loss(grid: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over each example's choices (``choice_grid``'s scores), in fp32."""
    return F.cross_entropy(grid.float(), labels.long())
