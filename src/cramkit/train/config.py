"""The run's configuration: one typed dataclass per layer, composed into :class:`RunConfig`.

``resolve_config("tiny-cpu", ["train.lr=1e-3"])`` reads the preset YAML, applies dotted overrides and
builds every section strictly (an unknown key lists the valid ones; an unknown preset lists presets).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cramkit import runtime
from cramkit.config import DEFAULT_PRESET, from_dict, load_preset, merge, parse_overrides, to_dict
from cramkit.data.mlm import DataConfig
from cramkit.errors import CramkitError
from cramkit.model.config import ModelConfig, config_parameters
from cramkit.runtime import Precision
from cramkit.text import MIN_FREQUENCY, VOCAB_SIZE
from cramkit.text.tokenizer import LANGS, MAX_VOCAB_SIZE
from cramkit.train.budget import Budget, parse_budget, parse_every
from cramkit.train.distributed import ParallelConfig
from cramkit.train.parallel import check_ep
from cramkit.train.pipeline import check_pp, stages_per_rank
from cramkit.train.report import report_to_setting, require_trackers
from cramkit.train.schedule import SCHEDULES
from cramkit.train.tensor_parallel import check_tp


@dataclass
class TokenizerConfig:
    """WordPiece tokenizer trained on the run's sources (unless a tokenizer or a store is given)."""

    vocab_size: int = VOCAB_SIZE
    lowercase: bool = True
    strip_accents: bool = True
    min_frequency: int = MIN_FREQUENCY
    lang: str = "auto"  # zh: character-level for Chinese; generic: BERT's; auto: zh when the text is Chinese

    def validate(self) -> None:
        if self.lang not in ("auto", *LANGS):
            raise CramkitError(f"tokenizer.lang must be auto, {' or '.join(LANGS)}, got {self.lang!r}")
        if not 100 <= self.vocab_size <= MAX_VOCAB_SIZE:
            raise CramkitError(
                f"tokenizer.vocab_size must be between 100 and {MAX_VOCAB_SIZE:,}, got {self.vocab_size:,} "
                f"({VOCAB_SIZE} is usual; BERT uses 30522)"
            )
        if self.min_frequency < 1:
            raise CramkitError(f"tokenizer.min_frequency must be at least 1, got {self.min_frequency}")


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
    # sequences per forward/backward on each process; auto: the largest of 8..256 whose activations fit in a
    # GPU's memory (resolve_micro_batch), 32 on a CPU
    micro_batch: int | str = 64
    batch_size: int = 8192  # target global batch in sequences (reached through gradient accumulation)
    batch_ramp: float = 0.6  # fraction of the budget at which the global batch reaches batch_size
    grad_clip: float = 0.5  # max global gradient norm (0 = off)
    precision: Precision = "auto"  # runtime.precision_rule: auto is bf16 on CUDA and native-bf16 CPUs, else fp32
    fp8_recipe: Literal["tensorwise", "rowwise"] = "tensorwise"  # torchao's float8 scaling (precision fp8)
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
    progress: bool | str = "auto"  # auto: a bar in a terminal, a line every 10 s in a log; true: a bar; false: none
    threads: int = 0  # torch CPU threads (0 = PyTorch's default)
    # pretrain --from a model without an MLM head: the fresh head learns at this multiple of train.lr (the
    # encoder at train.lr), so that it catches up before its random gradients move the encoder far
    fresh_head_lr_scale: float = 10.0
    # pretrain --from: train the MLM head only, the encoder (and its tied embeddings) frozen: a head for
    # prompt-based fine-tuning in minutes, the model's own outputs untouched
    head_only: bool = False
    # pretrain --from: anchors to the starting model, so that adapting it to new text keeps what made it
    # useful. keep_vectors: weight of (1 - cosine) between each training sequence's mean-pooled vector and
    # the starting model's (frozen, on the same input): its sentence vectors as an auxiliary target.
    # l2sp: alpha of alpha/2 * ||theta - theta_0||^2 over the encoder's weights (L2-SP, Li et al. 2018)
    keep_vectors: float = 0.0
    l2sp: float = 0.0
    # experiment trackers that also receive metrics.jsonl's records: none, or tensorboard, wandb, mlflow, trackio
    # (comma-separated); their files go into the run directory (train/report.py)
    report_to: str = "none"

    @functools.cached_property
    def parsed_budget(self) -> Budget:
        """``budget`` read once (the text stays as written, for config.yaml and the checkpoints): what every
        reader of the budget uses. Set ``budget`` before reading this, or replace the config."""
        return self.read_budget(self.budget)

    @staticmethod
    def read_budget(text: str, where: str = "train.budget") -> Budget:
        """A budget's text read, or one CramkitError line naming ``where`` (the one reader of budget texts)."""
        return parse_budget(text, where)

    @property
    def micro(self) -> int:
        """``micro_batch`` as a number (``auto`` is resolved by the pretraining recipe; unresolved: the CPU's)."""
        return self.micro_batch if isinstance(self.micro_batch, int) else AUTO_MICRO_CPU

    def validate(self) -> None:
        _ = self.parsed_budget  # read here, once: a bad text is one line
        parse_every(self.checkpoint_every, "train.checkpoint_every")
        parse_every(self.eval_every, "train.eval_every")
        if isinstance(self.micro_batch, str) and self.micro_batch != "auto":
            raise CramkitError(f"train.micro_batch must be a positive number or auto, got {self.micro_batch!r}")
        if (isinstance(self.micro_batch, int) and self.micro_batch <= 0) or self.batch_size <= 0:
            raise CramkitError(
                f"train.micro_batch ({self.micro_batch}) and train.batch_size ({self.batch_size}) must be positive"
            )
        if not 0.0 < self.lr <= 1.0:
            raise CramkitError(f"train.lr must be a positive learning rate of at most 1, got {self.lr} (1e-3 is usual)")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise CramkitError(f"train.betas must be two numbers in [0, 1), got {list(self.betas)} (0.9,0.98 is usual)")
        if not 0.0 < self.eps < 1.0:
            raise CramkitError(f"train.eps must be a small positive number, got {self.eps} (1e-12 is usual)")
        if not 0.0 <= self.weight_decay < 1.0:
            raise CramkitError(f"train.weight_decay must be in [0, 1), got {self.weight_decay} (0.01 is usual)")
        if self.grad_clip < 0:
            raise CramkitError(f"train.grad_clip must be 0 (off) or a positive norm, got {self.grad_clip}")
        for name, low in (("log_every", 1), ("eval_batches", 1), ("threads", 0), ("seed", 0)):
            if getattr(self, name) < low:
                raise CramkitError(f"train.{name} must be at least {low}, got {getattr(self, name)}")
        if isinstance(self.micro_batch, int) and self.batch_size < self.micro_batch:
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
        if not 0.0 < self.fresh_head_lr_scale <= 1000.0:
            raise CramkitError(f"train.fresh_head_lr_scale must be in (0, 1000], got {self.fresh_head_lr_scale}")
        for name in ("keep_vectors", "l2sp"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 1e6):
                raise CramkitError(f"train.{name} must be a weight in [0, 1e6] (0: off), got {value!r}")
        self.report_to = report_to_setting(self.report_to, "train.report_to")
        if self.keep_checkpoints < 1:
            raise CramkitError(f"train.keep_checkpoints must be at least 1, got {self.keep_checkpoints}")
        if self.max_nan_steps < 1:
            raise CramkitError(f"train.max_nan_steps must be at least 1, got {self.max_nan_steps}")
        assert self.schedule in SCHEDULES


@dataclass
class ExampleSettings:
    """The settings every recipe over examples shares (fine-tuning and distillation: ``--set KEY=VALUE``), with
    their one check. Each recipe's config adds its own (and its own defaults for the rest)."""

    weight_decay: float = 0.01  # on weight matrices only (biases, norms and scalars excluded)
    max_length: int = 128  # tokens per input (pairs together); longer inputs are cut
    max_train_examples: int = 0  # use only the first N training examples (0: all)
    dropout: float = 0.1  # the encoder's hidden dropout and the head's (a BiLSTM's: its own)
    device: str = "auto"  # auto | cpu | cuda | cuda:1
    precision: Precision = "auto"  # runtime.precision_rule: auto is bf16 on CUDA and native-bf16 CPUs, else fp32
    checkpoint_every: str = "5m"  # a training killed midway resumes from its last checkpoint ('never': off)
    report_to: str = "none"  # experiment trackers that also get metrics.jsonl's records (--report-to)

    def check_shared(self, prefix: str = "") -> None:
        """The shared settings' check; ``prefix`` names the section in the line (``finetune.``)."""
        if self.max_length < 3:
            raise CramkitError(f"{prefix}max_length must be at least 3, got {self.max_length}")
        if self.max_train_examples < 0:
            raise CramkitError(f"{prefix}max_train_examples must be 0 (all) or positive, got {self.max_train_examples}")
        if not 0.0 <= self.dropout < 1.0:
            raise CramkitError(f"{prefix}dropout must be in [0, 1), got {self.dropout}")
        parse_every(self.checkpoint_every, f"{prefix}checkpoint_every")
        self.report_to = report_to_setting(require_trackers(self.report_to))


def example_config(
    *,
    budget: str,
    lr: float,
    batch_size: int,
    weight_decay: float,
    schedule: Any,
    precision: Any,
    device: str,
    seed: int,
    checkpoint_every: str,
    report_to: str = "none",
    micro_batch: int | None = None,
    warmup: float | None = None,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-12,
    grad_clip: float = 0.0,
    compile: bool | str = False,
    eval_every: str = "never",
    log_every: int = 1,
    progress: bool | str = False,
    threads: int = 0,
) -> TrainConfig:
    """The engine's settings for a recipe over examples (fine-tuning, distillation, the contrastive stage), the
    one translation of their configs: AdamW, a fixed batch (no ramp; ``micro_batch`` defaults to the batch),
    one checkpoint kept. With a ``warmup`` fraction the rate starts at 0, peaks there and decays over the rest
    (no decay with the ``constant`` schedule); without one, the schedule's own shape."""
    cooldown = lr_start = None
    if warmup is not None:
        cooldown = 0.0 if schedule == "constant" else 1.0 - warmup
        lr_start = 0.0 if warmup > 0 else 1.0
    return TrainConfig(
        budget=budget,
        optimizer="adamw",
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        schedule=schedule,
        warmup=warmup,
        cooldown=cooldown,
        lr_start=lr_start,
        micro_batch=micro_batch or batch_size,
        batch_size=batch_size,
        batch_ramp=0.0,
        grad_clip=grad_clip,
        precision=precision,
        compile=compile,
        device=device,
        seed=seed,
        checkpoint_every=checkpoint_every,
        keep_checkpoints=1,
        eval_every=eval_every,
        log_every=log_every,
        progress=progress,
        threads=threads,
        report_to=report_to,
    )


@dataclass
class InheritConfig:
    """Knowledge inheritance (``pretrain --inherit TEACHER``): loss = (1 - a) MLM + a KL(teacher || student)."""

    alpha: float = 0.5  # the teacher's weight at the start; falls linearly to 0 at ``until``
    until: float = 0.3  # fraction of the budget after which the teacher is released
    temperature: float = 1.0  # softening of both distributions in the KL term
    init: Literal["none", "teacher"] = "none"  # teacher: copy its weights (same width; layers repeated)

    def validate(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise CramkitError(f"inherit.alpha must be in [0, 1], got {self.alpha} (0.5 is usual)")
        if not 0.0 < self.until <= 1.0:
            raise CramkitError(f"inherit.until must be in (0, 1], a fraction of the budget; got {self.until}")
        if not 0.0 < self.temperature <= 100.0:
            raise CramkitError(f"inherit.temperature must be positive, got {self.temperature} (1 is usual)")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    inherit: InheritConfig = field(default_factory=InheritConfig)

    def validate(self) -> None:
        check_tp(self.model, self.parallel.tp)
        check_pp(self.model, self.parallel.pp, virtual=stages_per_rank(self.parallel))
        check_ep(self.model, self.parallel.ep)

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
    preset: str = DEFAULT_PRESET, overrides: Iterable[str] = (), base: Mapping[str, Any] | None = None
) -> RunConfig:
    """Preset (or ``base``, e.g. a run's saved config) + ``--set`` overrides -> a validated RunConfig."""
    data = dict(base) if base is not None else load_preset(preset)
    data = merge(data, parse_overrides(list(overrides)))
    return build_config(data)


# bytes per parameter while training in fp32 with Adam/LAMB: weights 4, gradients 4, two moments 8
TRAIN_BYTES_PER_PARAM = 16


def estimate_training_bytes(cfg: RunConfig, vocab_size: int | None = None) -> tuple[int, int]:
    """(parameters, bytes) a pretraining process needs at least: fp32 weights, gradients and optimizer
    state, plus the activations of one micro-batch kept for the backward pass (a lower bound)."""
    m = cfg.model if vocab_size is None else cfg.model.replace(vocab_size=vocab_size)
    params = config_parameters(m)
    tokens = cfg.train.micro * cfg.data.seq_len
    act_bytes = 4 if cfg.train.precision == "fp32" else 2  # auto may pick bf16: count the least
    per_layer = tokens * (6 * m.hidden + m.intermediate) * act_bytes
    layers_kept = 1 if m.gradient_checkpointing else m.layers
    buffers = m.max_position * m.hidden * 4 if m.position == "sinusoidal" else 0
    return params, params * TRAIN_BYTES_PER_PARAM + layers_kept * per_layer + buffers


def _count(n: int) -> str:
    return f"{n / 1e9:,.1f} billion" if n >= 1e9 else f"{n / 1e6:,.1f} million"


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


# train.micro_batch=auto: the candidates, the largest first, and the share of a GPU's memory they may take by
# estimate_training_bytes (a lower bound: crammed-bert measured 1.86-1.88x it on an H200 at 128-512)
AUTO_MICRO_BATCHES = (256, 128, 64, 32, 16, 8)
AUTO_MICRO_CPU = 32
MEASURED_OVER_ESTIMATE = 1.9
AUTO_MEMORY_SHARE = 0.75


def resolve_micro_batch(cfg: RunConfig, vocab_size: int | None = None) -> tuple[RunConfig, str | None]:
    """``cfg`` with ``train.micro_batch=auto`` made a number, and the reason in words (None: it was one).
    On a GPU the largest of AUTO_MICRO_BATCHES whose training memory fits in AUTO_MEMORY_SHARE of it (more
    sequences per pass keep the matrix units busier: 36% MFU at 256 against 27% at 128 on an H200); on a CPU
    AUTO_MICRO_CPU. Never more than the batch itself."""
    if cfg.train.micro_batch != "auto":
        return cfg, None
    have, what = runtime.machine_memory(cfg.train.device)
    chosen, why = AUTO_MICRO_CPU, "on a CPU"
    if have is not None and what.startswith("GPU"):
        chosen, why = AUTO_MICRO_BATCHES[-1], f"the smallest; {what} is small for this model"
        for size in AUTO_MICRO_BATCHES:
            trial = cfg.replace(train=dataclasses.replace(cfg.train, micro_batch=size))
            need = estimate_training_bytes(trial, vocab_size)[1] * MEASURED_OVER_ESTIMATE
            if need <= AUTO_MEMORY_SHARE * have:
                chosen, why = size, f"about {_gib(need)} of {_gib(have)} of {what}"
                break
    chosen = min(chosen, cfg.train.batch_size)
    resolved = cfg.replace(train=dataclasses.replace(cfg.train, micro_batch=chosen))
    return resolved, f"train.micro_batch auto: {chosen} ({why})"


def check_fits(cfg: RunConfig, vocab_size: int | None = None) -> None:
    """CramkitError, before anything is allocated, when the model cannot train in this machine's memory."""
    need: float
    params, need = estimate_training_bytes(cfg, vocab_size)
    have, what = runtime.machine_memory(cfg.train.device)
    # FSDP shards weights, gradients and optimizer state over all ranks (with TP: 1/tp of each layer,
    # then FSDP over the groups), tensor parallelism alone over its tp ranks
    # (pipeline parallelism: 1/pp of the blocks on each rank)
    shards = runtime.torchrun().world if cfg.parallel.strategy == "fsdp" else cfg.parallel.tp * cfg.parallel.pp
    need -= params * TRAIN_BYTES_PER_PARAM * (1 - 1 / max(1, shards))
    if have is not None and need > have:
        m = cfg.model
        raise CramkitError(
            f"model.layers={m.layers} model.hidden={m.hidden} model.intermediate={m.intermediate}: about "
            f"{_count(params)} parameters, needing at least {_gib(need)} to train, but this machine has "
            f"{_gib(have)} of {what}; choose smaller model settings (tiny-cpu: hidden 256, 4 layers) or "
            "train.micro_batch"
        )
