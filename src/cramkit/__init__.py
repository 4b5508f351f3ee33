"""cramkit: train BERT-style encoders on a budget.

Raw text -> WordPiece tokenizer -> memory-mapped token store -> budgeted masked-LM pretraining
(the Cramming recipe) -> fine-tuning and evaluation -> Hugging Face export.
"""

from __future__ import annotations

from typing import Any

from cramkit.errors import CramkitError
from cramkit.load import LoadedModel, load  # the function shadows the module name `cramkit.load`

__version__ = "0.1.0"
__all__ = ["CramkitError", "__version__", "LoadedModel", "load", "pretrain"]


def pretrain(*args: Any, **kwargs: Any) -> Any:
    """Pretrain an encoder; see :func:`cramkit.train.api.pretrain`."""
    from cramkit.train.api import pretrain as _pretrain

    return _pretrain(*args, **kwargs)
