"""Fine-tuning an encoder on a task: load, tokenise, bucket, train, evaluate, report.

One set of hyperparameters for every task by default: Cramming's "GLUE-sane" recipe (Geiping &
Goldstein 2023, ``cramming/config/eval/GLUE_sane.yaml``), see :class:`FinetuneConfig`. Batches are
padded only to their longest member, and examples of similar length are batched together (length
bucketing), so almost no compute is spent on padding; evaluation runs on length-sorted batches.

    results = finetune(get_task("glue/sst2", data_dir="glue"), "runs/tiny", FinetuneConfig(), "out/sst2")

The methods' pieces sit beside this module: the settings (finetune_config.py), the model each method trains and
its scores (finetune_model.py), its objective for the engine (finetune_objective.py), prompts and their zero-shot
score (finetune_prompt.py), SetFit's body and head (setfit.py). Here: one run per seed (checkpointed, resumable),
the medians over the seeds, and the median seed's model and test predictions kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from cramkit.config import to_dict
from cramkit.data.batching import Encoded, EncodedChoices
from cramkit.errors import CramkitError
from cramkit.loading import LoadedModel
from cramkit.recipes.finetune_config import SETTINGS_FILE, FinetuneConfig, auto_lr, train_config
from cramkit.recipes.finetune_model import (
    build_model,
    encode_task_examples,
    encode_test_splits,
    predict,
    resolve_pooling,
    task_columns,
    trained_inputs,
)
from cramkit.recipes.finetune_objective import BEST_WEIGHTS, ClassifierObjective, rank
from cramkit.recipes.finetune_prompt import resolve_prompt, zero_shot, zero_shot_line
from cramkit.runtime import torchrun
from cramkit.tasks.registry import Task

if TYPE_CHECKING:
    from cramkit.data.prompts import PromptSpec
    from cramkit.model.encoder import Encoder

PathLike = str | os.PathLike


def eval_period(cfg: FinetuneConfig, examples: int, steps: int) -> int:
    """Steps between the 'epoch' dev evaluations: an epoch, or when the step floor stretches the run past
    ``cfg.epochs`` epochs, ``steps / ceil(epochs)`` (as many evaluations as the epochs would give)."""
    from cramkit.train.epochs import epoch_steps

    per_epoch = epoch_steps(examples, cfg.batch_size, 1)
    if steps <= epoch_steps(examples, cfg.batch_size, cfg.epoch_count):
        return per_epoch
    return max(per_epoch, math.ceil(steps / max(1, math.ceil(cfg.epoch_count))))


def train_one_seed(
    loaded: LoadedModel,
    train: Encoded | EncodedChoices,
    num_labels: int,
    cfg: FinetuneConfig,
    seed: int,
    *,
    progress: bool = True,
    desc: str = "finetune",
    run: PathLike | None = None,
    multilabel: bool = False,
    multiple_choice: bool = False,
    resume_hint: str = "rerun the same command to continue",
    ctx: Any = None,
    dev: tuple[Task, str, Encoded | EncodedChoices] | None = None,
    prompt: PromptSpec | None = None,
    targets: np.ndarray | None = None,
    head_weight: np.ndarray | None = None,
):
    """Train a fresh classifier on ``train`` with ``seed`` through the training engine; returns (model,
    stats). With ``run`` (a directory) checkpoints go there and a run killed midway resumes from them.
    dev: (task, split, encoded) scored at every evaluation (``cfg.eval_every``); with ``cfg.keep == "best"``
    the model returned is the one with the best dev score. targets: soft targets [rows, classes] of the rows
    (self-training's student: distill/selftrain.py) instead of their labels. head_weight: the head's starting
    rows (recipes/label_prior.py's :func:`head_init`), else as initialised."""
    from cramkit.train.epochs import train_epochs

    cfg = dataclasses.replace(cfg, lr=auto_lr(cfg, getattr(loaded, "hidden", None)))
    kind: type[ClassifierObjective] = ClassifierObjective
    steps = cfg.steps(len(train))[0]  # the epochs, or the step floor when the user set neither
    if cfg.method == "setfit":
        from cramkit.recipes import setfit

        kind, steps = setfit.SetFitObjective, setfit.steps(cfg.setfit_pairs, len(train), cfg.batch_size)
    if targets is not None:
        from cramkit.recipes.finetune_objective import SoftTargetObjective

        kind = SoftTargetObjective
    objective = kind(loaded, train, num_labels, cfg, seed, desc, resume_hint, multilabel, multiple_choice, prompt)
    if targets is not None:
        objective.targets = targets  # type: ignore[attr-defined]
    objective.head_weight = head_weight
    objective.dev = dev
    if run is not None:
        objective.best_dir = Path(run)
        Path(run).mkdir(parents=True, exist_ok=True)
        objective.resume_best()
    per_epoch = eval_period(cfg, len(train), steps)
    tcfg = train_config(cfg, seed, steps, progress="auto" if progress else False, steps_per_epoch=per_epoch)
    done = train_epochs(objective, tcfg, run, examples=len(train), batch_size=cfg.batch_size, ctx=ctx)
    if cfg.keep == "best":
        best = objective.best_state()
        if best is not None:
            done.model.load_state_dict(best)
    losses = done.losses
    stats = {
        "seed": seed,
        "steps": done.steps,
        "lr": cfg.lr,
        "examples_seen": done.examples_seen,
        "train_seconds": round(done.seconds, 3),
        "examples_per_s": round(done.examples_per_s, 2),
        "loss_curve": curve(losses),
        "first_loss": losses[0] if losses else float("nan"),
        "dev_curve": done.evals,
        "last_loss": float(np.mean(losses[-max(1, len(losses) // 10) :])) if losses else float("nan"),
        "trainable_parameters": sum(p.numel() for p in done.model.parameters() if p.requires_grad),
    }
    if cfg.keep == "best" and done.evals:
        best = max(done.evals, key=lambda r: rank(r.get("dev_score", float("-inf")), r.get("val_loss", float("inf"))))
        stats["best_step"] = best["step"]
    return done.model, stats


def curve(losses: list[float], points: int = 100) -> list[float]:
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
    targets: np.ndarray | None = None,
    first_line: str | None = None,
) -> dict[str, Any]:
    """Fine-tune ``source`` on ``task`` once per seed; evaluate on the dev split(s); write results.

    Returns (and writes to out_dir/results.json) per-seed metrics on each dev split and their median,
    with the task's main score; test-set predictions (leaderboard format) from the seed with the
    median dev score go to out_dir/predictions/. predict_also: test-only tasks with the same labels
    predicted by the same model (GLUE's diagnostic set AX by the MNLI model). ``out_dir`` follows the rule of
    every output (``cramkit.io.check_out``: never into its input, never over another product), checked
    before anything is read; a full disk gets one line. targets: soft targets of the train rows (self-training).
    first_line: said once the checks have passed, before anything trains (the caller's advice).
    """
    cfg = cfg or FinetuneConfig()
    from cramkit.recipes.label_prior import given_label_names

    given_label_names(task, cfg)  # label_names that do not name each label once: one line before anything
    if cfg.method == "auto":  # cross-validation chooses the method, then trains it here (recipes/method_auto.py)
        from cramkit.recipes.method_auto import finetune_auto

        return finetune_auto(task, source, cfg, out_dir, train=finetune, progress=progress, predict_also=predict_also)
    from cramkit.io import RUN_OUTPUTS, check_out, disk_errors

    if out_dir is None:
        return _finetune(task, source, cfg, None, progress, predict_also, targets, first_line)
    own = {SETTINGS_FILE: ("task", "config")}  # its settings, as _claim records them: the folder is a fine-tuning's
    check_out(out_dir, inputs=[source], own=own, writes=RUN_OUTPUTS, command="cramkit finetune")
    with disk_errors(out_dir):
        return _finetune(task, source, cfg, out_dir, progress, predict_also, targets, first_line)


def _finetune(
    task: Task,
    source: PathLike | LoadedModel,
    cfg: FinetuneConfig,
    out_dir: PathLike | None,
    progress: bool,
    predict_also: Sequence[Task],
    targets: np.ndarray | None = None,
    first_line: str | None = None,
) -> dict[str, Any]:
    from cramkit.loading import load_torch

    loaded = source if isinstance(source, LoadedModel) else load_torch(source, purpose="fine-tuning")
    max_length = min(cfg.max_length, loaded.max_length)
    tok = loaded.tokenizer

    if cfg.max_eval_examples:
        from cramkit.tasks.registry import cap_dev

        task = cap_dev(task, cfg.max_eval_examples)
    prompt = resolve_prompt(task, loaded, cfg)
    train_rows = task.examples(task.train_split)
    if cfg.max_train_examples:
        train_rows = train_rows[: cfg.max_train_examples]
        targets = targets[: len(train_rows)] if targets is not None else None
    if not train_rows:
        raise CramkitError(f"task {task.name}: the {task.train_split} split is empty; nothing to fine-tune on")
    if torchrun().is_main:  # under torchrun: once
        from cramkit.text.coverage import unk_report

        if first_line:
            print(first_line, file=sys.stderr)
        floor = cfg.steps(len(train_rows))[1] if cfg.method != "setfit" else None
        if floor is not None:  # the step floor, not the epochs, chose the steps: the first line says so
            print(f"finetune: {floor}", file=sys.stderr)

        texts = [t for e in train_rows for t in (e.text_a, e.text_b, *(e.choices or ())) if t]
        unk_report(tok, texts, str(loaded.source), verbose=progress)
    train = encode_task_examples(task, tok, train_rows, max_length, prompt)
    if train.labels is None:
        raise CramkitError(f"task {task.name}: some {task.train_split} examples have no label")
    dev = {s: encode_task_examples(task, tok, task.examples(s), max_length, prompt) for s in task.dev_splits}
    for split, enc in dev.items():
        if enc.labels is None:
            raise CramkitError(f"task {task.name}: the {split} split has unlabelled examples; it cannot be scored")
    from cramkit.recipes.label_prior import head_init, head_init_line

    head = head_init(task, loaded, cfg, train_rows, max_length)
    if head[0] is not None and torchrun().is_main:  # (like the step floor's line: said with or without bars)
        print(head_init_line(head[1]), file=sys.stderr)
    tests = encode_test_splits(task, tok, max_length, prompt)
    for other in predict_also:
        if other.labels != task.labels or other.kind != task.kind:
            raise CramkitError(f"task {other.name} has labels {other.labels}, not {task.name}'s {task.labels}")
        tests.update(encode_test_splits(other, tok, max_length, prompt))

    from cramkit.train.distributed import fault_guard, init_distributed, shutdown

    ctx = init_distributed(cfg.device)  # under torchrun: one process group for every seed
    if ctx.distributed and out_dir is None:
        raise CramkitError("under torchrun give --out DIR: every process must write into the same directory")
    from cramkit.io import dir_lock

    lock = dir_lock(out_dir, "--out") if out_dir is not None and ctx.is_main else contextlib.nullcontext()
    try:
        with lock, fault_guard(ctx):
            return _finetune_seeds(
                task, loaded, cfg, out_dir, ctx, train, dev, tests, predict_also, progress, prompt, targets, head
            )
    finally:
        shutdown(ctx)


def _finetune_seeds(
    task, loaded, cfg, out_dir, ctx, train, dev, tests, predict_also, progress, prompt=None, targets=None, head=None
) -> dict[str, Any]:
    from cramkit.train.distributed import main_first

    max_length = min(cfg.max_length, loaded.max_length)
    seeds_dir = None
    if out_dir is not None:
        with main_first(ctx, "checking --out"):
            seeds_dir = _claim(Path(out_dir), task, loaded, cfg) if ctx.is_main else Path(out_dir) / "seeds"
    before = None
    if prompt is not None and ctx.is_main:
        before = zero_shot(task, loaded, cfg, prompt, max_length, ctx.device)
        if progress:
            print(zero_shot_line(before, task, loaded.source), file=sys.stderr)
    weight, init = head if head is not None else (None, {"used": False})
    per_seed, test_logits, states = _train_seeds(
        task, loaded, cfg, seeds_dir, ctx, train, dev, tests, progress, prompt, targets, weight
    )
    if not ctx.is_main:
        return {}
    results = _results(task, loaded, cfg, max_length, len(train), dev, prompt, before, per_seed)
    results["head_init"] = init
    pick = _median_seed(task, per_seed)
    results["kept_seed"] = cfg.seeds[pick]
    if out_dir is not None:
        assert seeds_dir is not None  # claimed with out_dir
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = states[pick] if states[pick] is not None else _kept_weights(out, seeds_dir, cfg, cfg.seeds[pick])
        if state is not None:  # (else: every seed was reused and the kept model is already saved)
            _save_model(loaded, task, cfg, max_length, state, cfg.seeds[pick], out, prompt)
        if tests and dev:
            kept = test_logits[pick]
            results["test_predictions"] = _write_test_predictions(out, task, predict_also, tests, kept, cfg.seeds[pick])
        results["trainable_parameters"] = per_seed[pick].get("trainable_parameters")
        results["stored_bytes"] = (out / "model.safetensors").stat().st_size
        write_json(out / "results.json", results)
        for seed in cfg.seeds:  # the kept model is saved: the seeds' checkpoints are no longer needed
            shutil.rmtree(seeds_dir / f"seed-{seed}" / "checkpoints", ignore_errors=True)
            (seeds_dir / f"seed-{seed}" / BEST_WEIGHTS).unlink(missing_ok=True)
    return results


def _train_seeds(
    task: Task,
    loaded: LoadedModel,
    cfg: FinetuneConfig,
    seeds_dir: Path | None,
    ctx: Any,
    train: Encoded | EncodedChoices,
    dev: dict[str, Encoded | EncodedChoices],
    tests: dict[tuple[str, str], Encoded | EncodedChoices],
    progress: bool,
    prompt: PromptSpec | None,
    targets: np.ndarray | None = None,
    head_weight: np.ndarray | None = None,
) -> tuple[list[dict[str, Any]], list[dict[tuple[str, str], np.ndarray]], list[dict[str, Any] | None]]:
    """Every seed trained and scored, or its results reused when an earlier (interrupted) invocation finished it:
    (each seed's stats, its test logits by (task, split), its weights: None when they stay in its checkpoint).
    Under torchrun every rank trains; rank 0 alone scores, so the others' lists stay empty."""
    hint = "rerun the same command to continue (finished seeds are kept; this one resumes from its checkpoint)"
    per_seed: list[dict[str, Any]] = []
    test_logits: list[dict[tuple[str, str], np.ndarray]] = []
    states: list[dict[str, Any] | None] = []
    for seed in cfg.seeds:
        run = seeds_dir / f"seed-{seed}" if seeds_dir is not None else None
        done = _finished_seed(run, tests) if run is not None else None
        if done is not None:  # finished by an earlier, interrupted invocation
            stats, logits, state = done
            per_seed.append(stats)
            test_logits.append(logits)
            states.append(state)
            continue
        model, stats = train_one_seed(
            loaded,
            train,
            task.num_labels,
            cfg,
            seed,
            progress=progress,
            desc=f"{task.name} seed {seed}",
            run=run,
            resume_hint=hint,
            ctx=ctx,
            multiple_choice=task.is_multiple_choice,
            dev=(task, task.selection_splits[0], dev[task.selection_splits[0]]) if dev else None,
            prompt=prompt,
            targets=targets,
            head_weight=head_weight,
        )
        if not ctx.is_main:  # rank 0 scores and writes; the others go on to the next seed's training
            continue
        logits = _score_seed(model, task, cfg, ctx.device, loaded, stats, dev, tests)
        test_logits.append(logits)
        per_seed.append(stats)
        if run is not None:
            _finish_seed(run, stats, logits)
            states.append(None)  # its weights stay in its final checkpoint until the median is known
        else:
            states.append({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
        del model
    return per_seed, test_logits, states


def _score_seed(
    model: Any,
    task: Task,
    cfg: FinetuneConfig,
    device: Any,
    loaded: LoadedModel,
    stats: dict[str, Any],
    dev: dict[str, Encoded | EncodedChoices],
    tests: dict[tuple[str, str], Encoded | EncodedChoices],
) -> dict[tuple[str, str], np.ndarray]:
    """A trained seed's scores, added to its ``stats``: every dev split's metrics (``dev``) and those of the test
    files that have labels (``test``). Returns its logits for every test split."""
    regression = task.is_regression
    pad_id, with_types = loaded.pad_id, loaded.with_types
    stats["dev"] = {}
    for split, enc in dev.items():
        logits = predict(model, enc, cfg, device, pad_id, with_types)
        preds = logits[:, 0] if regression else logits
        metrics = task.compute_metrics(preds, enc.labels, task.examples(split))
        stats["dev"][split] = {"metrics": metrics, "score": task.score(metrics)}
    test_logits = {s: predict(model, enc, cfg, device, pad_id, with_types) for s, enc in tests.items()}
    for (name, split), enc in tests.items():  # a test file with labels is scored too
        if name == task.name and enc.labels is not None:
            preds = test_logits[(name, split)][:, 0] if regression else test_logits[(name, split)]
            metrics = task.compute_metrics(preds, enc.labels, task.examples(split))
            stats.setdefault("test", {})[split] = {"metrics": metrics, "score": task.score(metrics)}
    return test_logits


def _results(
    task: Task,
    loaded: LoadedModel,
    cfg: FinetuneConfig,
    max_length: int,
    train_examples: int,
    dev: dict[str, Encoded | EncodedChoices],
    prompt: PromptSpec | None,
    before: dict[str, Any] | None,
    per_seed: list[dict[str, Any]],
) -> dict[str, Any]:
    """The fine-tuning's results: its settings, every seed's stats, and the median over the seeds of each dev
    split (and labelled test file) with the task's score."""
    results: dict[str, Any] = {
        "task": task.name,
        "source": loaded.source,
        "config": to_dict(cfg),
        "max_length": max_length,
        "train_examples": train_examples,
        "dev_examples": {s: len(e) for s, e in dev.items()},
        "main_metric": task.main_metric,
        "method": cfg.method,
        **({"prompt": prompt.meta()} if prompt is not None else {}),
        **({"zero_shot": before} if before is not None else {}),
        "seeds": per_seed,
        "median": {},
    }
    for split in dev:
        metrics = {m: statistics.median(r["dev"][split]["metrics"][m] for r in per_seed) for m in task.metrics}
        results["median"][split] = {
            "metrics": metrics,
            "score": statistics.median(r["dev"][split]["score"] for r in per_seed),
        }
    scored = task.scored_splits  # dev holds every dev split
    results["score"] = float(np.mean([results["median"][s]["score"] for s in scored])) if scored else None
    scored_tests = sorted({s for r in per_seed for s in r.get("test", {})})
    for split in scored_tests:  # labelled test files: scored like the dev splits (median over seeds)
        rows = [r["test"][split] for r in per_seed if split in r.get("test", {})]
        results.setdefault("test", {})[split] = {
            "metrics": {m: statistics.median(x["metrics"][m] for x in rows) for m in task.metrics},
            "score": statistics.median(x["score"] for x in rows),
        }
    skipped = {s: n for s, n in task.skipped.items() if n}
    if skipped:
        results["skipped_rows"] = skipped
    return results


def _median_seed(task: Task, per_seed: list[dict[str, Any]]) -> int:
    """The seed whose dev score is the (lower) median: its model is kept, its test predictions written."""
    chosen = task.selection_splits
    scores = [float(np.mean([r["dev"][s]["score"] for s in chosen])) if chosen else 0.0 for r in per_seed]
    return sorted(range(len(scores)), key=lambda i: scores[i])[(len(scores) - 1) // 2]


def _kept_weights(out: Path, seeds_dir: Path, cfg: FinetuneConfig, seed: int) -> dict | None:
    """The weights of the kept ``seed`` from its run (with keep=best, its best dev score's); None when its run is
    gone but ``out`` already holds the kept model (every seed reused)."""
    from cramkit.loading import MODEL_FILE
    from cramkit.train import checkpoint as ckpt

    seed_dir = seeds_dir / f"seed-{seed}"
    found = ckpt.find_latest(seed_dir)
    if cfg.keep == "best" and (seed_dir / BEST_WEIGHTS).is_file():  # the best dev score's weights
        from cramkit.model.hf import read_weights

        return read_weights(seed_dir / BEST_WEIGHTS)
    if found is not None:
        return ckpt.model_weights(found)
    if not (out / MODEL_FILE).is_file():
        raise CramkitError(
            f"{out}: seed {seed} finished earlier but neither its checkpoint nor the kept model "
            f"is there any more; delete {out} and fine-tune again"
        )
    return None


def _write_test_predictions(
    out: Path,
    task: Task,
    predict_also: Sequence[Task],
    tests: dict[tuple[str, str], Encoded | EncodedChoices],
    logits: dict[tuple[str, str], np.ndarray],
    seed: int,
) -> dict[str, Any]:
    """The kept seed's test predictions in out/predictions, each in its task's leaderboard format (``task``'s, or
    that of a test-only task in ``predict_also``). Returns {"seed", "files": {split: path}} (another task's split
    named TASK:SPLIT)."""
    written: dict[str, Any] = {"seed": seed, "files": {}}
    owners = {t.name: t for t in [task, *predict_also]}
    for (name, split), enc in tests.items():
        owner = owners[name]
        values = logits[(name, split)]
        preds = values[:, 0] if task.is_regression else values.argmax(-1)
        path = owner.write_predictions(split, zip(enc.idx.tolist(), preds.tolist(), strict=True), out / "predictions")
        key = split if owner is task else f"{owner.name}:{split}"
        written["files"][key] = str(path)
    return written


def _claim(out: Path, task: Task, loaded: LoadedModel, cfg: FinetuneConfig) -> Path:
    """``out/seeds``, after checking that ``out`` holds no fine-tuning with other settings."""
    from cramkit.io import claim_dir

    settings = {"task": task.name, "source": loaded.source, "config": to_dict(cfg)}
    claim_dir(out, SETTINGS_FILE, settings, "a fine-tuning")
    return out / "seeds"


def _finish_seed(run: Path, stats: dict[str, Any], logits: dict[tuple[str, str], np.ndarray]) -> None:
    """A finished seed's results (its test logits as .npy), written last so a rerun can reuse them."""
    from cramkit.io import write_json_atomic

    files = {}
    for i, ((name, split), values) in enumerate(sorted(logits.items())):
        files[f"{name}|{split}"] = f"test-{i}.npy"
        np.save(run / f"test-{i}.npy", values, allow_pickle=False)
    write_json_atomic(run / "result.json", {"stats": stats, "test_logits": files})


def _finished_seed(run: Path, tests: dict) -> tuple[dict, dict, None] | None:
    from cramkit.rundir import finished_result

    data = finished_result(run / "result.json", key="stats")
    if data is None:
        return None
    try:
        logits = {}
        for key, name in data["test_logits"].items():
            task_name, split = key.split("|", 1)
            if "/" in name or "\\" in name or not name.endswith(".npy"):
                raise ValueError(f"bad file name {name!r}")
            logits[(task_name, split)] = np.load(run / name, allow_pickle=False)
        if set(logits) != set(tests):
            return None
        return data["stats"], logits, None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # damaged: train this seed again


def _save_model(
    loaded: LoadedModel,
    task: Task,
    cfg: FinetuneConfig,
    max_length: int,
    state: dict,
    seed: int,
    out: Path,
    prompt: PromptSpec | None = None,
) -> None:
    """The fine-tuned model as a model directory (``cramkit.load(out)``); with method=ptuning only the
    prefixes and the head, and the base model named by the checksum of its encoder."""
    from cramkit.loading import LoadedModel as Saved
    from cramkit.loading import load_weights
    from cramkit.model.prompting import encoder_digest

    model = build_model(loaded, task.num_labels, cfg, multiple_choice=task.is_multiple_choice, prompt=prompt)
    # a checkpoint stores tied weights (the MLM decoder of a prompt model) under one name
    load_weights(model, dict(state), f"{out}: the kept seed's weights", tied=cfg.method == "prompt")
    kind = {"regression": "regression", "multiple_choice": "multiple_choice"}.get(task.kind, "classifier")
    extra = {
        "finetuned_from": loaded.source,
        "seed": seed,
        "trained_inputs": trained_inputs(task),
        **task_columns(task),
    }
    if cfg.label_names and task.labels is not None:  # the data's values the names stand for, in logit order
        extra["label_values"] = [str(x) for x in task.labels]
    architecture, head = "encoder", getattr(model, "head_cfg", None)
    if cfg.method == "prompt":
        architecture, head = "prompt", None
        extra["prompt"] = cast("PromptSpec", prompt).meta()  # build_model refused method=prompt without one
    elif cfg.method == "ptuning":
        architecture = "prefix"
        extra["base"] = {
            "source": str(loaded.source),
            "sha256": encoder_digest(cast("Encoder", loaded.encoder)),  # build_model refused models without one
            "prefix_len": cfg.prefix_len,
        }
    Saved(
        model=model,
        kind=kind,
        config=model.cfg,
        tokenizer=loaded.tokenizer,
        labels=_saved_labels(task, cfg),
        task=task.name,
        max_length=max_length,
        pooling=resolve_pooling(cfg, loaded).pooling,
        with_types=loaded.with_types,
        head=to_dict(head) if head is not None else None,
        architecture=architecture,
        extra=extra,
    ).save(out)


def _saved_labels(task: Task, cfg: FinetuneConfig) -> list[str] | None:
    """The labels a model saves, in logit order: the names ``label_names`` gives them, else the data's values."""
    from cramkit.recipes.label_prior import given_label_names

    if task.labels is None:
        return None
    return given_label_names(task, cfg) or [str(x) for x in task.labels]


def write_json(path: Path, data: Any) -> None:
    """Write JSON to a temporary name, then rename (a crash never leaves half a file)."""
    from cramkit.io import write_json_atomic

    write_json_atomic(path, data)
