"""The run's configuration: one typed dataclass per layer, composed into :class:`RunConfig`.

``resolve_config("tiny-cpu", ["train.lr=1e-3"])`` reads the preset YAML, applies dotted overrides and
builds every section strictly (an unknown key lists the valid ones; an unknown preset lists presets).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cramkit.config import from_dict, load_preset, merge, parse_overrides, to_dict
from cramkit.data.mlm import DataConfig
from cramkit.errors import CramkitError
from cramkit.model.encoder import ModelConfig
from cramkit.train.budget import parse_budget, parse_every
from cramkit.train.parallel import ParallelConfig
from cramkit.train.schedule import SCHEDULES


@dataclass
class TokenizerConfig:
    """WordPiece tokenizer trained on the run's sources (unless a tokenizer or a store is given)."""

    vocab_size: int = 32768
    lowercase: bool = True
    strip_accents: bool = True
    min_frequency: int = 2

    def validate(self) -> None:
        if self.vocab_size < 100:
            raise CramkitError(f"tokenizer.vocab_size must be at least 100, got {self.vocab_size}")


@dataclass
class TrainConfig:
    """The recipe: budget, optimizer, schedule, batch, precision, checkpoints (Cramming's defaults)."""

    budget: str = "3m"  # '30s', '5m', '24h' (training time), '2e9tok' (tokens), '1000steps'
    optimizer: Literal["adamw", "lamb"] = "adamw"
    lr: float = 1e-3  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-12
    weight_decay: float = 0.01  # on weight matrices and embeddings; never on biases and norms
    schedule: Literal["budget-triangle", "one-cycle", "linear", "constant"] = "budget-triangle"
    warmup: float | None = None  # fraction of the budget to reach the peak (None: the schedule's own)
    cooldown: float | None = None  # fraction of the budget at the end spent decaying
    lr_start: float | None = None  # learning rate at the start, as a fraction of the peak
    micro_batch: int = 64  # sequences per forward/backward on each process
    batch_size: int = 8192  # target global batch in sequences (reached through gradient accumulation)
    batch_ramp: float = 0.6  # fraction of the budget at which the global batch reaches batch_size
    grad_clip: float = 0.5  # max global gradient norm (0 = off)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    compile: bool | str = "auto"  # torch.compile the encoder; auto: on for CUDA, off on CPU
    device: str = "auto"  # auto, cpu, cuda, cuda:1
    seed: int = 0
    deterministic: bool | str = "auto"  # torch.use_deterministic_algorithms; auto: on for CPU
    checkpoint_every: str = "15m"  # '10m', '500steps', 'never' (a checkpoint is always saved at the end)
    keep_checkpoints: int = 2
    eval_every: str = "5m"  # validation MLM loss on held-out documents; also at the end
    eval_batches: int = 32  # micro-batches of held-out data per evaluation
    log_every: int = 10  # optimizer steps between lines in metrics.jsonl
    max_nan_steps: int = 5  # stop after this many non-finite losses in a row
    progress: bool | str = "auto"  # tqdm progress bar; auto: when stderr is a terminal
    threads: int = 0  # torch CPU threads (0 = PyTorch's default)

    def validate(self) -> None:
        parse_budget(self.budget)
        parse_every(self.checkpoint_every, "train.checkpoint_every")
        parse_every(self.eval_every, "train.eval_every")
        if self.micro_batch <= 0 or self.batch_size <= 0:
            raise CramkitError("train.micro_batch and train.batch_size must be positive")
        if self.batch_size < self.micro_batch:
            raise CramkitError(
                f"train.batch_size ({self.batch_size}) is smaller than train.micro_batch ({self.micro_batch}); "
                "lower train.micro_batch or raise train.batch_size"
            )
        if not 0.0 <= self.batch_ramp < 1.0:
            raise CramkitError(f"train.batch_ramp must be in [0, 1), got {self.batch_ramp}")
        for name in ("warmup", "cooldown", "lr_start"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise CramkitError(f"train.{name} must be in [0, 1], got {value}")
        for name in ("compile", "deterministic", "progress"):
            if isinstance(getattr(self, name), str) and getattr(self, name) != "auto":
                raise CramkitError(f"train.{name} must be true, false or auto, got {getattr(self, name)!r}")
        if self.keep_checkpoints < 1:
            raise CramkitError(f"train.keep_checkpoints must be at least 1, got {self.keep_checkpoints}")
        if self.max_nan_steps < 1:
            raise CramkitError(f"train.max_nan_steps must be at least 1, got {self.max_nan_steps}")
        assert self.schedule in SCHEDULES


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def to_dict(self) -> dict[str, Any]:
        return _plain(to_dict(self))

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)


def _plain(value: Any) -> Any:
    """Tuples -> lists, recursively (for YAML/JSON)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def build_config(data: Mapping[str, Any]) -> RunConfig:
    """A RunConfig from a nested dict (a preset, a run's config.yaml), strictly."""
    return from_dict(RunConfig, data, "config")


def resolve_config(
    preset: str = "tiny-cpu", overrides: Iterable[str] = (), base: Mapping[str, Any] | None = None
) -> RunConfig:
    """Preset (or ``base``, e.g. a run's saved config) + ``--set`` overrides -> a validated RunConfig."""
    data = dict(base) if base is not None else load_preset(preset)
    data = merge(data, parse_overrides(list(overrides)))
    return build_config(data)
