"""What ``cramkit data build|join|inspect`` and their functions (:mod:`cramkit.data.verbs`) take, declared once
(:mod:`cramkit.request`): the command line's flags and the functions' keywords come from here."""

from __future__ import annotations

import os
from dataclasses import KW_ONLY, dataclass

from cramkit.request import param
from cramkit.text.request import Sources, refuse_overwrite


@dataclass
class DataBuildRequest(Sources):
    """Raw text tokenised into a token store (or one shard of it)."""

    _: KW_ONLY
    tokenizer: str | os.PathLike = param(
        required=True, help="directory with tokenizer.json or vocab.txt (or either file)"
    )
    out: str | os.PathLike = param(required=True, help="directory for NAME.bin, NAME.idx, NAME.json")
    name: str = param("train", help="store name inside --out")
    force: bool = param(False, help="replace a store of that --name already in --out")
    workers: int | None = param(None, help="encoding processes (default: all cores)")
    dedup: bool = param(False, help="drop exact duplicate documents")
    quality_cutoff: float | None = param(
        None, help="drop documents with more tokens per character than this (Cramming uses 0.3)"
    )
    shard_size: str | int | None = param(
        None,
        metavar="SIZE",
        help="split the store into shards of at most SIZE (e.g. 1GB) of tokens, NAME-00000.bin/.idx, ..., listed "
        "in NAME.json; each stages and opens on its own (default: one .bin/.idx pair)",
    )
    shard: str | None = param(
        None,
        metavar="I/N",
        help="tokenise only shard I of N (counted from 0) of the input files, into the store NAME-IIIII; run every "
        "shard with the same --out (on N machines), then `cramkit data join DIR`",
    )
    quiet: bool = param(False, help="no progress line")

    def shards(self) -> tuple[int | None, tuple[int, int] | None]:
        """``shard_size`` in bytes (``"1GB"``) and ``shard`` as (i, N), checked."""
        from cramkit.data.stage import parse_size
        from cramkit.runtime import parse_shard

        size = None if self.shard_size is None else parse_size(str(self.shard_size), "--shard-size")
        return size, None if self.shard is None else parse_shard(self.shard)

    def check(self, store: str) -> None:
        """No store ``store`` in ``out`` is replaced unless ``force``."""
        refuse_overwrite(self.out, [f"{store}{ext}" for ext in (".bin", ".idx", ".json")], self.force)


@dataclass
class DataJoinRequest:
    """The shards of ``data build --shard i/N`` joined into one store."""

    store: str | os.PathLike = param(positional=True, metavar="DIR", help="the --out of the shards")
    _: KW_ONLY
    name: str = param("train", help="store name inside DIR")


@dataclass
class DataInspectRequest:
    """A token store's counts, length histogram and decoded samples."""

    store: str | os.PathLike = param(positional=True, metavar="DIR", help="store directory (or NAME prefix / NAME.idx)")
    _: KW_ONLY
    name: str | None = param(None, help="store name when DIR holds several")
    tokenizer: str | os.PathLike | None = param(None, help="tokenizer to decode with (default: the store's copy)")
    samples: int = param(3, help="documents decoded and shown")
