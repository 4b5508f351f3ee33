"""``cramkit distill``'s front door, the verb ``cramkit.distill(...)``: the request checked
(:meth:`~cramkit.distillation.request.DistillRequest.resolve`: the same line from the command line and from
Python), the task resolved and read, then the recipe (:func:`cramkit.distillation.core.distill`, or
:func:`~cramkit.distillation.embedding_student.distill_embeddings` for ``layers:N``). Imports nothing heavy at
import time."""

from __future__ import annotations

import os
from typing import Any

from cramkit.distillation.request import DistillRequest, check_student, is_embedding_student
from cramkit.request import verb

__all__ = ["check_student", "distill"]


@verb(DistillRequest, rest="settings")
def distill(request: DistillRequest) -> dict[str, Any]:
    """Distil the fine-tuned ``teacher`` into a small ``student`` on a registered ``task`` or your files (``train``
    and ``dev``, scored for teacher and student); ``unlabelled``: extra text for the transfer set (a text file, one
    text per line, or a token store). Keywords that are not fields are settings (DistillConfig fields). Writes the
    student with report.json and report.md to ``out``; returns the report. ``student="layers:N"``: an embedding
    student (:mod:`cramkit.distillation.embedding_student`), trained on the texts of ``unlabelled`` alone."""
    from cramkit.io import disk_errors

    r = request
    student, cfg = r.resolve()
    task = None if is_embedding_student(student) else _task(r)
    texts = None
    if r.unlabelled:
        from cramkit.distillation.unlabelled import STORE_DEFAULT_LIMIT, is_text_file, read_unlabelled

        limit = cfg.max_unlabelled or (0 if is_text_file(str(r.unlabelled)) else STORE_DEFAULT_LIMIT)
        texts = read_unlabelled(str(r.unlabelled), limit=limit, seed=cfg.seed)
    if isinstance(r.teacher, (str, os.PathLike)):
        from cramkit.loading import check_source

        check_source(str(r.teacher), "--teacher")
    with disk_errors(r.out):
        if task is None:
            from cramkit.distillation.embedding_student import distill_embeddings

            return distill_embeddings(r.teacher, texts or [], student, cfg, r.out, cache=r.cache, progress=r.progress)
        from cramkit.distillation.core import distill as recipe

        return recipe(r.teacher, task, student, cfg, r.out, cache=r.cache, unlabelled=texts, progress=r.progress)


def _task(r: DistillRequest) -> Any:
    """The labelled task (a registered name or the user's files, scored on their dev file), every split read:
    a missing or malformed file fails before any work."""
    from cramkit.tasks.resolve import resolve_task

    task = resolve_task(
        r.task,
        data_dir=r.data_dir,
        train=r.train,
        dev=r.dev,
        text_a=r.text_a,
        text_b=r.text_b,
        label=r.label,
        regression=r.regression,
        dev_fraction=None,  # teacher and student are scored on the user's dev file
    )
    for split in [task.train_split, *task.dev_splits]:
        task.examples(split)
    return task
