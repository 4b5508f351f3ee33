"""Evaluate an encoder on a suite (GLUE, CLUE, ...): fine-tune on every task present, then one table and one chart.

evaluate_suite("glue", "runs/tiny", "glue_data", "out/glue")
# -> out/glue/results.json, results.md (task by task + the suite's average), scores.png, TASK/results.json,
#    submission/ (every task's test predictions, in the leaderboard's file names and format)

A task in FewCLUE's layout follows FewCLUE's protocol (:func:`finetune_fewshot`): train_K of each split K, scored
on test_public; the mean over the splits and their standard deviation (without ``fewshot_splits``: ``few_all``).
"""

from __future__ import annotations

import difflib
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from cramkit.errors import CramkitError
from cramkit.io import json_loads, json_text
from cramkit.loading import LoadedModel, load_torch
from cramkit.recipes import FEWSHOT_SPLITS
from cramkit.recipes.finetune import finetune, write_json
from cramkit.recipes.finetune_config import FinetuneConfig
from cramkit.tasks.registry import Suite, Task, get_suite

PathLike = str | os.PathLike
# trains one split of a few-shot protocol: (task view, model, config, its directory, progress=, label=) -> results
SplitTrainer = Callable[..., dict[str, Any]]
SUBMISSION_DIR = "submission"


def plus_minus(few: dict[str, Any]) -> str:
    """ " ± sd" over a few-shot result's splits, or nothing for a single split (which has no spread)."""
    return f" ± {few['std']:.2f}" if len(few.get("splits", ())) > 1 else ""


def evaluate_suite(
    suite: str,
    source: PathLike,
    data_dir: PathLike | None,
    out_dir: PathLike,
    cfg: FinetuneConfig | None = None,
    *,
    skip_bad_rows: bool = False,
    progress: bool = True,
    tasks: Sequence[str] | None = None,
    fewshot_splits: Sequence[str] | None = None,
    few_shot: int | None = None,
    splits: int = FEWSHOT_SPLITS,
) -> dict[str, Any]:
    """Fine-tune and score ``source`` on every task of ``suite`` (a registered :class:`Suite`) whose data
    is in data_dir.

    Absent tasks are skipped with a note (in results.json and results.md). Writes results.json,
    results.md and scores.png to out_dir, each task's own results and test predictions to
    out_dir/<task>/, and a copy of every task's test predictions to out_dir/submission/. fewshot_splits
    (e.g. ["0", "1", "few_all"]): the FewCLUE splits to run for tasks in FewCLUE's layout. few_shot (K):
    LM-BFF's protocol for every classification task instead, ``splits`` splits of K per class.
    """
    if few_shot is not None and fewshot_splits:
        raise CramkitError(
            "--few-shot K (LM-BFF's protocol) and --fewshot-splits (FewCLUE's) are two protocols: give one"
        )
    from cramkit.config import to_dict

    spec = get_suite(suite)
    cfg = cfg or FinetuneConfig()
    if cfg.label_names:
        raise CramkitError("label_names names one task's labels: give it to cramkit finetune, not to a suite")
    wanted = _wanted(spec, tasks)
    todo, skipped = _plan(spec, spec.tasks(data_dir, skip_bad_rows), wanted, cfg, few_shot, splits, fewshot_splits)
    if fewshot_splits and todo and not any(ks for _, ks in todo):
        raise CramkitError(
            f"--fewshot-splits: no task to run in {data_dir} is in FewCLUE's layout (TASK/train_0.json ... "
            "test_public.json); leave the option out"
        )
    for task, ks in todo:
        if fewshot_splits and not ks:
            print(
                f"cramkit: note: {task.name} is not in FewCLUE's layout: --fewshot-splits does not apply to it",
                file=sys.stderr,
            )
    if not todo:
        raise CramkitError(
            f"cramkit eval: no {suite.upper()} task to run in {data_dir} "
            f"({'; '.join(f'{k}: {v}' for k, v in skipped.items())}). Its data: {spec.data_hint}"
        )
    loaded = load_torch(source, purpose="evaluation")  # once for all tasks
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    done, entries, submission = _run_tasks(todo, loaded, cfg, out, data_dir, progress, few_shot)

    average = spec.average(entries)
    results: dict[str, Any] = {
        "suite": suite,
        "source": str(source),
        "data_dir": str(data_dir) if data_dir is not None else None,
        "config": to_dict(cfg),
        "tasks": done,
        "entries": entries,
        "average": average,
        "average_note": spec.average_note,
        "skipped": skipped,
        "complete": not skipped and set(done) == set(spec.task_names),
    }
    if suite == "glue":  # the names results.json has always had for GLUE
        results["glue_average"] = average
        results["glue_average_over"] = sorted(entries)
    results["submission"] = _collect_submission(out / SUBMISSION_DIR, submission)
    write_json(out / "results.json", results)
    write_report(
        out,
        results,
        title=f"{suite.upper()} results",
        average_name=f"{suite.upper()} average",
        total=len(spec.task_names),
    )
    return results


def _plan(
    spec: Suite,
    all_tasks: Sequence[Task],
    wanted: set[str] | None,
    cfg: FinetuneConfig,
    few_shot: int | None,
    splits: int,
    fewshot_splits: Sequence[str] | None,
) -> tuple[list[tuple[Task, list[str] | None]], dict[str, str]]:
    """(the tasks to run, each with its few-shot splits or None for plain fine-tuning; the suite's tasks skipped,
    each with why). Every few-shot split is drawn and read here, before anything is trained."""
    from cramkit.tasks.clue import fewshot_task, is_fewclue
    from cramkit.tasks.fewshot import few_shot_task

    present = {t.name for t in all_tasks}
    skipped = {name: "no data in --data-dir" for name in spec.task_names if name not in present}
    todo: list[tuple[Task, list[str] | None]] = []
    ks: list[str] | None
    for task in all_tasks:
        if wanted is not None and task.name not in wanted:
            continue
        unfit = _method_unfit(task, cfg)
        if unfit:
            skipped[task.name] = unfit
            continue
        if few_shot is not None:
            if task.is_regression:
                skipped[task.name] = "a regression task: no classes to draw K per class from"
                continue
            ks = [str(i) for i in range(splits)]
            for k in ks:  # every split draws and reads before anything is trained
                view = few_shot_task(task, few_shot, int(k))
                for split in (view.train_split, *view.dev_splits):
                    view.examples(split)
            todo.append((task, ks))
            continue
        if is_fewclue(task):
            ks = list(fewshot_splits or ["few_all"])
            for k in ks:  # every split asked for is there and reads, before anything is trained
                view = fewshot_task(task, k)
                for split in (view.train_split, *view.dev_splits):
                    view.examples(split)
            todo.append((task, ks))
            continue
        missing = [s for s in [task.train_split, *task.dev_splits] if not _split_present(task, s)]
        if missing:
            skipped[task.name] = f"no {', '.join(missing)} split in --data-dir"
            continue
        todo.append((task, None))
    if wanted is not None:
        skipped = {k: v for k, v in skipped.items() if k in wanted}
    return todo, skipped


def _run_tasks(
    todo: list[tuple[Task, list[str] | None]],
    loaded: LoadedModel,
    cfg: FinetuneConfig,
    out: Path,
    data_dir: PathLike | None,
    progress: bool,
    few_shot: int | None,
) -> tuple[dict[str, Any], dict[str, dict[str, float]], dict[str, list[str]]]:
    """Every task fine-tuned into out/TASK (or reused when an earlier run finished it), the time left on stderr:
    (each task's summary, the median metrics of each scored entry, each task's test prediction files)."""
    from cramkit.config import to_dict

    done: dict[str, Any] = {}
    entries: dict[str, dict[str, float]] = {}  # "glue/mnli:dev_matched" -> median metrics
    submission: dict[str, list[str]] = {}  # task -> its test prediction files
    start = time.perf_counter()
    ran = 0
    for i, (task, ks) in enumerate(todo, 1):
        task_dir = out / task.name.split("/")[-1]
        res = _finished(task_dir, loaded.source, to_dict(cfg), ks, few_shot)
        if res is not None:
            print(f"cramkit: [{i}/{len(todo)}] {task.name}: already done in {task_dir}, reused", file=sys.stderr)
        else:
            what = f"FewCLUE split(s) {','.join(ks)}" if ks else "fine-tuning"
            if few_shot is not None:
                what = f"{len(cast(list, ks))} few-shot splits of K={few_shot} per class"
            print(f"cramkit: [{i}/{len(todo)}] {task.name}: {what} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            if ks:
                res = finetune_fewshot(task, loaded, cfg, task_dir, ks, progress=progress, k=few_shot)
            else:
                also = _diagnostics(task.name, data_dir)
                res = finetune(task, loaded, cfg, task_dir, progress=progress, predict_also=also)
            ran += 1
            took = time.perf_counter() - t0
            left = (time.perf_counter() - start) / ran * (len(todo) - i)
            spread = plus_minus(res["fewshot"]) if ks else ""
            print(
                f"cramkit: [{i}/{len(todo)}] {task.name}: {res['main_metric']} {res['score']:.2f}{spread} in "
                f"{took:.0f}s{f'; about {left / 60:.1f} min left' if i < len(todo) else ''}",
                file=sys.stderr,
                flush=True,
            )
        done[task.name] = _summary(res)
        for split, med in res["median"].items():
            key = task.name if len(res["median"]) == 1 else f"{task.name}:{split}"
            entries[key] = med["metrics"]
        submission[task.name] = _prediction_files(res)
    return done, entries, submission


def _method_unfit(task: Task, cfg: FinetuneConfig) -> str | None:
    """Why ``cfg.method`` cannot run on ``task`` within a suite (the task is then skipped with this note)."""
    from cramkit.tasks.prompts import builtin_prompt

    if cfg.method == "prompt" and task.kind != "classification":
        return f"a {task.kind} task: a prompt needs classes"
    if cfg.method == "prompt" and not (cfg.prompt and cfg.label_words) and builtin_prompt(task.name) is None:
        return "no built-in prompt: fine-tune it alone with --prompt and --label-words"
    if cfg.method == "setfit" and (task.kind != "classification" or task.is_multiple_choice):
        return f"a {task.kind} task: SetFit fits a classifier"
    if cfg.method == "ptuning" and task.is_multiple_choice:
        return "multiple choice: deep prompts train a classification or regression head"
    return None


def _wanted(spec: Suite, tasks: Sequence[str] | None) -> set[str] | None:
    """--tasks as the suite's task names ("rte" -> "glue/rte"), each one of them (did-you-mean otherwise)."""
    if not tasks:
        return None
    by_short = {n.split("/")[-1]: n for n in spec.task_names}
    wanted = {t if t in spec.task_names else by_short.get(t.lower(), t) for t in tasks}
    unknown = sorted(w for w in wanted if w not in spec.task_names)
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name.split("/")[-1].lower(), list(by_short), n=1, cutoff=0.5)
            if close:
                hints.append(f"'{name}': did you mean '{close[0]}'?")
        raise CramkitError(
            f"--tasks: unknown {spec.name.upper()} task(s) {', '.join(unknown)}"
            f"{' (' + '; '.join(hints) + ')' if hints else ''}; known: {', '.join(by_short)}"
        )
    return wanted


def finetune_fewshot(
    task: Task,
    source: PathLike | LoadedModel,
    cfg: FinetuneConfig,
    out_dir: PathLike,
    splits: Sequence[str],
    *,
    progress: bool = True,
    k: int | None = None,
    train_split: SplitTrainer | None = None,
    summarize: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    keep_model: bool = False,
) -> dict[str, Any]:
    """A few-shot protocol on one task, each split fine-tuned into out_dir/split-S/ (its model, results, test
    predictions). ``train_split``: how a split is trained instead of :func:`finetune` (self-training: the api
    passes it), ``summarize``: what its results add to the whole's, from every split's.

    FewCLUE's (``k`` None): split S trains on train_S (dev_S picks the kept seed), scored on test_public.
    LM-BFF's (``k``): split S is K examples per class for training and K for the dev set that keeps the best
    checkpoint, drawn from the training data (:func:`cramkit.tasks.fewshot.few_shot_task`), scored on the task's
    own scored splits and on a labelled test file (``--test``).

    Returns (and writes to out_dir/results.json) each split's metrics, their mean (``score``, ``median``) and
    standard deviation (``fewshot.std``), ``test``: a labelled test file's, per split and the mean. ``keep_model``:
    out_dir also holds the model of the split best on the scored split (``model``): ``cramkit.load(out_dir)``.
    """
    import dataclasses

    from cramkit.config import to_dict
    from cramkit.recipes.frozen_baseline import frozen_baseline
    from cramkit.tasks.clue import fewshot_task
    from cramkit.tasks.fewshot import few_shot_task

    if k is None:
        views = [(s, fewshot_task(task, s)) for s in splits]  # a missing split fails before any training
    else:
        views = [(s, _with_tests(few_shot_task(task, k, int(s)), task)) for s in splits]
        if cfg.keep == "last" and cfg.eval_every not in ("never", "0", "off"):
            cfg = dataclasses.replace(cfg, keep="best")  # the sampled dev set picks the checkpoint
    loaded = source if isinstance(source, LoadedModel) else load_torch(source, purpose="fine-tuning")
    out = Path(out_dir)
    per_split: dict[str, Any] = {}
    files: dict[str, str] = {}
    from cramkit.progress import parts_left

    clock: list[float] = []  # the seconds of each split trained by this invocation: the time left from them
    for n, (key, view) in enumerate(views, 1):
        run, t0 = out / f"split-{key}", time.perf_counter()
        if k is not None:  # a split directory holds one draw: another K (or task) is never mixed into it
            _claim_sample(run, view, k, key)
        res = _finished(run, loaded.source, to_dict(cfg), None) if train_split is None else None
        if res is None and train_split is not None:
            res = train_split(view, loaded, cfg, run, progress=progress, label=f"split {key}")
        elif res is None:
            res = finetune(view, loaded, cfg, run, progress=progress)
        if progress and n < len(views) and time.perf_counter() - t0 > 1:
            clock.append(time.perf_counter() - t0)
            print(f"cramkit: few-shot split {parts_left(n, len(views), clock)}", file=sys.stderr, flush=True)
        scored = {s: res["median"][s] for s in view.scored_splits}
        per_split[key] = {
            "score": res["score"],
            "metrics": _mean_metrics(list(scored.values())),
            "scored": scored,
            "dev": res["median"][view.selection_splits[0]],
            "train_examples": res["train_examples"],
            "trainable_parameters": res.get("trainable_parameters"),
            "lr": (res.get("seeds") or [{}])[0].get("lr"),  # the rate lr "auto" chose
            **({"zero_shot": res["zero_shot"]} if "zero_shot" in res else {}),
            **({"self_training": res["self_training"]} if "self_training" in res else {}),
            **({"test": res["test"]} if res.get("test") else {}),
        }
        for split, path in res.get("test_predictions", {}).get("files", {}).items() if k is None else ():
            files[f"{key}:{split}"] = path  # (LM-BFF's: a labelled --test file's, in each split's folder)
    scores = [per_split[key]["score"] for key in splits]
    baseline = frozen_baseline(loaded, views, cfg.device, cfg.precision)
    first = views[0][1]
    median = {
        s: {
            "metrics": _mean_metrics([per_split[key]["scored"][s] for key in splits]),
            "score": statistics.fmean(per_split[key]["scored"][s]["score"] for key in splits),
        }
        for s in first.scored_splits
    }
    results = {
        "task": task.name,
        "source": loaded.source,
        "config": to_dict(cfg),
        "main_metric": task.main_metric,
        "method": cfg.method,
        "score": statistics.fmean(scores),
        "median": median,
        "fewshot": {
            "protocol": "fewclue" if k is None else "lm-bff",
            **({"k": k} if k is not None else {}),
            "splits": list(splits),
            "per_split": per_split,
            "mean": statistics.fmean(scores),
            "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
            **({"frozen_baseline": baseline} if baseline is not None else {}),
        },
        "train_examples": {key: per_split[key]["train_examples"] for key in splits},
        "trainable_parameters": per_split[splits[0]]["trainable_parameters"],
        "test_predictions": {"files": files},
    }
    tested = [s for s in first.test_splits if all(s in per_split[key].get("test", {}) for key in splits)]
    for split in tested:  # a labelled test file: each split's score, their mean and spread
        each = [per_split[key]["test"][split] for key in splits]
        spread = statistics.stdev(x["score"] for x in each) if len(each) > 1 else 0.0
        mean = statistics.fmean(x["score"] for x in each)
        results.setdefault("test", {})[split] = {"metrics": _mean_metrics(each), "score": mean, "std": spread}
    skipped = {s: n for s, n in task.skipped.items() if n}
    if skipped:
        results["skipped_rows"] = skipped
    if summarize is not None:
        results.update(summarize(per_split))
    out.mkdir(parents=True, exist_ok=True)
    if keep_model:
        results["model"] = _keep_best_split(out, per_split, list(splits))
    write_json(out / "results.json", results)
    return results


def fewshot_run(
    task: Task,
    source: PathLike,
    cfg: FinetuneConfig,
    out_dir: PathLike,
    splits: Sequence[str],
    *,
    k: int | None = None,
    progress: bool = True,
    train_split: SplitTrainer | None = None,
    summarize: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``finetune --fewshot-splits`` (FewCLUE's protocol) or ``finetune --few-shot K --splits S`` (LM-BFF's,
    ``k``): every split is drawn and read before anything is trained or written; out_dir is checked as every
    output is; then :func:`finetune_fewshot`, results.md and scores.png with the mean and spread, and the test
    predictions in out_dir/submission (FewCLUE). ``train_split``, ``summarize``: as :func:`finetune_fewshot`'s."""
    from cramkit.io import RUN_OUTPUTS, check_out, disk_errors
    from cramkit.recipes.label_prior import first_lines
    from cramkit.tasks.clue import fewshot_task
    from cramkit.tasks.fewshot import few_shot_task

    for key in splits:  # a missing split, or K too large for a class, fails before anything is written
        view = fewshot_task(task, key) if k is None else few_shot_task(task, k, int(key))
        for split in (view.train_split, *view.dev_splits):
            view.examples(split)
    first_lines(task, cfg, unlabelled=train_split is not None)  # labels without words: the flag that helps
    out = Path(out_dir)
    own = {"split-*/finetune.json": ("task", "config"), f"split-*/{SAMPLE_FILE}": ("task", "k", "split")}
    check_out(out, inputs=[source], own=own, writes=RUN_OUTPUTS, command="the few-shot fine-tuning")
    with disk_errors(out):
        how: dict[str, Any] = {"progress": progress, "k": k, "train_split": train_split, "summarize": summarize}
        res = finetune_fewshot(task, source, cfg, out, splits, keep_model=True, **how)
        what = f"FewCLUE splits {','.join(splits)}" if k is None else f"{len(splits)} few-shot splits, K={k} per class"
        report = {
            "source": str(source),
            "tasks": {task.name: _summary(res)},
            "submission": _collect_submission(out / SUBMISSION_DIR, {task.name: _prediction_files(res)}),
        }
        write_report(out, report, title=f"{task.name}: {what}", average_name="", total=1)
    return res


SAMPLE_FILE = "fewshot-sample.json"


def _with_tests(view: Task, task: Task) -> Task:
    """A few-shot split's view with the task's labelled test files (``--test``) to score (not GLUE's unlabelled)."""
    import dataclasses

    tests = [s for s in task.test_splits if _split_present(task, s)]
    tests = [s for s in tests if all(e.label is not None for e in task.examples(s)) and task.examples(s)]
    if not tests:
        return view
    splits = {**view.splits, **{s: task.splits[s] for s in tests}}
    cache = {**view._cache, **{s: task.examples(s) for s in tests}}
    return dataclasses.replace(view, splits=splits, test_splits=tests, _cache=cache)


def _keep_best_split(out: Path, per_split: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """The model of the split best on the scored split (of equal ones the first) copied into ``out`` (loadable)."""
    from cramkit.loading.model_dir import copy_model

    best = max(keys, key=lambda key: (per_split[key]["score"], -keys.index(key)))
    copy_model(out / f"split-{best}", out)
    return {"split": best, "from": str(out / f"split-{best}"), "score": per_split[best]["score"], "of": len(keys)}


def _claim_sample(run: Path, view: Task, k: int, key: str) -> None:
    """Record which rows split ``key`` drew (``run``/fewshot-sample.json); a directory that holds another
    draw (another K, task or data) is refused: its finished seeds would otherwise be taken for this one's."""
    from cramkit.io import write_json_atomic
    from cramkit.tasks.fewshot import FEWSHOT_DEV

    sample = {"task": view.name, "k": k, "split": key, "train": [int(e.idx) for e in view.examples("train")]}
    sample["dev"] = [int(e.idx) for e in view.examples(FEWSHOT_DEV)]
    file = run / SAMPLE_FILE
    if file.is_file():
        try:
            old = json_loads(json_text(file))
        except (OSError, ValueError):
            old = None
        if old != sample:
            what = f"K={old.get('k')}" if isinstance(old, dict) else "an unreadable record"
            raise CramkitError(
                f"{run} holds few-shot split {key} of another draw ({what}, not K={k} of {view.name}); give "
                "another --out, or delete it"
            )
        return
    run.mkdir(parents=True, exist_ok=True)
    write_json_atomic(file, sample)


def _mean_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The mean of each metric over rows of ``{"metrics": {...}}``."""
    return {m: statistics.fmean(r["metrics"][m] for r in rows) for m in rows[0]["metrics"]}


def _summary(res: dict[str, Any]) -> dict[str, Any]:
    """A task's entry in the suite's results.json."""
    entry = {
        "score": res["score"],
        "main_metric": res["main_metric"],
        "median": res["median"],
        "train_examples": res["train_examples"],
    }
    if "fewshot" in res:
        entry["fewshot"] = res["fewshot"]
        entry.update({"test": res["test"]} if res.get("test") else {})
    else:
        entry["seeds"] = [
            {"seed": r["seed"], "dev": r["dev"], "examples_per_s": r["examples_per_s"]} for r in res["seeds"]
        ]
    return entry


def _prediction_files(res: dict[str, Any]) -> list[str]:
    """The test prediction files of a task's results (checked to cover their split by Task.write_predictions)."""
    return list(res.get("test_predictions", {}).get("files", {}).values())


def _collect_submission(folder: Path, files: dict[str, list[str]]) -> dict[str, str]:
    """Copy every task's test prediction files into ``folder`` (the leaderboard's names): {file name: task}."""
    out: dict[str, str] = {}
    for name, paths in files.items():
        for path in map(Path, paths):
            if not path.is_file():
                raise CramkitError(
                    f"{path}: the test predictions of {name} are gone; delete {path.parent.parent} and run again"
                )
            if path.name in out:
                raise CramkitError(
                    f"{path.name}: two tasks write a submission file of this name ({out[path.name]}, {name})"
                )
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, folder / path.name)
            out[path.name] = name
    return out


def _split_present(task: Any, split: str) -> bool:
    if split not in task.splits:
        return False
    try:
        src = task.source(split)
    except CramkitError:  # the loader says where its file should be, and that it is missing
        return False
    return src.startswith("hf:") or Path(src).is_file()


def _finished(
    task_dir: Path, source: str, config: dict[str, Any], splits: Sequence[str] | None, k: int | None = None
) -> dict[str, Any] | None:
    """The results of a task an earlier (interrupted) run finished with the same model, settings and splits."""
    from cramkit.rundir import finished_result

    res = finished_result(task_dir / "results.json", key="median")
    if res is None or res.get("source") != source or res.get("config") != config:
        return None
    fewshot = res.get("fewshot") or {}
    return res if fewshot.get("splits") == (list(splits) if splits else None) and fewshot.get("k") == k else None


# the diagnostic sets (test only) a task's model also predicts for the leaderboard
DIAGNOSTICS = {"glue/mnli": ("glue/ax",), "superglue/rte": ("superglue/axb", "superglue/axg")}


def _diagnostics(task: str, data_dir: PathLike | None) -> list:
    """The diagnostic sets ``task``'s model predicts whose file is present (GLUE's AX by MNLI's, SuperGLUE's AX-b
    and AX-g by RTE's)."""
    from cramkit.tasks.registry import get_task

    out = []
    for name in DIAGNOSTICS.get(task, ()):
        try:
            ax = get_task(name, data_dir=data_dir)
            present = Path(ax.source(ax.test_splits[0])).is_file()  # local file only: no hub call mid-suite
        except (CramkitError, IndexError):
            continue
        if present:
            out.append(ax)
    return out


# --------------------------------------------------------------------------------------------------- report


def write_report(out: Path, results: dict[str, Any], *, title: str, average_name: str, total: int) -> None:
    """results.md and scores.png for ``results`` (evaluate_suite's shape); total: the suite's task count."""
    _write_markdown(out / "results.md", results, title, average_name, total)
    _write_chart(out / "scores.png", results, title, average_name)


def _rows(results: dict[str, Any]):
    """(label for the chart, task, split, metrics, score, spread or None) per scored entry."""
    for name, res in results["tasks"].items():
        short = name.split("/")[-1]
        for split, med in res["median"].items():
            suffix = {"dev_matched": "m", "dev_mismatched": "mm"}.get(split, split)
            label = short if len(res["median"]) == 1 else f"{short}-{suffix}"
            spread = res["fewshot"]["std"] if "fewshot" in res else None
            yield f"{label}\n({res.get('main_metric') or 'score'})", name, split, med["metrics"], med["score"], spread


def _write_markdown(path: Path, results: dict[str, Any], title: str, average_name: str, total: int) -> None:
    from cramkit.io import write_text_atomic

    lines = [
        f"# {title}: {results['source']}",
        "",
        "| task | split | metrics (median over seeds; x100: accuracy %, F1 %, MCC x100, Pearson/Spearman r x100) "
        "| score |",
        "|---|---|---|---:|",
    ]
    for _, name, split, metrics, score, spread in _rows(results):
        res, text = results["tasks"][name], ", ".join(f"{m} {v:.2f}" for m, v in metrics.items())
        if spread is None:
            lines.append(f"| {name} | {split} | {text} | {score:.2f} |")
            continue
        few, lmbff = res["fewshot"], res["fewshot"].get("protocol") == "lm-bff"
        what, per = ("split", f" of K={few.get('k')} per class") if lmbff else ("FewCLUE split", "")
        if len(few["splits"]) < 2:  # one split has no spread to show
            lines.append(f"| {name} | {split}: {what} {few['splits'][0]}{per} | {text} | {score:.2f} |")
        else:
            lines.append(
                f"| {name} | {split}: mean ± sd over {what}s {', '.join(few['splits'])}{per} | {text} "
                f"(sd {spread:.2f}) | {score:.2f} ± {spread:.2f} |"
            )
        for k, one in few["per_split"].items():
            dev = one["dev"]["score"]
            how = f"its {few.get('k')} per class -> {split} (its drawn dev rows {dev:.2f})" if lmbff else ""
            text = ", ".join(f"{m} {v:.2f}" for m, v in one["metrics"].items())
            lines.append(
                f"| | split {k}: {how or f'train_{k} -> {split} (dev_{k} {dev:.2f})'} | {text} | {one['score']:.2f} |"
            )
        for test, t in res.get("test", {}).items() if split == list(res["median"])[-1] else ():
            each = ", ".join(f"{few['per_split'][k]['test'][test]['score']:.2f}" for k in few["splits"])
            text = ", ".join(f"{m} {v:.2f}" for m, v in t["metrics"].items())
            lines.append(
                f"| {name} | {test} (labelled test file), splits {each} | {text} | {t['score']:.2f} ± {t['std']:.2f} |"
            )
    avg = results.get("average")
    avg_text = f"{avg:.2f}" if avg is not None else "n/a"
    n = len(results["tasks"])
    if total > 1 and n >= total and not results.get("skipped"):  # (one task, finetune --fewshot-splits: no average)
        lines.append(f"| **{average_name}** | | over all {total} tasks | **{avg_text}** |")
    elif total > 1:
        lines.append(
            f"| {average_name} (partial) | | over {n} of {total} tasks only: not comparable to published averages "
            f"| {avg_text} |"
        )
    if results.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(f"{k} ({v})" for k, v in results["skipped"].items())]
    if any("f1" in m for _, _, _, m, _, _ in _rows(results)):
        lines += ["", "F1 is that of the positive class, label 1 (MRPC: paraphrase; QQP: duplicate)."]
    protocols = {r["fewshot"].get("protocol") for r in results["tasks"].values() if "fewshot" in r}
    if "fewclue" in protocols:
        lines += [
            "",
            "FewCLUE's protocol: for each split K, fine-tuned on train_K and scored on test_public (dev_K in "
            "brackets); the task's score is the mean over the splits, ± their sample standard deviation.",
        ]
    if "lm-bff" in protocols:
        lines += [
            "",
            "LM-BFF's protocol (--few-shot K): each split draws K rows per class from the training rows to train on "
            "and K more per class as the dev rows that pick the checkpoint; every split is scored on the task's dev "
            "split (your own files: --dev, else the rows held out of --train) and on a labelled --test file; the "
            "score is the mean over the splits, ± their sample standard deviation.",
        ]
    if results.get("average_note"):
        lines += ["", results["average_note"]]
    write_text_atomic(path, "\n".join(lines) + "\n")


def _write_chart(path: Path, results: dict[str, Any], title: str, average_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(_rows(results))
    names = [r[0] for r in rows]
    scores = [r[4] for r in rows]
    errors = [r[5] or 0.0 for r in rows]
    avg = results.get("average")
    if avg is not None:
        names.append(average_name.replace(" average", " avg"))
        scores.append(avg)
        errors.append(0.0)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(names) + 1.5), 3.6))
    colors = ["#4c72b0"] * len(rows) + ["#dd8452"] * (avg is not None)
    yerr = [e or float("nan") for e in errors] if any(errors) else None  # no bar for a task without spread
    bars = ax.bar(names, scores, color=colors, yerr=yerr, capsize=4)
    for bar, s, e in zip(bars, scores, errors, strict=True):
        where = (bar.get_x() + bar.get_width() / 2, max(s + e, 0))
        ax.annotate(f"{s:.1f}" + (f"±{e:.1f}" if e else ""), where, ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("score (main metric)")
    ax.set_ylim(min(0.0, min(scores, default=0) - 5), 100)
    source = str(results["source"])
    source = source if len(source) <= 60 else "..." + source[-57:]
    ax.set_title(f"{title} (x100): {source}", fontsize=9)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
