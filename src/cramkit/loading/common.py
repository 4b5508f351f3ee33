"""What every reader of ``cramkit.load`` shares: weights checked against the model they go into, a model's
size against this machine's memory before anything is allocated, a config's default input limit, and the
tokenizer against the embedding it feeds."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError

if TYPE_CHECKING:  # torch is imported by the functions that need it: `cramkit --help` stays instant
    import torch
    from torch import nn

    from cramkit.model.loaded import LoadedModel


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], what: str, *, tied: bool = False) -> None:
    """Load ``state`` into ``model``, or a CramkitError naming ``what`` when they do not fit each other;
    with ``tied``, tied MLM weights stored under one name only are found under either."""
    if tied:  # tied weights may be stored under either name only
        word, decoder = "encoder.embeddings.word.weight", "head.decoder.weight"
        if decoder not in state and word in state:
            state[decoder] = state[word]
        elif word not in state and decoder in state:
            state[word] = state[decoder]
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise CramkitError(
            f"{what}: the weights do not fit the model its config describes (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}); the weights and the config come from different models"
        )
    for k, ref in expected.items():
        if tuple(state[k].shape) != tuple(ref.shape):
            raise CramkitError(
                f"{what}: weight {k} has shape {tuple(state[k].shape)} but the config implies {tuple(ref.shape)}; "
                "the weights and the config come from different models"
            )
    model.load_state_dict(state, strict=True)


def check_size(cfg: Any, file: Path) -> None:
    """Refuse, before allocating, a model (its config, or a module built on the meta device) too big for
    this machine's RAM to hold even its fp32 weights: a config read from a file (``cramkit-model.json``, a
    run's config.yaml, an HF config.json) may ask for any size. The parameter count is pretraining's."""
    from cramkit.model.config import config_parameters
    from cramkit.runtime import machine_memory

    params = config_parameters(cfg) if not hasattr(cfg, "parameters") else sum(p.numel() for p in cfg.parameters())
    have, where = machine_memory("cpu")
    if have is not None and params * 4 > have:
        raise CramkitError(
            f"{file} describes a model of about {params / 1e9:,.1f} billion parameters, needing at least "
            f"{params * 4 / 2**30:,.1f} GiB to load, but this machine has {have / 2**30:,.1f} GiB of {where}; the "
            "file is damaged or crafted, or the model is too big for this machine"
        )


def default_max_length(cfg: Any) -> int:
    """A model's input limit when nothing records one: its position table's rows (past RoBERTa's offset); with
    rotary positions the length it was trained to (max_position), at most 512."""
    if cfg.position == "rope":
        return min(512, int(cfg.max_position))
    return int(cfg.max_position) - int(getattr(cfg, "position_offset", 0))


def check_vocab(loaded: LoadedModel) -> None:
    """The tokenizer fits the model's embedding (sizes, [CLS] and [SEP] inside it), else one line."""
    cfg = loaded.config
    rows = getattr(cfg, "vocab_size", None)
    if rows is None:
        return
    vocab = loaded.tokenizer.get_vocab_size(with_added_tokens=True)
    # equal sizes, or model rows padded up to a multiple of 64 for speed (fewer than 128 extra rows)
    if not (vocab == rows or (vocab < rows < vocab + 128 and rows % 64 == 0)):
        raise CramkitError(
            f"{loaded.source}: the tokenizer has {vocab} tokens but the model's embedding has {rows} rows; "
            "the tokenizer and weights come from different vocabularies. Keep the tokenizer saved with them"
        )
    from cramkit.text.tokenizer import SPECIAL_ROLES, special_id

    for role in ("cls", "sep"):
        tid = special_id(loaded.tokenizer, role)
        if tid is None or tid >= rows:
            raise CramkitError(
                f"{loaded.source}: the tokenizer has no usable {' or '.join(SPECIAL_ROLES[role])} token; cramkit "
                "needs a BERT- or RoBERTa-style vocabulary with [CLS], [SEP] and [PAD] (or <s>, </s> and <pad>)"
            )
