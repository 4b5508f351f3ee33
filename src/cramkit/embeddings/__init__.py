"""Embedding at scale: the rows of a file, or the sequences (or chunks) of a token store, to vectors; resumable,
split across torchrun processes and across machines.

    cramkit.embed("texts.csv", "hf:models/minilm", "emb/")               # or `cramkit embed`: a memory map
    cramkit.embed("texts.csv", MODEL, "emb/", format="parquet", shard="0/2")  # Parquet parts: shard 0 of 2
    vectors, ids = cramkit.embeddings.read_vectors("emb/")                   # a Parquet folder's rows, in order
    ds.map_batches(cramkit.embeddings.CramkitEmbedder, fn_constructor_kwargs={"model": "hf:DIR"})  # Ray Data

Modules: ``verb`` (``cramkit embed``: its inputs, then a memory map or Parquet parts), ``memmap`` (embeddings
streamed to a memory-mapped matrix, resumable), ``parquet`` (one Parquet file per part, the join, reading them
back), ``encoder`` (the encoder loaded and fingerprinted, its retrieval prompts), ``store_text`` (a token store
read back as text), ``embedder`` (``CramkitEmbedder`` for Ray Data), ``progress``.

The verb ``cramkit.embed(source, model, out, ...)`` is :func:`cramkit.embeddings.verb.embed_source`; it takes an
:class:`~cramkit.embeddings.request.EmbedRequest` (what ``cramkit embed`` builds) or its fields. Its names
load on first use (PEP 562): this package must not import numpy or torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cramkit.lazy import lazy_names

# rows (or chunks) embedded between two commits of the work done: what a stopped run redoes at most; the embed and
# index verbs' --block
BLOCK = 1024

if TYPE_CHECKING:
    from cramkit.embeddings.embedder import CramkitEmbedder
    from cramkit.embeddings.parquet import read_vectors
    from cramkit.embeddings.request import EmbedRequest
    from cramkit.embeddings.verb import embed_source

__all__ = ["CramkitEmbedder", "EmbedRequest", "embed_source", "read_vectors"]
__getattr__ = lazy_names(
    __name__,
    {
        "CramkitEmbedder": "cramkit.embeddings.embedder",
        "EmbedRequest": "cramkit.embeddings.request",
        "embed_source": "cramkit.embeddings.verb",
        "read_vectors": "cramkit.embeddings.parquet",
    },
)
