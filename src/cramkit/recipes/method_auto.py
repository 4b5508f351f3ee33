"""``finetune --method auto``: the few-label method chosen by the labelled rows themselves.

Which method wins depends on the task (SetFit on topic tasks, the head on SST-2, deep prompts on MRPC), and the
spread between splits is larger than any gap between them, so no default can choose. Cross-validation can:

1. every labelled row the run may look at is pooled: the training rows and, under a few-shot protocol, the dev
   rows drawn to choose checkpoints (LM-BFF's K per class, FewCLUE's dev_K; never a split the score is read
   from), then dealt into ``auto_folds`` folds that keep the classes balanced (each class's rows shuffled and
   dealt in turn; a regression task's rows by the order of their scores);
2. every candidate method (``auto_methods``: head, SetFit, deep prompts, and prompts where the model has an MLM
   head that reads the context) is trained on the other folds and scored on the held-out one with the task's
   metric, ``auto_steps`` of its steps (SetFit: of its pairs) so that F folds x M methods cost about M x
   ``auto_steps`` x F trainings, not F x M;
3. the first candidate (head by default) is kept unless another beats it on the folds by more than the standard
   error of their paired differences (the largest such lead wins): with 8-16 rows held out per fold, smaller
   gaps are noise, and choosing on noise cost 5 points against the best method in hindsight (bench/RESULTS.md);
   the choice is trained on the training rows by the normal path, ``--method X``'s: the same settings, the same
   model, the same files.

Every candidate's fold scores, mean, sd and lead over the first, the methods left out and why, the choice and what
the cross-validation cost against the final training go to results.json (``method_auto``) and one line. Each
finished cross-validation run is recorded in ``OUT/method-auto.json``, so a run killed midway resumes where it
stopped.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from cramkit.errors import CramkitError

if TYPE_CHECKING:
    from cramkit.loading import LoadedModel
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.tasks.registry import Example, Task

PathLike = str | os.PathLike
AUTO_FILE = "method-auto.json"
CV_SPLIT = "cv_fold"


def check_route(cfg: FinetuneConfig, *, few_shot: int | None = None, suite: bool = False) -> None:
    """What ``--method auto`` can run, checked before anything is read: K per class of ``--few-shot`` enough for
    the folds; a suite only under a few-shot protocol (``suite``: ``cramkit eval`` without one)."""
    if cfg.method != "auto":
        return
    if suite:
        raise CramkitError(
            "--method auto chooses a method by cross-validation on a few labels; a suite's full training sets are "
            "not few: give --few-shot K (or FewCLUE's --fewshot-splits), or leave out --method (head)"
        )
    if few_shot is not None and few_shot < cfg.auto_folds:
        raise CramkitError(
            f"--method auto: --few-shot {few_shot} gives {few_shot} rows per class, fewer than the {cfg.auto_folds} "
            f"folds of its cross-validation (each fold holds out a row of every class): give --few-shot "
            f"{cfg.auto_folds} or more, or --set auto_folds={max(2, few_shot)}"
            + ("" if few_shot >= 2 else " with K >= 2")
        )


def make_folds(task: Task, rows: list[Example], folds: int, seed: int) -> list[list[int]]:
    """``rows`` (their positions) dealt into ``folds`` folds that keep the classes balanced: each class's rows
    shuffled, then dealt in turn, the next class starting where the last one stopped (a regression task's rows in
    the order of their scores, so each fold spans the range). One line when a class has fewer rows than folds."""
    rng = np.random.default_rng([folds, seed, 29])
    if task.is_regression:
        if len(rows) < 2 * folds:
            raise CramkitError(
                f"--method auto: task {task.name} has {len(rows)} labelled rows, fewer than 2 per fold of its "
                f"{folds}-fold cross-validation: --set auto_folds={max(2, len(rows) // 2)}, or choose a method"
            )
        groups = [sorted(range(len(rows)), key=lambda i: float(rows[i].label))]  # type: ignore[arg-type]
    else:
        by_class: dict[int, list[int]] = {}
        for i, e in enumerate(rows):
            by_class.setdefault(int(e.label), []).append(i)  # type: ignore[arg-type]
        names = task.labels or []
        for c, members in sorted(by_class.items()):
            if len(members) < folds:
                name = names[c] if c < len(names) else str(c)
                raise CramkitError(
                    f"--method auto: class {name} of task {task.name} has {len(members)} labelled rows, fewer than "
                    f"the {folds} folds of its cross-validation (each fold holds out a row of every class): give "
                    f"--set auto_folds={max(2, len(members))} or more labels"
                    + ("" if len(members) >= 2 else ", or choose a method (--method head)")
                )
        groups = [[members[j] for j in rng.permutation(len(members))] for _, members in sorted(by_class.items())]
    out: list[list[int]] = [[] for _ in range(folds)]
    at = 0
    for members in groups:
        for i in members:
            out[at % folds].append(i)
            at += 1
    return [sorted(f) for f in out]


def candidates(task: Task, loaded: LoadedModel, cfg: FinetuneConfig, rows: list[Example]) -> tuple[list, dict]:
    """The methods of ``auto_methods`` that fit ``task`` and the model, and those left out with why."""
    from cramkit.recipes.finetune_prompt import resolve_prompt

    keep, skipped = [], {}
    for method in [m.strip() for m in cfg.auto_methods.split(",") if m.strip()]:
        why = _unfit(task, loaded, method)
        if why is None:
            try:
                spec = resolve_prompt(task, loaded, method_cfg(cfg, method))
                if spec is not None and not _reads_context(task, loaded, method_cfg(cfg, method), spec, rows):
                    why = (
                        "its MLM head gives every labelled row one label before training (it does not read the context)"
                    )
            except CramkitError as exc:
                why = str(exc)
        if why is None:
            keep.append(method)
        else:
            skipped[method] = why
    return keep, skipped


def _unfit(task: Task, loaded: LoadedModel, method: str) -> str | None:
    """Why ``method`` cannot train on ``task`` from ``loaded``, in a few words (None: it can)."""
    from cramkit.model.heads import MLMHead

    kind = "a regression task" if task.is_regression else "a multiple-choice task"
    if method in ("setfit", "prompt") and (task.is_regression or task.is_multiple_choice):
        return f"{kind}: it needs classes"
    if method == "ptuning" and task.is_multiple_choice:
        return f"{kind}: deep prompts train a classification or regression head"
    if method == "prompt" and not isinstance(getattr(loaded.model, "head", None), MLMHead):
        return "no MLM head"
    return None


def _reads_context(task: Task, loaded: LoadedModel, cfg: FinetuneConfig, spec: Any, rows: list[Example]) -> bool:
    """Whether the prompt, before training, gives the labelled rows more than one label (one label for every row:
    an MLM head that predicts word frequencies whatever the sentence; ``recipes.finetune_prompt.zero_shot``)."""
    from cramkit.recipes.finetune_model import build_model, encode_task_examples, predict
    from cramkit.runtime import resolve_device

    max_length = min(cfg.max_length, loaded.max_length)
    enc = encode_task_examples(task, loaded.tokenizer, rows, max_length, spec)
    model = build_model(loaded, task.num_labels, cfg, prompt=spec)
    logits = predict(model, enc, cfg, resolve_device(cfg.device), loaded.pad_id, loaded.with_types)
    return len(set(logits.argmax(1).tolist())) > 1


def method_cfg(cfg: FinetuneConfig, method: str) -> FinetuneConfig:
    """``cfg`` as ``--method METHOD`` would give it (the template and label words only for prompts)."""
    if method == "prompt":
        return dataclasses.replace(cfg, method="prompt")
    return dataclasses.replace(cfg, method=cast(Any, method), prompt="", label_words="")


def cv_cfg(cfg: FinetuneConfig, method: str, all_rows: int, fold_rows: int) -> FinetuneConfig:
    """The settings of one cross-validation run: ``method``'s, one seed, the last model (no dev evaluations, no
    checkpoints, no trackers), ``auto_steps`` of the steps the method trains on every labelled row (SetFit: of
    its pairs per row), given as epochs so that no step-floor line is printed for each run."""
    one = dataclasses.replace(
        method_cfg(cfg, method),
        seeds=cfg.seeds[:1],
        keep="last",
        eval_every="never",
        checkpoint_every="never",
        report_to="none",
        max_train_examples=0,
        max_eval_examples=0,
    )
    if method == "setfit":
        return dataclasses.replace(one, setfit_pairs=max(1, round(cfg.setfit_pairs * cfg.auto_steps)))
    steps = max(1, round(cfg.steps(all_rows)[0] * cfg.auto_steps))
    per_epoch = math.ceil(fold_rows / cfg.batch_size)
    return dataclasses.replace(one, min_steps=0, epochs=(steps - 0.5) / per_epoch)


def fold_view(task: Task, train: list[Example], held: list[Example]) -> Task:
    """``task`` with ``train`` as its training rows and ``held`` as its one (scored) dev split, no test split."""
    return dataclasses.replace(
        task,
        splits={"train": lambda: train, CV_SPLIT: lambda: held},
        train_split="train",
        dev_splits=[CV_SPLIT],
        score_splits=[CV_SPLIT],
        test_splits=[],
        skipped={},
        _cache={"train": train, CV_SPLIT: held},
    )


def finetune_auto(
    task: Task,
    source: PathLike | LoadedModel,
    cfg: FinetuneConfig,
    out_dir: PathLike | None,
    *,
    train: Callable[..., dict[str, Any]],
    progress: bool = True,
    predict_also: Any = (),
) -> dict[str, Any]:
    """``--method auto`` on ``task``: cross-validation among the candidate methods on its labelled training rows,
    then the best one trained on all of them by ``train`` (:func:`cramkit.recipes.finetune.finetune`, which calls
    this and passes itself) into ``out_dir``.
    Returns that training's results with ``method_auto`` added (also out_dir/results.json)."""
    from cramkit.config import to_dict
    from cramkit.io import write_json_atomic
    from cramkit.loading import LoadedModel as Loaded
    from cramkit.loading import load_torch
    from cramkit.recipes.finetune_config import SETTINGS_FILE
    from cramkit.runtime import torchrun

    if torchrun().world > 1:
        raise CramkitError("--method auto trains its candidates one after another in one process; leave out --nproc")
    rows = task.examples(task.train_split)
    if cfg.max_train_examples:
        rows = rows[: cfg.max_train_examples]
    if len(rows) > cfg.auto_max_rows:
        raise CramkitError(
            f"--method auto is for few labels: task {task.name} has {len(rows):,} labelled training rows (more than "
            f"auto_max_rows={cfg.auto_max_rows:,}); with this many, fine-tune the whole model: leave out --method "
            "(head), or --few-shot K to draw K per class, or --set auto_max_rows=N to cross-validate anyway"
        )
    if out_dir is not None:
        from cramkit.io import RUN_OUTPUTS, check_out

        own = {SETTINGS_FILE: ("task", "config"), AUTO_FILE: ("key", "runs")}  # a fine-tuning's, its cross-validation's
        check_out(out_dir, inputs=[source], own=own, writes=RUN_OUTPUTS, command="cramkit finetune --method auto")
    loaded = source if isinstance(source, Loaded) else load_torch(source, purpose="fine-tuning")
    methods, skipped = candidates(task, loaded, cfg, rows)
    if not methods:
        why = "; ".join(f"{m}: {w}" for m, w in skipped.items())
        raise CramkitError(f"--method auto: none of auto_methods={cfg.auto_methods} fits task {task.name} ({why})")
    pool = rows + selection_rows(task)
    folds = make_folds(task, pool, cfg.auto_folds, cfg.seeds[0]) if len(methods) > 1 else []
    cv = _cross_validate(task, loaded, cfg, pool, len(rows), folds, methods, out_dir, progress, train) if folds else {}
    chosen = choose(cv, methods) if cv else methods[0]
    res = train(task, loaded, method_cfg(cfg, chosen), out_dir, progress=progress, predict_also=predict_also)
    final = sum(float(s.get("train_seconds", 0.0)) for s in res.get("seeds", []))
    spent = sum(c["train_seconds"] for c in cv.values())
    res["config"] = to_dict(cfg)  # what was asked (method auto): a rerun of it reuses these results
    res["method_auto"] = {
        "chosen": chosen,
        "folds": cfg.auto_folds if cv else 0,
        "rows": len(rows),
        "cv_rows": len(pool) if cv else 0,
        "rule": f"{methods[0]} unless another leads it by more than the standard error of the fold differences",
        "metric": task.main_metric,
        "cv_steps": cfg.auto_steps,
        "cv": cv,
        "skipped": skipped,
        "cv_seconds": round(spent, 2),
        "final_seconds": round(final, 2),
        "cost_ratio": round(spent / final, 2) if final > 0 else None,
    }
    if out_dir is not None and res:
        from cramkit.io import disk_errors

        with disk_errors(out_dir):
            write_json_atomic(Path(out_dir) / "results.json", res)
    print(summary_line(res["method_auto"]), file=sys.stderr, flush=True)
    return res


def _cross_validate(
    task: Task,
    loaded: LoadedModel,
    cfg: FinetuneConfig,
    rows: list[Example],
    train_rows: int,
    folds: list[list[int]],
    methods: list[str],
    out_dir: PathLike | None,
    progress: bool,
    train: Callable[..., dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Every candidate trained on all folds of ``rows`` but one and scored on that one, for a quarter
    (``auto_steps``) of the steps it trains on the ``train_rows`` training rows; each run recorded in
    ``out_dir/method-auto.json`` as it finishes (a rerun of the same settings and rows reuses it). Returns each
    method's fold scores, mean, sd, lead over the first method with its standard error, and training seconds."""
    import contextlib
    import io

    from cramkit.config import to_dict
    from cramkit.io import dir_lock, disk_errors, json_loads, json_text, write_json_atomic

    key = {
        "task": task.name,
        "source": str(loaded.source),
        "config": to_dict(cfg),
        "folds": [[["train" if i < train_rows else "dev", int(rows[i].idx)] for i in fold] for fold in folds],
    }
    record = Path(out_dir) / AUTO_FILE if out_dir is not None else None
    runs: dict[str, Any] = {}
    if record is not None and record.is_file():
        try:
            old = json_loads(json_text(record))
            runs = dict(old["runs"]) if isinstance(old, dict) and old.get("key") == key else {}
        except (OSError, ValueError, KeyError, TypeError):
            runs = {}  # damaged: cross-validate again
    if progress:
        print(
            f"method auto: {len(folds)}-fold cross-validation of {', '.join(methods)} on {len(rows)} labelled rows "
            f"({len(folds) * len(methods)} runs of {cfg.auto_steps:g} of each method's steps) ...",
            file=sys.stderr,
            flush=True,
        )
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    lock = dir_lock(out_dir, "--out") if out_dir is not None else contextlib.nullcontext()
    writing = disk_errors(out_dir) if out_dir is not None else contextlib.nullcontext()
    with lock, writing:
        for method in methods:
            for f, held in enumerate(folds):
                name = f"{method}/{f}"
                if isinstance(runs.get(name), dict) and "score" in runs[name]:
                    continue
                inside = set(held)
                fit = [rows[i] for i in range(len(rows)) if i not in inside]
                view = fold_view(task, fit, [rows[i] for i in held])
                t0 = time.perf_counter()
                with contextlib.redirect_stderr(io.StringIO()):  # the engine's notes, twice for each of F x M runs
                    res = train(view, loaded, cv_cfg(cfg, method, train_rows, len(fit)), None, progress=False)
                runs[name] = {
                    "score": float(res["score"]),
                    "train_seconds": sum(float(s["train_seconds"]) for s in res["seeds"]),
                    "seconds": round(time.perf_counter() - t0, 2),
                }
                if record is not None:
                    write_json_atomic(record, {"key": key, "runs": runs})
            if progress:
                scores = [runs[f"{method}/{f}"]["score"] for f in range(len(folds))]
                sd = statistics.stdev(scores) if len(scores) > 1 else 0.0
                took = sum(runs[f"{method}/{f}"]["seconds"] for f in range(len(folds)))
                print(
                    f"method auto: {method}: CV {task.main_metric} {statistics.fmean(scores):.1f} ± {sd:.1f} "
                    f"({took:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    out = {}
    for method in methods:
        scores = [runs[f"{method}/{f}"]["score"] for f in range(len(folds))]
        out[method] = {
            "mean": statistics.fmean(scores),
            "sd": statistics.stdev(scores) if len(scores) > 1 else 0.0,
            "folds": [round(s, 3) for s in scores],
            "train_seconds": round(sum(runs[f"{method}/{f}"]["train_seconds"] for f in range(len(folds))), 2),
        }
    first = out[methods[0]]["folds"]
    for method in methods[1:]:
        diffs = [a - b for a, b in zip(out[method]["folds"], first, strict=True)]
        out[method]["lead"] = round(statistics.fmean(diffs), 3)
        out[method]["lead_se"] = round(statistics.stdev(diffs) / math.sqrt(len(diffs)), 3) if len(diffs) > 1 else 0.0
    return out


def choose(cv: dict[str, dict[str, Any]], methods: list[str]) -> str:
    """The first of ``methods`` unless another beats it on the folds by more than the standard error of the
    paired differences (``lead`` > ``lead_se``); among several such, the largest lead (ties: the earlier one)."""
    ahead = [m for m in methods[1:] if cv[m]["lead"] > 0 and cv[m]["lead"] > cv[m]["lead_se"]]
    return max(ahead, key=lambda m: (cv[m]["lead"], -methods.index(m))) if ahead else methods[0]


def selection_rows(task: Task) -> list[Example]:
    """The labelled rows of the splits a run looks at to choose (checkpoints, the kept seed) and that no score is
    read from: a few-shot protocol's drawn dev rows; none for a task whose dev split is its score."""
    scored = set(task.scored_splits)
    return [e for s in task.dev_splits if s not in scored for e in task.examples(s)]


def summary_line(auto: dict[str, Any]) -> str:
    """One line: the method chosen with its CV score, the others', those left out, and what the CV cost."""
    cv, chosen = auto["cv"], auto["chosen"]
    if not cv:
        left = "; ".join(f"{m} skipped: {w}" for m, w in auto["skipped"].items())
        return f"method auto: {chosen}, the only method that fits (no cross-validation; {left})"
    best = cv[chosen]
    others = [f"{m} {c['mean']:.1f} ± {c['sd']:.1f}" for m, c in cv.items() if m != chosen]
    if chosen == next(iter(cv)) and len(cv) > 1:
        others.append("no other ahead by more than its standard error")
    others += [f"{m} skipped: {w}" for m, w in auto["skipped"].items()]
    ratio = auto["cost_ratio"]
    cost = f"{ratio:.1f}x the final training ({auto['final_seconds']:.0f} s)" if ratio is not None else "n/a"
    return (
        f"method auto: {chosen} ({auto['folds']}-fold CV {auto['metric']} {best['mean']:.1f} ± {best['sd']:.1f}; "
        f"{', '.join(others)}) — CV {auto['cv_seconds']:.0f} s of training, {cost}"
    )
