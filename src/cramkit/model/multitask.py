"""One encoder, one head per task: the model a mixture trains (``cramkit finetune --mixture``).

Each head is a SequenceClassifier's: BERT's pooler (dense + tanh), dropout and a linear layer with the
task's outputs (labels, 1 for a regression score, 1 for a multiple-choice task's score of each
(context, choice) pair, softmax over an example's choices). :meth:`MultiTaskModel.single` gives one task's
model as a plain :class:`~cramkit.model.heads.SequenceClassifier` that shares the encoder and the head's
parameters (no copy), so everything that runs a classifier (predict, export, serve) runs a task head.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from cramkit.model.encoder import Encoder, ModelConfig, init_weights
from cramkit.model.heads import (
    ClassifierConfig,
    MultipleChoice,
    SequenceClassifier,
    choice_grid,
    choice_loss,
    classification_loss,
    pool_hidden,
)


class TaskHead(nn.Module):
    def __init__(self, cfg: ModelConfig, num_labels: int, head: ClassifierConfig) -> None:
        super().__init__()
        self.num_labels, self.head_cfg = num_labels, head
        self.pooler = nn.Linear(cfg.hidden, cfg.hidden) if head.pooler_dense else None
        self.dropout = nn.Dropout(head.dropout)
        self.classifier = nn.Linear(cfg.hidden, num_labels)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return self.classifier(
            self.dropout(
                pool_hidden(hidden, attention_mask, self.head_cfg.pooling, self.pooler, self.head_cfg.pooler_activation)
            )
        )


class MultiTaskModel(nn.Module):
    """A shared encoder and ``heads[i]`` for task i (``num_labels[i]`` outputs; kinds[i]: classification,
    regression or multiple_choice)."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_labels: list[int],
        head: ClassifierConfig | None = None,
        kinds: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.cfg, self.head_cfg = cfg, head or ClassifierConfig()
        self.kinds = list(kinds) if kinds is not None else ["classification"] * len(num_labels)
        self.encoder = Encoder(cfg)
        self.heads = nn.ModuleList(TaskHead(cfg, n, self.head_cfg) for n in num_labels)
        init_weights(self, cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        choice_mask: torch.Tensor | None = None,
        *,
        task: int,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        hidden = self.encoder(input_ids, attention_mask, token_type_ids)
        head = cast(TaskHead, self.heads[task])
        logits = head(hidden, attention_mask)
        if self.kinds[task] == "multiple_choice" and choice_mask is not None:
            grid = choice_grid(logits, choice_mask)
            return (choice_loss(grid, labels) if labels is not None else None), grid
        loss = classification_loss(logits, labels, head.num_labels, False) if labels is not None else None
        return loss, logits

    def single(self, task: int) -> SequenceClassifier:
        """Task ``task``'s classifier, sharing this model's parameters."""
        head = cast(TaskHead, self.heads[task])
        view: SequenceClassifier
        with torch.device("meta"):  # the view's own modules are replaced below: allocate nothing
            if self.kinds[task] == "multiple_choice":
                view = MultipleChoice(self.cfg, self.head_cfg)
            else:
                view = SequenceClassifier(self.cfg, head.num_labels, self.head_cfg)
        view.encoder, view.pooler, view.dropout, view.classifier = (
            self.encoder,
            head.pooler,
            head.dropout,
            head.classifier,
        )
        return view.train(self.training)
