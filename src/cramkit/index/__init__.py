"""Retrieval over a corpus with our encoder: chunking, embedding the chunks (:mod:`cramkit.embed`), a tuned
Faiss index, search, RETRO neighbours for a token store, and export to vector databases.

    idx = cramkit.index.build_index("corpus/", "out/model", "idx")      # or `cramkit index build`
    hits = cramkit.index.open("idx").search(["a question"], k=5)         # [[{score, text, doc, source, chunk}]]
    cramkit.index.export_index("idx", "milvus", "http://localhost:19530")  # or `cramkit index export`
"""

from cramkit.embed.embedder import CramkitEmbedder  # at home in cramkit.embed; kept here for older code
from cramkit.index.add import add_to_index
from cramkit.index.build import build_index
from cramkit.index.export import export_index
from cramkit.index.neighbours import retro_neighbours
from cramkit.index.search import Index, open

__all__ = ["CramkitEmbedder", "Index", "add_to_index", "build_index", "export_index", "open", "retro_neighbours"]
