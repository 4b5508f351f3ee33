"""The model under evaluation: checked, opened as an :class:`~cramkit.infer.Engine` that can embed, its texts
embedded in blocks (with progress), and what the results record of it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cramkit.errors import CramkitError
from cramkit.progress import Progress

if TYPE_CHECKING:
    from cramkit.infer.engine import Engine

EMBED_BLOCK = 2048  # texts per Engine.embed call (progress between them)


def check_model(model: Any) -> None:
    """A model given by its path or hub id that cannot be had: one line, before any data is read."""
    if isinstance(model, (str, os.PathLike)):
        from cramkit.loading import check_source

        check_source(str(model))


def open_engine(model: Any, device: str = "auto", max_batch_tokens: int | None = None) -> Engine:
    """An :class:`~cramkit.infer.Engine` over ``model`` that can embed (else one error naming the model)."""
    from cramkit.infer import Engine

    engine = Engine(model, device=device, max_batch_tokens=max_batch_tokens)
    if not engine.can_embed:
        arch = getattr(engine.loaded, "architecture", None) or engine.kind
        raise CramkitError(
            f"{engine.source}: this model ({arch}) has no transformer encoder to take sentence embeddings from "
            "(a distilled BiLSTM student or a deep-prompt export gives labels only); evaluate an encoder: a "
            "pretraining run, a fine-tuned model or hf:DIR"
        )
    return engine


def embed_texts(
    engine: Engine,
    texts: Sequence[str],
    *,
    pooling: str | None = None,
    normalize: bool | None = True,
    progress: bool = True,
    desc: str = "embedding",
    dimensions: int | None = None,
    prompt: str | None = None,
) -> tuple[np.ndarray, int]:
    """(embeddings [n, dim] float32, how many texts were cut to the model's limit), ``EMBED_BLOCK`` texts per
    call, with the model's pooling unless ``pooling`` is given; ``prompt``: a text put before each (None: the
    model's default prompt, if any)."""
    n = len(texts)
    out: np.ndarray | None = None
    truncated = 0
    bar = Progress(desc, n, unit="texts", enabled="auto" if progress else False)
    try:
        for a in range(0, n, EMBED_BLOCK):
            vec, cut = engine.embed_truncated(
                list(texts[a : a + EMBED_BLOCK]),
                pooling=pooling,
                normalize=normalize,
                dimensions=dimensions,
                prompt=prompt,
            )
            if out is None:
                out = np.zeros((n, vec.shape[1]), dtype=np.float32)
            out[a : a + len(vec)] = vec
            truncated += int(cut.sum())
            bar.to(min(a + EMBED_BLOCK, n))
    finally:
        bar.close()
    if out is None:
        out = np.zeros((0, int(dimensions or engine.hidden_size or 0)), dtype=np.float32)
    return out, truncated


def model_info(engine: Engine) -> dict[str, Any]:
    """What the results record of the model."""
    return {
        "source": engine.source,
        "kind": engine.kind,
        "backend": engine.backend,
        "pooling": engine.pooling,
        "normalize": engine.normalize,
        "max_length": engine.max_length,
        "hidden_size": engine.hidden_size,
    }
