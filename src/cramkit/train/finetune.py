"""Fine-tuning an encoder on a task: load, tokenise, bucket, train, evaluate, report.

One set of hyperparameters for every task by default: Cramming's "GLUE-sane" recipe (Geiping &
Goldstein 2023, ``cramming/config/eval/GLUE_sane.yaml``), see :class:`FinetuneConfig`. Batches are
padded only to their longest member, and examples of similar length are batched together (length
bucketing), so almost no compute is spent on padding; evaluation runs on length-sorted batches.

    results = finetune(get_task("glue/sst2", data_dir="glue"), "runs/tiny", FinetuneConfig(), "out/sst2")
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cramkit.config import from_dict, to_dict
from cramkit.data.batching import Encoded, bucketed_batches, collate, encode_examples
from cramkit.errors import CramkitError
from cramkit.load import LoadedModel
from cramkit.tasks.registry import Task

PathLike = str | os.PathLike


@dataclass
class FinetuneConfig:
    """Fine-tuning hyperparameters; the defaults are one recipe for every task.

    Defaults follow Cramming's GLUE-sane evaluation config: AdamW (lr 4e-5, betas 0.9/0.98, eps 1e-6),
    batch size 16, 5 epochs, linear warmup over the first 10% of steps then cosine decay to 0, no
    gradient clipping, max_length 128, first-token pooling through a dense+tanh pooler, dropout 0.1
    (re-enabled for fine-tuning, as Cramming does). Weight decay 0.01 on matrices only (biases, norms
    and scalars excluded, like Cramming's ``limited_decay_keys`` and the HF Trainer); Cramming's own
    GLUE-sane file sets 0.0, which ``--set weight_decay=0`` reproduces.
    """

    lr: float = 4e-5
    batch_size: int = 16
    epochs: float = 5.0  # Cramming's "GLUE-sane" rule: at most 5 epochs
    warmup: float = 0.1  # fraction of all steps
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    grad_clip: float = 0.0  # 0 = no clipping (Cramming)
    max_length: int = 128
    pooling: Literal["first", "mean"] = "first"
    pooler_dense: bool = True
    dropout: float = 0.1  # encoder hidden dropout and classifier dropout
    attention_dropout: float = 0.1
    seeds: list[int] = field(default_factory=lambda: [0])  # several seeds: the median is reported
    eval_batch_size: int = 128
    bucket_chunk: int = 50  # batches per chunk sorted by length (length bucketing); 0 = no bucketing
    max_train_examples: int = 0  # use only the first N training examples (0 = all)
    device: str = "auto"  # auto | cpu | cuda | cuda:1 | mps
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto = bf16 autocast on CUDA, fp32 elsewhere

    def validate(self) -> None:
        for name in ("lr", "batch_size", "epochs", "max_length", "eval_batch_size"):
            if getattr(self, name) <= 0:
                raise CramkitError(f"finetune.{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.warmup < 1.0:
            raise CramkitError(f"finetune.warmup is a fraction of the steps in [0, 1), got {self.warmup}")
        if len(self.betas) != 2:
            raise CramkitError(f"finetune.betas needs two numbers, e.g. [0.9, 0.98]; got {self.betas}")
        if not self.seeds:
            raise CramkitError("finetune.seeds is empty; give at least one seed, e.g. --seeds 0")
        if self.max_length < 3:
            raise CramkitError(f"finetune.max_length must be at least 3, got {self.max_length}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise CramkitError(f"finetune.{name} must be in [0, 1), got {getattr(self, name)}")


# ---------------------------------------------------------------------------------------------------
# Training and evaluation


def resolve_device(name: str):
    import torch

    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise CramkitError(
            f"finetune.device: unknown device '{name}'; use auto, cpu, cuda or cuda:N"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CramkitError("finetune.device=cuda but no CUDA device is available; use device=cpu or auto")
    return device


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the peak learning rate at ``step``: linear warmup, then cosine/linear decay to 0."""
    if step < warmup:
        return step / max(1, warmup)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def build_model(loaded: LoadedModel, num_labels: int, cfg: FinetuneConfig, *, multilabel: bool = False):
    """A SequenceClassifier on the loaded model's encoder (and BERT pooler, when it has one)."""
    import torch

    from cramkit.model.heads import ClassifierConfig, SequenceClassifier

    encoder = loaded.encoder
    if encoder is None:
        raise CramkitError(
            f"--from {loaded.source}: a {loaded.architecture} model has no transformer encoder to fine-tune"
        )
    model_cfg = loaded.config.replace(
        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, gradient_checkpointing=False
    )
    head = ClassifierConfig(pooling=cfg.pooling, pooler_dense=cfg.pooler_dense, dropout=cfg.dropout)
    model = SequenceClassifier(model_cfg, num_labels, head, multilabel=multilabel)
    model.encoder.load_state_dict(encoder.state_dict(), strict=True)
    pooler = getattr(loaded.model, "pooler", None)
    pooler_state = pooler.state_dict() if pooler is not None else loaded.pooler_state
    if pooler_state is not None and model.pooler is not None and cfg.pooling == "first":
        with torch.no_grad():
            model.pooler.weight.copy_(pooler_state["weight"])
            model.pooler.bias.copy_(pooler_state["bias"])
    return model


def _optimizer(model, cfg: FinetuneConfig, device):
    import torch

    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    kwargs = {"lr": cfg.lr, "betas": tuple(cfg.betas), "eps": cfg.eps}
    if device.type in ("cuda", "cpu"):
        kwargs["fused"] = True  # one kernel over all parameters instead of a Python loop
    return torch.optim.AdamW(groups, **kwargs)


def predict(model, enc: Encoded, cfg: FinetuneConfig, device, pad_id: int, with_types: bool) -> np.ndarray:
    """Logits for every example (in the given order), computed on length-sorted batches."""
    import torch

    model.eval()
    order = np.argsort(enc.lengths, kind="stable")
    out = np.zeros((len(enc), model.num_labels), dtype=np.float32)
    amp = _autocast(cfg, device)
    with torch.inference_mode():
        for s in range(0, len(order), cfg.eval_batch_size):
            batch = order[s : s + cfg.eval_batch_size]
            inputs = {
                k: (v.to(device) if v is not None else None)
                for k, v in collate(enc, batch, pad_id, with_types).items()
            }
            with amp:
                _, logits = model(**inputs)
            out[batch] = logits.float().cpu().numpy()
    return out


def _autocast(cfg: FinetuneConfig, device):
    import contextlib

    import torch

    use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
    if use_bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_one_seed(
    loaded: LoadedModel,
    train: Encoded,
    num_labels: int,
    cfg: FinetuneConfig,
    seed: int,
    *,
    progress: bool = True,
    desc: str = "finetune",
):
    """Train a fresh classifier on ``train`` with ``seed``; returns (model, stats)."""
    import torch
    from tqdm import tqdm

    device = resolve_device(cfg.device)
    torch.manual_seed(seed)
    model = build_model(loaded, num_labels, cfg).to(device)
    model.train()
    opt = _optimizer(model, cfg, device)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    warmup = int(cfg.warmup * total)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, warmup, cfg.schedule))
    rng = np.random.default_rng(seed)
    pad_id = loaded.pad_id
    with_types = loaded.with_types
    labels = torch.from_numpy(train.labels)
    amp = _autocast(cfg, device)

    losses: list[float] = []
    seen, step, start = 0, 0, time.perf_counter()
    bar = tqdm(total=total, desc=desc, unit="step", disable=not progress, dynamic_ncols=True, leave=False)
    while step < total:
        for batch in bucketed_batches(train.lengths, cfg.batch_size, cfg.bucket_chunk, rng):
            if step >= total:
                break
            inputs = {
                k: (v.to(device) if v is not None else None)
                for k, v in collate(train, batch, pad_id, with_types).items()
            }
            with amp:
                loss, _ = model(**inputs, labels=labels[batch].to(device))
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            seen += len(batch)
            losses.append(loss.item())
            if progress and (step % 10 == 0 or step == total):
                rate = seen / max(1e-9, time.perf_counter() - start)
                bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", ex_s=f"{rate:.0f}")
                bar.update(step - bar.n)
    bar.close()
    elapsed = time.perf_counter() - start
    stats = {
        "seed": seed,
        "steps": step,
        "examples_seen": seen,
        "train_seconds": round(elapsed, 3),
        "examples_per_s": round(seen / max(1e-9, elapsed), 2),
        "loss_curve": _curve(losses),
        "first_loss": losses[0],
        "last_loss": float(np.mean(losses[-max(1, len(losses) // 10) :])),
    }
    return model, stats


def _curve(losses: list[float], points: int = 100) -> list[float]:
    """The loss averaged over (at most) ``points`` equal slices of training."""
    if len(losses) <= points:
        return [round(v, 5) for v in losses]
    return [round(float(np.mean(part)), 5) for part in np.array_split(np.asarray(losses), points)]


def finetune(
    task: Task,
    source: PathLike | LoadedModel,
    cfg: FinetuneConfig | None = None,
    out_dir: PathLike | None = None,
    *,
    progress: bool = True,
    predict_also: Sequence[Task] = (),
) -> dict[str, Any]:
    """Fine-tune ``source`` on ``task`` once per seed; evaluate on the dev split(s); write results.

    Returns (and writes to out_dir/results.json) per-seed metrics on each dev split and their median,
    with the task's main score; test-set predictions (leaderboard format) from the seed with the
    median dev score go to out_dir/predictions/. predict_also: test-only tasks with the same labels
    predicted by the same model (GLUE's diagnostic set AX by the MNLI model).
    """
    cfg = cfg or FinetuneConfig()
    from cramkit.load import load

    loaded = source if isinstance(source, LoadedModel) else load(source)
    max_length = min(cfg.max_length, loaded.max_length)
    tok = loaded.tokenizer
    regression = task.is_regression

    train_rows = task.examples(task.train_split)
    if cfg.max_train_examples:
        train_rows = train_rows[: cfg.max_train_examples]
    if not train_rows:
        raise CramkitError(
            f"task {task.name}: the {task.train_split} split is empty; nothing to fine-tune on"
        )
    train = encode_examples(tok, train_rows, max_length, regression=regression)
    if train.labels is None:
        raise CramkitError(f"task {task.name}: some {task.train_split} examples have no label")
    dev = {
        s: encode_examples(tok, task.examples(s), max_length, regression=regression) for s in task.dev_splits
    }
    for split, enc in dev.items():
        if enc.labels is None:
            raise CramkitError(
                f"task {task.name}: the {split} split has unlabelled examples; it cannot be scored"
            )
    tests = _test_splits(task, tok, max_length, regression)
    for other in predict_also:
        if other.labels != task.labels:
            raise CramkitError(
                f"task {other.name} has labels {other.labels}, not {task.name}'s {task.labels}"
            )
        tests.update(_test_splits(other, tok, max_length, regression))

    device = resolve_device(cfg.device)
    pad_id, with_types = loaded.pad_id, loaded.with_types
    per_seed, test_logits, states = [], [], []
    for seed in cfg.seeds:
        model, stats = train_one_seed(
            loaded, train, task.num_labels, cfg, seed, progress=progress, desc=f"{task.name} seed {seed}"
        )
        stats["dev"] = {}
        for split, enc in dev.items():
            logits = predict(model, enc, cfg, device, pad_id, with_types)
            preds = logits[:, 0] if regression else logits
            metrics = task.compute_metrics(preds, enc.labels)
            stats["dev"][split] = {"metrics": metrics, "score": task.score(metrics)}
        test_logits.append(
            {s: predict(model, enc, cfg, device, pad_id, with_types) for s, enc in tests.items()}
        )
        per_seed.append(stats)
        if out_dir is not None:  # kept on the CPU until the median seed is known
            states.append({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
        del model

    results: dict[str, Any] = {
        "task": task.name,
        "source": loaded.source,
        "config": to_dict(cfg),
        "max_length": max_length,
        "train_examples": len(train),
        "dev_examples": {s: len(e) for s, e in dev.items()},
        "main_metric": task.main_metric,
        "seeds": per_seed,
        "median": {},
    }
    for split in dev:
        metrics = {
            m: statistics.median(r["dev"][split]["metrics"][m] for r in per_seed) for m in task.metrics
        }
        results["median"][split] = {
            "metrics": metrics,
            "score": statistics.median(r["dev"][split]["score"] for r in per_seed),
        }
    results["score"] = float(np.mean([results["median"][s]["score"] for s in dev])) if dev else None
    skipped = {s: n for s, n in task.skipped.items() if n}
    if skipped:
        results["skipped_rows"] = skipped

    # the seed whose dev score is the (lower) median: its model is kept, its test predictions written
    scores = [float(np.mean([r["dev"][s]["score"] for s in dev])) if dev else 0.0 for r in per_seed]
    pick = sorted(range(len(scores)), key=lambda i: scores[i])[(len(scores) - 1) // 2]
    results["kept_seed"] = cfg.seeds[pick]
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        _save_model(loaded, task, cfg, max_length, states[pick], cfg.seeds[pick], out)
        if tests and dev:
            results["test_predictions"] = {"seed": cfg.seeds[pick], "files": {}}
            owners = {t.name: t for t in [task, *predict_also]}
            for (name, split), enc in tests.items():
                owner = owners[name]
                logits = test_logits[pick][(name, split)]
                preds = logits[:, 0] if regression else logits.argmax(-1)
                path = owner.write_predictions(
                    split, zip(enc.idx.tolist(), preds.tolist(), strict=True), out / "predictions"
                )
                key = split if owner is task else f"{owner.name}:{split}"
                results["test_predictions"]["files"][key] = str(path)
        write_json(out / "results.json", results)
    return results


def _save_model(
    loaded: LoadedModel, task: Task, cfg: FinetuneConfig, max_length: int, state: dict, seed: int, out: Path
) -> None:
    """The fine-tuned classifier as a model directory (``cramkit.load(out)``)."""
    from cramkit.load import LoadedModel as Saved

    model = build_model(loaded, task.num_labels, cfg)
    model.load_state_dict(state)
    kind = "regression" if task.is_regression else "classifier"
    Saved(
        model=model,
        kind=kind,
        config=model.cfg,
        tokenizer=loaded.tokenizer,
        labels=None if task.is_regression else [str(x) for x in task.labels],
        task=task.name,
        max_length=max_length,
        pooling="cls" if cfg.pooling == "first" else "mean",
        with_types=loaded.with_types,
        head=to_dict(model.head_cfg),
        extra={"finetuned_from": loaded.source, "seed": seed},
    ).save(out)


def _test_splits(task: Task, tok, max_length: int, regression: bool) -> dict[tuple[str, str], Encoded]:
    """Encoded test splits that are present, keyed (task, split); an absent test file is not an error."""
    out = {}
    for split in task.test_splits:
        if split not in task.splits:
            continue
        source = task.source(split)
        if not source.startswith("hf:") and not Path(source).exists():
            continue
        rows = task.examples(split)
        if rows:
            out[(task.name, split)] = encode_examples(tok, rows, max_length, regression=regression)
    return out


def write_json(path: Path, data: Any) -> None:
    """Write JSON to a temporary name, then rename (a crash never leaves half a file)."""
    from cramkit.io import write_json_atomic

    write_json_atomic(path, data)


def config_from(
    overrides: dict[str, Any] | None = None, base: FinetuneConfig | None = None
) -> FinetuneConfig:
    """A FinetuneConfig from ``--set`` overrides (strict: unknown keys are errors) on top of ``base``."""
    data = to_dict(base) if base is not None else {}
    data.update(overrides or {})
    return from_dict(FinetuneConfig, data, "finetune")
