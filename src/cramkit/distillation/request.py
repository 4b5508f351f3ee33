"""What ``cramkit distill`` and ``cramkit.distill`` take, declared once (:mod:`cramkit.request`): the command
line's flags, the function's keywords and the request file torchrun's workers read come from here; and the
checks both doors make (:meth:`DistillRequest.resolve`: the same line from either)."""

from __future__ import annotations

import os
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.loading import LoadedModel
from cramkit.request import Training, param

if TYPE_CHECKING:
    from cramkit.distillation.config import DistillConfig

SETTINGS_HELP = "a distillation setting, e.g. --set epochs=5 --set layers=2 --set p_pos=0"
FILE_TASK = ("--task", "--data-dir", "--train", "--dev", "--text-a", "--text-b")


@dataclass
class DistillRequest(Training):
    """A distillation: the fine-tuned teacher, the student, the task (a name or your files) and the settings."""

    teacher: str | os.PathLike | LoadedModel = param(
        required=True,
        metavar="MODEL",
        help="a fine-tuned model directory (cramkit finetune --out) or hf:DIR with a classification head",
    )
    _: KW_ONLY
    student: str = param(
        required=True,
        metavar="NAME",
        help="bilstm, encoder (the teacher's layers), a pretrained small model to start from (hf:DIR, e.g. "
        "all-MiniLM-L6-v2, or a model directory: all of its layers), or layers:N: an embedding student, N of an "
        "embedding teacher's layers trained on --unlabelled text to give its vectors",
    )
    out: str | os.PathLike = param(required=True, help="output directory: the student model, report.json, report.md")
    task: str | None = param(None, help="registered task name, e.g. glue/sst2")
    data_dir: str | os.PathLike | list[str] | None = param(None, help="GLUE root folder; default $CRAMKIT_GLUE_DIR")
    train: str | os.PathLike | None = param(
        None, help="training file (.csv, .tsv or .jsonl with a header / named fields)"
    )
    dev: str | os.PathLike | None = param(None, help="dev file, scored for teacher and student")
    text_a: str | None = param(None, help="column with the (first) text")
    text_b: str | None = param(None, help="column with the second text of a pair")
    label: str = param("label", help="label column")
    regression: bool = param(False, help="the label is a number (MSE, Pearson/Spearman)")
    unlabelled: str | os.PathLike | None = param(
        None,
        metavar="FILE_OR_STORE",
        help="extra text for the transfer set: a UTF-8 text file (one text per line) or a token store (its "
        "documents, decoded and cut into sentences; --set max_unlabelled=N); with --student layers:N, the only "
        "text the embedding student learns from",
    )
    cache: str | os.PathLike | None = param(
        None, help="folder for the transfer set and teacher logits (default OUT/cache)"
    )
    settings: dict[str, Any] = param(
        {}, help="DistillConfig fields (epochs, layers, p_pos, ...; what --config FILE holds); overrides on top"
    )

    def resolve(self) -> tuple[str, DistillConfig]:
        """The student's kind (bilstm, encoder, layers:N) and the settings (``settings``, the ``--set``
        ``overrides`` on top, then what the student and ``report_to`` stand for), every rule of what combines
        checked: one CramkitError line, the same from the command line and from Python."""
        from cramkit.config import parse_overrides
        from cramkit.distillation.config import config_from

        settings = {**self.settings, **parse_overrides(self.overrides)}
        student = self.student
        if is_embedding_student(student):
            student_layers(student)
            given = [flag for flag in FILE_TASK if getattr(self, flag[2:].replace("-", "_"))]
            if given:
                raise CramkitError(
                    f"--student {student} learns the teacher's embeddings from text alone: drop {', '.join(given)} "
                    "and give the texts as --unlabelled FILE (one text per line)"
                )
            if not self.unlabelled:
                raise CramkitError(
                    f"--student {student} needs text to learn from: give --unlabelled FILE (one text per line)"
                )
        else:
            check_student(student)
            if settings.get("export"):
                raise CramkitError(
                    f"--set export={settings['export']} exports an embedding student (--student layers:N); for "
                    f"--student {student} run cramkit export OUT --target cpu after the distillation"
                )
            if is_model_student(student):  # a small pretrained encoder, all of its layers
                if settings.get("init") not in (None, student):
                    raise CramkitError(
                        f"--student {student} and init={settings['init']}: give the model once, as --student"
                    )
                student, settings = "encoder", {**settings, "init": student}
        if self.report_to is not None:
            from cramkit.train.report import report_to_setting

            settings["report_to"] = report_to_setting(self.report_to)
        return student, config_from(settings)


EMBEDDING_STUDENT = "layers:"  # --student layers:N


def is_embedding_student(student: str) -> bool:
    """``--student layers:N``: an embedding student (N of the teacher's layers)."""
    return str(student).startswith(EMBEDDING_STUDENT)


def is_model_student(student: str) -> bool:
    """``--student`` names a model (``hf:DIR``, a hub id, or a directory) rather than a kind of student."""
    from cramkit.distillation.students import STUDENTS

    return student not in STUDENTS and (student.startswith("hf:") or os.path.isdir(student))


def check_student(student: str) -> None:
    """An unknown student's name (not ``layers:N``): one line with the names there are (and the closest)."""
    from cramkit.distillation.students import STUDENTS

    if student not in STUDENTS and not is_model_student(student):
        import difflib

        close = difflib.get_close_matches(student, STUDENTS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise CramkitError(
            f"--student {student!r}: unknown student{hint}; choose one of {', '.join(STUDENTS)}, a pretrained "
            "small model (hf:DIR or a model directory) to start from, or layers:N (an embedding student)"
        )


def student_layers(student: str) -> int:
    """N of ``layers:N``; one CramkitError line when it is not a whole number of at least 1."""
    text = str(student)[len(EMBEDDING_STUDENT) :].strip()
    if not text.isdigit() or int(text) < 1:
        raise CramkitError(
            f"--student {student}: give the layers the student keeps as a whole number of at least 1, e.g. "
            "--student layers:3"
        )
    return int(text)
