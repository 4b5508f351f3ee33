"""Embedding at scale: the rows of a file, or the sequences (or chunks) of a token store, to vectors; resumable,
split across torchrun processes and across machines.

    cramkit.embed("texts.csv", "hf:models/minilm", "emb/")               # or `cramkit embed`: a memory map
    cramkit.embed("texts.csv", MODEL, "emb/", format="parquet", shard="0/2")  # Parquet parts: shard 0 of 2
    vectors, ids = cramkit.embed.read_vectors("emb/")                   # a Parquet folder's rows, in order
    ds.map_batches(cramkit.embed.CramkitEmbedder, fn_constructor_kwargs={"model": "hf:DIR"})  # Ray Data

Modules: ``verb`` (``cramkit embed``: its inputs, then a memory map or Parquet parts), ``memmap`` (embeddings
streamed to a memory-mapped matrix, resumable), ``parquet`` (one Parquet file per part, the join, reading them
back), ``encoder`` (the encoder loaded and fingerprinted, its retrieval prompts), ``store_text`` (a token store
read back as text), ``embedder`` (``CramkitEmbedder`` for Ray Data), ``progress``.

This package is also the verb: ``cramkit.embed(source, model, out, ...)`` calls
:func:`cramkit.embed.verb.embed_source`. Its names load on first use (PEP 562): ``import cramkit`` imports this
package and must not import numpy or torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cramkit.lazy import callable_package, lazy_names

# rows (or chunks) embedded between two commits of the work done: what a stopped run redoes at most; the embed and
# index verbs' --block
BLOCK = 1024

if TYPE_CHECKING:
    from cramkit.embed.embedder import CramkitEmbedder
    from cramkit.embed.parquet import read_vectors
    from cramkit.embed.verb import embed_source

__all__ = ["CramkitEmbedder", "embed_source", "read_vectors"]
__getattr__ = lazy_names(
    __name__,
    {
        "CramkitEmbedder": "cramkit.embed.embedder",
        "embed_source": "cramkit.embed.verb",
        "read_vectors": "cramkit.embed.parquet",
    },
)
callable_package(__name__, "cramkit.embed.verb", "embed_source")
