"""The engine's embeddings (:class:`EmbeddingEngine`): pooled last hidden states, cut to a Matryoshka
dimension and normalised; the model's named prompts put before the inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cramkit.data.batching import Encoded
from cramkit.errors import CramkitError
from cramkit.infer.engine_core import EngineCore, TextOrPair
from cramkit.model import forward
from cramkit.model.pooling import Pooling, read_pooling


class EmbeddingEngine(EngineCore):
    """Sentence embeddings (:meth:`embed`), with the model's dimensions and prompts."""

    @property
    def can_embed(self) -> bool:
        return self.loaded.can_embed

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

    def check_pooling(self, pooling: str | None) -> Pooling:
        return read_pooling(pooling or self.pooling, "pooling")

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
