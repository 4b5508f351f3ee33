"""cramkit.text: documents from text sources, and WordPiece tokenizers.

Its names load on first use (:mod:`cramkit.lazy`); the defaults below live here, where nothing heavy is imported,
so that the command line's flags and help read them without loading the readers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cramkit.lazy import lazy_names

if TYPE_CHECKING:
    from cramkit.text.sources import iter_documents
    from cramkit.text.tokenizer import (
        SpecialIds,
        load_tokenizer,
        save_tokenizer,
        special_ids,
        tokenizer_hash,
        train_tokenizer,
    )

DOC_SPLITS = ("auto", "file", "blank", "wikitext")  # how a file is cut into documents (--doc-split)
VOCAB_SIZE = 32768  # the default vocabulary, for text that is not Chinese (BERT's is 30,522)
ZH_VOCAB_SIZE = 21128  # bert-base-chinese's: room for the 20,902 ideographs of the main CJK block
MIN_FREQUENCY = 2  # times a piece must occur to enter the vocabulary, by default

__all__ = [
    "SpecialIds",
    "iter_documents",
    "load_tokenizer",
    "save_tokenizer",
    "special_ids",
    "tokenizer_hash",
    "train_tokenizer",
]
__getattr__ = lazy_names(
    __name__,
    {
        "iter_documents": "cramkit.text.sources",
        **{
            name: "cramkit.text.tokenizer"
            for name in (
                "SpecialIds",
                "load_tokenizer",
                "save_tokenizer",
                "special_ids",
                "tokenizer_hash",
                "train_tokenizer",
            )
        },
    },
)
