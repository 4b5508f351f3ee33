"""How raw text is read, declared once for every verb that reads it (``pretrain``, ``data build``, ``tokenizer
train``, ``embed``, ``index build``): request field groups (:mod:`cramkit.request`) that a verb's request mixes
in, and the options as :func:`cramkit.text.sources.iter_documents` takes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cramkit.request import param
from cramkit.text import DOC_SPLITS

GROUP = "reading text"


@dataclass(kw_only=True)
class Encoding:
    """The encoding of the files and what to do with bytes invalid in it."""

    encoding: str | None = param(
        None,
        group=GROUP,
        help="text encoding of the files (default UTF-8; e.g. latin-1, cp1252; auto: each file UTF-8, else cp1252)",
    )
    errors: str = param(
        "strict",
        group=GROUP,
        choices=("strict", "replace", "ignore"),
        help="bytes invalid in the encoding: stop with an error (default), replace or ignore them",
    )


@dataclass(kw_only=True)
class Reading(Encoding):
    """The encoding of the files, what to do with bytes invalid in it, and the field of a table holding the text."""

    text_field: str = param(
        "text", group=GROUP, help="JSON Lines (.jsonl, .json) field / Parquet column holding the text"
    )

    def reading_options(self) -> dict[str, Any]:
        """The options as ``iter_documents`` takes them (those this request declares)."""
        out: dict[str, Any] = {"encoding": self.encoding, "errors": self.errors, "text_field": self.text_field}
        if isinstance(self, Documents):
            out["doc_split"] = self.doc_split
        if isinstance(self, Normalizing):
            out["normalize"] = None if str(self.normalize).lower() == "none" else self.normalize
        return out


@dataclass(kw_only=True)
class Documents:
    """Where the documents of a text file end."""

    doc_split: str = param(
        "auto",
        group=GROUP,
        choices=DOC_SPLITS,
        help="where documents end in text files: a file each, blank lines, WikiText ' = Title = ' headings, or "
        "auto (WikiText headings if present, else blank lines)",
    )


@dataclass(kw_only=True)
class Normalizing:
    """The Unicode normal form the text is brought to (``tokenizer train``, ``data build``)."""

    normalize: str | None = param("NFC", group=GROUP, help="Unicode normal form (NFC, NFKC, ... or none)")
