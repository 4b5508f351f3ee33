"""Batched inference for any model ``cramkit.load`` opens (torch, or an export run by its backend: ONNX
Runtime, CTranslate2, a registered format): embeddings, classification, multiple choice, fill-mask.

The passes are ``cramkit.model.forward``'s (the same ones fine-tuning scores with): inputs sorted by length
and cut into forward passes by a token budget (rows x longest row), each padded to its own longest member,
results in the caller's order; the default budget is cache-sized on a CPU, large on CUDA. torch:
``torch.inference_mode`` always, autocast as ``cramkit.runtime`` decides (bf16 on CUDA by default). Inputs
longer than the model's limit are truncated (on by default) and reported per input in ``truncated``; with
``truncate=False`` they are an error instead.

The ``*_encoded`` methods take already tokenised inputs (:meth:`Engine.tokenize`) and cut them into passes;
the ``*_pass`` methods run given rows as exactly one forward pass: the server's batcher forms the passes
itself, from many requests, with :func:`fits` (the same rule), and runs each as it is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from cramkit.backends.finite import FiniteRunner, check_weights
from cramkit.data.batching import (
    Encoded,
    EncodedChoices,
    choice_probabilities,
    encode_choices,
    encode_texts,
    scores_to_choices,
)
from cramkit.errors import CramkitError
from cramkit.infer.offload import check_expert_cache as check_expert_cache
from cramkit.infer.offload import offload_model
from cramkit.model import forward
from cramkit.model.forward import CPU_BATCH_TOKENS as CPU_BATCH_TOKENS
from cramkit.model.forward import CUDA_BATCH_TOKENS as CUDA_BATCH_TOKENS
from cramkit.model.forward import MAX_BATCH_ROWS as MAX_BATCH_ROWS
from cramkit.model.forward import default_batch_tokens as default_batch_tokens
from cramkit.model.forward import fits as fits
from cramkit.text.tokenizer import special_id, special_token

if TYPE_CHECKING:
    import torch

    from cramkit.backends import ExportedModel, Runner
    from cramkit.data.prompts import PromptSpec
    from cramkit.loading import LoadedModel

TextOrPair = str | tuple[str, str] | list[str]


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


MIN_CHOICES = 2  # a multiple-choice input needs at least this many choices


class InputTooLong(CramkitError):
    """An input is longer than the model's limit and truncation was refused."""


def probabilities(kind: str, logits: np.ndarray) -> np.ndarray | None:
    """softmax (classifier) or sigmoid (multilabel) of logits; None for regression."""
    if kind == "regression":
        return None
    if kind == "multilabel":
        return 1.0 / (1.0 + np.exp(-logits))
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def check_model_weights(loaded: LoadedModel) -> None:
    """One line naming the model when a weight of its torch module is NaN or infinite (training diverged, or
    the file is damaged or crafted)."""
    fix = "its training diverged or the file is damaged: train it again (a lower learning rate) or load a checkpoint"
    check_weights(loaded.source, loaded.model.named_parameters(), fix)


# ------------------------------------------------------------------------------------------ engine


class Engine:
    """Batched inference over a model: a :class:`~cramkit.loading.LoadedModel`, an
    :class:`~cramkit.backends.ExportedModel`, or a path (anything ``cramkit.load`` opens: a run, a
    model directory, ``hf:DIR``, an export).

    backend: ``auto`` (the model's own: torch for a torch model, the export's format for an export), ``torch``,
    or an export format (``onnx``, ``ct2``, a registered one): asking for a format with a torch model exports
    it (at full precision) to a temporary directory first. The engine holds one runner
    (``model.runner()``) and never asks which backend it is.
    max_batch_tokens: padded tokens per forward pass (rows x longest row; default the runner's ``batch_tokens``
    where it has one, e.g. 512 for CTranslate2 on a CPU, else from the device: :func:`default_batch_tokens`);
    max_length: cut inputs to this many tokens ([CLS]/[SEP] included), default the model's limit;
    threads: an export runtime's CPU threads (default: the cores this process may use; torch keeps its own
    setting).
    offload_experts: of a mixture-of-experts torch model, keep its experts out of memory and bring in only the
    ones each pass's router picks (InfMoE): on a CPU read from the model's safetensors file through a memory
    map, on CUDA copied from pinned host memory on a side stream; attention, the dense blocks and the routers
    stay resident. The loaded model's experts leave it (it is changed in place). The outputs are the resident
    model's. expert_cache: experts kept resident per MoE layer (least recently used leave first; default 0).
    """

    def __init__(
        self,
        model: LoadedModel | ExportedModel | str | os.PathLike,
        *,
        backend: str = "auto",
        device: str | torch.device | None = "auto",
        max_batch_tokens: int | None = None,
        max_length: int | None = None,
        precision: str = "auto",
        threads: int | None = None,
        offload_experts: bool = False,
        expert_cache: int | None = None,
    ) -> None:
        from cramkit import backends
        from cramkit.loading import LoadedModel, for_task, load

        known = ("auto", "torch", *backends.names())
        if backend not in known:
            raise CramkitError(f"backend must be one of {', '.join(known)}, got {backend!r}")
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise CramkitError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        cache = check_expert_cache(expert_cache, offload_experts)
        if offload_experts and backend not in ("auto", "torch"):
            raise CramkitError(f"--offload-experts runs the torch model; drop --backend {backend} (or use torch)")
        self._tmp: Any = None
        src = load(model, threads=threads) if isinstance(model, (str, os.PathLike)) else model
        if isinstance(src, LoadedModel):  # an export's tables are checked by its format, when it is opened
            check_model_weights(src)
        own = "torch" if isinstance(src, LoadedModel) else src.backend_name
        if isinstance(src, LoadedModel) and src.kind == "multitask":
            for_task(src, None)  # one line: choose the task (load(..., task=NAME))
        if backend not in ("auto", own):
            if not isinstance(src, LoadedModel):
                raise CramkitError(
                    f"{src.source} is an export in the {src.backend.title} format; run it with backend {own} (or "
                    "auto), or give the torch model it was exported from"
                )
            import tempfile

            self._tmp = tempfile.TemporaryDirectory(prefix=f"cramkit-{backend}-")
            out = backends.write_export(
                backend, src, Path(self._tmp.name) / "model", compare=compare_outputs, progress=False
            )
            src = backends.open_export(out, threads=threads)
        self.loaded: LoadedModel | ExportedModel = src
        self.offload: dict[str, Any] | None = None
        if offload_experts:
            self.offload = offload_model(src, device, cache)
        # the one place outputs leave a backend: NaN or infinity there is an error naming the model, every verb
        self.runner: Runner = FiniteRunner(src.runner(device, precision), str(src.source))
        self.device = getattr(self.runner, "device", "cpu")
        self.model = getattr(self.runner, "model", None)  # the torch module, for a torch model
        self.backend = self.runner.name
        self.kind: str = src.kind
        self.labels: list[str] | None = src.labels
        self.tokenizer = src.tokenizer
        self.pooling: str = src.pooling
        self.normalize: bool = src.normalize
        self.with_types: bool = src.with_types
        self.source: str = str(src.source)
        self.pad_id: int = src.pad_id
        self.model_max_length: int = int(src.max_length)
        # the runner's own budget where it has one (CTranslate2 on a CPU: smaller passes), else the device's
        own_budget = getattr(self.runner, "batch_tokens", None)
        self.max_batch_tokens = int(max_batch_tokens or own_budget or default_batch_tokens(self.device))
        self.max_length = min(int(max_length), self.model_max_length) if max_length else self.model_max_length
        if self.max_length < 3:
            raise CramkitError(f"max_length must be at least 3 tokens, got {self.max_length}")
        # a prompt model (finetune --prompt), or its export, reads its inputs through its template
        self.prompt: PromptSpec | None = src.prompt
        self._prompts()  # an embedding model's named prompts, checked once (a malformed entry: one line)

    # ------------------------------------------------------------------------------ what it can do

    @property
    def can_embed(self) -> bool:
        return self.loaded.can_embed

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

    @property
    def can_fill_mask(self) -> bool:
        return self.kind == "mlm" and special_id(self.tokenizer, "mask") is not None

    @property
    def hidden_size(self) -> int | None:
        return self.loaded.hidden

    @property
    def dimensions(self) -> list[int]:
        """The vector sizes this model answers: its hidden size, and the leading dimensions it was trained to
        be cut to (``--set matryoshka=256,128``: recorded by the contrastive stage), largest first."""
        dims = self.loaded.extra.get("matryoshka")
        if isinstance(dims, list) and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
            return sorted(set(dims), reverse=True)
        return [self.hidden_size] if self.hidden_size else []

    def check_dimensions(self, dimensions: int | None) -> int | None:
        """``dimensions`` if this model answers it (None: the whole vector); else one CramkitError line."""
        if dimensions is None or dimensions == self.hidden_size:
            return None
        if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions not in self.dimensions:
            if len(self.dimensions) <= 1:
                raise CramkitError(
                    f"dimensions {dimensions!r}: {self.source} was not trained to be cut (Matryoshka); its vectors "
                    f"have {self.hidden_size} dimensions: train it with --objective contrastive --set "
                    "matryoshka=256,128 to get shorter ones"
                )
            raise CramkitError(
                f"dimensions {dimensions!r}: {self.source} answers {', '.join(map(str, self.dimensions))} (the "
                "Matryoshka dimensions it was trained with)"
            )
        return dimensions

    @property
    def prompts(self) -> dict[str, str]:
        """The model's named embedding prompts (name -> text put before each input: ``query: ``), as
        sentence-transformers' ``prompts``; empty without any."""
        return dict(self._prompts()[0])

    @property
    def default_prompt_name(self) -> str | None:
        """The prompt an input gets when no other is asked for (sentence-transformers' ``default_prompt_name``)."""
        return self._prompts()[1]

    def _prompts(self) -> tuple[dict[str, str], str | None]:
        from cramkit.model import embedding_prompts

        return embedding_prompts.recorded(self.loaded.extra, self.source)

    def prompt_text(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The text put before each input: ``prompt`` when given ('' for none), else the prompt named
        ``prompt_name``, else the default prompt ('' without one); an unknown name is one CramkitError line
        naming the model's prompts."""
        from cramkit.model import embedding_prompts

        prompts, default = self._prompts()
        return embedding_prompts.resolve(prompts, default, prompt_name, self.source, prompt)

    def retrieval_prompt_name(self, which: str) -> str | None:
        """The prompt name a retrieval side gets ("query" or "document"): sentence-transformers'
        ``encode_query`` / ``encode_document`` rule (a prompt named query; document, passage or corpus; else
        the default)."""
        from cramkit.model import embedding_prompts

        prompts, default = self._prompts()
        return embedding_prompts.side(prompts, default, which)

    def with_prompt(
        self, inputs: Sequence[TextOrPair], prompt_name: str | None = None, prompt: str | None = None
    ) -> list[TextOrPair]:
        """``inputs`` with :meth:`prompt_text` put before each (a pair's first text)."""
        from cramkit.model import embedding_prompts

        return embedding_prompts.prefix(list(inputs), self.prompt_text(prompt_name, prompt))

    # ------------------------------------------------------------------------------ tokenisation

    def tokenize(
        self, inputs: Sequence[TextOrPair], max_length: int | None = None, *, truncate: bool = True
    ) -> Encoded:
        """Encode texts or (text_a, text_b) pairs; CramkitError naming the first bad input (or, with
        ``truncate=False``, the first one longer than the limit)."""
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
        limit = max_length or self.max_length
        mask = special_token(self.tokenizer, "mask") if self.kind == "mlm" else None
        if mask is not None and mask != "[MASK]":  # cramkit's spelling of the blank, for RoBERTa's <mask> too
            a = [t.replace("[MASK]", mask) for t in a]
        if self.prompt is not None:
            from cramkit.data.prompts import encode_prompts

            enc = encode_prompts(self.tokenizer, self.prompt, a, b, limit)
        else:
            enc = encode_texts(self.tokenizer, a, b if any(s is not None for s in b) else None, limit)
        if not truncate and enc.truncated.any():
            i = int(np.flatnonzero(enc.truncated)[0])
            raise InputTooLong(
                f"input {i} is longer than the model's limit of {limit} tokens; shorten it or allow truncation"
            )
        return enc

    def tokenize_choices(
        self, contexts: Sequence[str], choices: Sequence[Sequence[str]], *, truncate: bool = True
    ) -> EncodedChoices:
        """Encode each context with each of its choices (a pair row per choice); CramkitError naming the
        first bad input (a context that is not a string, fewer than two choices, a choice not a string)."""
        if len(contexts) != len(choices):
            raise CramkitError(f"{len(contexts)} contexts but {len(choices)} lists of choices; give one per context")
        for i, (a, cs) in enumerate(zip(contexts, choices, strict=True)):
            if not isinstance(a, str):
                raise CramkitError(f"input {i}: the context is a {type(a).__name__}; give a string")
            if not isinstance(cs, (list, tuple)) or not all(isinstance(c, str) for c in cs):
                raise CramkitError(f"input {i}: the choices must be a list of strings")
            if len(cs) < MIN_CHOICES:
                raise CramkitError(f"input {i} has {len(cs)} choice(s); give at least {MIN_CHOICES}")
        enc = encode_choices(self.tokenizer, contexts, choices, self.max_length)
        if not truncate and enc.truncated.any():
            i = int(np.flatnonzero(enc.truncated)[0])
            raise InputTooLong(
                f"input {i} (with one of its choices) is longer than the model's limit of {self.max_length} "
                "tokens; shorten it or allow truncation"
            )
        return enc

    def _pad(self, enc: Encoded, rows: np.ndarray | None) -> forward.Inputs:
        return forward.pad(enc, rows, self.pad_id, self.with_types)

    @property
    def workers(self) -> int:
        """Forward passes the runtime runs at once (CTranslate2 on a CPU: one per thread; else 1)."""
        return int(getattr(self.runner, "workers", 1))

    def batches(self, enc: Encoded) -> list[np.ndarray]:
        """Length-sorted index batches within the token budget (each one :func:`fits`)."""
        return forward.passes(enc, self.max_batch_tokens)

    # ------------------------------------------------------------------------------ embeddings

    def _need_embed(self) -> None:
        if not self.can_embed and self.loaded.architecture == "prefix":  # an export of deep prompts
            raise CramkitError(
                f"{self.source}: a deep-prompt export gives labels only (its embeddings would be its base's); "
                "embed with the base model it was trained on"
            )
        if not self.can_embed:
            raise CramkitError(
                f"{self.source}: this model has no transformer encoder to take embeddings from; use an "
                "encoder, a pretraining run or a fine-tuned model"
            )

    def embed_encoded(self, enc: Encoded) -> tuple[np.ndarray, np.ndarray]:
        """(mean-pooled, first-token) last hidden states [n, hidden] float32, not normalised."""
        self._need_embed()
        n = len(enc)
        mean: np.ndarray | None = None
        cls: Any = None  # an array, made with mean
        batches = self.batches(enc)
        outs = forward.run_passes(lambda rows: self.embed_pass(enc, rows), batches, self.workers)
        for batch, (m, c) in zip(batches, outs, strict=True):
            if mean is None:
                mean = np.zeros((n, m.shape[1]), dtype=np.float32)
                cls = np.zeros((n, c.shape[1]), dtype=np.float32)
            mean[batch] = m
            cls[batch] = c
        if mean is None:
            h = self.hidden_size or 0
            return np.zeros((0, h), np.float32), np.zeros((0, h), np.float32)
        return mean, cls

    def embed_pass(self, enc: Encoded, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(mean-pooled, first-token) states of ``rows`` (default: all of ``enc``) in one forward pass."""
        self._need_embed()
        return self.runner.pooled(self._pad(enc, rows))

    def check_pooling(self, pooling: str | None) -> str:
        pooling = pooling or self.pooling
        if pooling not in ("mean", "cls"):
            raise CramkitError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        return pooling

    @staticmethod
    def finish_embeddings(pooled: np.ndarray, normalize: bool, dimensions: int | None = None) -> np.ndarray:
        """Pooled vectors cut to their first ``dimensions`` (a Matryoshka model), then L2-normalised."""
        if dimensions is not None:
            pooled = pooled[:, :dimensions]
        if normalize:
            norm = np.linalg.norm(pooled, axis=1, keepdims=True)
            pooled = pooled / np.maximum(norm, 1e-12)
        return pooled.astype(np.float32, copy=False)

    def embed_truncated(
        self,
        texts: Sequence[TextOrPair],
        pooling: str | None = None,
        normalize: bool | None = None,
        *,
        truncate: bool = True,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(Sentence embeddings [n, hidden] (float32): mean of the last hidden states over real tokens,
        or the first ([CLS]) token's; L2-normalised when ``normalize`` (default: the model's own);
        ``dimensions``: cut to that many leading dimensions (a Matryoshka model's, :attr:`dimensions`);
        ``prompt_name``: one of the model's :attr:`prompts` put before each text (default: its
        :attr:`default_prompt_name`, if any); ``prompt``: that text itself ('' for none). The prompt's tokens
        count toward the length limit; and which inputs were cut to the limit, a bool per input)."""
        self._need_embed()
        pooling = self.check_pooling(pooling)
        dimensions = self.check_dimensions(dimensions)
        normalize = self.normalize if normalize is None else normalize
        enc = self.tokenize(self.with_prompt(texts, prompt_name, prompt), truncate=truncate)
        mean, cls = self.embed_encoded(enc)
        return self.finish_embeddings(mean if pooling == "mean" else cls, normalize, dimensions), enc.truncated

    def embed(
        self,
        texts: Sequence[TextOrPair],
        pooling: str | None = None,
        normalize: bool | None = None,
        *,
        truncate: bool = True,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
    ) -> np.ndarray:
        """The embeddings of :meth:`embed_truncated`, without which inputs were cut."""
        return self.embed_truncated(
            texts, pooling, normalize, truncate=truncate, dimensions=dimensions, prompt_name=prompt_name, prompt=prompt
        )[0]

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

    # ------------------------------------------------------------------------------ description

    def info(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "kind": self.kind,
            "backend": self.backend,
            "precision": self.runner.precision,
            "device": str(self.device),
            "labels": self.labels,
            "max_length": self.max_length,
            "max_batch_tokens": self.max_batch_tokens,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "dimensions": self.dimensions if self.can_embed else [],
            "prompts": self.prompts,
            "default_prompt_name": self.default_prompt_name,
            "rerank": self.can_rerank,
            "hidden_size": self.hidden_size,
            "embed": self.can_embed,
            "classify": self.can_classify,
            "choose": self.can_choose,
            "fill_mask": self.can_fill_mask,
            "offload_experts": self.offload,
        }

    def expert_traffic(self) -> dict[str, int] | None:
        """Offloaded experts (``offload_experts``): how many were brought in and how many found resident,
        summed over the MoE layers since the engine started; None when the experts are resident."""
        if self.offload is None or self.model is None:
            return None
        from cramkit.model.moe import moe_layers

        stores = [m.store for m in moe_layers(self.model) if m.store is not None]
        return {"reads": sum(s.reads for s in stores), "hits": sum(s.hits for s in stores)}


def compare_outputs(loaded: LoadedModel, exported: ExportedModel, texts: list[Any]) -> dict[str, Any]:
    """The largest differences between the torch model's and its export's outputs on ``texts`` (the check of
    ``cramkit.backends.write_export``)."""
    import torch

    ref = Engine(loaded, backend="torch", device="cpu", precision="fp32", max_batch_tokens=4096)
    got = Engine(exported, max_batch_tokens=4096)
    res: dict[str, Any] = {"texts": len(texts)}
    with torch.inference_mode():
        if ref.can_embed and got.can_embed:  # a deep-prompt export gives its labels only
            enc = ref.tokenize(texts)
            for name, a, b in zip(("mean", "cls"), ref.embed_encoded(enc), got.embed_encoded(enc), strict=True):
                res[f"max_abs_diff_{name}"] = float(np.abs(a - b).max())
                res[f"scale_{name}"] = float(np.abs(a).max())
                cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
                res[f"cosine_{name}_mean"] = float(cos.mean())
                res[f"cosine_{name}_min"] = float(cos.min())
        if ref.can_classify or ref.can_choose:  # multiple choice: the scores of the pairs
            enc = ref.tokenize(texts)
            a, b = ref.logits_encoded(enc), got.logits_encoded(enc)
            res["max_abs_diff_logits"] = float(np.abs(a - b).max())
            res["scale_logits"] = float(np.abs(a).max())
            if ref.can_classify and loaded.kind != "regression":
                res["label_agreement"] = float((a.argmax(1) == b.argmax(1)).mean())
        if ref.can_fill_mask:
            masked = [" ".join(t.split()[:6] + ["[MASK]"] + t.split()[6:12]) for t in texts[:32] if isinstance(t, str)]
            ra, ga = ref.fill_mask(masked, top_k=1), got.fill_mask(masked, top_k=1)
            pa = [m[0]["id"] for r in ra for m in r[:1]]
            pb = [m[0]["id"] for r in ga for m in r[:1]]
            sa = np.asarray([m[0]["score"] for r in ra for m in r[:1]])
            sb = np.asarray([m[0]["score"] for r in ga for m in r[:1]])
            res["fill_mask_top1_agreement"] = float(np.mean([x == y for x, y in zip(pa, pb, strict=True)]))
            res["max_abs_diff_fill_mask_top1_prob"] = float(np.abs(sa - sb).max()) if len(sa) else 0.0
    return res
