"""Tasks, registered once by name (seqio's shape, without its machinery), and the suites they form.

A :class:`Task` is a name, a loader per split returning :class:`Example` rows (text_a, text_b, label;
or a context and its choices), its kind (classification, regression or multiple choice), labels and
metrics. A :class:`Suite` (GLUE, CLUE, SuperGLUE) is a named set of tasks read from one data folder,
scored together by ``cramkit eval SUITE``. Built-in tasks (``glue/*``) are registered as factories, because where their
files live (``data_dir``) is only known when they are asked for; user tasks are registered as objects. The built-in
tasks register themselves when ``cramkit.tasks`` is imported (which importing this module does first).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cramkit.errors import CramkitError

PathLike = str | os.PathLike
TASK_KINDS = ("classification", "regression", "multiple_choice")
PREDICTION_FORMATS = ("glue", "clue", "superglue")


@dataclass(frozen=True)
class Example:
    """One row of a task: the text (or text pair), the label id / score (None on test splits), an index.

    idx is the row's index in the official file (the ``index`` / ``id`` column where the file has one,
    else the row number from 0); leaderboard files are keyed by it.

    A multiple-choice row has ``choices``: the model scores each pair (text_a, choice) (text_b, when
    present, is joined to text_a's side by the task's own preprocessing, never here) and label is the
    index of the right choice. ``group`` ties rows that are scored together (MultiRC's answers to one
    question: exact match per group); ``meta`` keeps what a task's metric or submission file needs
    beyond the label (never compared).
    """

    text_a: str
    text_b: str | None
    label: int | float | None
    idx: int
    choices: tuple[str, ...] | None = None
    group: int | None = None
    meta: dict | None = field(default=None, compare=False, hash=False)


@dataclass
class Task:
    """A named task: splits (name -> loader), kind, labels, metrics.

    kind: "classification" (labels: the label strings), "regression" (labels None, one score) or
    "multiple_choice" (labels None; each Example has choices and its label is the right one's index).
    Left empty it follows from labels. prediction_format: how test predictions are written for the
    benchmark's leaderboard: "glue" (index<TAB>prediction TSV), "clue" (JSON lines {"id", "label"}) or
    "superglue" (JSON lines {"idx", "label"}).

    A loader is any callable returning ``list[Example]``; one may also carry ``source`` (a description of
    the file it reads, used in messages) and, after being called, ``skipped`` (bad rows skipped).
    main_metric is the metric that stands for the task in one number (defaults to metrics[0]).
    """

    name: str
    splits: Mapping[str, Callable[[], list[Example]]]
    labels: list[str] | None
    metrics: list[str]
    main_metric: str | None = None
    train_split: str = "train"
    dev_splits: list[str] = field(default_factory=lambda: ["dev"])
    # the dev splits whose mean is the task's score (None: all of them); FewCLUE: test_public, the split it
    # reports (its dev split is scored beside it and is what a choice between runs looks at)
    score_splits: list[str] | None = None
    test_splits: list[str] = field(default_factory=lambda: ["test"])
    leaderboard_files: dict[str, str] = field(default_factory=dict)  # split -> file name, e.g. "RTE.tsv"
    label_names: list[str] | None = None  # readable names, e.g. ["unacceptable", "acceptable"] for "0"/"1"
    description: str = ""
    skipped: dict[str, int] = field(default_factory=dict)  # split -> bad rows skipped when loading it
    kind: str = ""  # classification | regression | multiple_choice ("" : from labels)
    prediction_format: str = "glue"  # glue | clue | superglue
    _cache: dict[str, list[Example]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        from cramkit.tasks.metrics import METRICS

        if not self.kind:
            self.kind = "regression" if self.labels is None else "classification"
        if self.kind not in TASK_KINDS:
            raise CramkitError(f"task {self.name}: unknown kind '{self.kind}'; known: {', '.join(TASK_KINDS)}")
        if self.kind != "classification" and self.labels is not None:
            raise CramkitError(f"task {self.name}: a {self.kind} task has no label set (labels=None)")
        if self.kind == "classification" and not self.labels:
            raise CramkitError(f"task {self.name}: a classification task needs its labels")
        if self.prediction_format not in PREDICTION_FORMATS:
            raise CramkitError(
                f"task {self.name}: unknown prediction_format '{self.prediction_format}'; "
                f"known: {', '.join(PREDICTION_FORMATS)}"
            )
        if self.main_metric is None:
            self.main_metric = self.metrics[0] if self.metrics else None
        for m in [*self.metrics, self.main_metric]:
            if m not in METRICS:
                raise CramkitError(f"task {self.name}: unknown metric '{m}'; known: {', '.join(METRICS)}")
        if self.main_metric not in self.metrics:
            raise CramkitError(f"task {self.name}: main_metric '{self.main_metric}' is not in its metrics")
        if self.labels is not None and len(set(self.labels)) != len(self.labels):
            raise CramkitError(f"task {self.name}: labels {self.labels} contain duplicates")
        regression_metrics = {"pearson", "spearman"}
        for m in self.metrics:
            if (m in regression_metrics) != self.is_regression:
                kind = "a regression" if self.is_regression else "a classification"
                raise CramkitError(f"task {self.name}: metric '{m}' does not fit {kind} task")

    @property
    def is_regression(self) -> bool:
        return self.kind == "regression"

    @property
    def is_multiple_choice(self) -> bool:
        return self.kind == "multiple_choice"

    @property
    def num_labels(self) -> int:
        """Outputs of the head: the number of labels, or 1 (regression's score, a choice's score)."""
        return len(self.labels) if self.labels is not None else 1

    @property
    def scored_splits(self) -> list[str]:
        """The dev splits the task's score is the mean of."""
        return [s for s in self.dev_splits if self.score_splits is None or s in self.score_splits]

    @property
    def selection_splits(self) -> list[str]:
        """The dev splits a choice between runs (the kept seed, the best epoch) looks at: those not
        reported as the score when there are any, so that a reported test split does not pick the run."""
        return [s for s in self.dev_splits if s not in self.scored_splits] or self.scored_splits

    def examples(self, split: str) -> list[Example]:
        """The split's examples (loaded once, then cached). CramkitError on an unknown or absent split."""
        if split not in self.splits:
            close = difflib.get_close_matches(split, list(self.splits), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise CramkitError(f"task {self.name} has no split '{split}'{hint}; its splits: {', '.join(self.splits)}")
        if split not in self._cache:
            loader = self.splits[split]
            rows = loader()
            self.skipped[split] = int(getattr(loader, "skipped", 0))
            self._cache[split] = rows
        return self._cache[split]

    def source(self, split: str) -> str:
        """Where a split comes from (a file path, a hub dataset), for messages."""
        return str(getattr(self.splits.get(split), "source", f"{self.name}:{split}"))

    def score(self, metric_values: dict[str, float]) -> float:
        """The one number that stands for this task (its main metric), e.g. MCC for CoLA."""
        if self.main_metric not in metric_values:
            raise CramkitError(f"task {self.name}: results lack its main metric '{self.main_metric}'")
        return float(metric_values[self.main_metric])

    def compute_metrics(self, predictions, labels, examples=None) -> dict[str, float]:
        """The task's metrics (0..100). examples: the scored rows in the same order, for metrics that
        need more than the label (groups for exact match, meta for answer strings)."""
        from cramkit.tasks.metrics import compute_metrics

        groups = None
        if examples is not None and any(e.group is not None for e in examples):
            groups = [e.group for e in examples]
        return compute_metrics(self.metrics, predictions, labels, groups=groups)

    def leaderboard_file(self, split: str) -> str:
        """File name for a split's predictions: the leaderboard's name (e.g. RTE.tsv, tnews_predict.json),
        else TASK-SPLIT.tsv (.jsonl for the JSON formats)."""
        if split in self.leaderboard_files:
            return self.leaderboard_files[split]
        ext = ".tsv" if self.prediction_format == "glue" else ".jsonl"
        return f"{self.name.replace('/', '-')}-{split}{ext}"

    def format_prediction(self, pred) -> str:
        """A prediction as the leaderboard writes it: the label string, the score with 3 decimals, or the
        index of the chosen choice."""
        if self.is_multiple_choice:
            return str(int(pred))
        if self.labels is None:
            return f"{float(pred):.3f}"
        if isinstance(pred, str):
            if pred not in self.labels:
                raise CramkitError(f"task {self.name}: prediction '{pred}' is not one of {self.labels}")
            return pred
        i = int(pred)
        if not 0 <= i < len(self.labels):
            raise CramkitError(f"task {self.name}: predicted label id {i} is outside 0..{len(self.labels) - 1}")
        return self.labels[i]

    def write_predictions(self, split: str, idx_and_preds: Iterable[tuple[int, object]], out_path: PathLike) -> Path:
        """Write predictions in the GLUE leaderboard format: ``index<TAB>prediction`` rows after a header.

        out_path is a directory (the file gets the leaderboard's name, e.g. MNLI-m.tsv) or a .tsv path.
        Predictions are label ids (or label strings), or scores for regression. When the split can be
        loaded, its indices must be covered exactly. Written to a temporary name, then renamed.
        """
        rows = sorted((int(i), self.format_prediction(p)) for i, p in idx_and_preds)
        idxs = [i for i, _ in rows]
        if len(set(idxs)) != len(idxs):
            raise CramkitError(f"task {self.name} {split}: predictions repeat an index")
        expected = sorted(e.idx for e in self.examples(split))
        if idxs != expected:
            missing = sorted(set(expected) - set(idxs))
            extra = sorted(set(idxs) - set(expected))
            raise CramkitError(
                f"task {self.name} {split}: predictions cover {len(idxs)} indices but the split has "
                f"{len(expected)} examples (missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                f"unknown {extra[:5]}{'...' if len(extra) > 5 else ''}); predict every example of the split"
            )
        out = Path(out_path)
        if out.suffix not in (".tsv", ".json", ".jsonl"):
            out = out / self.leaderboard_file(split)
        from cramkit.io import write_text_atomic

        if self.prediction_format == "glue":
            text = "index\tprediction\n" + "".join(f"{i}\t{p}\n" for i, p in rows)
        else:  # CLUE: {"id": 0, "label": "..."}; SuperGLUE: {"idx": 0, "label": ...}, one object a line
            key = "id" if self.prediction_format == "clue" else "idx"
            text = "".join(
                json.dumps({key: i, "label": self.submission_value(p)}, ensure_ascii=False) + "\n" for i, p in rows
            )
        return write_text_atomic(out, text)

    def submission_value(self, formatted: str) -> object:
        """A formatted prediction as a JSON submission holds it: a chosen choice as its index, a score as a
        number, a label as its string (SuperGLUE's grader reads BoolQ's and WiC's "true"/"false" as strings,
        as jiant writes them)."""
        if self.is_multiple_choice:
            return int(formatted)
        if self.is_regression:
            return float(formatted)
        return formatted


TaskFactory = Callable[..., Task]  # factory(data_dir=..., skip_bad_rows=...) -> Task

_TASKS: dict[str, Task | TaskFactory] = {}


def register_task(task: Task | TaskFactory, name: str | None = None, *, overwrite: bool = True) -> Task | TaskFactory:
    """Register a Task (or a factory ``f(data_dir=None, skip_bad_rows=False) -> Task``) under its name."""
    key = name or getattr(task, "name", None)
    if not key:
        raise CramkitError("register_task: a factory needs an explicit name")
    if not overwrite and key in _TASKS:
        raise CramkitError(f"a task named '{key}' is already registered")
    _TASKS[key] = task
    return task


def register_family(prefix: str, keys: Iterable[str], make: Callable[..., Task]) -> None:
    """Register ``prefix/KEY`` for each key as a factory ``make(key, data_dir, skip_bad_rows)``: a benchmark's
    tasks, built when asked for (their files' folder is known only then)."""
    for key in keys:

        def factory(data_dir: PathLike | None = None, skip_bad_rows: bool = False, key: str = key) -> Task:
            return make(key, data_dir, skip_bad_rows)

        factory.__name__ = f"{prefix}_{key}"
        register_task(factory, name=f"{prefix}/{key}")


def list_tasks() -> list[str]:
    return sorted(_TASKS)


def _unknown(kind: str, name: str, known: Sequence[str]) -> CramkitError:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    if not close:  # "sst2" -> "glue/sst2"
        close = [k for k in known if k.split("/")[-1] == name.lower()][:1]
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return CramkitError(f"unknown {kind} '{name}'.{hint} Known {kind}s: {', '.join(known)}")


def get_task(name: str, *, data_dir: PathLike | None = None, skip_bad_rows: bool = False) -> Task:
    """The task registered as ``name``; built-in tasks read their files from data_dir.

    skip_bad_rows: skip (and count in ``task.skipped``) rows with the wrong number of columns or a
    label outside the label set, instead of stopping with an error naming the file and line.
    """
    if name not in _TASKS:
        raise _unknown("task", name, sorted(_TASKS))
    entry = _TASKS[name]
    if isinstance(entry, Task):
        return entry
    return entry(data_dir=data_dir, skip_bad_rows=skip_bad_rows)


def hold_out(task: Task, fraction: float, seed: int = 0) -> Task:
    """``task`` with a dev split held out of its train split: ``fraction`` of the rows, shuffled with
    ``seed`` (the same rows every time); the rest is the new train split."""
    import dataclasses

    if not 0.0 < fraction < 1.0:
        raise CramkitError(f"--dev-fraction must be between 0 and 1 (exclusive), got {fraction}")
    cache: dict[str, list[Example]] = {}

    def part(name: str) -> Callable[[], list[Example]]:
        def load() -> list[Example]:
            if not cache:
                rows = task.examples(task.train_split)
                order = np.random.default_rng(seed).permutation(len(rows))
                n_dev = max(1, round(len(rows) * fraction))
                if len(rows) - n_dev < 1:
                    raise CramkitError(
                        f"task {task.name}: {len(rows)} training rows are too few to hold out a dev split; "
                        "give --dev FILE"
                    )
                cache["dev"] = [rows[i] for i in sorted(order[:n_dev])]
                cache["train"] = [rows[i] for i in sorted(order[n_dev:])]
            if name == "train":  # the bad rows skipped in the file are counted once, on the train part
                load.skipped = task.skipped.get(task.train_split, 0)  # type: ignore[attr-defined]
            return cache[name]

        part = "held out" if name == "dev" else "rest"
        load.source = f"{task.source(task.train_split)} ({part})"  # type: ignore[attr-defined]
        return load

    splits = {k: v for k, v in task.splits.items() if k != task.train_split}
    splits |= {task.train_split: part("train"), "dev": part("dev")}
    return dataclasses.replace(task, splits=splits, dev_splits=["dev"], _cache={})


def cap_dev(task: Task, n: int) -> Task:
    """``task`` with each dev split cut to its first ``n`` examples (a quicker, rougher score; grouped metrics
    such as MultiRC's may lose the tail of a group)."""
    import dataclasses

    def first(name: str) -> Callable[[], list[Example]]:
        def load() -> list[Example]:
            return task.examples(name)[:n]

        load.source = f"{task.source(name)} (first {n:,})"  # type: ignore[attr-defined]
        return load

    splits = dict(task.splits) | {s: first(s) for s in task.dev_splits}
    return dataclasses.replace(task, splits=splits, _cache={})


# --------------------------------------------------------------------------------------------- suites


@dataclass(frozen=True)
class Suite:
    """A benchmark scored by ``cramkit eval NAME``: its task names, how to build the tasks whose data is
    in a folder, and the one average that stands for it.

    tasks(data_dir, skip_bad_rows) returns the tasks whose files are present (raising CramkitError with a
    hint when none is); average(entries) takes {"TASK" or "TASK:SPLIT": metric values} and returns the
    suite's average (None when nothing present enters it); average_note says how it is computed.
    """

    name: str
    task_names: tuple[str, ...]
    tasks: Callable[..., list[Task]]
    average: Callable[[dict[str, dict[str, float]]], float | None]
    average_note: str = ""
    data_hint: str = ""  # where the data comes from, for messages


_SUITES: dict[str, Suite] = {}


def register_suite(suite: Suite) -> Suite:
    _SUITES[suite.name] = suite
    return suite


def list_suites() -> list[str]:
    return sorted(_SUITES)


def get_suite(name: str) -> Suite:
    if name not in _SUITES:
        raise _unknown("suite", name, sorted(_SUITES))
    return _SUITES[name]
