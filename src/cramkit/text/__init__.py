"""cramkit.text: documents from text sources, and WordPiece tokenizers."""

from cramkit.text.sources import iter_documents
from cramkit.text.tokenizer import (
    SpecialIds,
    load_tokenizer,
    save_tokenizer,
    special_ids,
    tokenizer_hash,
    train_tokenizer,
)

__all__ = [
    "SpecialIds",
    "iter_documents",
    "load_tokenizer",
    "save_tokenizer",
    "special_ids",
    "tokenizer_hash",
    "train_tokenizer",
]
