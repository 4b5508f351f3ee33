"""The engine's scores from a head (:class:`ScoringEngine`): a classifier's, a multi-label model's or a
regression's outputs, a multiple-choice model's choice, a cross-encoder's relevance and ranking."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from cramkit.data.batching import Encoded, EncodedChoices, choice_probabilities, scores_to_choices
from cramkit.errors import CramkitError
from cramkit.infer.engine_core import EngineCore, TextOrPair
from cramkit.model import forward


@dataclass
class ClassifyResult:
    """Per input: logits; for classifiers probabilities and label names; for regression scores."""

    logits: np.ndarray  # [n, C] float32
    probs: np.ndarray | None  # softmax (classifier) or sigmoid (multilabel) of logits
    labels: list[str] | list[list[str]] | None  # argmax label name; multilabel: names with p >= 0.5
    scores: np.ndarray | None  # regression: the predicted value per input
    truncated: np.ndarray  # bool per input


@dataclass
class ChoiceResult:
    """Per example of a multiple-choice model: the chosen choice's index, and per choice its score and
    probability (softmax over the example's choices)."""

    chosen: np.ndarray  # [n] int
    scores: list[np.ndarray]  # per example [its choices] float32
    probs: list[np.ndarray]
    truncated: np.ndarray  # bool per example: any of its pairs cut to the limit


def probabilities(kind: str, logits: np.ndarray) -> np.ndarray | None:
    """softmax (classifier) or sigmoid (multilabel) of logits; None for regression."""
    if kind == "regression":
        return None
    if kind == "multilabel":
        return 1.0 / (1.0 + np.exp(-logits))
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


class ScoringEngine(EngineCore):
    """Logits, classification, multiple choice, reranking."""

    @property
    def can_classify(self) -> bool:
        return self.kind in ("classifier", "multilabel", "regression")

    @property
    def can_choose(self) -> bool:
        return self.kind == "multiple_choice"

    @property
    def can_rerank(self) -> bool:
        """A cross-encoder: a model fine-tuned on text pairs with one score (regression) or two labels (the
        second, or the one named like "1"/"entailment", is "relevant")."""
        two = self.kind == "classifier" and len(self.labels or []) == 2
        return (self.kind == "regression" or two) and self.trained_inputs in ("pairs", None)

    def relevance(self, logits: np.ndarray, raw: bool = False) -> np.ndarray:
        """A cross-encoder's score per pair: the regression's value, or the relevant label's probability
        (``raw``: its logit minus the other's, as TEI's raw_scores)."""
        if self.kind == "regression":
            return logits[:, 0].astype(np.float32)
        names = [str(x).lower() for x in self.labels or []]
        pos = next((i for i, n in enumerate(names) if n in ("1", "entailment", "paraphrase", "relevant", "yes")), 1)
        margin = (logits[:, pos] - logits[:, 1 - pos]).astype(np.float32)
        return margin if raw else (1.0 / (1.0 + np.exp(-margin))).astype(np.float32)

    def rerank(self, query: str, texts: Sequence[str], *, raw: bool = False, truncate: bool = True) -> list[int]:
        """The indices of ``texts`` from the most to the least relevant to ``query`` (:meth:`relevance`)."""
        if not self.can_rerank:
            raise CramkitError(
                f"{self.source} is not a cross-encoder (a {self.kind} model); fine-tune one on (query, passage, "
                "label) pairs: cramkit finetune --train FILE --text-a query --text-b passage --label label"
            )
        scores = self.relevance(self.logits([(query, t) for t in texts], truncate=truncate), raw)
        return [int(i) for i in np.argsort(-scores, kind="stable")]

    @property
    def trained_inputs(self) -> str | None:
        """What the model was fine-tuned to read: "single" texts, "pairs" or "choices" (None: not recorded)."""
        value = self.loaded.extra.get("trained_inputs")
        return value if value in ("single", "pairs", "choices") else None

    # ------------------------------------------------------------------------------ classification

    def _need_head(self) -> None:
        if not (self.can_classify or self.can_choose):
            raise CramkitError(
                f"{self.source} is a {self.kind} model without a classification head; fine-tune "
                "it first (cramkit finetune ... --out DIR) and predict with DIR"
            )

    def logits_encoded(self, enc: Encoded) -> np.ndarray:
        """The classification/regression head's raw outputs [n, C] for tokenised inputs."""
        self._need_head()
        return forward.logits(
            self.runner,
            enc,
            pad_id=self.pad_id,
            with_types=self.with_types,
            max_tokens=self.max_batch_tokens,
            width=len(self.labels or []) or 1,
            workers=self.workers,
        )

    def logits_pass(self, enc: Encoded, rows: np.ndarray | None = None) -> np.ndarray:
        """The head's outputs for ``rows`` (default: all of ``enc``) in one forward pass."""
        self._need_head()
        return self.runner.logits(self._pad(enc, rows))

    def logits(self, inputs: Sequence[TextOrPair], *, truncate: bool = True) -> np.ndarray:
        """The classification/regression head's raw outputs [n, C] for texts or pairs."""
        self._need_head()
        return self.logits_encoded(self.tokenize(inputs, truncate=truncate))

    def classify_logits(self, logits: np.ndarray, truncated: np.ndarray) -> ClassifyResult:
        kind, names = self.kind, self.labels
        probs = cast(np.ndarray, probabilities(kind, logits))  # None only for regression, which does not use it
        if kind == "regression":
            return ClassifyResult(logits, None, None, logits[:, 0].copy(), truncated)
        if kind == "multilabel":
            labels = [[names[j] if names else str(j) for j in np.flatnonzero(p >= 0.5)] for p in probs]
            return ClassifyResult(logits, probs, labels, None, truncated)
        top = probs.argmax(axis=1)
        return ClassifyResult(logits, probs, [names[j] if names else str(j) for j in top], None, truncated)

    def classify(self, inputs: Sequence[TextOrPair], *, truncate: bool = True) -> ClassifyResult:
        self._need_head()
        enc = self.tokenize(inputs, truncate=truncate)
        return self.classify_logits(self.logits_encoded(enc), enc.truncated)

    # ------------------------------------------------------------------------------ multiple choice

    def _need_choice(self) -> None:
        if not self.can_choose:
            raise CramkitError(
                f"{self.source} is a {self.kind} model, not a multiple-choice one; fine-tune it on a multiple-"
                "choice task first (cramkit finetune ... --choices COLS --out DIR)"
            )

    @staticmethod
    def choice_result(pair_scores: np.ndarray, enc: EncodedChoices) -> ChoiceResult:
        """Pair rows' scores ([rows, 1], :meth:`logits_encoded` of ``enc.pairs``) regrouped per example."""
        grid = scores_to_choices(pair_scores, enc.offsets)
        probs = choice_probabilities(grid)
        n = enc.num_choices
        return ChoiceResult(
            chosen=grid.argmax(axis=1) if len(grid) else np.zeros(0, dtype=np.int64),
            scores=[grid[i, : n[i]] for i in range(len(n))],
            probs=[probs[i, : n[i]] for i in range(len(n))],
            truncated=enc.truncated,
        )

    def choose(
        self, contexts: Sequence[str], choices: Sequence[Sequence[str]], *, truncate: bool = True
    ) -> ChoiceResult:
        """For each context, the best of its choices (a score per (context, choice) pair, softmax over them)."""
        self._need_choice()
        enc = self.tokenize_choices(contexts, choices, truncate=truncate)
        return self.choice_result(self.logits_encoded(enc.pairs), enc)
