"""Self-training (issue 49): ``cramkit finetune ... --unlabelled FILE``. A teacher fine-tuned on the labelled rows
labels the unlabelled ones, a student of the same backbone learns from the labels and the confident pseudo-labels.

1. The teacher: the ordinary fine-tuning of the labelled rows into OUT/teacher (``self_train_teachers`` N > 1:
   an ensemble of N seeds, OUT/teacher-I), resumed or reused like any fine-tuning; with it, where the task has
   label words, their prior (``distill/prior.py``: the backbone's embeddings against a description of each class).
2. Its labels: the teacher's logits over the unlabelled rows through the inference engine, in batches committed
   as they are done (``distill/teacher.py``: a memory-mapped .npy renamed into place when complete, no pickle), so
   a run stopped midway (Ctrl-C, kill -9) resumes where the labelling stopped and a rerun reuses them. They are
   calibrated by temperature scaling fitted on the selection dev split (the few-shot protocol's sampled dev);
   averaged with the neighbours' labels (``distill/neighbours.py``: the labelled rows' classes spread over the
   backbone's nearest-neighbour graph of all the rows, where the labelled rows held out show they work: on the
   topic task abc the student then beats its teacher on every split, +3.4, instead of ending under it).
3. The selection (:func:`select`): per predicted class the most confident rows, at most ``self_train_fraction`` of
   the unlabelled rows shared equally among the classes, and no class more than the rarest one (class balance
   kept; ``self_train_balance=predicted``: each class's most confident ``self_train_fraction`` of the rows the
   teacher gives it, its shares kept); ``self_train_threshold`` a number: only rows at least that probable. A
   teacher that answers one class for (nearly) everything, or a selection of one class, is caught: one line, no
   student, the teacher's own result.
4. The student: the same backbone fine-tuned through the engine on the labels and the kept rows with soft targets
   (the teacher's calibrated probabilities; KL as distillation's), dropout on and, with ``self_train_mask``, words
   of the pseudo-labelled rows masked; ``self_train_rounds`` R > 1: the student labels again for the next one.

5. The model kept: the student (OUT/student, its last weights) replaces the teacher unless the teacher answers the
   dev rows that picked its checkpoint better beyond chance (:func:`kept_model`); when it collapsed, the teacher.

OUT holds the model kept (``cramkit.load(OUT)``, saved from OUT/student or OUT/teacher, so a resumed run copies
from a finished model); results.json adds ``self_training``: which was kept and why, the pseudo-labels'
distribution, the thresholds, the rows kept, the teacher's and the student's dev scores and the wall time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.errors import CramkitError
from cramkit.loading import LoadedModel
from cramkit.recipes.calibrate import fit_temperature, softmax
from cramkit.recipes.finetune_config import FinetuneConfig
from cramkit.tasks.registry import Example, Task

PathLike = str | os.PathLike
SETTINGS_FILE = "self-train.json"
LABEL_CHUNK = 512  # unlabelled rows per labelling batch: each is committed before the next starts
COLLAPSED = 0.95  # a teacher that gives one class to this share of the unlabelled rows is not trained on
TEXT_EXT = {".txt", ".text", ""}


# ------------------------------------------------------------------------------------------ the unlabelled rows


def read_unlabelled(
    path: PathLike,
    task: Task,
    *,
    text_a: str | None = None,
    text_b: str | None = None,
    skip_bad_rows: bool = False,
) -> tuple[list[tuple[str, str | None]], int]:
    """The unlabelled rows of ``path`` as (text, second text or None), and how many bad rows were skipped.

    A text file (.txt): one text per line (blank lines are no rows). A table (.csv, .tsv, .jsonl) is read by the
    readers of ``--train``: the columns ``text_a``/``text_b`` (else the task's own, else the usual names); a row
    without its text, or with an empty one, is one line naming the file and the row, or skipped and counted
    with ``skip_bad_rows``; invalid UTF-8 is one line naming the file."""
    from cramkit.tasks.files import FileSplit
    from cramkit.tasks.glue import SKIP_HINT
    from cramkit.text.tables import guess_text_columns, table_format

    p = Path(path).expanduser()
    if not p.exists():
        raise CramkitError(f"--unlabelled {p} does not exist; give a text file (one text per line) or a table")
    pairs = _is_pair_task(task)
    if p.is_dir() or p.suffix.lower() in TEXT_EXT:
        if pairs:
            raise CramkitError(
                f"--unlabelled {p}: task {task.name} reads pairs of texts; give a table (.csv, .tsv, .jsonl) with "
                "both columns (--text-a, --text-b)"
            )
        from cramkit.distillation.unlabelled import read_unlabelled as read_lines

        return [(t, None) for t in read_lines(p)], 0
    fmt = table_format(p, None)
    cols = _task_columns(task)
    a = text_a or cols.get("text_a")
    b = text_b or cols.get("text_b")
    if a is None:
        a, guessed_b, columns = guess_text_columns(p)
        b = b or (guessed_b if pairs else None)
        if a is None:
            raise CramkitError(
                f"--unlabelled {p}: no usual text column among {', '.join(columns) or 'its columns'}; name it with "
                "--text-a COLUMN (and --text-b for a pair's second text)"
            )
    if pairs and b is None:
        raise CramkitError(f"--unlabelled {p}: task {task.name} reads pairs; name the second text with --text-b")
    reader = FileSplit(task.name, p, fmt, None, (a, b if pairs else None, None, None), None, False, skip_bad_rows)
    rows, skipped = [], 0
    for e in reader():
        if not e.text_a or (pairs and not e.text_b):
            if not skip_bad_rows:
                raise CramkitError(f"--unlabelled {p}, row {e.idx + 1 + skipped}: an empty text. {SKIP_HINT}")
            skipped += 1
            continue
        rows.append((e.text_a, e.text_b if pairs else None))
    if not rows:
        raise CramkitError(f"--unlabelled {p} holds no text to label")
    return rows, reader.skipped + skipped


def unlabelled_rows(
    given: Any,
    task: Task,
    cfg: FinetuneConfig,
    *,
    text_a: str | None = None,
    text_b: str | None = None,
    skip_bad_rows: bool = False,
) -> list[tuple[str, str | None]]:
    """``cramkit.finetune``'s ``unlabelled``: a file (:func:`read_unlabelled`) or a list of texts (or of pairs),
    read and checked before anything trains; the bad rows skipped are said in one line."""
    check(task, cfg)
    if isinstance(given, (str, os.PathLike)):
        rows, skipped = read_unlabelled(given, task, text_a=text_a, text_b=text_b, skip_bad_rows=skip_bad_rows)
        if skipped:
            print(f"cramkit: --unlabelled {given}: {skipped:,} bad rows skipped", file=sys.stderr)
        return rows
    rows = []
    for i, item in enumerate(given):
        pair = (item, None) if isinstance(item, str) else tuple(item)
        if len(pair) != 2 or not isinstance(pair[0], str) or not pair[0].strip():
            raise CramkitError(f"unlabelled[{i}]: give texts (or pairs of texts), not {item!r:.60}")
        rows.append((pair[0].strip(), pair[1].strip() if isinstance(pair[1], str) else None))
    if not rows:
        raise CramkitError("unlabelled is empty: give the texts to label")
    return rows


def run_self_train(
    task: Task, source: PathLike, cfg: FinetuneConfig, out: PathLike | None, rows, *, progress: bool = True
) -> dict[str, Any]:
    """``cramkit.finetune(..., unlabelled=...)`` on one task: ``out`` checked as every output is (None: a
    temporary directory, no model kept), a full disk one line."""
    import tempfile

    from cramkit.io import RUN_OUTPUTS, check_out, disk_errors
    from cramkit.recipes.finetune import SETTINGS_FILE as FINETUNE_FILE
    from cramkit.recipes.label_prior import first_lines

    first_lines(task, cfg, unlabelled=True)  # classes without words: said first, with the flag that helps
    if out is None:
        with tempfile.TemporaryDirectory(prefix="cramkit-selftrain-") as tmp:
            return self_train(task, source, cfg, Path(tmp) / "out", rows, progress=progress)
    own = {SETTINGS_FILE: ("unlabelled", "config"), FINETUNE_FILE: ("task", "config")}  # a self-training's settings
    check_out(out, inputs=[source], own=own, writes=RUN_OUTPUTS, command="the self-training")
    with disk_errors(out):
        return self_train(task, source, cfg, out, rows, progress=progress)


def _is_pair_task(task: Task) -> bool:
    rows = task.examples(task.train_split)
    return any(e.text_b is not None for e in rows[:50])


def _task_columns(task: Task) -> dict[str, str]:
    from cramkit.recipes.finetune_model import task_columns

    return {k: v for k, v in task_columns(task).get("columns", {}).items() if v and k != "label"}


def digest(rows: Sequence[tuple[str, str | None]]) -> str:
    h = hashlib.sha256()
    for a, b in rows:
        h.update(a.encode("utf-8", "surrogatepass") + b"\0" + (b or "").encode("utf-8", "surrogatepass") + b"\1")
    return h.hexdigest()[:16]


def check(task: Task, cfg: FinetuneConfig) -> None:
    """What self-training needs: a classification task and a method trained on a head (one line otherwise)."""
    if task.kind != "classification" or task.is_multiple_choice:
        raise CramkitError(f"--unlabelled: task {task.name} is a {task.kind} task; self-training pseudo-labels classes")
    if cfg.method != "head":
        raise CramkitError(
            f"--unlabelled trains the teacher and the student with --method head; method {cfg.method} is not "
            "supported for self-training"
        )
    from cramkit.recipes.label_prior import prior_spec

    prior_spec(task, cfg, _is_pair_task(task))  # the prior: descriptions of the task's labels, or a pair's similarity


# ------------------------------------------------------------------------------------------ the labels


def select(probs: np.ndarray, cfg: FinetuneConfig, names: Sequence[str]) -> dict[str, Any]:
    """The rows kept as pseudo-labels: per predicted class the most confident, at most ``self_train_fraction`` of
    the rows shared equally among the classes and no class more than the rarest predicted one (``predicted``
    balance: that fraction of each class's predicted rows, in the teacher's shares; only rows at least
    ``self_train_threshold`` probable when it is a number). ``collapsed``: why nothing is trained on (the teacher
    answers one class for at least COLLAPSED of the rows, or the selection holds one class), else None."""
    n, classes = probs.shape
    pred, conf = probs.argmax(1), probs.max(1)
    predicted = np.bincount(pred, minlength=classes)
    out: dict[str, Any] = {
        "unlabelled_rows": n,
        "predicted": {names[c]: int(predicted[c]) for c in range(classes)},
        "threshold_rule": "auto" if cfg.self_train_threshold == "auto" else "given",
        "collapsed": None,
    }
    top = int(predicted.argmax())
    if predicted[top] >= COLLAPSED * n:
        out["collapsed"] = (
            f"the teacher answers {names[top]!r} for {predicted[top] / n:.0%} of the {n:,} unlabelled rows"
        )
        out.update(kept_rows=0, kept={}, thresholds={}, keep=np.zeros(0, dtype=np.int64))
        return out
    pools = []
    for c in range(classes):
        rows = np.flatnonzero(pred == c)
        if cfg.self_train_threshold != "auto":
            rows = rows[conf[rows] >= float(cfg.self_train_threshold)]
        pools.append(rows[np.argsort(-conf[rows], kind="stable")])
    if cfg.self_train_balance == "predicted":  # each class's own most confident share: the teacher's shares
        keep = [p[: int(round(cfg.self_train_fraction * int(predicted[c])))] for c, p in enumerate(pools)]
    else:  # an equal share each, and no class more than the rarest predicted one
        present = [len(p) for p in pools if len(p)]
        per_class = min([int(cfg.self_train_fraction * n / classes), *present]) if present else 0
        keep = [p[:per_class] for p in pools]
    out["kept"] = {names[c]: len(k) for c, k in enumerate(keep)}
    out["thresholds"] = {names[c]: round(float(conf[k].min()), 4) for c, k in enumerate(keep) if len(k)}
    chosen = np.sort(np.concatenate(keep)) if keep else np.zeros(0, dtype=np.int64)
    out["kept_rows"] = len(chosen)
    out["keep"] = chosen
    # the teacher's calibrated probability of its own answer, averaged: the share of pseudo-labels it expects
    # right (SST-2, K=16, 3 teachers: 68.9% expected on the kept half, 69.8% right against the true labels)
    out["expected_accuracy"] = {
        "all": round(float(conf.mean()), 4),
        "kept": round(float(conf[chosen].mean()), 4) if len(chosen) else None,
    }
    if sum(1 for k in keep if len(k)) < 2:
        which = "no row" if not len(chosen) else f"rows of {names[int(pred[chosen[0]])]!r} only"
        rule = f"self_train_threshold {cfg.self_train_threshold}" if out["threshold_rule"] == "given" else "it"
        out["collapsed"] = f"the selection ({rule}) keeps {which} of the {n:,} unlabelled rows"
    return out


def _teacher_probs(
    teachers: list[Path],
    task: Task,
    rows: list[tuple[str, str | None]],
    root: Path,
    cfg: FinetuneConfig,
    progress: bool,
    label: str = "",
) -> tuple[np.ndarray, dict[str, Any]]:
    """The teachers' mean calibrated probabilities over ``rows`` (each teacher's logits cached in ``root``)."""
    from cramkit.distillation.teacher import teacher_key, teacher_logits
    from cramkit.infer.engine import Engine
    from cramkit.loading import load_torch

    dev_split = task.selection_splits[0] if task.dev_splits else None
    root.mkdir(parents=True, exist_ok=True)
    total, temps, seconds, reused = None, [], 0.0, True
    for tdir in teachers:
        teacher = load_torch(tdir, purpose="self-training")
        max_length = min(cfg.max_length, teacher.max_length)
        cached = (root / f"teacher-{teacher_key(teacher, max_length)}.npy").is_file()  # (checked when read)
        if progress and not cached:
            print(f"{_what(label)}{tdir.name} labels {len(rows):,} unlabelled rows", file=sys.stderr)
        logits, done = teacher_logits(
            teacher,
            [a for a, _ in rows],
            [b for _, b in rows],
            root,
            max_length=max_length,
            chunk=LABEL_CHUNK,
            device=cfg.device,
            progress=progress,
        )
        if done.get("cached"):  # a rerun: said whatever the progress setting, as the labelling resumed is
            print(f"{_what(label)}{tdir.name}'s labels of {len(rows):,} rows, reused", file=sys.stderr)
        if done.get("resumed_from"):
            print(f"{_what(label)}labelling resumed at row {done['resumed_from']:,}", file=sys.stderr)
        reused = reused and bool(done.get("cached"))
        seconds += float(done.get("seconds", 0.0))
        temp = 1.0
        if dev_split is not None:
            dev = task.examples(dev_split)
            engine = Engine(teacher, device=cfg.device, max_length=max_length)
            dev_logits = engine.logits([e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in dev])
            temp = fit_temperature(dev_logits, np.asarray([int(e.label) for e in dev]))  # type: ignore[arg-type]
        temps.append(round(temp, 4))
        probs = softmax(np.asarray(logits), temp)
        total = probs if total is None else total + probs
        del teacher
    assert total is not None
    stats = {"temperatures": temps, "labelling_seconds": round(seconds, 2), "labels_reused": reused}
    return (total / len(teachers)).astype(np.float32), stats


# ------------------------------------------------------------------------------------------ the student


def _mask_words(text: str, p: float, rng: np.random.Generator) -> str:
    """Noise for the student: each word masked with probability ``p`` (distillation's word masking)."""
    from cramkit.distillation.augment import AugmentConfig, edit, words

    tokens = words(text)
    edited = edit(tokens, [""] * len(tokens), None, AugmentConfig(p_mask=p, p_pos=0.0, p_ng=0.0), rng)
    return " ".join(edited) or text


def student_task(
    task: Task, rows: list[tuple[str, str | None]], probs: np.ndarray, keep: np.ndarray, cfg: FinetuneConfig
) -> tuple[Task, np.ndarray]:
    """The student's task (the labelled rows, then the kept unlabelled rows with the teacher's labels) and its
    targets: one-hot for the labelled rows, the teacher's probabilities (or its labels) for the others."""
    labelled = task.examples(task.train_split)
    classes = probs.shape[1]
    rng = np.random.default_rng([cfg.seeds[0], 49])
    extra = []
    for j, i in enumerate(keep.tolist()):
        a, b = rows[i]
        if cfg.self_train_mask > 0:
            a = _mask_words(a, cfg.self_train_mask, rng)
            b = _mask_words(b, cfg.self_train_mask, rng) if b is not None else None
        extra.append(Example(a, b, int(probs[i].argmax()), len(labelled) + j))
    train = [*labelled, *extra]
    targets = np.zeros((len(train), classes), dtype=np.float32)
    targets[np.arange(len(labelled)), [int(e.label) for e in labelled]] = 1.0  # type: ignore[arg-type]
    if cfg.self_train_soft:
        targets[len(labelled) :] = probs[keep]
    else:
        targets[np.arange(len(labelled), len(train)), [int(e.label) for e in extra]] = 1.0  # type: ignore[arg-type]
    splits = dict(task.splits)
    splits[task.train_split] = lambda: train
    cache = {k: v for k, v in task._cache.items() if k != task.train_split}
    return dataclasses.replace(task, splits=splits, _cache={**cache, task.train_split: train}), targets


def student_config(cfg: FinetuneConfig) -> FinetuneConfig:
    """The student trains ``self_train_epochs`` epochs over its rows, at least the labelled run's step floor, and
    keeps its last weights: it learns from thousands of rows, and picking among its ~20 evaluations on the few
    dev rows picks their noise (abc K=16, 5 splits: 87.4 ± 2.1 picked, 88.2 ± 0.8 last; bench/RESULTS.md)."""
    return dataclasses.replace(cfg, epochs=cfg.self_train_epochs, min_steps=cfg.step_floor, keep="last")


# ------------------------------------------------------------------------------------------ the whole


def self_train(
    task: Task,
    source: PathLike | LoadedModel,
    cfg: FinetuneConfig,
    out_dir: PathLike,
    rows: list[tuple[str, str | None]],
    *,
    progress: bool = True,
    label: str = "",
) -> dict[str, Any]:
    """Self-training on ``task`` from ``source`` with the unlabelled ``rows`` into ``out_dir`` (see the module's
    doc); returns the student's results (the teacher's when it collapsed) with ``self_training``. ``label``
    names the run in the printed line (a few-shot split: "split 0")."""
    from cramkit.config import to_dict
    from cramkit.io import claim_dir, write_json_atomic
    from cramkit.loading import load_torch
    from cramkit.recipes.finetune import finetune
    from cramkit.rundir import finished_result
    from cramkit.selftraining.neighbours import neighbour_probs
    from cramkit.selftraining.prior import prior_probs

    check(task, cfg)
    t0 = time.perf_counter()
    out = Path(out_dir)
    loaded = source if isinstance(source, LoadedModel) else load_torch(source, purpose="fine-tuning")
    given = len(rows)
    rows = _without_labelled(task, rows)
    dropped = given - len(rows)
    if not rows:
        raise CramkitError(
            f"--unlabelled: all {given:,} rows are the text of a labelled row or a dev row that picks the "
            "checkpoint; give texts without labels"
        )
    key = digest(rows)
    settings = {"task": task.name, "source": loaded.source, "unlabelled": key, "rows": len(rows)}
    settings["config"] = to_dict(cfg)
    claim_dir(out, SETTINGS_FILE, settings, "a self-training")
    done = finished_result(out / "results.json", key="self_training")
    if done is not None and done["self_training"].get("unlabelled") == key:
        print(line(done, label) + " (done earlier, reused)", file=sys.stderr)
        return done
    if dropped:
        print(
            f"cramkit: self-training{f' {label}' if label else ''} drops {dropped:,} of the {given:,} unlabelled rows: "
            f"the same text as a labelled row or a dev row that picks the checkpoint; {len(rows):,} left to label",
            file=sys.stderr,
        )
    plain: dict[str, Any] = {
        f.name: f.default for f in dataclasses.fields(FinetuneConfig) if f.name.startswith("self_train")
    }
    teachers = []
    for i in range(cfg.self_train_teachers):
        seeds = cfg.seeds if cfg.self_train_teachers == 1 else [cfg.seeds[0] + i]
        tdir = out / ("teacher" if cfg.self_train_teachers == 1 else f"teacher-{i}")
        tcfg = dataclasses.replace(cfg, seeds=seeds, **plain)  # the labelled rows' own fine-tuning
        res = finished_result(tdir / "results.json", key="median")
        if res is None or res.get("config") != to_dict(tcfg) or res.get("source") != loaded.source:
            res = finetune(task, loaded, tcfg, tdir, progress=progress)
        else:  # a rerun after a stop: say what it starts from
            print(
                f"{_what(label)}{tdir.name} trained earlier, reused ({_scores(res)['score']:.2f} on dev)",
                file=sys.stderr,
            )
        teachers.append((tdir, res))
    report: dict[str, Any] = {"settings": _own(cfg), "unlabelled": key, "dropped": dropped, "rounds": []}
    teacher_dirs, teacher_res, res = [d for d, _ in teachers], teachers[0][1], teachers[0][1]
    pair, labels_dir = _is_pair_task(task), out / "labels" / key
    prior, report["prior"] = prior_probs(loaded, task, rows, cfg, labels_dir, pair, progress)
    neighbours, report["neighbours"] = neighbour_probs(loaded, task, rows, cfg, labels_dir, pair, progress)
    for r in range(1, cfg.self_train_rounds + 1):
        probs, stats = _teacher_probs(teacher_dirs, task, rows, labels_dir, cfg, progress, label)
        if prior is not None:  # the label words' prior weighs as much as the trained teachers together
            probs = ((probs + prior) / 2).astype(np.float32)
        if neighbours is not None:  # and the neighbours' labels as much as those two
            probs = ((probs + neighbours) / 2).astype(np.float32)
        names = [str(x) for x in (task.labels or range(probs.shape[1]))]
        sel = select(probs, cfg, names)
        keep = sel.pop("keep")
        one = {"round": r, "teacher": [str(d) for d in teacher_dirs], **stats, **sel}
        one["teacher_dev"] = _scores(res)
        report["rounds"].append(one)
        if sel["collapsed"]:  # not trained on: the result stays the teacher's
            break
        view, targets = student_task(task, rows, probs, keep, cfg)
        where = out / ("student" if r == cfg.self_train_rounds else f"round-{r}")
        res = finetune(view, loaded, student_config(cfg), where, progress=progress, targets=targets)
        one["student_dev"] = _scores(res)
        teacher_dirs = [where]
    collapsed = report["rounds"][-1]["collapsed"]
    first = report["rounds"][0]
    trained = not (collapsed and len(report["rounds"]) == 1)
    answers = _right_on_selection(task, [teachers[0][0], teacher_dirs[0]], cfg) if trained else None
    expected = (report["rounds"][-1].get("expected_accuracy") or {}).get("kept")
    kept, why = kept_model(task, teacher_res, res if trained else None, answers, expected)
    final = dict(teacher_res if kept == "teacher" else res)
    load_torch(teachers[0][0] if kept == "teacher" else teacher_dirs[0], purpose="self-training").save(out)
    report.update(
        collapsed=collapsed,
        kept=kept,
        kept_why=why,
        model=str(out),
        other=str(_other_dir(kept, teachers[0][0], teacher_dirs[0])) if trained else None,
        teacher=_scores(teacher_res),
        student=_scores(res) if trained else None,
        distribution=report["rounds"][-1].get("kept", {}),
        thresholds=report["rounds"][-1].get("thresholds", {}),
        kept_rows=report["rounds"][-1].get("kept_rows", 0),
        expected_accuracy=report["rounds"][-1].get("expected_accuracy"),
        unlabelled_rows=first["unlabelled_rows"],
        seconds=round(time.perf_counter() - t0, 1),
        teacher_train_seconds=round(sum(s.get("train_seconds", 0.0) for _, t in teachers for s in t["seeds"]), 1),
    )
    final["self_training"] = report
    write_json_atomic(out / "results.json", final)
    print(line(final, label), file=sys.stderr)
    return final


def kept_model(
    task: Task,
    teacher: dict[str, Any],
    student: dict[str, Any] | None,
    answers: tuple[np.ndarray, np.ndarray] | None = None,
    expected: float | None = None,
) -> tuple[str, str]:
    """Which model a self-training keeps, ``"student"`` or ``"teacher"``, and why: the student only where the
    evidence says it is better. ``answers``: whether the teacher and the student answer each row of the dev split
    that picked the teacher's checkpoint right; ``expected``: the share of the kept pseudo-labels the run expects
    right (the labellers' calibrated confidence).

    McNemar's test on the rows only one of them answers right (the teacher's b against the student's c) decides
    where one is ahead beyond chance (``|b - c| > 2 sqrt(b + c)``). Within chance: a tie (b = c) keeps the teacher
    (an SST-2 student of 66.32 was kept over a teacher of 71.20 on a tie of 56.25 each on 32 rows, issue 66), and so
    do pseudo-labels the run expects right less often than the teacher answers those rows (the student learns from
    them: it beats its labels by a little, not by much); else the student, whose labels are the better evidence (a
    comparison of the two scores alone kept the teacher on an MRPC split where the student was 5.9 F1 ahead on the
    408 dev pairs, bench/RESULTS.md). No such split, or no answers: the student."""
    if student is None:
        return "teacher", "no student was trained"
    split = task.selection_splits[0] if task.dev_splits else None
    s, t = (_scores(student).get(split), _scores(teacher).get(split)) if split else (None, None)
    if s is None or t is None or answers is None:
        return "student", "no dev rows pick checkpoints to compare it with the teacher"
    teacher_right, student_right = answers
    b = int((teacher_right & ~student_right).sum())
    c = int((student_right & ~teacher_right).sum())
    rows = f"on {split} the student scores {s:.2f}, the teacher {t:.2f}; {b} row{'s' * (b != 1)} only the teacher "
    rows += f"answers right, {c} only the student"
    if b - c > 2 * (b + c) ** 0.5:
        return "teacher", f"the teacher is ahead beyond chance: {rows}"
    if c - b > 2 * (b + c) ** 0.5:
        return "student", f"the student is ahead beyond chance: {rows}"
    if b == c:
        return "teacher", f"the two tie, nothing says the student is better: {rows}"
    accuracy = float(np.mean(teacher_right)) if len(teacher_right) else None
    if expected is not None and accuracy is not None and expected < accuracy:
        return "teacher", (
            f"its pseudo-labels are expected {expected:.0%} right, under the teacher's {accuracy:.0%} on {split}, "
            f"and the student is not ahead beyond chance: {rows}"
        )
    return "student", rows


def _right_on_selection(task: Task, models: list[Path], cfg: FinetuneConfig) -> tuple[np.ndarray, np.ndarray] | None:
    """Whether each of ``models`` (the teacher, the student) answers each row of the split that picks the teacher's
    checkpoint right (None without such a split)."""
    from cramkit.infer.engine import Engine
    from cramkit.loading import load_torch

    if not task.dev_splits:
        return None
    rows = task.examples(task.selection_splits[0])
    labels = np.asarray([int(e.label) for e in rows])  # type: ignore[arg-type]
    texts = [e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in rows]
    right = []
    for where in models:
        model = load_torch(where, purpose="self-training")
        engine = Engine(model, device=cfg.device, max_length=min(cfg.max_length, model.max_length))
        right.append(np.asarray(engine.logits(texts)).argmax(1) == labels)
    return right[0], right[1]


def _other_dir(kept: str, teacher: Path, student: Path) -> Path:
    """Where the model not kept is: the student's directory when the teacher is kept, else the teacher's."""
    return student if kept == "teacher" else teacher


def _own(cfg: FinetuneConfig) -> dict[str, Any]:
    from cramkit.config import to_dict

    return {k: v for k, v in to_dict(cfg).items() if k.startswith("self_train")}


def _without_labelled(task: Task, rows: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    """The unlabelled rows less those that are a labelled row's or a selection dev row's text (kept honest)."""
    seen = {(e.text_a, e.text_b) for e in task.examples(task.train_split)}
    for split in task.selection_splits if task.dev_splits else ():
        if split not in task.scored_splits:
            seen |= {(e.text_a, e.text_b) for e in task.examples(split)}
    return [r for r in rows if r not in seen]


def _scores(res: dict[str, Any]) -> dict[str, float]:
    """A fine-tuning's dev scores: each dev split's (median over seeds) and the task's score."""
    return {**{s: round(m["score"], 2) for s, m in res.get("median", {}).items()}, "score": res.get("score")}


def _what(label: str) -> str:
    return f"cramkit: self-training{f' {label}' if label else ''}: "


def line(res: dict[str, Any], label: str = "") -> str:
    """The one line a self-training prints: the teacher's score, the student's, the rows kept and the time."""
    st = res["self_training"]
    what = _what(label)
    teacher = st["teacher"]["score"]
    if st["collapsed"]:
        return (
            f"{what}{st['collapsed']}: no student is trained on it; the result is the teacher's, {teacher:.2f} "
            f"({res.get('main_metric')}, model in {st['model']}); {st['seconds']:.0f}s"
        )
    kept = f"; the {st.get('kept', 'student')} is kept ({st['kept_why']})" if st.get("kept_why") else ""
    if st.get("other"):
        kept += f"; the {'student' if st.get('kept') == 'teacher' else 'teacher'} is in {st['other']}"
    dist = ", ".join(f"{k} {v:,}" for k, v in st["distribution"].items())
    cuts = ", ".join(f"{k} {v:.2f}" for k, v in st["thresholds"].items())
    expected = (st.get("expected_accuracy") or {}).get("kept")
    right = f"; the teacher expects {expected:.0%} of them right" if expected is not None else ""
    prior = st.get("prior") or {}
    if prior.get("used"):
        kind = (
            "the label words' prior (" + " / ".join(repr(v) for v in prior["descriptions"].values())
            if "descriptions" in prior
            else "the similarity prior (the two texts' cosine"
        )
        share = f"{prior['labelled_accuracy']:.0%} of the {prior['labelled_rows']} labelled rows right"
        right += f"; labelled with {kind}: {share})"
    elif prior.get("why"):  # without one, unlabelled text gained nothing measurable (bench/RESULTS.md)
        right += f"; no prior: {prior['why']}"
    near = st.get("neighbours") or {}
    if "held_out_accuracy" in near:  # weighed on the labelled rows: taken, or left out and why
        right += (
            f"; with the neighbours' labels ({near['held_out_accuracy']:.0%} of the {near['labelled_rows']} labelled "
            f"rows right held out, log-loss {near['held_out_loss']:.3f} against a linear classifier's "
            f"{near['linear_loss']:.3f})"
            if near["used"]
            else "; no neighbours' labels: held out, a linear classifier answers the labelled rows better"
        )
    return (
        f"{what}teacher {teacher:.2f} -> student {st['student']['score']:.2f} ({res.get('main_metric')}); "
        f"{st['kept_rows']:,} of {st['unlabelled_rows']:,} unlabelled rows kept ({dist}; confidence from "
        f"{cuts}{right}){kept}; {st['seconds']:.0f}s"
    )


def summary(per_split: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Over a few-shot protocol's splits: the teachers' and the students' scores, their means and spreads."""
    import statistics

    runs = {k: v["self_training"] for k, v in per_split.items() if "self_training" in v}
    if not runs:
        return None

    def spread(values: list[float]) -> dict[str, Any]:
        return {
            "scores": values,
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        }

    return {
        "teacher": spread([r["teacher"]["score"] for r in runs.values()]),
        "student": spread([per_split[k]["score"] for k in runs]),  # the model kept on each split (its name since 49)
        # each split's student itself (the teacher's score where it collapsed and none was trained)
        "students": spread([(r["student"] or r["teacher"])["score"] for r in runs.values()]),
        "collapsed": [k for k, r in runs.items() if r["collapsed"]],
        "teacher_kept": [k for k, r in runs.items() if r.get("kept") == "teacher" and not r["collapsed"]],
        "student_kept": [k for k, r in runs.items() if r.get("kept") == "student"],
        "model": str(Path(next(iter(runs.values()))["model"]).parent),
        "seconds_per_split": {k: r["seconds"] for k, r in runs.items()},
    }


def fewshot_line(res: dict[str, Any]) -> str:
    """A few-shot protocol's self-training in one line: the teachers' mean ± sd against the students'."""
    st = res["self_training"]
    t, s = st["teacher"], st.get("students", st["student"])
    collapsed = f"; collapsed (the teacher's result kept) on split(s) {', '.join(st['collapsed'])}" * bool(
        st["collapsed"]
    )
    kept, root = [], st.get("model", "OUT")
    for who, other in (("student", "teacher"), ("teacher", "student")):
        keys = st.get(f"{who}_kept", [])
        if keys:
            kept.append(f"the {who} on split(s) {', '.join(keys)} (the {other}s in {root}/split-S/{other})")
    both = f"kept: {'; '.join(kept) or 'the teacher on every split'}: {st['student']['mean']:.2f} ± "
    both += f"{st['student']['std']:.2f}"
    per = sorted(st["seconds_per_split"].values())
    return (
        f"self-training: teacher {t['mean']:.2f} ± {t['std']:.2f} -> student {s['mean']:.2f} ± {s['std']:.2f} "
        f"({res['main_metric']}, {len(t['scores'])} splits); {both}; {per[len(per) // 2]:.0f}s per split (median)"
        f"{collapsed}"
    )
