"""SuperGLUE: the readers on files written in the official JSON-lines layout (no SuperGLUE data is on this
machine; the rows below follow the published format field for field), the submission files, bad rows,
the suite's average, and fine-tuning a SuperGLUE task through the real command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clirun import cli as run_cli
from cramkit.errors import CramkitError
from cramkit.tasks.registry import get_suite, get_task

PASSAGE = (
    "Oak Valley Library opened a new reading room in March. The mayor, Ana Ruiz, cut the ribbon while "
    "pupils from Hill School sang.\n@highlight\nAna Ruiz opened the room\n@highlight\nHill School pupils sang"
)


def _ent(text: str, s: str) -> dict:
    i = text.index(s)
    return {"start": i, "end": i + len(s) - 1}  # ReCoRD's end is inclusive


FILES: dict[str, dict[str, list[dict]]] = {
    "BoolQ": {
        "train": [
            {
                "question": "is the sky blue",
                "passage": "Sky -- The sky looks blue by day.",
                "idx": 0,
                "label": True,
            },
            {"question": "is snow hot", "passage": "Snow -- Snow is frozen water.", "idx": 1, "label": False},
        ],
        "val": [{"question": "do cats bark", "passage": "Cat -- Cats meow.", "idx": 0, "label": False}],
        "test": [
            {"question": "can fish swim", "passage": "Fish -- Fish live in water.", "idx": 0},
            {"question": "is iron a metal", "passage": "Iron -- Iron is a metal.", "idx": 1},
        ],
    },
    "CB": {
        "train": [
            {"premise": "She said it rained.", "hypothesis": "It rained", "label": "entailment", "idx": 0},
            {"premise": "He doubted it was late.", "hypothesis": "It was late", "label": "neutral", "idx": 1},
        ],
        "val": [
            {"premise": "It was not red.", "hypothesis": "It was red", "label": "contradiction", "idx": 0},
        ],
        "test": [{"premise": "I think he left.", "hypothesis": "He left", "idx": 0}],
    },
    "COPA": {
        "train": [
            {
                "premise": "The glass fell off the table.",
                "choice1": "It shattered.",
                "choice2": "It was refilled.",
                "question": "effect",
                "label": 0,
                "idx": 0,
            },
        ],
        "val": [
            {
                "premise": "The road was wet.",
                "choice1": "The sun was out.",
                "choice2": "It had rained.",
                "question": "cause",
                "label": 1,
                "idx": 0,
            },
        ],
        "test": [
            {
                "premise": "The boy was hungry.",
                "choice1": "He ate lunch.",
                "choice2": "He went to sleep.",
                "question": "effect",
                "idx": 0,
            },
            {
                "premise": "The lamp went dark.",
                "choice1": "The bulb burnt out.",
                "choice2": "The room was painted.",
                "question": "cause",
                "idx": 1,
            },
        ],
    },
    "RTE": {
        "train": [
            {
                "premise": "Paris is in France.",
                "hypothesis": "Paris is French.",
                "label": "entailment",
                "idx": 0,
            },
        ],
        "val": [
            {
                "premise": "Tom owns a dog.",
                "hypothesis": "Tom owns a cat.",
                "label": "not_entailment",
                "idx": 0,
            },
        ],
        "test": [{"premise": "Rain fell all day.", "hypothesis": "It was wet.", "idx": 0}],
    },
    "WiC": {
        "train": [
            {
                "word": "bank",
                "sentence1": "He sat on the bank of the river.",
                "sentence2": "The bank lent her money.",
                "idx": 0,
                "label": False,
                "start1": 14,
                "start2": 4,
                "end1": 18,
                "end2": 8,
                "version": 1.1,
            },
        ],
        "val": [
            {
                "word": "run",
                "sentence1": "They run every day.",
                "sentence2": "She runs fast.",
                "idx": 0,
                "label": True,
                "start1": 5,
                "start2": 4,
                "end1": 8,
                "end2": 8,
                "version": 1.1,
            },
        ],
        "test": [
            {
                "word": "key",
                "sentence1": "A key opens the door.",
                "sentence2": "That is the key point.",
                "idx": 0,
                "start1": 2,
                "start2": 12,
                "end1": 5,
                "end2": 15,
                "version": 1.1,
            },
        ],
    },
    "WSC": {
        "train": [
            {
                "text": "Mr. Lee thanked Sam because he had helped him .",
                "target": {"span2_index": 5, "span1_index": 3, "span1_text": "Sam", "span2_text": "he"},
                "idx": 0,
                "label": True,
            },
        ],
        "val": [
            {
                "text": "The trophy did not fit in the case because it was too big .",
                "target": {
                    "span1_text": "The trophy",
                    "span1_index": 0,
                    "span2_text": "it",
                    "span2_index": 9,
                },
                "idx": 0,
                "label": True,
            },
        ],
        "test": [
            {
                "text": "Mr. Lee thanked Sam because he had helped him .",
                "target": {"span1_text": "Mr. Lee", "span1_index": 0, "span2_text": "him", "span2_index": 8},
                "idx": 0,
            },
        ],
    },
    "MultiRC": {
        "train": [
            {
                "idx": 0,
                "version": 1.1,
                "passage": {
                    "text": "Mia baked bread. She gave it to Leo.",
                    "questions": [
                        {
                            "question": "Who baked?",
                            "answers": [
                                {"text": "Mia", "idx": 0, "label": 1},
                                {"text": "Leo", "idx": 1, "label": 0},
                            ],
                            "idx": 0,
                        }
                    ],
                },
            }
        ],
        "val": [
            {
                "idx": 3,
                "version": 1.1,
                "passage": {
                    "text": "Ben ran to the shop. He bought milk and eggs.",
                    "questions": [
                        {
                            "question": "What did Ben buy?",
                            "answers": [
                                {"text": "Milk", "idx": 10, "label": 1},
                                {"text": "Eggs", "idx": 11, "label": 1},
                                {"text": "Bread", "idx": 12, "label": 0},
                            ],
                            "idx": 7,
                        },
                        {
                            "question": "Where did Ben go?",
                            "answers": [{"text": "The shop", "idx": 13, "label": 1}],
                            "idx": 8,
                        },
                    ],
                },
            }
        ],
        "test": [
            {
                "idx": 5,
                "version": 1.1,
                "passage": {
                    "text": "Ana met Joe. They went to the park.",
                    "questions": [
                        {
                            "question": "Who met Joe?",
                            "answers": [{"text": "Ana", "idx": 20}, {"text": "Joe", "idx": 21}],
                            "idx": 9,
                        },
                        {
                            "question": "Where did they go?",
                            "answers": [{"text": "The park", "idx": 22}],
                            "idx": 10,
                        },
                    ],
                },
            }
        ],
    },
    "ReCoRD": {
        "train": [
            {
                "source": "Daily mail",
                "passage": {
                    "text": PASSAGE,
                    "entities": [_ent(PASSAGE, s) for s in ("Oak Valley Library", "Ana Ruiz", "Hill School")],
                },
                "qas": [
                    {
                        "query": "@placeholder welcomed the pupils.",
                        "answers": [{**_ent(PASSAGE, "Ana Ruiz"), "text": "Ana Ruiz"}],
                        "idx": 0,
                    }
                ],
                "idx": 0,
            }
        ],
        "val": [
            {
                "source": "Daily mail",
                "passage": {
                    "text": PASSAGE,
                    "entities": [_ent(PASSAGE, s) for s in ("Oak Valley Library", "Ana Ruiz", "Hill School", "Ana")],
                },
                "qas": [
                    {
                        "query": "The new room belongs to @placeholder.",
                        "answers": [{**_ent(PASSAGE, "Oak Valley Library"), "text": "Oak Valley Library"}],
                        "idx": 4,
                    },
                    {
                        "query": "@placeholder cut the ribbon.",
                        "answers": [
                            {**_ent(PASSAGE, "Ana Ruiz"), "text": "Ana Ruiz"},
                            {**_ent(PASSAGE, "Ana"), "text": "Ana"},
                        ],
                        "idx": 5,
                    },
                ],
                "idx": 1,
            }
        ],
        "test": [
            {
                "source": "CNN",
                "passage": {
                    "text": PASSAGE,
                    "entities": [_ent(PASSAGE, s) for s in ("Ana Ruiz", "Hill School")],
                },
                "qas": [{"query": "Pupils of @placeholder sang.", "idx": 9}],
                "idx": 2,
            }
        ],
    },
    "AX-b": {
        "AX-b": [
            {
                "idx": "0",
                "label": "not_entailment",
                "sentence1": "The cat sat.",
                "sentence2": "The cat did not sit.",
                "logic": "Negation",
            },
            {
                "idx": "1",
                "label": "entailment",
                "sentence1": "A dog ran.",
                "sentence2": "An animal ran.",
                "lexical-semantics": "Lexical entailment",
            },
        ]
    },
    "AX-g": {
        "AX-g": [
            {
                "hypothesis": "The nurse was paid.",
                "idx": 0,
                "label": "entailment",
                "pair_id": 5,
                "premise": "The doctor paid the nurse her wage.",
            }
        ]
    },
}


def write_superglue(root: Path, files: dict = FILES) -> Path:
    for folder, splits in files.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for split, rows in splits.items():
            text = "".join(json.dumps(r) + "\n" for r in rows)
            (root / folder / f"{split}.jsonl").write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def sg_dir(tmp_path: Path) -> Path:
    return write_superglue(tmp_path / "superglue_data")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_suite_reads_every_task_from_the_official_layout(sg_dir: Path) -> None:
    suite = get_suite("superglue")
    tasks = {t.name: t for t in suite.tasks(sg_dir)}
    assert list(tasks) == [f"superglue/{k}" for k in ("boolq", "cb", "copa", "multirc", "record", "rte", "wic", "wsc")]
    assert list(tasks) == list(suite.task_names)

    boolq = tasks["superglue/boolq"]
    assert boolq.kind == "classification" and boolq.labels == ["false", "true"]
    assert [(e.text_a, e.label) for e in boolq.examples("train")] == [
        ("is the sky blue", 1),
        ("is snow hot", 0),
    ]
    assert boolq.examples("train")[0].text_b == "Sky -- The sky looks blue by day."
    assert [e.label for e in boolq.examples("test")] == [None, None]
    assert boolq.dev_splits == ["dev"] and boolq.source("dev").endswith("BoolQ/val.jsonl")

    cb = tasks["superglue/cb"]
    assert cb.labels == ["entailment", "contradiction", "neutral"]
    assert cb.metrics == ["macro_f1", "accuracy"]
    assert [e.label for e in cb.examples("train")] == [0, 2] and cb.examples("dev")[0].label == 1

    copa = tasks["superglue/copa"]
    assert copa.kind == "multiple_choice" and copa.is_multiple_choice and copa.labels is None
    dev = copa.examples("dev")[0]
    assert dev.text_a == "The road was wet. What was the cause?"
    assert dev.choices == ("The sun was out.", "It had rained.") and dev.label == 1
    assert copa.examples("train")[0].text_a == "The glass fell off the table. What happened as a result?"

    wic = tasks["superglue/wic"].examples("train")[0]
    assert (wic.text_a, wic.text_b, wic.label) == (
        "He sat on the *bank* of the river.",
        "The *bank* lent her money.",
        0,
    )
    assert tasks["superglue/wic"].examples("dev")[0].text_b == "She *runs* fast."

    wsc = tasks["superglue/wsc"].examples("dev")[0]
    assert wsc.text_a == "[The trophy] did not fit in the case because *it* was too big ."
    assert wsc.text_b == 'Does "it" refer to "The trophy"?' and wsc.label == 1

    multirc = tasks["superglue/multirc"]
    rows = multirc.examples("dev")
    assert multirc.metrics == ["f1a", "em"] and multirc.labels == ["false", "true"]
    assert [(e.idx, e.group, e.label) for e in rows] == [(10, 7, 1), (11, 7, 1), (12, 7, 0), (13, 8, 1)]
    assert rows[0].text_a.startswith("Ben ran") and rows[2].text_b == "What did Ben buy? Bread"

    record = tasks["superglue/record"]
    assert record.kind == "multiple_choice" and record.metrics == ["answer_f1", "answer_em"]
    q4, q5 = record.examples("dev")
    assert q4.meta["entities"] == ["Ana", "Ana Ruiz", "Hill School", "Oak Valley Library"]
    assert q4.choices[3] == "The new room belongs to Oak Valley Library." and q4.label == 3
    assert q5.meta["answers"] == ["Ana", "Ana Ruiz"] and q5.label == 0  # the first gold entity
    assert record.examples("test")[0].label is None and record.examples("test")[0].idx == 9

    rte = tasks["superglue/rte"]
    assert rte.labels == ["entailment", "not_entailment"] and rte.examples("dev")[0].label == 1


def test_present_tasks_only_and_a_clear_error_when_none(tmp_path: Path) -> None:
    write_superglue(tmp_path / "d", {"RTE": FILES["RTE"], "CB": FILES["CB"]})
    assert [t.name for t in get_suite("superglue").tasks(tmp_path / "d")] == ["superglue/cb", "superglue/rte"]
    with pytest.raises(CramkitError, match="none of the SuperGLUE task folders"):
        get_suite("superglue").tasks(tmp_path / "empty")
    with pytest.raises(CramkitError, match="no folder .*BoolQ"):
        get_task("superglue/boolq", data_dir=tmp_path / "d")


def test_data_dir_defaults_to_the_environment_variable(sg_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("CRAMKIT_SUPERGLUE_DIR", str(sg_dir))
    assert get_task("superglue/rte").examples("train")[0].text_a == "Paris is in France."


def test_test_predictions_in_the_submission_formats(sg_dir: Path, tmp_path: Path) -> None:
    tasks = {t.name.split("/")[1]: t for t in get_suite("superglue").tasks(sg_dir)}
    out = tmp_path / "sub"

    path = tasks["boolq"].write_predictions("test", [(1, 0), (0, 1)], out)
    assert path.name == "BoolQ.jsonl"
    assert _lines(path) == [
        {"idx": 0, "label": "true"},
        {"idx": 1, "label": "false"},
    ]  # strings, as the grader reads
    assert _lines(tasks["cb"].write_predictions("test", [(0, 2)], out)) == [{"idx": 0, "label": "neutral"}]
    assert _lines(tasks["copa"].write_predictions("test", [(0, 1), (1, 0)], out)) == [
        {"idx": 0, "label": 1},
        {"idx": 1, "label": 0},
    ]
    assert _lines(tasks["rte"].write_predictions("test", [(0, 1)], out)) == [{"idx": 0, "label": "not_entailment"}]
    assert _lines(tasks["wic"].write_predictions("test", [(0, 1)], out)) == [{"idx": 0, "label": "true"}]
    assert _lines(tasks["wsc"].write_predictions("test", [(0, 0)], out)) == [{"idx": 0, "label": "False"}]

    # MultiRC: nested, one line per paragraph, answers' labels 0/1
    path = tasks["multirc"].write_predictions("test", [(20, 1), (21, 0), (22, 1)], out)
    assert path.name == "MultiRC.jsonl"
    assert _lines(path) == [
        {
            "idx": 5,
            "passage": {
                "questions": [
                    {"idx": 9, "answers": [{"idx": 20, "label": 1}, {"idx": 21, "label": 0}]},
                    {"idx": 10, "answers": [{"idx": 22, "label": 1}]},
                ]
            },
        }
    ]
    # ReCoRD: the chosen entity's text, keyed by the query's idx
    path = tasks["record"].write_predictions("test", [(9, 1)], out)
    assert path.name == "ReCoRD.jsonl" and _lines(path) == [{"idx": 9, "label": "Hill School"}]
    with pytest.raises(CramkitError, match="missing"):
        tasks["multirc"].write_predictions("test", [(20, 1)], out)
    with pytest.raises(CramkitError, match="outside"):
        tasks["record"].write_predictions("test", [(9, 5)], out)

    axb, axg = get_task("superglue/axb", data_dir=sg_dir), get_task("superglue/axg", data_dir=sg_dir)
    assert axb.dev_splits == [] and [e.label for e in axb.examples("test")] == [1, 0]
    assert [e.idx for e in axb.examples("test")] == [0, 1]  # AX-b writes its idx as a string
    path = axb.write_predictions("test", [(0, 1), (1, 0)], out)
    assert path.name == "AX-b.jsonl" and _lines(path)[1] == {"idx": 1, "label": "entailment"}
    assert axg.write_predictions("test", [(0, 0)], out).name == "AX-g.jsonl"


def test_multirc_and_record_metrics_through_the_task(sg_dir: Path) -> None:
    multirc = get_task("superglue/multirc", data_dir=sg_dir)
    rows = multirc.examples("dev")
    labels = [e.label for e in rows]
    # question 7 has one wrong answer, question 8 is right: F1a = 2tp/(2tp+fp+fn) = 4/5, EM 1 of 2
    m = multirc.compute_metrics([1, 0, 0, 1], labels, rows)
    assert m == pytest.approx({"f1a": 80.0, "em": 50.0})

    record = get_task("superglue/record", data_dir=sg_dir)
    rows = record.examples("dev")
    # q4 picks "Oak Valley Library" (right), q5 picks "Ana" (a gold too): both exact
    assert record.compute_metrics([3, 0], [e.label for e in rows], rows) == {
        "answer_f1": 100.0,
        "answer_em": 100.0,
    }
    logits = [np.array([0.0, 0.0, 0.0, 1.0]), np.array([0.0, 0.0, 1.0, 0.0])]  # q5 picks "Hill School"
    m = record.compute_metrics(logits, [e.label for e in rows], rows)
    assert m == {"answer_f1": 50.0, "answer_em": 50.0}


def test_superglue_average_counts_cb_multirc_record_as_two_metric_means() -> None:
    average = get_suite("superglue").average
    entries = {
        "superglue/boolq": {"accuracy": 70.0},
        "superglue/cb:dev": {"macro_f1": 60.0, "accuracy": 80.0},
        "superglue/multirc": {"f1a": 50.0, "em": 10.0},
        "superglue/record": {"answer_f1": 40.0, "answer_em": 30.0},
        "glue/rte": {"accuracy": 99.0},  # another suite's task: not averaged
    }
    assert average(entries) == pytest.approx((70 + 70 + 30 + 35) / 4)
    assert average({"glue/rte": {"accuracy": 1.0}}) is None


def _bad(tmp_path: Path, folder: str, row: dict, split: str = "train") -> Path:
    files = {folder: {**FILES[folder], split: [*FILES[folder][split], row]}}
    return write_superglue(tmp_path / "bad", files)


@pytest.mark.parametrize(
    ("folder", "row", "needle"),
    [
        (
            "BoolQ",
            {"question": "q", "passage": "p", "idx": 7, "label": True, "title": "x"},
            "unknown field 'title'",
        ),
        (
            "CB",
            {"premise": "p", "hypothesis": "h", "label": "maybe", "idx": 7},
            'label "maybe" is not one of',
        ),
        (
            "RTE",
            {"premise": "p", "hypothesis": "h", "label": "entailment", "idx": 0},
            "idx 0 was already used",
        ),
        (
            "COPA",
            {"premise": "p", "choice1": "a", "choice2": "b", "question": "why", "label": 0, "idx": 5},
            "question 'why'",
        ),
        (
            "WSC",
            {
                "text": "Ann met Bo .",
                "target": {"span1_text": "Bo", "span1_index": 0, "span2_text": "Ann", "span2_index": 2},
                "idx": 4,
                "label": False,
            },
            "target.span1_text 'Bo' does not match the words at span1_index 0 ('Ann')",
        ),
        ("WiC", {**FILES["WiC"]["train"][0], "idx": 3, "end1": 99}, "start1/end1 offsets 14..99"),
        (
            "MultiRC",
            {
                "idx": 9,
                "passage": {
                    "text": "t",
                    "questions": [
                        {
                            "question": "q",
                            "idx": 4,
                            "answers": [{"text": "a", "idx": 40, "label": 1, "score": 3}],
                        }
                    ],
                },
            },
            "unknown field 'score' in an answer",
        ),
        ("ReCoRD", {**FILES["ReCoRD"]["train"][0], "idx": 1, "summary": "s"}, "unknown field 'summary'"),
    ],
)
def test_bad_rows_name_file_line_and_field_or_are_skipped(tmp_path: Path, folder: str, row: dict, needle: str) -> None:
    root = _bad(tmp_path, folder, row)
    key = {"BoolQ": "boolq", "CB": "cb", "RTE": "rte", "COPA": "copa", "WSC": "wsc", "WiC": "wic"}.get(
        folder, folder.lower()
    )
    with pytest.raises(CramkitError) as e:
        get_task(f"superglue/{key}", data_dir=root).examples("train")
    msg = str(e.value)
    n = len(FILES[folder]["train"]) + 1
    assert f"{folder}/train.jsonl, line {n}: " in msg and needle in msg and "--skip-bad-rows" in msg
    assert "\n" not in msg
    task = get_task(f"superglue/{key}", data_dir=root, skip_bad_rows=True)
    good = get_task(f"superglue/{key}", data_dir=write_superglue(tmp_path / "good", {folder: FILES[folder]}))
    assert task.examples("train") == good.examples("train") and task.skipped["train"] == 1


def test_broken_json_and_non_utf8_files_are_one_clear_line(tmp_path: Path) -> None:
    root = write_superglue(tmp_path / "d", {"RTE": FILES["RTE"]})
    train = root / "RTE" / "train.jsonl"
    train.write_text(train.read_text() + '{"premise": "p", "hypothesis": \n', encoding="utf-8")
    with pytest.raises(CramkitError, match=r"RTE/train.jsonl, line 2: not valid JSON"):
        get_task("superglue/rte", data_dir=root).examples("train")
    train.write_bytes('{"premise": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(CramkitError, match="is not UTF-8 text"):
        get_task("superglue/rte", data_dir=root).examples("train")


def test_cli_unknown_field_is_one_line_and_exit_2(tmp_path: Path) -> None:
    root = _bad(tmp_path, "CB", {"premise": "p", "hypothesis": "h", "label": "neutral", "idx": 9, "genre": "x"})
    proc = run_cli("finetune", "--task", "superglue/cb", "--data-dir", str(root), "--from", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr and len(err.splitlines()) == 1
    assert "CB/train.jsonl, line 3: unknown field 'genre'" in err


def _rte_rows(n: int, start: int, labelled: bool = True) -> list[dict]:
    """Pairs a tiny model can tell apart: the hypothesis repeats the premise (entailment) or negates it."""
    nouns = ["film", "story", "actor", "plot", "scene", "music", "ending", "cast"]
    rows = []
    for i in range(start, start + n):
        noun = nouns[i % len(nouns)]
        entail = i % 2 == 0
        row = {
            "premise": f"The {noun} was good and the people liked the {noun}.",
            "hypothesis": f"The {noun} was good." if entail else f"The {noun} was not good at all.",
            "idx": i - start,
        }
        if labelled:
            row["label"] = "entailment" if entail else "not_entailment"
        rows.append(row)
    return rows


def test_finetune_cli_on_superglue_rte(tiny_run: Path, tmp_path: Path) -> None:
    root = write_superglue(
        tmp_path / "sg",
        {
            "RTE": {
                "train": _rte_rows(40, 0),
                "val": _rte_rows(10, 40),
                "test": _rte_rows(6, 50, labelled=False),
            }
        },
    )
    out = tmp_path / "out"
    proc = run_cli(
        "finetune",
        "--task",
        "superglue/rte",
        "--data-dir",
        str(root),
        "--from",
        str(tiny_run),
        "--out",
        str(out),
        "--set",
        "epochs=2",
        "--set",
        "min_steps=0",
        "--set",
        "max_length=32",
        "--set",
        "batch_size=8",
        "--seeds",
        "0,1",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    assert "superglue/rte dev: accuracy" in proc.stdout
    # two seeds: the median is the mean of the middle two, and the kept model says which seed it is
    assert "(median of 2 seeds: " in proc.stdout and "; the mean of the middle two)" in proc.stdout
    assert "the lower of the two middle seeds by dev score) saved in" in proc.stdout
    res = json.loads((out / "results.json").read_text())
    accuracy = res["median"]["dev"]["metrics"]["accuracy"]
    assert set(res["median"]["dev"]["metrics"]) == {"accuracy"}
    assert accuracy == pytest.approx(round(accuracy / 10) * 10)  # scored on the 10 rows of val.jsonl
    preds = _lines(out / "predictions" / "RTE.jsonl")
    assert [p["idx"] for p in preds] == list(range(6))
    assert {p["label"] for p in preds} <= {"entailment", "not_entailment"}


def test_eval_superglue_predicts_the_diagnostics_with_the_rte_model(tiny_run: Path, tmp_path: Path) -> None:
    """`cramkit eval superglue` on RTE also predicts AX-b and AX-g with the RTE model (as GLUE's AX with
    MNLI's), into the submission folder under the leaderboard's names."""
    files = {"RTE": {"train": _rte_rows(24, 0), "val": _rte_rows(8, 24), "test": _rte_rows(4, 40, labelled=False)}}
    files |= {k: FILES[k] for k in ("AX-b", "AX-g")}
    root = write_superglue(tmp_path / "sg", files)
    out = tmp_path / "eval"
    proc = run_cli(
        "eval",
        "superglue",
        "--from",
        str(tiny_run),
        "--data-dir",
        str(root),
        "--out",
        str(out),
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--set",
        "max_length=32",
        "--set",
        "batch_size=8",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    sub = out / "submission"
    assert {p.name for p in sub.iterdir()} >= {"RTE.jsonl", "AX-b.jsonl", "AX-g.jsonl"}
    for name, folder in (("AX-b.jsonl", "AX-b"), ("AX-g.jsonl", "AX-g")):
        rows = _lines(sub / name)
        assert sorted(r["idx"] for r in rows) == sorted(int(r["idx"]) for r in FILES[folder][folder])
        assert {r["label"] for r in rows} <= {"entailment", "not_entailment"}
