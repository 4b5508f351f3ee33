"""cramkit.data: the token store (.bin/.idx), its parallel build, packing + masking, and the loader. Names load on
first use (:mod:`cramkit.lazy`): the command line reads the requests of ``cramkit data`` (:mod:`cramkit.data.request`)
without importing numpy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cramkit.lazy import lazy_names

if TYPE_CHECKING:
    from cramkit.data.build import build_store
    from cramkit.data.loader import MLMLoader, PretrainData
    from cramkit.data.mlm import DataConfig, PackedSequences, mask_tokens
    from cramkit.data.tokenstore import TokenStore, TokenStoreWriter

__all__ = [
    "DataConfig",
    "MLMLoader",
    "PackedSequences",
    "PretrainData",
    "TokenStore",
    "TokenStoreWriter",
    "build_store",
    "mask_tokens",
]
__getattr__ = lazy_names(
    __name__,
    {
        name: f"cramkit.data.{module}"
        for module, names in (
            ("build", ("build_store",)),
            ("loader", ("MLMLoader", "PretrainData")),
            ("mlm", ("DataConfig", "PackedSequences", "mask_tokens")),
            ("tokenstore", ("TokenStore", "TokenStoreWriter")),
        )
        for name in names
    },
)
