"""``cramkit distill``'s front door, the verb ``cramkit.distill(...)``: the teacher, a task name or your files,
the student's name and the settings checked here (the same line from the command line and from Python), then
the recipe (:func:`cramkit.distillation.core.distill`) on the resolved task. Imports nothing heavy at import time."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError

if TYPE_CHECKING:
    from cramkit.loading import LoadedModel

PathLike = str | os.PathLike


def distill(
    teacher: PathLike | LoadedModel,
    *,
    student: str,
    out: PathLike,
    task: str | None = None,
    data_dir: PathLike | Sequence[str] | None = None,
    train: PathLike | None = None,
    dev: PathLike | None = None,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str = "label",
    regression: bool = False,
    unlabelled: PathLike | None = None,
    cache: PathLike | None = None,
    progress: bool = True,
    report_to: str | Sequence[str] | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Distil the fine-tuned ``teacher`` into a small ``student`` (bilstm | encoder) on a registered ``task`` or
    your files (``train`` and ``dev``, scored for teacher and student); ``unlabelled``: extra text for the
    transfer set (a text file, one text per line, or a token store). ``settings``: DistillConfig fields (epochs,
    layers, p_pos, max_unlabelled, ...). Writes the student's model directory with report.json and report.md to
    ``out``; returns the report. The same as ``cramkit distill --teacher MODEL --student NAME --out OUT``.

    ``student="layers:N"``: an embedding student, N of the embedding ``teacher``'s layers trained to give its
    vectors on the texts of ``unlabelled`` alone (no task, no labels): :mod:`cramkit.distillation.embedding_student`."""
    from cramkit.distillation.config import config_from
    from cramkit.distillation.core import distill as _distill
    from cramkit.io import disk_errors
    from cramkit.tasks.resolve import resolve_task

    if is_embedding_student(student):
        given = {
            "--task": task,
            "--data-dir": data_dir,
            "--train": train,
            "--dev": dev,
            "--text-a": text_a,
            "--text-b": text_b,
        }
        return _distill_embeddings(
            teacher, student, out, unlabelled, cache, progress, report_to, [k for k, v in given.items() if v], settings
        )
    student, over = student_and_settings(student, settings)
    if report_to is not None:
        from cramkit.train.report import report_to_setting

        over["report_to"] = report_to_setting(report_to)
    cfg = config_from(over)
    the_task = resolve_task(
        task,
        data_dir=data_dir,
        train=train,
        dev=dev,
        text_a=text_a,
        text_b=text_b,
        label=label,
        regression=regression,
        dev_fraction=None,  # teacher and student are scored on the user's dev file
    )
    for split in [the_task.train_split, *the_task.dev_splits]:  # a missing or malformed file: before any work
        the_task.examples(split)
    texts = None
    if unlabelled:
        from cramkit.distillation.unlabelled import STORE_DEFAULT_LIMIT, is_text_file, read_unlabelled

        limit = cfg.max_unlabelled or (0 if is_text_file(str(unlabelled)) else STORE_DEFAULT_LIMIT)
        texts = read_unlabelled(str(unlabelled), limit=limit, seed=cfg.seed)
    if isinstance(teacher, (str, os.PathLike)):
        from cramkit.loading import check_source

        check_source(str(teacher), "--teacher")
    with disk_errors(out):
        return _distill(teacher, the_task, student, cfg, out, cache=cache, unlabelled=texts, progress=progress)


def _distill_embeddings(
    teacher: PathLike | LoadedModel,
    student: str,
    out: PathLike,
    unlabelled: PathLike | None,
    cache: PathLike | None,
    progress: bool,
    report_to: str | Sequence[str] | None,
    task_flags: list[str],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """``--student layers:N``: every input checked in one line before anything loads, then the recipe."""
    from cramkit.distillation.config import config_from
    from cramkit.distillation.embedding_student import distill_embeddings, student_layers
    from cramkit.io import disk_errors

    student_layers(student)
    if task_flags:
        raise CramkitError(
            f"--student {student} learns the teacher's embeddings from text alone: drop {', '.join(task_flags)} and "
            "give the texts as --unlabelled FILE (one text per line)"
        )
    if not unlabelled:
        raise CramkitError(f"--student {student} needs text to learn from: give --unlabelled FILE (one text per line)")
    over = dict(settings)
    if report_to is not None:
        from cramkit.train.report import report_to_setting

        over["report_to"] = report_to_setting(report_to)
    cfg = config_from(over)
    from cramkit.distillation.unlabelled import STORE_DEFAULT_LIMIT, is_text_file, read_unlabelled

    limit = cfg.max_unlabelled or (0 if is_text_file(str(unlabelled)) else STORE_DEFAULT_LIMIT)
    texts = read_unlabelled(str(unlabelled), limit=limit, seed=cfg.seed)
    if isinstance(teacher, (str, os.PathLike)):
        from cramkit.loading import check_source

        check_source(str(teacher), "--teacher")
    with disk_errors(out):
        return distill_embeddings(teacher, texts, student, cfg, out, cache=cache, progress=progress)


def is_embedding_student(student: str) -> bool:
    """``--student layers:N``: an embedding student (N of the teacher's layers)."""
    return str(student).startswith("layers:")


def student_and_settings(student: str, settings: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The student's kind and the settings it adds: ``--student hf:DIR`` (or a model directory) is a small
    pretrained encoder, all of its layers (``encoder`` with ``init=DIR``); else a name in STUDENTS."""
    check_student(student)
    if is_model_student(student):
        if settings.get("init") not in (None, student):
            raise CramkitError(f"--student {student} and init={settings['init']}: give the model once, as --student")
        return "encoder", {**settings, "init": student}
    return student, dict(settings)


def is_model_student(student: str) -> bool:
    """``--student`` names a model (``hf:DIR``, a hub id, or a directory) rather than a kind of student."""
    from cramkit.distillation.students import STUDENTS

    return student not in STUDENTS and (student.startswith("hf:") or os.path.isdir(student))


def check_student(student: str) -> None:
    """An unknown student's name: one line with the names there are (and the closest)."""
    from cramkit.distillation.students import STUDENTS

    if is_embedding_student(student):
        from cramkit.distillation.embedding_student import student_layers

        student_layers(student)
        return
    if student not in STUDENTS and not is_model_student(student):
        import difflib

        close = difflib.get_close_matches(student, STUDENTS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise CramkitError(
            f"--student {student!r}: unknown student{hint}; choose one of {', '.join(STUDENTS)}, a pretrained "
            "small model (hf:DIR or a model directory) to start from, or layers:N (an embedding student)"
        )
