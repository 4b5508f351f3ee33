"""Retrieval over a corpus with our encoder: chunking, embedding the chunks (:mod:`cramkit.embeddings`), a tuned
Faiss index, search, RETRO neighbours for a token store, and export to vector databases.

    idx = cramkit.index.build_index("corpus/", "out/model", "idx")      # or `cramkit index build`
    hits = cramkit.index.open("idx").search(["a question"], k=5)         # [[{score, text, doc, source, chunk}]]
    cramkit.index.export_index("idx", "milvus", "http://localhost:19530")  # or `cramkit index export`

Each sub-verb's function takes its request (:mod:`cramkit.index.request`: ``BuildRequest``, ``QueryRequest``,
``InfoRequest``, ``AddRequest``, ``NeighboursRequest``, ``ExportRequest``) or the request's fields:
``build_index``, ``query``, ``info``, ``add_to_index``, ``retro_neighbours``, ``export_index``.
"""

from typing import TYPE_CHECKING

from cramkit.lazy import lazy_names

if TYPE_CHECKING:
    from cramkit.embeddings.embedder import CramkitEmbedder
    from cramkit.index.add import add_to_index
    from cramkit.index.build import build_index
    from cramkit.index.export import export_index
    from cramkit.index.neighbours import retro_neighbours
    from cramkit.index.request import (
        AddRequest,
        BuildRequest,
        ExportRequest,
        InfoRequest,
        NeighboursRequest,
        QueryRequest,
    )
    from cramkit.index.search import Index, info, open, query

# how text is cut by default: passages of 128 word pieces, 16 shared by neighbours (or fewer where the encoder's
# limit is shorter); a token store into RETRO's chunks of 64 tokens (kept here, light, for the command's help)
PASSAGE_TOKENS = 128
OVERLAP = 16
RETRO_CHUNK = 64

__all__ = [
    "AddRequest",
    "BuildRequest",
    "CramkitEmbedder",
    "ExportRequest",
    "Index",
    "InfoRequest",
    "NeighboursRequest",
    "QueryRequest",
    "add_to_index",
    "build_index",
    "export_index",
    "info",
    "open",
    "query",
    "retro_neighbours",
]
__getattr__ = lazy_names(
    __name__,
    {
        "CramkitEmbedder": "cramkit.embeddings.embedder",  # at home in cramkit.embeddings; kept here for older code
        "add_to_index": "cramkit.index.add",
        "build_index": "cramkit.index.build",
        "export_index": "cramkit.index.export",
        "retro_neighbours": "cramkit.index.neighbours",
        "Index": "cramkit.index.search",
        "open": "cramkit.index.search",
        "query": "cramkit.index.search",
        "info": "cramkit.index.search",
        **dict.fromkeys(
            ("BuildRequest", "QueryRequest", "InfoRequest", "AddRequest", "NeighboursRequest", "ExportRequest"),
            "cramkit.index.request",
        ),
    },
)
