"""SuperGLUE (BoolQ, CB, COPA, MultiRC, ReCoRD, RTE, WiC, WSC and the AX-b / AX-g diagnostics), read from
the official JSON-lines files, scored with the official metrics.

Local layout, as the official download (super.gluebenchmark.com, one zip per task) leaves it::

    DIR/BoolQ/{train,val,test}.jsonl   DIR/CB/...   DIR/COPA/...   DIR/MultiRC/...   DIR/ReCoRD/...
    DIR/RTE/...   DIR/WiC/...   DIR/WSC/...   DIR/AX-b/AX-b.jsonl   DIR/AX-g/AX-g.jsonl

DIR is ``data_dir``, else $CRAMKIT_SUPERGLUE_DIR, else ./superglue_data. ``val.jsonl`` is the split named
"dev" here (as in GLUE). Each line is one JSON object with the fields the release has, and no others: a
field this reader does not know is a bad row (a renamed or re-shaped file would otherwise be read wrong),
as is a missing field, a label outside the task's set or an ``idx`` seen before in the file. Test rows
have no label. The readers were written to the published format (the SuperGLUE paper, the benchmark's
own toolkit jiant, Hugging Face's ``super_glue`` script) and are tested on files written in it: no
SuperGLUE data was at hand.

How rows become examples:

- BoolQ: (question, passage), labels false/true. CB: (premise, hypothesis), entailment / contradiction /
  neutral. RTE and the diagnostics: (premise, hypothesis), entailment / not_entailment.
- COPA: multiple choice; the context is the premise and its question ("What was the cause?" / "What
  happened as a result?"), the choices choice1 and choice2.
- WiC: (sentence1, sentence2) with the word's occurrence marked ``*word*`` in each (start/end are
  character offsets, end exclusive). WSC: the text with the noun phrase marked ``[...]`` and the pronoun
  ``*...*`` (span indices count words split on spaces), and the question whether one refers to the other;
  a span whose text is not the words at its index (case and punctuation aside) is a bad row.
- MultiRC: one false/true row per answer option, (paragraph, question + answer), grouped by question for
  the exact-match metric; test predictions are written in MultiRC's nested submission format.
- ReCoRD: multiple choice over the passage's entities (the distinct entity strings), each choice the query
  with ``@placeholder`` filled by one entity; the label is the first gold entity (training needs one
  index; the metrics take the max over all golds). Scored by SQuAD-style F1 / EM over answer strings;
  test predictions are the chosen entity's text.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np

from cramkit.errors import CramkitError
from cramkit.tasks.glue import SKIP_HINT, BadRow
from cramkit.tasks.jsonlines import JsonLinesSplit
from cramkit.tasks.registry import Example, PathLike, Suite, Task, register_family, register_suite

log = logging.getLogger("cramkit.tasks")

ENV_DIR = "CRAMKIT_SUPERGLUE_DIR"
BOOL_LABELS = ["false", "true"]
NLI2 = ["entailment", "not_entailment"]
COPA_QUESTIONS = {"cause": "What was the cause?", "effect": "What happened as a result?"}


def superglue_dir(data_dir: PathLike | None = None) -> Path:
    """data_dir, else $CRAMKIT_SUPERGLUE_DIR, else ./superglue_data."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    return Path(os.environ.get(ENV_DIR, "superglue_data")).expanduser()


# --------------------------------------------------------------------------------------- row helpers


def _fields(obj, where: str, what: str, required: set[str], optional: set[str] | frozenset[str] = frozenset()) -> dict:
    """obj as a dict with every required field and no field outside required | optional (else BadRow)."""
    if not isinstance(obj, dict):
        raise BadRow(f"{where}: {what} is not a JSON object. {SKIP_HINT}")
    known = required | optional
    for key in obj:
        if key not in known:
            raise BadRow(
                f"{where}: unknown field '{key}' in {what} (the official fields: {', '.join(sorted(known))}). "
                + SKIP_HINT
            )
    for key in sorted(required):
        if key not in obj:
            raise BadRow(f"{where}: {what} has no field '{key}'. {SKIP_HINT}")
    return obj


def _str(obj: dict, key: str, where: str) -> str:
    v = obj[key]
    if not isinstance(v, str):
        raise BadRow(f"{where}: field '{key}' is not a string. {SKIP_HINT}")
    return v


def _int(obj: dict, key: str, where: str) -> int:
    """An integer field; a string of digits counts too (AX-b's idx is written as one)."""
    v = obj[key]
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRow(f"{where}: field '{key}' is {v!r}, not an integer. {SKIP_HINT}")
    return v


def _label(obj: dict, where: str, labels: list[str], test: bool) -> int | None:
    """The label id of a row (None on a test row without one). Booleans and 0/1 read as false/true."""
    if "label" not in obj:
        if test:
            return None
        raise BadRow(f"{where}: the row has no label (only test rows may lack one). {SKIP_HINT}")
    v = obj["label"]
    if labels == BOOL_LABELS and (isinstance(v, bool) or v in (0, 1)):
        return int(v)
    if isinstance(v, str) and v in labels:
        return labels.index(v)
    raise BadRow(f"{where}: label {json.dumps(v)} is not one of {labels}. {SKIP_HINT}")


def _pair(a: str, b: str, labels: list[str], extra: frozenset[str] = frozenset()):
    """Parser of a sentence-pair classification row (fields a, b, idx, label)."""

    def parse(row: dict, where: str, test: bool) -> list[Example]:
        _fields(row, where, "the row", {a, b, "idx"}, {"label"} | extra)
        label = _label(row, where, labels, test)
        return [Example(_str(row, a, where), _str(row, b, where), label, _int(row, "idx", where))]

    return parse


def _copa(row: dict, where: str, test: bool) -> list[Example]:
    _fields(row, where, "the row", {"premise", "choice1", "choice2", "question", "idx"}, {"label"})
    question = _str(row, "question", where)
    if question not in COPA_QUESTIONS:
        raise BadRow(f"{where}: question '{question}' is neither 'cause' nor 'effect'. {SKIP_HINT}")
    label = None
    if "label" in row:
        if row["label"] not in (0, 1) or isinstance(row["label"], bool):
            raise BadRow(f"{where}: label {json.dumps(row['label'])} is not 0 or 1. {SKIP_HINT}")
        label = row["label"]
    elif not test:
        raise BadRow(f"{where}: the row has no label (only test rows may lack one). {SKIP_HINT}")
    context = f"{_str(row, 'premise', where)} {COPA_QUESTIONS[question]}"
    choices = (_str(row, "choice1", where), _str(row, "choice2", where))
    return [Example(context, None, label, _int(row, "idx", where), choices=choices)]


def _mark_chars(text: str, start: int, end: int, where: str, which: str) -> str:
    if not 0 <= start < end <= len(text):
        raise BadRow(
            f"{where}: {which} offsets {start}..{end} fall outside the sentence ({len(text)} characters). " + SKIP_HINT
        )
    return f"{text[:start]}*{text[start:end]}*{text[end:]}"


def _wic(row: dict, where: str, test: bool) -> list[Example]:
    keys = {"word", "sentence1", "sentence2", "start1", "end1", "start2", "end2", "idx"}
    _fields(row, where, "the row", keys, {"label", "version"})
    label = _label(row, where, BOOL_LABELS, test)
    s1, s2 = _str(row, "sentence1", where), _str(row, "sentence2", where)
    a = _mark_chars(s1, _int(row, "start1", where), _int(row, "end1", where), where, "start1/end1")
    b = _mark_chars(s2, _int(row, "start2", where), _int(row, "end2", where), where, "start2/end2")
    return [Example(a, b, label, _int(row, "idx", where))]


def _norm_word(w: str) -> str:
    return re.sub(r"[^\w]", "", w.lower())


def _wsc(row: dict, where: str, test: bool) -> list[Example]:
    _fields(row, where, "the row", {"text", "target", "idx"}, {"label"})
    target = _fields(row["target"], where, "target", {"span1_text", "span1_index", "span2_text", "span2_index"})
    label = _label(row, where, BOOL_LABELS, test)
    words = _str(row, "text", where).split()
    spans = []
    for k in ("span1", "span2"):
        text, i = _str(target, f"{k}_text", where), _int(target, f"{k}_index", where)
        n = len(text.split())
        found = words[i : i + n] if i >= 0 else []
        if not n or [_norm_word(w) for w in found] != [_norm_word(w) for w in text.split()]:
            raise BadRow(
                f"{where}: target.{k}_text '{text}' does not match the words at {k}_index {i} "
                f"('{' '.join(found)}'). {SKIP_HINT}"
            )
        spans.append((i, i + n, text))
    (i1, j1, noun), (i2, j2, pronoun) = spans
    if i1 < j2 and i2 < j1:
        raise BadRow(f"{where}: the two target spans overlap. {SKIP_HINT}")
    marked = list(words)
    for i, j, left, right in ((i1, j1, "[", "]"), (i2, j2, "*", "*")):
        marked[i] = left + marked[i]
        marked[j - 1] += right
    question = f'Does "{pronoun}" refer to "{noun}"?'
    return [Example(" ".join(marked), question, label, _int(row, "idx", where))]


def _multirc(row: dict, where: str, test: bool) -> list[Example]:
    _fields(row, where, "the row", {"idx", "passage"}, {"version"})
    p_idx = _int(row, "idx", where)
    passage = _fields(row["passage"], where, "passage", {"text", "questions"})
    paragraph = _str(passage, "text", where)
    questions = passage["questions"]
    if not isinstance(questions, list) or not questions:
        raise BadRow(f"{where}: passage.questions is not a non-empty list. {SKIP_HINT}")
    out = []
    for q in questions:
        _fields(q, where, "a question", {"question", "answers", "idx"})
        q_idx, question = _int(q, "idx", where), _str(q, "question", where)
        if not isinstance(q["answers"], list) or not q["answers"]:
            raise BadRow(f"{where}: question {q_idx} has no list of answers. {SKIP_HINT}")
        for a in q["answers"]:
            _fields(a, where, "an answer", {"text", "idx"}, {"label"})
            label = _label(a, where, BOOL_LABELS, test)
            meta = {"paragraph": p_idx, "question": q_idx}
            text_b = f"{question} {_str(a, 'text', where)}"
            out.append(Example(paragraph, text_b, label, _int(a, "idx", where), group=q_idx, meta=meta))
    return out


def _record(row: dict, where: str, test: bool) -> list[Example]:
    _fields(row, where, "the row", {"idx", "passage", "qas"}, {"source"})
    passage = _fields(row["passage"], where, "passage", {"text", "entities"})
    text = _str(passage, "text", where)
    if not isinstance(passage["entities"], list):
        raise BadRow(f"{where}: passage.entities is not a list. {SKIP_HINT}")
    entities = set()
    for e in passage["entities"]:
        _fields(e, where, "an entity", {"start", "end"})
        s, t = _int(e, "start", where), _int(e, "end", where)  # end is inclusive in ReCoRD
        if not 0 <= s <= t < len(text):
            raise BadRow(f"{where}: entity {s}..{t} falls outside the passage. {SKIP_HINT}")
        entities.add(text[s : t + 1])
    ents = sorted(entities)
    if not ents:
        raise BadRow(f"{where}: the passage has no entities to choose from. {SKIP_HINT}")
    if not isinstance(row["qas"], list) or not row["qas"]:
        raise BadRow(f"{where}: qas is not a non-empty list. {SKIP_HINT}")
    out = []
    for qa in row["qas"]:
        _fields(qa, where, "a query", {"query", "idx"}, {"answers"})
        query = _str(qa, "query", where)
        if "@placeholder" not in query:
            raise BadRow(f"{where}: query {qa['idx']} has no @placeholder. {SKIP_HINT}")
        answers: list[str] = []
        for a in qa.get("answers", []):
            _fields(a, where, "an answer", {"start", "end", "text"})
            answers.append(_str(a, "text", where))
        answers = sorted(set(answers))
        label = None
        if answers:
            hits = [i for i, e in enumerate(ents) if e in answers]
            if not hits:
                raise BadRow(f"{where}: query {qa['idx']}: no answer ({', '.join(answers)}) is an entity. {SKIP_HINT}")
            label = hits[0]
        elif not test:
            raise BadRow(f"{where}: query {qa['idx']} has no answers (only test rows may lack them). {SKIP_HINT}")
        choices = tuple(query.replace("@placeholder", e) for e in ents)
        meta = {"passage": _int(row, "idx", where), "entities": ents, "answers": answers}
        out.append(Example(text, None, label, _int(qa, "idx", where), choices=choices, meta=meta))
    return out


# ------------------------------------------------------------------------------------------ tasks


@dataclass(frozen=True)
class SgSpec:
    key: str  # "boolq"
    dirname: str  # "BoolQ"
    parse: Callable[[dict, str, bool], list[Example]]  # (row, where, is_test) -> examples
    labels: list[str] | None  # None: multiple choice
    metrics: list[str]
    leaderboard: str  # the submission file, e.g. "BoolQ.jsonl"
    files: tuple[tuple[str, str], ...] = (
        ("train", "train.jsonl"),
        ("dev", "val.jsonl"),
        ("test", "test.jsonl"),
    )


_AXB_EXTRA = frozenset({"lexical-semantics", "predicate-argument-structure", "logic", "knowledge"})

SPECS: dict[str, SgSpec] = {
    s.key: s
    for s in [
        SgSpec(
            "boolq",
            "BoolQ",
            _pair("question", "passage", BOOL_LABELS),
            BOOL_LABELS,
            ["accuracy"],
            "BoolQ.jsonl",
        ),
        SgSpec(
            "cb",
            "CB",
            _pair("premise", "hypothesis", ["entailment", "contradiction", "neutral"]),
            ["entailment", "contradiction", "neutral"],
            ["macro_f1", "accuracy"],
            "CB.jsonl",
        ),
        SgSpec("copa", "COPA", _copa, None, ["accuracy"], "COPA.jsonl"),
        SgSpec("multirc", "MultiRC", _multirc, BOOL_LABELS, ["f1a", "em"], "MultiRC.jsonl"),
        SgSpec("record", "ReCoRD", _record, None, ["answer_f1", "answer_em"], "ReCoRD.jsonl"),
        SgSpec("rte", "RTE", _pair("premise", "hypothesis", NLI2), NLI2, ["accuracy"], "RTE.jsonl"),
        SgSpec("wic", "WiC", _wic, BOOL_LABELS, ["accuracy"], "WiC.jsonl"),
        SgSpec("wsc", "WSC", _wsc, BOOL_LABELS, ["accuracy"], "WSC.jsonl"),
        # the diagnostics: test only, predicted with an RTE model, scored by the leaderboard (AX-b: MCC)
        SgSpec(
            "axb",
            "AX-b",
            _pair("sentence1", "sentence2", NLI2, _AXB_EXTRA),
            NLI2,
            ["mcc"],
            "AX-b.jsonl",
            (("test", "AX-b.jsonl"),),
        ),
        SgSpec(
            "axg",
            "AX-g",
            _pair("premise", "hypothesis", NLI2, frozenset({"pair_id"})),
            NLI2,
            ["accuracy"],
            "AX-g.jsonl",
            (("test", "AX-g.jsonl"),),
        ),
    ]
}

#: the eight tasks of the SuperGLUE score, in the paper's order (Table 1)
SUPERGLUE_TASKS = ["boolq", "cb", "copa", "multirc", "record", "rte", "wic", "wsc"]


def _parse(
    parse: Callable[[dict, str, bool], list[Example]], row: dict, where: str, n: int, test: bool
) -> list[Example]:
    """A SuperGLUE row's examples (``n``, the row's place, is not used: every row carries its idx)."""
    return parse(row, where, test)


class _SuperGlueTask(Task):
    """A task whose test predictions are checked against its split and written as SuperGLUE JSON lines."""

    def _checked(self, split: str, idx_and_preds) -> dict[int, Any]:
        preds: dict[int, Any] = {}
        for i, p in idx_and_preds:
            if int(i) in preds:
                raise CramkitError(f"task {self.name} {split}: predictions repeat an index")
            preds[int(i)] = p
        expected = {e.idx for e in self.examples(split)}
        if set(preds) != expected:
            missing, extra = sorted(expected - set(preds)), sorted(set(preds) - expected)
            raise CramkitError(
                f"task {self.name} {split}: predictions cover {len(preds)} indices but the split has "
                f"{len(expected)} examples (missing {missing[:5]}, unknown {extra[:5]}); predict every example"
            )
        return preds

    def _write_lines(self, split: str, objects: list[dict], out_path: PathLike) -> Path:
        from cramkit.io import write_text_atomic

        out = Path(out_path)
        if out.suffix not in (".json", ".jsonl"):
            out = out / self.leaderboard_file(split)
        return write_text_atomic(out, "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objects))


class WSCTask(_SuperGlueTask):
    """WSC's submission labels are "True"/"False" (capitalised, as jiant writes them for the grader)."""

    def submission_value(self, formatted: str) -> object:
        return formatted.capitalize()


class MultiRCTask(_SuperGlueTask):
    """MultiRC: rows are answer options; predictions are written nested, one line per paragraph:
    ``{"idx": P, "passage": {"questions": [{"idx": Q, "answers": [{"idx": A, "label": 0|1}]}]}}``."""

    def write_predictions(self, split: str, idx_and_preds, out_path: PathLike) -> Path:
        preds = self._checked(split, idx_and_preds)
        paragraphs: dict[int, dict[int, list]] = {}
        for ex in self.examples(split):  # file order
            label = int(self.format_prediction(preds[ex.idx]) == "true")
            meta = cast(dict, ex.meta)  # MultiRC rows carry their paragraph and question
            questions = paragraphs.setdefault(meta["paragraph"], {})
            questions.setdefault(meta["question"], []).append({"idx": ex.idx, "label": label})
        lines = [
            {"idx": p, "passage": {"questions": [{"idx": q, "answers": a} for q, a in qs.items()]}}
            for p, qs in paragraphs.items()
        ]
        return self._write_lines(split, lines, out_path)


def _chosen(predictions, n: int) -> list[int]:
    """Chosen choice per row: from ids, from a (n, choices) array, or from one score array per row."""
    if isinstance(predictions, np.ndarray) and predictions.ndim == 2:
        return predictions.argmax(-1).tolist()
    out = [int(np.argmax(p)) if np.ndim(p) else int(p) for p in predictions]
    if len(out) != n:
        raise CramkitError(f"got {len(out)} predictions for {n} examples; they must be equal in number")
    return out


class RecordTask(_SuperGlueTask):
    """ReCoRD: multiple choice over the passage's entities, scored on the chosen entity's text against every
    gold answer (SQuAD-style F1 / EM, max over golds); predictions ``{"idx": Q, "label": "entity"}``."""

    def compute_metrics(self, predictions, labels, examples=None) -> dict[str, float]:
        from cramkit.tasks.metrics import compute_metrics

        if examples is None:
            raise CramkitError(f"task {self.name}: its metrics compare answer strings and need the examples")
        chosen = _chosen(predictions, len(examples))
        strings = []
        for ex, c in zip(examples, chosen, strict=True):
            if not 0 <= c < len(ex.meta["entities"]):
                raise CramkitError(f"task {self.name}: choice {c} is outside row {ex.idx}'s entities")
            strings.append(ex.meta["entities"][c])
        return compute_metrics(self.metrics, strings, [ex.meta["answers"] for ex in examples])

    def write_predictions(self, split: str, idx_and_preds, out_path: PathLike) -> Path:
        preds = self._checked(split, idx_and_preds)
        lines = []
        for ex in sorted(self.examples(split), key=lambda e: e.idx):
            c = int(preds[ex.idx])
            meta = cast(dict, ex.meta)  # ReCoRD rows carry their entities
            if not 0 <= c < len(meta["entities"]):
                raise CramkitError(f"task {self.name}: choice {c} is outside row {ex.idx}'s entities")
            lines.append({"idx": ex.idx, "label": meta["entities"][c]})
        return self._write_lines(split, lines, out_path)


_TASK_CLASS = {"multirc": MultiRCTask, "record": RecordTask, "wsc": WSCTask}


def _task_folder(spec: SgSpec, root: Path) -> Path:
    """DIR/TASK; also accepts DIR being the task folder itself (``--data-dir superglue_data/BoolQ``)."""
    if root.name == spec.dirname and root.is_dir():
        return root
    return root / spec.dirname


def _hint(spec: SgSpec, folder: Path) -> str:
    return (
        f"Provide the official SuperGLUE files in {folder} ({', '.join(f for _, f in spec.files)}), from "
        f"the {spec.dirname} download of super.gluebenchmark.com, and point --data-dir (or ${ENV_DIR}) at "
        "their parent folder."
    )


def make_superglue_task(key: str, data_dir: PathLike | None = None, skip_bad_rows: bool = False) -> Task:
    """Build superglue/KEY from DIR/TASK; nothing is read until a split is asked for."""
    spec = SPECS[key]
    name = f"superglue/{key}"
    folder = _task_folder(spec, superglue_dir(data_dir))
    if not folder.is_dir():
        raise CramkitError(f"{name}: there is no folder {folder}. {_hint(spec, folder)}")
    hint = _hint(spec, folder)
    splits = {
        split: JsonLinesSplit(
            name,
            folder / fname,
            partial(_parse, spec.parse, test=split == "test"),
            suite="SuperGLUE",
            skip_bad_rows=skip_bad_rows,
            unique_idx=True,
            hint=hint,
        )
        for split, fname in spec.files
    }
    test_only = len(spec.files) == 1
    cls = _TASK_CLASS.get(key, Task)
    return cls(
        name=name,
        splits=splits,
        labels=list(spec.labels) if spec.labels else None,
        metrics=list(spec.metrics),
        kind="classification" if spec.labels else "multiple_choice",
        train_split="" if test_only else "train",
        dev_splits=[] if test_only else ["dev"],
        leaderboard_files={"test": spec.leaderboard},
        prediction_format="superglue",
        description=f"SuperGLUE {spec.dirname} from {folder}",
    )


def superglue_tasks(data_dir: PathLike | None = None, skip_bad_rows: bool = False) -> list[Task]:
    """Every one of the eight SuperGLUE tasks whose folder is in data_dir (the diagnostics are not here:
    they have no training data; an RTE model predicts them)."""
    root = superglue_dir(data_dir)
    present = [k for k in SUPERGLUE_TASKS if _task_folder(SPECS[k], root).is_dir()]
    if not present:
        raise CramkitError(
            f"superglue: none of the SuperGLUE task folders ({', '.join(SPECS[k].dirname for k in SUPERGLUE_TASKS)}) "
            f"is in {root}. Put the official SuperGLUE download there, or point --data-dir (or ${ENV_DIR}) at it."
        )
    return [make_superglue_task(k, data_dir, skip_bad_rows) for k in present]


register_family("superglue", SPECS, make_superglue_task)

#: the metrics whose mean is a task's number in the SuperGLUE score (the others: their one metric)
SCORE_METRICS: dict[str, tuple[str, ...]] = {
    "boolq": ("accuracy",),
    "cb": ("accuracy", "macro_f1"),
    "copa": ("accuracy",),
    "multirc": ("f1a", "em"),
    "record": ("answer_f1", "answer_em"),
    "rte": ("accuracy",),
    "wic": ("accuracy",),
    "wsc": ("accuracy",),
}


def superglue_average(entries: dict[str, dict[str, float]]) -> float | None:
    """The SuperGLUE score over the tasks present: the mean over tasks of each task's number, which is
    the mean of its two metrics for CB (accuracy, macro-F1), MultiRC (F1a, EM) and ReCoRD (F1, EM) as on
    the leaderboard, else its one metric. Keys: "superglue/cb" or "superglue/cb:dev"; others are ignored.
    None when no SuperGLUE task is present."""
    per_task: dict[str, list[float]] = {}
    for key, values in entries.items():
        k = key.split(":")[0].lower().removeprefix("superglue/")
        if k not in SCORE_METRICS or not all(m in values for m in SCORE_METRICS[k]):
            continue
        per_task.setdefault(k, []).append(float(np.mean([values[m] for m in SCORE_METRICS[k]])))
    if not per_task:
        return None
    return float(np.mean([np.mean(v) for v in per_task.values()]))


register_suite(
    Suite(
        name="superglue",
        task_names=tuple(f"superglue/{k}" for k in SUPERGLUE_TASKS),
        tasks=superglue_tasks,
        average=superglue_average,
        average_note="SuperGLUE score as on its leaderboard: mean over BoolQ, CB, COPA, MultiRC, ReCoRD, RTE, WiC "
        "and WSC, where CB counts as the mean of accuracy and macro-F1, MultiRC of F1a and EM, ReCoRD of F1 and EM "
        "(the AX-b / AX-g diagnostics are not in it). Here on the dev (val) sets.",
        data_hint="the official SuperGLUE download (super.gluebenchmark.com, one folder per task)",
    )
)
