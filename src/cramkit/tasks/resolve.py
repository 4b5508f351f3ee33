"""The one way a verb gets its task: a registered name, or the user's own files. ``cramkit finetune``,
``cramkit distill`` and their Python twins (``cramkit.finetune``, ``cramkit.distill``) all come here, so a
mistake gets the same line from the command line and from Python."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cramkit.errors import CramkitError
from cramkit.tasks.registry import Task, get_task, hold_out

PathLike = str | os.PathLike


def data_dir_for(task: str, given: PathLike | Sequence[str] | None) -> str | None:
    """The data folder of ``task`` (e.g. glue/mrpc): ``given`` is one folder, or several values where
    ``SUITE=DIR`` names a suite's folder and a plain ``DIR`` the rest; None: the suite's default."""
    if given is None or isinstance(given, (str, os.PathLike)):
        return None if given is None else str(given)
    plain, per_suite = None, {}
    for item in given:
        suite, sep, path = item.partition("=")
        if sep and suite and "/" not in suite and not Path(item).exists():
            per_suite[suite] = path
        elif plain is not None and plain != item:
            raise CramkitError(
                f"--data-dir given twice ({plain}, {item}); for tasks of several benchmarks name each: "
                "--data-dir glue=DIR --data-dir clue=DIR2"
            )
        else:
            plain = item
    return per_suite.get(task.split("/")[0], plain)


def resolve_task(
    task: str | None = None,
    *,
    data_dir: PathLike | Sequence[str] | None = None,
    train: PathLike | None = None,
    dev: PathLike | None = None,
    test: PathLike | None = None,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str = "label",
    regression: bool = False,
    choices: Sequence[str] | None = None,
    name: str | None = None,
    dev_fraction: float | None = None,
    skip_bad_rows: bool = False,
) -> Task:
    """A registered ``task`` (its files in ``data_dir``) or a task from the user's files: ``train`` with the
    ``text_a`` column (``text_b`` for pairs, ``choices`` for multiple choice, ``label``), ``dev`` (else
    ``dev_fraction`` of train is held out; None: ``dev`` is required) and ``test``. Either one, never both."""
    if task is not None and train is not None:
        raise CramkitError("give either a task (--task NAME, task=) or your own files (--train FILE, train=), not both")
    if train is not None:
        from cramkit.tasks.files import task_from_file

        if not text_a:  # the usual names (as predict finds them): text, sentence, sentence1 + sentence2, ...
            from cramkit.text.tables import guess_text_columns

            text_a, guessed_b, columns = guess_text_columns(Path(train))
            if not text_a:
                raise CramkitError(
                    f"{train}: no usual text column among {', '.join(columns) or 'its columns'}; name it with "
                    "--text-a COLUMN / text_a= (and --text-b for a pair's second text)"
                )
            text_b = text_b or (guessed_b if not choices else None)
            pair = f" and {text_b!r}" if text_b else ""
            note = f"cramkit: {train}: text from the column {text_a!r}{pair} (--text-a/--text-b to choose others)"
            print(note, file=sys.stderr)
        if dev is None and dev_fraction is None:
            raise CramkitError("your own files need a dev file here (--dev FILE, dev=): the models are scored on it")
        found = task_from_file(
            name or Path(train).stem,
            train,
            dev,
            test,
            text_a=text_a,
            text_b=text_b,
            label=label,
            regression=regression,
            choices=list(choices) if choices is not None else None,
            skip_bad_rows=skip_bad_rows,
        )
        return found if dev is not None or dev_fraction is None else hold_out(found, float(dev_fraction))
    if not task:
        raise CramkitError(
            "name a task (--task glue/sst2, task='glue/sst2') or give your own files (--train FILE, train=)"
        )
    found = get_task(task, data_dir=data_dir_for(task, data_dir), skip_bad_rows=skip_bad_rows)
    if not found.dev_splits:
        raise CramkitError(f"task {found.name} has no dev split to score; pick a task with labelled dev data")
    return found
