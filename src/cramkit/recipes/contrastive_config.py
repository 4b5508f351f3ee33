"""The contrastive stage's settings (``cramkit finetune --objective contrastive|simcse``, ``--set KEY=VALUE``):
:class:`ContrastiveConfig`, read from overrides by :func:`config_from`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cramkit.config import from_dict
from cramkit.errors import CramkitError
from cramkit.model.pooling import PoolingSetting


@dataclass
class ContrastiveConfig:
    """``cramkit finetune --objective contrastive|simcse`` (``--set KEY=VALUE``)."""

    objective: Literal["contrastive", "simcse"] = "contrastive"
    budget: str = ""  # '' : ``epochs`` epochs over the pairs; else the engine's ('10m', '2000steps', '5e6tok')
    epochs: float = 1.0
    batch_size: int = 64  # pairs per step: each anchor's negatives are the batch's other positives
    micro_batch: int = 0  # 0: the batch at once; smaller: cached negatives (activation checkpointing)
    gather_negatives: bool = True  # under torchrun: every process's vectors are each anchor's negatives
    lr: float | Literal["auto"] = "auto"  # auto: 2e-5 from width 384 up (sentence-transformers'), 1e-3 below
    warmup: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    temperature: float = 0.05
    learn_temperature: bool = False
    symmetric: bool = False
    matryoshka: str = ""  # e.g. "256,128,64": leading dimensions trained too
    pooling: PoolingSetting = "auto"  # auto: the model's own (pooling_for), mean when it declares none
    max_length: int = 128
    dropout: float = 0.1  # simcse's noise; the model's dropout otherwise too
    dev_fraction: float = 0.05  # of the pairs held out (at most max_dev) when no --dev is given
    max_dev: int = 1000
    max_train_examples: int = 0
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"
    eval_every: str = "never"  # the engine's: '200steps', '5m'; the end is always scored
    checkpoint_every: str = "5m"
    report_to: str = "none"  # experiment trackers that also get metrics.jsonl's records (--report-to)
    # named prompts (E5's "query: " / "passage: "): anchors get query_prompt, positives and negatives
    # passage_prompt; recorded in the model (extra.prompts: query, passage) for embed/serve/index
    query_prompt: str = ""
    passage_prompt: str = ""
    default_prompt_name: str = ""  # '', 'query' or 'passage': the prompt an input gets when none is named

    def validate(self) -> None:
        if self.objective not in ("contrastive", "simcse"):
            raise CramkitError(f"--objective is contrastive or simcse, got {self.objective!r}")
        if self.batch_size < 2:
            raise CramkitError(f"contrastive batch_size must be at least 2 (in-batch negatives), got {self.batch_size}")
        if self.micro_batch < 0 or self.micro_batch > self.batch_size:
            raise CramkitError(f"micro_batch must be 0 or 1..batch_size ({self.batch_size}), got {self.micro_batch}")
        if not 0 < self.temperature <= 10:
            raise CramkitError(f"temperature must be in (0, 10], got {self.temperature}")
        if self.lr != "auto" and (not isinstance(self.lr, (int, float)) or self.lr <= 0) or self.epochs <= 0:
            raise CramkitError(f"lr and epochs must be positive, got {self.lr}, {self.epochs}")
        if not 0 <= self.dev_fraction < 1:
            raise CramkitError(f"dev_fraction must be in [0, 1), got {self.dev_fraction}")
        matryoshka_dims(self.matryoshka, None)
        if (self.query_prompt or self.passage_prompt) and self.objective == "simcse":
            raise CramkitError(
                "--query-prompt/--passage-prompt apply to --objective contrastive (an anchor and its positive); "
                "simcse's two views are the same text"
            )
        named = self.prompts()
        if self.default_prompt_name and self.default_prompt_name not in named:
            raise CramkitError(
                f"--default-prompt-name {self.default_prompt_name!r}: give one of the prompts set "
                f"({', '.join(named) or 'none: add --query-prompt TEXT or --passage-prompt TEXT'})"
            )
        from cramkit.train.report import report_to_setting, require_trackers

        self.report_to = report_to_setting(require_trackers(self.report_to))

    def prompts(self) -> dict[str, str]:
        """The named prompts the model records: {"query": ..., "passage": ...} (the ones set)."""
        return {k: v for k, v in (("query", self.query_prompt), ("passage", self.passage_prompt)) if v}


def config_from(overrides: dict[str, Any] | None = None) -> ContrastiveConfig:
    """A ContrastiveConfig from ``--set`` overrides (unknown keys are errors)."""
    cfg = from_dict(ContrastiveConfig, dict(overrides or {}), "contrastive")
    cfg.validate()
    return cfg


def matryoshka_dims(text: str, hidden: int | None) -> list[int]:
    """``"256,128,64"`` -> [256, 128, 64] (each positive, below ``hidden`` when known)."""
    if not text:
        return []
    try:
        dims = sorted({int(x) for x in str(text).split(",") if x.strip()}, reverse=True)
    except ValueError:
        raise CramkitError(f"matryoshka {text!r}: give dimensions separated by commas, e.g. 256,128,64") from None
    if any(d < 1 for d in dims) or (hidden is not None and any(d > hidden for d in dims)):
        raise CramkitError(f"matryoshka {text!r}: each dimension must be in 1..{hidden or 'the hidden size'}")
    return [d for d in dims if hidden is None or d < hidden]
