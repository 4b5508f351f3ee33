"""The options for reading raw text, the same for every verb that reads it (one argument group)."""

from __future__ import annotations

import argparse

from cramkit.text import DOC_SPLITS


def add_reading_args(
    p: argparse.ArgumentParser,
    *,
    doc_split: bool = True,
    normalize: bool = False,
    text_field: bool = True,
    text_field_help: str = "",
) -> None:
    """Add --encoding, --errors, --text-field (and --doc-split, --normalize where the verb uses them)."""
    g = p.add_argument_group("reading text")
    g.add_argument(
        "--encoding",
        default=None,
        help="text encoding of the files (default UTF-8; e.g. latin-1, cp1252; auto: each file UTF-8, else cp1252)",
    )
    g.add_argument(
        "--errors",
        default="strict",
        choices=["strict", "replace", "ignore"],
        help="bytes invalid in the encoding: stop with an error (default), replace or ignore them",
    )
    if text_field:
        g.add_argument(
            "--text-field",
            default=None,
            help=text_field_help
            or "JSON Lines (.jsonl, .json) field / Parquet column holding the text (default: text)",
        )
    if doc_split:
        g.add_argument(
            "--doc-split",
            default="auto",
            choices=DOC_SPLITS,
            help="where documents end in text files: a file each, blank lines, WikiText ' = Title = ' "
            "headings, or auto (WikiText headings if present, else blank lines)",
        )
    if normalize:
        g.add_argument("--normalize", default="NFC", help="Unicode normal form (NFC, NFKC, ... or none)")


def reading_kwargs(args: argparse.Namespace) -> dict:
    """The reading options given, as keyword arguments of `cramkit.text.sources.iter_documents`."""
    out = dict(encoding=args.encoding, errors=args.errors)
    if hasattr(args, "text_field"):
        out["text_field"] = args.text_field or "text"
    if hasattr(args, "doc_split"):
        out["doc_split"] = args.doc_split
    if hasattr(args, "normalize"):
        out["normalize"] = None if str(args.normalize).lower() == "none" else args.normalize
    return out
