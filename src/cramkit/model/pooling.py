"""Pooling, said once: its names, how sentence-transformers' files spell it, and the one "auto" rule.

``cls``: the first token's vector; ``mean``: the mean over the real tokens. Every stored value and flag uses
these names (``--pooling``, cramkit-model.json, head configs, ``st_pooling``, index and embedding manifests).
The first token's older name ``first`` (head configs, ``--set pooling=first``, Hugging Face exports written
before) is read as ``cls``, here and nowhere else. No torch at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, cast, get_args

from cramkit.errors import CramkitError

Pooling = Literal["cls", "mean"]
POOLINGS: tuple[Pooling, ...] = get_args(Pooling)
# a pooling setting (finetune's and contrastive's ``pooling``): auto (the model's own, :func:`pooling_for`), one
# of POOLINGS, or the first token's older name
PoolingSetting = Literal["auto", "cls", "mean", "first"]
_OLD_NAMES = {"first": "cls"}
# sentence-transformers' pooling modes before v5 (one flag each, ``pooling_mode_<mode>``), in its order
_ST_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")


class Described(Protocol):
    """What the auto rule reads of a model: :class:`~cramkit.model.loaded.LoadedModel` is one."""

    @property
    def kind(self) -> str: ...

    @property
    def pooling(self) -> str: ...

    @property
    def extra(self) -> dict[str, Any]: ...


def read_pooling(value: object, where: str = "pooling") -> Pooling:
    """``value`` (a file's or a setting's) as one of POOLINGS, ``first`` read as ``cls``; else one error line."""
    name = _OLD_NAMES.get(value, value) if isinstance(value, str) else value
    if name not in POOLINGS:
        raise CramkitError(f"{where}: {str(value)[:40]!r} is not a pooling cramkit computes (cls or mean)")
    return cast(Pooling, name)


def read_head(head: Mapping[str, Any] | None) -> dict[str, Any]:
    """A head config as a file holds it (cramkit-model.json's ``head``), its older pooling name renamed; the
    config's own reader checks the rest."""
    out = dict(head or {})
    if out.get("pooling") in _OLD_NAMES:
        out["pooling"] = _OLD_NAMES[out["pooling"]]
    return out


def declared_pooling(model: Described) -> Pooling | None:
    """The pooling ``model`` declares: sentence-transformers' (its folder, a run continued from one, an embedding
    model cramkit trained: ``extra.st_pooling``), else its head's (a classifier's); None for a bare encoder or a
    masked LM, whose ``pooling`` is only what ``cramkit embed`` uses by default."""
    st = model.extra.get("st_pooling")
    if st is not None:
        return read_pooling(st, "st_pooling")
    return None if model.kind in ("mlm", "encoder") else read_pooling(model.pooling)


def pooling_for(model: Described, setting: str = "auto", undeclared: Pooling = "mean") -> Pooling:
    """The pooling to train or read ``model`` with: ``setting``; ``auto``: the model's own
    (:func:`declared_pooling`), ``undeclared`` when it declares none."""
    if setting != "auto":
        return read_pooling(setting)
    return declared_pooling(model) or undeclared


def st_pooling_config(pooling: str, hidden: int) -> dict[str, Any]:
    """sentence-transformers' ``1_Pooling/config.json`` of ``pooling`` (the flags every version reads)."""
    mode = read_pooling(pooling)
    return {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }


def read_st_pooling(conf: Mapping[str, Any], file: Path) -> Pooling | None:
    """The pooling of sentence-transformers' ``1_Pooling/config.json``: ``pooling_mode`` (v5) or its
    ``pooling_mode_*`` flags (before); None when it names none. One it does not compute (max, last token,
    weighted mean, several) is one error line, never a silently different embedding."""
    mode = conf.get("pooling_mode")
    if mode is None:
        mode = [m.removesuffix("_tokens").removesuffix("_token") for m in _ST_MODES if conf.get(f"pooling_mode_{m}")]
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if mode == []:
        return None
    if mode in POOLINGS:
        return cast(Pooling, mode)
    raise CramkitError(
        f"{file}: sentence-transformers pooling {mode!r} is not one cramkit computes (cls or mean); its embeddings "
        "would differ from the model's own"
    )
