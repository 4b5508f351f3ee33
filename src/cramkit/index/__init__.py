"""Retrieval over a corpus with our encoder: chunking, embedding to a memory map, a tuned Faiss index,
search, and RETRO neighbours for a token store.

    idx = cramkit.index.build_index("corpus/", "out/model", "idx")      # or `cramkit index build`
    hits = cramkit.index.open("idx").search(["a question"], k=5)         # [[{score, text, doc, source, chunk}]]
    ds.map_batches(cramkit.index.CramkitEmbedder, fn_constructor_kwargs={"model": "hf:DIR"})  # Ray Data
    cramkit.index.export_index("idx", "milvus", "http://localhost:19530")  # or `cramkit index export`
"""

from cramkit.index.core import Index, add_to_index, build_index, open, retro_neighbours
from cramkit.index.embedder import CramkitEmbedder
from cramkit.index.export import export_index

__all__ = ["CramkitEmbedder", "Index", "add_to_index", "build_index", "export_index", "open", "retro_neighbours"]
