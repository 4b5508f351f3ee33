"""Distillation: a fine-tuned teacher -> a small, fast student (Tang et al. 2019, arXiv 1903.12136).

    report = distill("out/sst2", get_task("glue/sst2", data_dir="glue"), "bilstm", DistillConfig(), "out/st")

1. the transfer set: the training sentences plus edited copies (``cramkit.distillation.augment``);
2. the teacher's logits over it, computed once and cached memory-mapped (``cramkit.distillation.teacher``);
3. the student trained to match them (MSE on logits by default, as Tang et al.; KL with a temperature;
   a mix with the hard labels by ``alpha``; for an encoder student optionally its last hidden states,
   through a learned projection, against the teacher's);
4. the same student trained on the labels alone (the baseline that shows what distillation bought);
5. dev scores of teacher, student and baseline, parameter counts, examples/s of teacher and student on
   the CPU measured in the same run: ``report.json`` and ``report.md`` beside the student's model
   directory (``cramkit.load`` / ``cramkit predict`` / ``cramkit export``).

The students are built by ``cramkit.distillation.students``; the scores, speeds and report.md are
``cramkit.distillation.report``'s. :func:`distill` runs these steps in order.

Both students train through the engine (``cramkit.distillation.objective``: ``train.epochs.train_epochs``), each in its
run directory ``OUT/runs/distilled`` and ``OUT/runs/labels-only`` (checkpoints, metrics.jsonl, loss.png).
The same command run again continues where it stopped: a training killed midway resumes from its latest
checkpoint, a finished one is reused, a finished distillation only prints its report. ``OUT/distill.json``
records the settings; a run with other settings on the same ``--out`` is refused, never mixed in.
Under torchrun (``cramkit distill --nproc N``) rank 0 builds the transfer set and the teacher's logits
(the others wait, then read them from the cache), every rank trains, rank 0 scores and writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cramkit.distillation.config import DistillConfig
from cramkit.errors import CramkitError
from cramkit.io import read_json
from cramkit.loading import LoadedModel

if TYPE_CHECKING:
    from cramkit.distillation.augment import TransferSet
    from cramkit.train.distributed import DistContext

PathLike = str | os.PathLike
HEAD_KINDS = ("classifier", "multilabel", "regression")


# ------------------------------------------------------------------------------------------ checks


def check_teacher(teacher: LoadedModel, task: Any) -> str:
    """The teacher's kind; CramkitError when it has no head or its labels differ from the task's."""
    if teacher.kind not in HEAD_KINDS:
        raise CramkitError(
            f"--teacher {teacher.source}: a {teacher.kind} model has no classification or regression head; "
            "fine-tune it first (cramkit finetune ... --out DIR) and distil DIR"
        )
    if task.is_regression != (teacher.kind == "regression"):
        what = "a regression" if task.is_regression else "a classification"
        raise CramkitError(
            f"--teacher {teacher.source} is a {teacher.kind} model but task {task.name} is {what} task; "
            "use a teacher fine-tuned on this task"
        )
    if not task.is_regression:
        have = list(teacher.labels or [])
        want = [str(x) for x in task.labels]
        names = [str(x) for x in task.label_names] if task.label_names else None
        # a teacher trained with label_names answers names, recorded with the data's values in their order
        values = teacher.extra.get("label_values") if isinstance(getattr(teacher, "extra", None), dict) else None
        if have != want and have != names and values != want:
            raise CramkitError(
                f"--teacher {teacher.source}: its labels {have} (in logit order) differ from task {task.name}'s "
                f"{want}; distil with a teacher fine-tuned on this task's labels in this order (no silent remap)"
            )
    return teacher.kind


# ------------------------------------------------------------------------------------------ training


def _targets(kind: str, labels: list[Any], n: int) -> np.ndarray:
    """Hard labels as the loss wants them: scores (regression), ids (classifier), 0/1 rows (multi-label;
    a task with one label per example gives one-hot rows)."""
    if kind == "regression":
        return np.asarray(labels, dtype=np.float32)
    if kind == "multilabel":
        out = np.zeros((len(labels), n), dtype=np.float32)
        for i, v in enumerate(labels):
            out[i, list(v) if isinstance(v, (list, tuple)) else int(v)] = 1.0
        return out
    return np.asarray(labels, dtype=np.int64)


# ------------------------------------------------------------------------------------------ the recipe


def _fingerprint(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, ensure_ascii=False, default=str).encode())
    return h.hexdigest()[:16]


def distill(
    teacher: PathLike | LoadedModel,
    task: Any,
    student: str,
    cfg: DistillConfig | None = None,
    out: PathLike = "distilled",
    *,
    cache: PathLike | None = None,
    unlabelled: list[str] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Distil ``teacher`` into a ``student`` (bilstm | encoder) on ``task``; write the student's model
    directory, report.json and report.md to ``out``; returns the report (under torchrun: on rank 0; {}
    on the others)."""
    import contextlib

    from cramkit.distillation.report import cpu_speeds, dev_scores
    from cramkit.distillation.students import build_student, parameter_counts
    from cramkit.io import RUN_OUTPUTS, check_out, dir_lock
    from cramkit.loading import load_torch
    from cramkit.train.distributed import fault_guard, init_distributed, shutdown

    t_start = time.perf_counter()
    cfg = (cfg or DistillConfig()).resolved(student)
    cfg.validate()
    out = Path(out)
    own = {SETTINGS_FILE: ("teacher", "config")}  # a distillation's settings
    check_out(out, inputs=[teacher], own=own, writes=RUN_OUTPUTS, command="cramkit distill")
    if cfg.augment and cfg.p_pos > 0:
        from cramkit.distillation.augment import find_tagger

        find_tagger()  # before anything slow: a missing tagger is the first thing said
    t = teacher if isinstance(teacher, LoadedModel) else load_torch(teacher, purpose="distillation")
    job = _Job(task, t, check_teacher(t, task), student, cfg, min(cfg.max_length, t.max_length), out)
    train_rows, dev_rows = _labelled_rows(task, cfg)
    pairs = any(r.text_b is not None for r in train_rows)
    cache = Path(cache) if cache is not None else out / "cache"
    # the student is built first: a config that cannot start from the teacher fails before any work
    st = build_student(student, t, cfg, pairs=pairs)
    base_model = build_student(student, t, cfg, pairs=pairs) if cfg.baseline else None
    if cfg.hidden_weight > 0 and st.tokenizer.get_vocab() != t.tokenizer.get_vocab():
        raise CramkitError("hidden_weight needs the student to share the teacher's tokenizer (init=teacher)")
    labelled = ([r.text_a for r in train_rows], [r.text_b for r in train_rows], [r.label for r in train_rows])
    settings = _settings(job, (*labelled, unlabelled or []), dev_rows)

    ctx = init_distributed(cfg.device)  # under torchrun: rank 0 prepares, scores and writes; all train
    with contextlib.ExitStack() as stack:
        stack.callback(shutdown, ctx)
        if ctx.is_main:
            stack.enter_context(dir_lock(out, "--out"))
        stack.enter_context(fault_guard(ctx))
        if _claimed_and_done(out, settings, ctx):  # finished earlier with these very settings
            if not ctx.is_main:
                return {}
            print(
                f"cramkit: {out}: distilled earlier with the same settings; its report is kept (delete "
                f"{out} to distil again)",
                file=sys.stderr,
            )
            return read_json(out / "report.json", f"delete {out} to distil again")
        # 1. transfer set and 2. teacher logits, cached (the other ranks read rank 0's)
        transfer, logits, tstats = _transfer_and_logits(job, cache, (*labelled, unlabelled or []), progress, ctx)
        # 3. the student on the transfer set, 4. the same student on the labels only
        training = _train_students(job, st, base_model, transfer, logits, labelled, progress, ctx)
        if not ctx.is_main:
            return {}

        # 5. scores and speed
        models = {"teacher": t, "student": st} | ({"labels_only": base_model} if base_model is not None else {})
        scores = dev_scores(task, job.kind, dev_rows, models, job.max_length, cfg.device)
        speeds = cpu_speeds(t, st, dev_rows, job.max_length, cfg.speed_examples, cfg.speed_seconds)

        # 6. the student's model directory, then the report
        _save_student(job, st, transfer)
        report = {
            "task": task.name,
            "teacher": t.source,
            "student": student,
            "out": str(out),
            "kind": job.kind,
            "main_metric": task.main_metric,
            "dev_split": task.dev_splits[0],
            "dev_examples": len(dev_rows),
            "scores": scores,
            "parameters": {"teacher": parameter_counts(t.model), "student": parameter_counts(st.model)},
            **speeds,  # cpu_examples_per_s, speedup, their 1-thread twins, cpu_threads
            "transfer_set": {k: v for k, v in transfer.manifest.items() if k != "config"}
            | {"root": str(transfer.root)},
            "teacher_logits": tstats,
            "training": training,
            "config": asdict(cfg),
            "seconds_total": round(time.perf_counter() - t_start, 1),
        }
        _write_report(out, report)
        return report


SETTINGS_FILE = "distill.json"
RUNS = {"distilled": "distilled", "labels_only": "labels-only"}  # report key -> run directory in OUT/runs
# the training examples: texts a, texts b (None: a single text), labels
_Labelled = tuple[list[str], list[str | None], list[Any]]
# and the unlabelled texts (--unlabelled) after them
_Inputs = tuple[list[str], list[str | None], list[Any], list[str]]


@dataclass
class _Job:
    """What the steps of one distillation share."""

    task: Any
    teacher: LoadedModel
    kind: str  # the teacher's: classifier | multilabel | regression
    student: str  # bilstm | encoder
    cfg: DistillConfig  # resolved for the student
    max_length: int  # the --set max_length, at most the teacher's
    out: Path


def _labelled_rows(task: Any, cfg: DistillConfig) -> tuple[list[Any], list[Any]]:
    """The task's training rows (at most ``max_train_examples``) and its first dev split's rows; CramkitError
    when either is empty or has unlabelled rows, or the task has no dev split."""
    train_rows = task.examples(task.train_split)
    if cfg.max_train_examples:
        train_rows = train_rows[: cfg.max_train_examples]
    if not train_rows:
        raise CramkitError(f"task {task.name}: the {task.train_split} split is empty; nothing to distil from")
    if any(r.label is None for r in train_rows):
        raise CramkitError(
            f"task {task.name}: the {task.train_split} split has unlabelled rows; give a labelled training file "
            "(--label COLUMN); extra unlabelled text goes in --unlabelled FILE"
        )
    if not task.dev_splits:
        raise CramkitError(f"task {task.name} has no dev split to score teacher and student on; give --dev")
    dev_rows = task.examples(task.dev_splits[0])
    if not dev_rows or any(r.label is None for r in dev_rows):
        raise CramkitError(
            f"task {task.name}: the {task.dev_splits[0]} split is empty or unlabelled; it cannot be scored"
        )
    return train_rows, dev_rows


def _settings(job: _Job, inputs: _Inputs, dev_rows: list[Any]) -> dict[str, Any]:
    """What ``OUT/distill.json`` records: a rerun on the same ``--out`` with other settings is refused."""
    from cramkit.distillation.teacher import teacher_key

    return {
        "task": job.task.name,
        "teacher": job.teacher.source,
        "teacher_weights": teacher_key(job.teacher, job.max_length),
        "student": job.student,
        "train": _fingerprint(*inputs),
        "dev": _fingerprint([[r.text_a, r.text_b, r.label] for r in dev_rows]),
        # (settings that cannot change the result may change between reruns)
        "config": {k: v for k, v in asdict(job.cfg).items() if k not in ("workers", "checkpoint_every")},
    }


def _claimed_and_done(out: Path, settings: dict[str, Any], ctx: DistContext) -> bool:
    """Rank 0 claims ``out`` for these settings (another distillation's is refused); every rank learns whether
    one with these very settings already finished there (its report and model written)."""
    from cramkit.io import claim_dir
    from cramkit.loading import MODEL_FILE
    from cramkit.train.distributed import broadcast_object, main_first

    with main_first(ctx, "checking --out"):
        done = False
        if ctx.is_main:
            claimed = claim_dir(out, SETTINGS_FILE, settings, "a distillation")
            done = claimed and (out / "report.json").is_file() and (out / MODEL_FILE).is_file()
    return bool(broadcast_object(done, ctx))


def _transfer_and_logits(
    job: _Job, cache: Path, inputs: _Inputs, progress: bool, ctx: DistContext
) -> tuple[TransferSet, Any, dict[str, Any]]:
    """The transfer set and the teacher's logits over it (and their figures), built by rank 0 into ``cache``;
    the other ranks wait, then read them from there."""
    from cramkit.distillation.augment import MASK
    from cramkit.distillation.teacher import teacher_logits
    from cramkit.train.distributed import main_first

    with main_first(ctx, "building the transfer set and the teacher's logits"):
        show = progress and ctx.is_main
        transfer = _transfer_set(job.cfg, cache, *inputs, show)
        ta, tb = transfer.rendered(MASK)
        logits, tstats = teacher_logits(
            job.teacher, ta, tb, transfer.root, max_length=job.max_length, device=job.cfg.device, progress=show
        )
    return transfer, logits, tstats


def _train_students(
    job: _Job,
    st: LoadedModel,
    base_model: LoadedModel | None,
    transfer: TransferSet,
    logits: Any,
    labelled: _Labelled,
    progress: bool,
    ctx: DistContext,
) -> dict[str, Any]:
    """``st`` trained on the transfer set to match the teacher's ``logits``, then ``base_model`` (the same
    student, with ``baseline``) on the ``labelled`` examples alone: their trainings under the report's keys."""
    from cramkit.data.batching import encode_texts
    from cramkit.distillation.augment import MASK, STUDENT_MASK
    from cramkit.distillation.objective import train_student

    t, cfg, runs = job.teacher, job.cfg, job.out / "runs"
    sa, sb = transfer.rendered(STUDENT_MASK if job.student == "bilstm" else MASK)
    enc = encode_texts(st.tokenizer, sa, sb, job.max_length)
    ylab = _targets(job.kind, [v if v is not None else 0 for v in transfer.labels], t.num_labels or 1)
    training: dict[str, Any] = {}
    training["distilled"] = train_student(
        st,
        enc,
        np.asarray(logits),
        ylab,
        transfer.orig,
        cfg,
        cfg.epochs,
        runs / RUNS["distilled"],
        teacher=t,
        desc=f"distil {job.student}",
        progress=progress,
        ctx=ctx,
    )
    training["labels_only"] = None
    if base_model is not None:
        a, b, y_train = labelled
        enc0 = encode_texts(base_model.tokenizer, a, b, job.max_length)
        y0 = _targets(job.kind, y_train, t.num_labels or 1)
        training["labels_only"] = train_student(
            base_model,
            enc0,
            None,
            y0,
            np.ones(len(a), dtype=bool),
            cfg,
            cfg.baseline_epochs,
            runs / RUNS["labels_only"],
            desc=f"{job.student} on labels only",
            progress=progress,
            ctx=ctx,
        )
    return training


def _save_student(job: _Job, st: LoadedModel, transfer: TransferSet) -> None:
    """The student's model directory in ``out`` (which an earlier report would no longer describe: removed)."""
    st.extra |= {"distilled_from": job.teacher.source, "student": job.student, "transfer_rows": len(transfer)}
    st.task = job.task.name
    for name in ("report.json", "report.md"):  # an old report must not describe the new model
        (job.out / name).unlink(missing_ok=True)
    st.save(job.out)


def _write_report(out: Path, report: dict[str, Any]) -> None:
    """report.json and report.md; then the trainings' checkpoints go (the student is saved)."""
    import shutil

    from cramkit.distillation.report import report_md
    from cramkit.io import write_json_atomic, write_text_atomic

    write_json_atomic(out / "report.json", report)
    write_text_atomic(out / "report.md", report_md(report))
    for name in RUNS.values():  # the student is saved: the trainings' checkpoints are no longer needed
        shutil.rmtree(out / "runs" / name / "checkpoints", ignore_errors=True)


def _transfer_set(cfg: DistillConfig, cache: Path, a: list, b: list, y: list, unlabelled: list[str], progress: bool):
    """The transfer set: the training examples and their edited copies (Tang et al.), then the
    unlabelled texts; cached under ``cache`` by a fingerprint of its inputs."""
    from cramkit.distillation.augment import MANIFEST, TransferSet, build_transfer

    acfg = cfg.augment_config()
    if cfg.augment:
        key = _fingerprint(asdict(acfg) | {"workers": 0}, a, b, y, unlabelled)
        root = cache / f"transfer-{key}"
        cached = (root / MANIFEST).is_file()
        ts = build_transfer(root, a, b, y, acfg, unlabelled=unlabelled, progress=progress)
        ts.manifest = {**ts.manifest, "cached": cached}
        return ts
    key = _fingerprint("plain", a, b, y, unlabelled)
    extra = [x for x in unlabelled if x and x.strip()]
    root = cache / f"transfer-{key}"
    root.mkdir(parents=True, exist_ok=True)
    return TransferSet(
        root,
        a + extra,
        b + [None] * len(extra),
        y + [None] * len(extra),
        np.asarray([True] * len(a) + [False] * len(extra)),
        {"rows": len(a) + len(extra), "originals": len(a), "copies": 0, "unlabelled": len(extra)},
    )
