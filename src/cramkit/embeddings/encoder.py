"""The encoder embeddings come from: loaded (it must have a transformer encoder to embed with), fingerprinted
(a hash of what decides its vectors), and the prompts each side of retrieval gets from it."""

from __future__ import annotations

import hashlib
from typing import Any

from cramkit.errors import CramkitError


def load_encoder(source: str, device: str = "auto") -> Any:
    from cramkit.loading import load

    loaded = load(source)
    if not loaded.can_embed:
        raise CramkitError(
            f"{source}: this model ({loaded.architecture}) has no transformer encoder to take embeddings "
            "from; index with an encoder, a pretraining run or a fine-tuned model"
        )
    return loaded


def encoder_fingerprint(loaded: Any) -> str:
    """A hash of what decides an embedding: the tokenizer and every encoder weight (an export's: its files'
    SHA-256)."""
    import torch

    from cramkit.text.tokenizer import tokenizer_hash

    h = hashlib.blake2b(digest_size=16)
    h.update(tokenizer_hash(loaded.tokenizer).encode())
    if getattr(loaded, "encoder", None) is None:  # an export: its weights are its files
        h.update(loaded.fingerprint().encode())
        return h.hexdigest()
    for name, t in sorted(loaded.encoder.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def retrieval_prompts(engine: Any, prompt_name: str | None = None) -> dict[str, dict[str, str | None]]:
    """The prompt each side of retrieval gets: ``{"documents": {"name", "text"}, "queries": {...}}``.
    Documents: ``prompt_name`` if given, else the encoder's prompt named document, passage or corpus, else
    its default prompt; queries: its prompt named query, else its default prompt (sentence-transformers'
    encode_document / encode_query). No prompt: name None, text ''."""
    doc = prompt_name if prompt_name is not None else engine.retrieval_prompt_name("document")
    query = engine.retrieval_prompt_name("query")
    return {
        "documents": {"name": doc, "text": engine.prompt_text(doc) if doc is not None else ""},
        "queries": {"name": query, "text": engine.prompt_text(query) if query is not None else ""},
    }
