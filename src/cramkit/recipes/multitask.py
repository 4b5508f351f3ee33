"""Fine-tuning on a mixture of tasks: one encoder, one head per task, batches drawn by the mixture's rates.

Every optimizer step trains one task: the task is drawn with the mixture's rates from a generator seeded
by (seed, step), and its next batch comes from that task's own length-bucketed, resumable loader
(``data.batching.BatchLoader``). So the sequence of tasks and batches is a function of the seed, and a run
killed midway resumes with the very batches it would have seen. An epoch of the mixture is
``Mixture.examples_per_epoch`` examples. After training every task is scored on its own dev split(s)
with its own head, and the model is saved once (``cramkit.load(out, task=NAME)`` gives a task's model).

    res = finetune_mixture(resolve_mixture("glue/mrpc,glue/rte"), "runs/tiny", FinetuneConfig(), "out/mix")
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from cramkit.config import to_dict
from cramkit.data.batching import BatchLoader, Encoded, EncodedChoices
from cramkit.errors import CramkitError
from cramkit.loading import LoadedModel
from cramkit.model.pooling import read_pooling
from cramkit.recipes.finetune import curve, write_json
from cramkit.recipes.finetune_config import FinetuneConfig, auto_lr, train_config
from cramkit.recipes.finetune_model import (
    encode_task_examples,
    encode_test_splits,
    predict,
    resolve_pooling,
    task_columns,
    trained_inputs,
)
from cramkit.tasks.mixtures import Mixture
from cramkit.tasks.registry import Task
from cramkit.train.objectives import ExampleObjective

if TYPE_CHECKING:
    import torch

    from cramkit.model.multitask import MultiTaskModel

PathLike = str | os.PathLike
SETTINGS_FILE = "mixture.json"


def draw_task(seed: int, batch: int, rates: np.ndarray) -> int:
    """The task of global batch ``batch``: drawn with ``rates`` by a generator seeded by (seed, batch)."""
    return int(np.random.default_rng([seed, 0x6D6978, batch]).choice(len(rates), p=rates))


class MixtureLoader:
    """Micro-batches of one process: each global batch from one task, drawn by ``rates`` with a generator
    seeded by (seed, batch number); resumable from its state_dict (the draw count and every task's loader).

    ``every_task``: each global batch holds one batch of every task instead (``--weighting``): a micro-batch is
    ``{"parts": {task: its micro-batch}, "batch": global batch number}``."""

    def __init__(self, loaders: list[BatchLoader], rates: np.ndarray, seed: int, *, every_task: bool = False) -> None:
        self.loaders, self.rates, self.seed, self.every_task = loaders, rates, seed, every_task
        self.accum = loaders[0].accum  # the same for every task: same batch size, micro-batch and world
        self.batch, self.part, self.current = 0, 0, 0

    def task_of(self, batch: int) -> int:
        return draw_task(self.seed, batch, self.rates)

    def __iter__(self) -> MixtureLoader:
        return self

    def __next__(self) -> dict:
        if self.every_task:
            out = {"parts": {i: next(loader) for i, loader in enumerate(self.loaders)}, "batch": self.batch}
            self.part += 1
            if self.part == self.accum:
                self.part, self.batch = 0, self.batch + 1
            return out
        if self.part == 0:
            self.current = self.task_of(self.batch)
        out = next(self.loaders[self.current])
        out["task"] = self.current
        self.part += 1
        if self.part == self.accum:
            self.part, self.batch = 0, self.batch + 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "part": self.part, "tasks": [x.state_dict() for x in self.loaders]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batch, self.part = int(state["batch"]), int(state["part"])
        self.current = self.task_of(self.batch)
        for loader, saved in zip(self.loaders, state["tasks"], strict=True):
            loader.load_state_dict(saved)


class MixtureObjective(ExampleObjective):
    """Fine-tuning on a mixture for the engine (train/trainer.py): a MultiTaskModel, a MixtureLoader."""

    cfg: FinetuneConfig  # (the hyperparameters the engine reports)

    def __init__(
        self,
        loaded: LoadedModel,
        tasks: list[Task],
        train: list[Encoded | EncodedChoices],
        rates: np.ndarray,
        cfg: FinetuneConfig,
        seed: int,
        title: str,
        resume_hint: str,
        weighting: str | None = None,
        primary: int | None = None,
    ) -> None:
        self.loaded, self.tasks, self.train, self.rates = loaded, tasks, train, rates
        self.cfg, self.seed, self.title, self.resume_hint = cfg, seed, title, resume_hint
        self.weighting, self.primary = weighting, primary  # weighting None: one task per step, drawn by rates
        self.flops_per_token = None
        self.world = 1
        self.drawn = np.zeros(len(tasks), dtype=np.int64)
        self.names = short_names([t.name for t in tasks])
        self._figures: torch.Tensor | None = None  # sums over the steps since the last log line (on the device)
        self._figure_steps = 0

    def build_model(self):
        return build_multitask(self.loaded, [t.num_labels for t in self.tasks], self.cfg, [t.kind for t in self.tasks])

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1) -> MixtureLoader:
        import torch

        self.world = world
        loaders = [
            BatchLoader(
                enc,
                self.cfg.batch_size,
                micro,
                rank,
                world,
                seed=self.seed + 1000 * i,
                chunk=self.cfg.bucket_chunk,
                pad_id=self.loaded.pad_id,
                with_types=self.loaded.with_types,
                columns={"labels": torch.from_numpy(enc.labels)},
            )
            for i, enc in enumerate(self.train)
        ]
        return MixtureLoader(loaders, self.rates, self.seed, every_task=self.weighting is not None)

    def count(self, batch: dict) -> int:  # a weighted step holds one batch of each task in "parts"
        if "parts" in batch:
            return sum(super(MixtureObjective, self).count(b) for b in batch["parts"].values())
        return super().count(batch)

    def tokens(self, batch: dict) -> int:
        if "parts" in batch:
            return sum(super(MixtureObjective, self).tokens(b) for b in batch["parts"].values())
        return super().tokens(batch)

    def loss(self, model, batch: dict, device):
        if "parts" in batch:
            return self._combined_loss(model, batch, device)
        task = int(batch["task"])
        inputs = {
            k: (v.to(device, non_blocking=True) if v is not None else None)
            for k, v in batch.items()
            if k not in ("count", "labels", "task")
        }
        loss, _ = model(**inputs, labels=batch["labels"].to(device, non_blocking=True), task=task)
        if self.world > 1:  # DDP reduces every parameter's gradient: the other heads take part with 0
            heads = getattr(model, "module", model).heads
            loss = loss + 0.0 * sum(p.sum() for i, h in enumerate(heads) if i != task for p in h.parameters())
        return loss

    def _task_loss(self, model, batch: dict, task: int, device):
        inputs = {
            k: (v.to(device, non_blocking=True) if v is not None else None)
            for k, v in batch.items()
            if k not in ("count", "labels", "task")
        }
        loss, _ = model(**inputs, labels=batch["labels"].to(device, non_blocking=True), task=task)
        return loss

    def _combined_loss(self, model, batch: dict, device):
        """One batch of every task (``--weighting``): the sum of the task losses, whose gradient is the tasks'
        gradients combined by the weighting (recipes/weighting.py) on the shared encoder, each head's own."""
        import torch

        from cramkit.recipes.weighting import gradient_figures, needs_task_gradients, pcgrad_order, task_weights

        parts = batch["parts"]
        weighting = cast(str, self.weighting)
        if not needs_task_gradients(weighting, self.primary):  # a plain sum: one backward pass, by the engine
            each = [self._task_loss(model, parts[i], i, device) for i in range(len(self.tasks))]
            self._add_figures(torch.stack([x.detach().float() for x in each]))
            return torch.stack(each).sum()
        net = getattr(model, "module", model)
        shared = [p for p in net.encoder.parameters() if p.requires_grad]
        size = sum(p.numel() for p in shared)
        # one row per task: its gradient on the shared encoder, flattened (written in place, no copies)
        rows = torch.empty(len(self.tasks), size, device=shared[0].device, dtype=torch.float32)
        heads: list[tuple[torch.Tensor, torch.Tensor]] = []
        losses: list[torch.Tensor] = []
        for i in range(len(self.tasks)):  # each task's forward and backward apart: its gradient alone
            head = [p for p in net.heads[i].parameters() if p.requires_grad]
            loss = self._task_loss(model, parts[i], i, device)
            got = torch.autograd.grad(loss, shared + head, allow_unused=True)
            offset = 0
            for g, p in zip(got[: len(shared)], shared, strict=True):
                part = rows[i, offset : offset + p.numel()]
                if g is None:  # a parameter this task's loss does not reach
                    part.zero_()
                else:
                    part.copy_(g.reshape(-1))
                offset += p.numel()
            heads.extend((p, g) for p, g in zip(head, got[len(shared) :], strict=True) if g is not None)
            losses.append(loss.detach().float())
        order = pcgrad_order(self.seed, int(batch["batch"]), len(self.tasks)) if weighting == "pcgrad" else None
        gram = rows @ rows.T
        weights = task_weights(gram, weighting, self.primary, order)
        combined = weights.float() @ rows
        self._add_figures(torch.cat([torch.stack(losses), gradient_figures(gram, weights)]))
        # a surrogate whose gradient is the combined one (each parameter's value times its gradient, detached),
        # with the value of the losses' sum: the engine's backward pass puts the combined gradient in .grad
        surrogate = torch.zeros((), device=combined.device)
        offset = 0
        for p in shared:
            surrogate = surrogate + (p * combined[offset : offset + p.numel()].view_as(p).to(p.dtype)).sum()
            offset += p.numel()
        for p, g in heads:
            surrogate = surrogate + (p * g.detach()).sum()
        total = torch.stack(losses).sum()
        return total + (surrogate - surrogate.detach())

    def _add_figures(self, values) -> None:
        self._figures = values if self._figures is None else self._figures + values
        self._figure_steps += 1

    def step_metrics(self) -> dict[str, float]:
        """Each task's loss (and, when the weighting needs task gradients, their norms on the encoder and
        cosines) averaged over the steps since the last call: logged with the step (metrics.jsonl)."""
        if self._figures is None or self.weighting is None:
            return {}
        from cramkit.recipes.weighting import figure_names

        values = (self._figures / self._figure_steps).tolist()
        self._figures, self._figure_steps = None, 0
        names = [f"loss.{x}" for x in self.names]
        if len(values) > len(names):
            names += figure_names(self.names)
        return {k: round(v, 6) for k, v in zip(names, values, strict=True)}

    def evaluate(self, model, ctx, precision: str) -> None:
        return None  # every task is scored by finetune_mixture() on the finished model


def short_names(names: list[str]) -> list[str]:
    """Task names for metrics: the part after the suite (glue/mrpc -> mrpc) when those are distinct."""
    short = [n.rsplit("/", 1)[-1] for n in names]
    return short if len(set(short)) == len(short) else [n.replace("/", "-") for n in names]


def build_multitask(loaded: LoadedModel, num_labels: list[int], cfg: FinetuneConfig, kinds: list[str] | None = None):
    """A MultiTaskModel on the loaded model's encoder; every head's pooler starts from the model's (BERT's
    pooler) when it has one, as a single-task classifier's does."""
    import torch

    from cramkit.model.heads import ClassifierConfig
    from cramkit.model.multitask import MultiTaskModel

    if loaded.encoder is None:
        raise CramkitError(
            f"--from {loaded.source}: a {loaded.architecture} model has no transformer encoder to fine-tune"
        )
    model_cfg = loaded.config.replace(
        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, gradient_checkpointing=False
    )
    pool = resolve_pooling(cfg, loaded)  # pooling=auto: the model's own
    head = ClassifierConfig(pooling=read_pooling(pool.pooling), pooler_dense=pool.pooler_dense, dropout=cfg.dropout)
    model = MultiTaskModel(model_cfg, num_labels, head, kinds)
    model.encoder.load_state_dict(loaded.encoder.state_dict(), strict=True)
    pooler = getattr(loaded.model, "pooler", None)
    pooler_state = pooler.state_dict() if pooler is not None else loaded.pooler_state
    if pooler_state is not None and pool.pooler_dense and pool.pooling == "cls":
        h: Any  # a TaskHead, with a dense pooler (pooler_dense)
        with torch.no_grad():
            for h in model.heads:
                h.pooler.weight.copy_(pooler_state["weight"])
                h.pooler.bias.copy_(pooler_state["bias"])
    return model


def finetune_mixture(
    mixture: Mixture,
    tasks: Sequence[Task],
    source: PathLike | LoadedModel,
    cfg: FinetuneConfig | None = None,
    out_dir: PathLike | None = None,
    *,
    progress: bool = True,
    weighting: str | None = None,
    primary: str | None = None,
) -> dict[str, Any]:
    """Fine-tune ``source`` on the mixture's ``tasks`` together; score each task on its dev split(s).

    Returns (and writes to out_dir/results.json) each task's dev metrics and main score, their mean, the
    rates and the steps; the model goes to out_dir (one head per task) and test predictions to
    out_dir/predictions/TASK/. Trains one seed (the first of cfg.seeds).

    ``weighting`` (sum, gradnorm, pcgrad: recipes/weighting.py): every step takes one batch of every task and
    combines their gradients on the encoder so (instead of one task per step drawn by the rates);
    ``primary``: a task whose loss the other (auxiliary) tasks' gradients must not oppose."""
    if cfg is not None and cfg.method != "head":
        raise CramkitError(
            f"a mixture trains one head per task; method={cfg.method} applies to one task: leave out --method/--prompt"
        )
    cfg = cfg or FinetuneConfig()
    tasks = list(tasks)
    index: int | None = None
    if weighting is not None or primary is not None:
        weighting, index = check_weighting_settings(weighting, primary, [t.name for t in tasks], cfg)
    if len(cfg.seeds) != 1:
        raise CramkitError(
            f"a mixture trains one model with one seed; got seeds {cfg.seeds}: run once per seed (--seeds N)"
        )
    from cramkit.loading import load_torch
    from cramkit.runtime import torchrun
    from cramkit.tasks.mixtures import mixture_rates

    loaded = source if isinstance(source, LoadedModel) else load_torch(source, purpose="fine-tuning")
    max_length = min(cfg.max_length, loaded.max_length)
    tok = loaded.tokenizer
    train, dev, tests = [], [], {}
    for t in tasks:
        rows = t.examples(t.train_split)
        if cfg.max_train_examples:
            rows = rows[: cfg.max_train_examples]
        if not rows:
            raise CramkitError(f"task {t.name}: the {t.train_split} split is empty; nothing to fine-tune on")
        enc = encode_task_examples(t, tok, rows, max_length)
        if enc.labels is None:
            raise CramkitError(f"task {t.name}: some {t.train_split} examples have no label")
        train.append(enc)
        dev.append({s: encode_task_examples(t, tok, t.examples(s), max_length) for s in t.dev_splits})
        tests.update(encode_test_splits(t, tok, max_length))
    if torchrun().is_main:
        from cramkit.text.coverage import unk_report

        texts = [x for t in tasks for e in t.examples(t.train_split)[:2000] for x in (e.text_a, e.text_b) if x]
        unk_report(tok, texts, str(loaded.source), verbose=progress)
    sizes = [len(e) for e in train]
    rates = mixture_rates(mixture.rates, sizes)

    from cramkit.recipes.weighting import needs_task_gradients
    from cramkit.train.distributed import fault_guard, init_distributed, shutdown

    ctx = init_distributed(cfg.device)
    if weighting is not None and ctx.world > 1 and needs_task_gradients(weighting, index):
        raise CramkitError(
            f"--weighting {weighting}{' --primary' if index is not None else ''} combines the tasks' gradients in "
            "one process; leave out --nproc/torchrun (only --weighting sum trains on several processes)"
        )
    if ctx.distributed and out_dir is None:
        raise CramkitError("under torchrun give --out DIR: every process must write into the same directory")
    from cramkit.io import dir_lock

    lock = dir_lock(out_dir, "--out") if out_dir is not None and ctx.is_main else contextlib.nullcontext()
    try:
        with lock, fault_guard(ctx):
            return _train_and_score(
                mixture, tasks, loaded, cfg, out_dir, ctx, train, dev, tests, rates, progress, weighting, index
            )
    finally:
        shutdown(ctx)


def check_weighting_settings(
    weighting: str | None, primary: str | None, names: list[str], cfg: FinetuneConfig
) -> tuple[str, int | None]:
    """``--weighting`` / ``--primary`` checked against the task names and the fine-tuning settings: the
    weighting and the primary task's index. What cannot combine the tasks' gradients is one line."""
    from cramkit.recipes.weighting import check_weighting, needs_task_gradients

    weighting, index = check_weighting(weighting, primary, names)
    if needs_task_gradients(weighting, index):
        what = f"--weighting {weighting}" + (f" --primary {primary}" if primary is not None else "")
        if cfg.micro_batch and cfg.micro_batch < cfg.batch_size:
            raise CramkitError(
                f"{what} combines the gradients of whole batches; micro_batch={cfg.micro_batch} would split them: "
                "leave out micro_batch (or lower batch_size)"
            )
        if cfg.precision == "fp16":
            raise CramkitError(f"{what}: each task's gradient is taken unscaled; use precision bf16 or fp32, not fp16")
    return weighting, index


def _train_and_score(
    mixture, tasks, loaded, cfg, out_dir, ctx, train, dev, tests, rates, progress, weighting=None, primary=None
):
    from cramkit.train.distributed import main_first
    from cramkit.train.epochs import epoch_steps, train_epochs

    seed = cfg.seeds[0]
    max_length = min(cfg.max_length, loaded.max_length)
    sizes = [len(e) for e in train]
    settings = {
        "mixture": mixture.name,
        "tasks": [t.name for t in tasks],
        "rates": mixture.rates,
        "source": loaded.source,
        "config": to_dict(cfg),
    }
    if weighting is not None:  # (absent otherwise: directories from before --weighting still match)
        settings["weighting"] = weighting
        settings["primary"] = None if primary is None else tasks[primary].name
    run = None
    if out_dir is not None:
        from cramkit.io import claim_dir

        out = Path(out_dir)
        with main_first(ctx, "checking --out"):
            if ctx.is_main:
                claim_dir(out, SETTINGS_FILE, settings, "a mixture fine-tuning")
        finished = _finished(out)
        if finished is not None:
            return finished if ctx.is_main else {}
        run = out / "run"
    per_epoch = mixture.examples_per_epoch(sizes)
    # with a weighting, a step takes one batch of every task: the same examples per epoch in fewer steps
    step_examples = cfg.batch_size * (len(tasks) if weighting is not None else 1)
    steps = epoch_steps(per_epoch, step_examples, cfg.epoch_count)  # (no step floor: a mixture's epochs)
    objective = MixtureObjective(
        loaded,
        tasks,
        train,
        rates,
        cfg,
        seed,
        f"{mixture.name} ({len(tasks)} tasks)",
        "rerun the same command to continue (the mixture resumes from its checkpoint)",
        weighting,
        primary,
    )
    cfg = dataclasses.replace(cfg, lr=auto_lr(cfg, loaded.hidden))
    tcfg = train_config(cfg, seed, steps, progress="auto" if progress else False)
    done = train_epochs(objective, tcfg, run, examples=per_epoch, batch_size=step_examples, ctx=ctx)
    if not ctx.is_main:
        return {}
    model = cast("MultiTaskModel", done.model)  # what MixtureObjective trains
    if weighting is not None:  # every task's batch at every step
        drawn = np.full(len(tasks), done.steps)
    else:
        drawn = np.bincount([draw_task(seed, b, rates) for b in range(done.steps)], minlength=len(tasks))
    results: dict[str, Any] = {
        "mixture": mixture.name,
        "tasks": {},
        "source": loaded.source,
        "config": to_dict(cfg),
        "rates_rule": mixture.rates,
        "max_length": max_length,
        "steps": done.steps,
        "train_seconds": round(done.seconds, 3),
        "examples_per_s": round(done.steps * step_examples / max(done.seconds, 1e-9), 2),
        "seconds_per_step": round(done.seconds / max(done.steps, 1), 4),
        "loss_curve": curve(done.losses),
        "seed": seed,
    }
    if weighting is not None:
        results["weighting"] = weighting
        results["primary"] = None if primary is None else tasks[primary].name
    device = next(model.parameters()).device
    for i, t in enumerate(tasks):
        view = model.single(i)
        entry: dict[str, Any] = {
            "train_examples": sizes[i],
            "rate": round(float(rates[i]), 6),
            "batches": int(drawn[i]),
            "main_metric": t.main_metric,
            "dev": {},
        }
        for split, enc in dev[i].items():
            if enc.labels is None:
                continue
            logits = predict(view, enc, cfg, device, loaded.pad_id, loaded.with_types)
            preds = logits[:, 0] if t.is_regression else logits
            metrics = t.compute_metrics(preds, enc.labels, t.examples(split))
            entry["dev"][split] = {"metrics": metrics, "score": t.score(metrics)}
        scores = [v["score"] for split, v in entry["dev"].items() if split in t.scored_splits]
        entry["score"] = float(np.mean(scores)) if scores else None
        results["tasks"][t.name] = entry
    scored = [e["score"] for e in results["tasks"].values() if e["score"] is not None]
    results["score"] = float(statistics.fmean(scored)) if scored else None
    if out_dir is not None:
        out = Path(out_dir)
        files = {}
        for i, t in enumerate(tasks):
            view = model.single(i)
            for (name, split), enc in tests.items():
                if name != t.name:
                    continue
                logits = predict(view, enc, cfg, device, loaded.pad_id, loaded.with_types)
                preds = logits[:, 0] if t.is_regression else logits.argmax(-1)
                folder = out / "predictions" / t.name.replace("/", "-")
                path = t.write_predictions(split, zip(enc.idx.tolist(), preds.tolist(), strict=True), folder)
                files[f"{t.name}:{split}"] = str(path)
        if files:
            results["test_predictions"] = files
        save_multitask(loaded, mixture, tasks, cfg, max_length, model, seed, out)
        write_json(out / "results.json", results)
        import shutil

        shutil.rmtree(out / "run" / "checkpoints", ignore_errors=True)  # the model is saved
    return results


def _finished(out: Path) -> dict[str, Any] | None:
    """The results of a mixture this directory finished before (same settings: claim_dir checked)."""
    from cramkit.loading import MODEL_FILE
    from cramkit.rundir import finished_result

    return finished_result(out / "results.json", needs=(out / MODEL_FILE,), key="tasks")


def save_multitask(
    loaded: LoadedModel,
    mixture: Mixture,
    tasks: list[Task],
    cfg: FinetuneConfig,
    max_length: int,
    model,
    seed: int,
    out: Path,
) -> None:
    """The mixture's model as one model directory: kind ``multitask``, each task's labels and columns."""
    heads = []
    for t in tasks:
        entry: dict[str, Any] = {
            "name": t.name,
            "kind": t.kind,
            "num_labels": t.num_labels,
            "labels": None if t.labels is None else [str(x) for x in t.labels],
        }
        if t.label_names:
            entry["label_names"] = list(t.label_names)
        entry["trained_inputs"] = trained_inputs(t)
        entry.update(task_columns(t))
        heads.append(entry)
    LoadedModel(
        model=model.to("cpu"),
        kind="multitask",
        config=model.cfg,
        tokenizer=loaded.tokenizer,
        labels=None,
        task=mixture.name,
        max_length=max_length,
        pooling=resolve_pooling(cfg, loaded).pooling,
        with_types=loaded.with_types,
        head=to_dict(model.head_cfg),
        extra={
            "finetuned_from": loaded.source,
            "seed": seed,
            "mixture": list(mixture.tasks),
            "rates": mixture.rates,
            "tasks": heads,
        },
    ).save(out)
