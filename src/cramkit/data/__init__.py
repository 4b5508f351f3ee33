"""cramkit.data: the token store (.bin/.idx), its parallel build, packing + masking, and the loader."""

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
