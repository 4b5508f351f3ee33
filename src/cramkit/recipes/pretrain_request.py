"""What ``cramkit pretrain`` and ``cramkit.pretrain`` take, declared once (:mod:`cramkit.request`): the command
line's flags, the function's keywords and the request file torchrun's workers read come from here."""

from __future__ import annotations

import os
from dataclasses import KW_ONLY, dataclass
from typing import Any

from cramkit.request import Training, param
from cramkit.text.reading import Documents, Reading

SETTINGS_HELP = "override a setting, e.g. --set train.lr=1e-3 (repeatable)"


@dataclass
class PretrainRequest(Reading, Documents, Training):
    """A pretraining run: text (or a token store) and a budget in, a run directory out."""

    inputs: list[str] | str | os.PathLike | None = param(
        [],
        positional=True,
        metavar="SOURCE_OR_STORE",
        help="text files, directories, globs or hf:dataset sources; or one token store directory "
        "(default: the built-in corpus)",
    )
    _: KW_ONLY
    preset: str | None = param(
        None,
        help="tiny-cpu (the default), tiny-zh (the default when the text is Chinese), crammed-bert, bert-base, "
        "bert-lamb, continue (the default with --from) or a YAML file",
    )
    init: str | None = param(
        None,
        flags=("--from",),
        metavar="MODEL",
        help="continue this model on the text (domain/task adaptation): a run, checkpoint, model directory or "
        "hf:DIR; its tokenizer, architecture and masking are kept",
    )
    inherit: str | None = param(
        None,
        metavar="MODEL",
        help="train a new model (the preset's shape) on MODEL's tokenizer that learns from MODEL's predictions "
        "early in the run (knowledge inheritance; --set inherit.alpha/until/init)",
    )
    extend_vocab: int = param(
        0,
        metavar="N",
        help="with --from: add the N most frequent words of the text that the tokenizer splits into pieces (new "
        "embeddings start as the mean of their pieces')",
    )
    upcycle: bool = param(
        False,
        help="with --from a dense model and --set model.moe_experts=E: start a mixture of experts whose every "
        "expert is a copy of the model's feed-forward weights (the routers fresh)",
    )
    budget: str | None = param(None, help="training budget: 30s, 5m, 24h (time), 2e9tok (tokens), 1000steps")
    out: str | os.PathLike | None = param(None, help="run directory (default: runs/<preset>-<timestamp>)")
    resume: str | os.PathLike | None = param(
        None, metavar="RUN", help="continue the run in RUN from its latest checkpoint"
    )
    tokenizer: str | os.PathLike | None = param(None, metavar="DIR", help="use this tokenizer instead of training one")

    def __post_init__(self) -> None:
        raw = self.inputs
        self.inputs = [os.fspath(raw)] if isinstance(raw, (str, os.PathLike)) else [os.fspath(s) for s in raw or []]
        self.init = os.fspath(self.init) if self.init is not None else None
        self.inherit = os.fspath(self.inherit) if self.inherit is not None else None

    @property
    def sources(self) -> list[str]:
        return list(self.inputs)  # type: ignore[arg-type]  # a list after __post_init__

    def settings(self) -> list[str]:
        """The ``--set`` overrides with what the budget, the progress bar and the trackers stand for."""
        from cramkit.train.report import report_to_setting

        out = list(self.overrides)
        if self.budget:
            out.append(f"train.budget={self.budget}")
        if not self.progress:
            out.append("train.progress=false")
        if self.report_to is not None:
            out.append(f"train.report_to={report_to_setting(self.report_to)}")
        return out

    def source_options(self) -> dict[str, Any]:
        """The reading options that differ from the defaults, checked (an unknown encoding fails here)."""
        from cramkit.text.sources import check_source_options

        given = self.reading_options()
        check_source_options(**given)
        defaults = {"encoding": None, "errors": "strict", "text_field": "text", "doc_split": "auto"}
        return {k: v for k, v in given.items() if v != defaults[k]}
