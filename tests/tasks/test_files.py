"""User tasks from CSV, TSV and JSONL files."""

from __future__ import annotations

import json

import pytest

from cramkit.errors import CramkitError
from cramkit.tasks import get_task, registry, task_from_file


@pytest.fixture(autouse=True)
def _private_registry(monkeypatch):
    monkeypatch.setattr(registry, "_TASKS", dict(registry._TASKS))


def test_csv_with_quoting_and_inferred_labels(tmp_path):
    train = tmp_path / "train.csv"
    train.write_text(
        'id,review,stars\n7,"Great, really great",5\n8,"Said ""meh""\nand left",2\n9,fine,10\n10,ok,2\n',
        encoding="utf-8",
    )
    test = tmp_path / "test.csv"
    test.write_text("id,review\n100,unseen\n101,another\n")
    t = task_from_file("reviews", train, test=test, text_a="review", label="stars", idx="id")
    assert t.name == "user/reviews" and get_task("user/reviews") is t
    assert t.labels == ["2", "5", "10"]  # numeric order when all labels are integers
    assert t.metrics == ["accuracy"]
    ex = t.examples("train")
    assert [(e.text_a, t.labels[e.label], e.idx) for e in ex] == [
        ("Great, really great", "5", 7),
        ('Said "meh"\nand left', "2", 8),
        ("fine", "10", 9),
        ("ok", "2", 10),
    ]
    assert [(e.label, e.idx) for e in t.examples("test")] == [(None, 100), (None, 101)]
    out = t.write_predictions("test", [(100, 0), (101, 2)], tmp_path / "preds")
    assert out.read_text() == "index\tprediction\n100\t2\n101\t10\n"


def test_tsv_quotes_are_text_and_pairs(tmp_path):
    train = tmp_path / "pairs.tsv"
    train.write_text('q1\tq2\tsame\n"How" do I?\tHow "do\tyes\nA\tB\tno\n')
    t = task_from_file("pairs", train, dev=train, text_a="q1", text_b="q2", label="same", labels=["no", "yes"])
    assert [(e.text_a, e.text_b, e.label) for e in t.examples("dev")] == [
        ('"How" do I?', 'How "do', 1),
        ("A", "B", 0),
    ]
    assert t.metrics == ["accuracy", "f1"] and t.dev_splits == ["dev"] and t.test_splits == []


def test_jsonl_regression_and_labels(tmp_path):
    rows = [{"a": "x", "b": "y", "score": 1.5}, {"a": "p", "b": "q", "score": 4}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    t = task_from_file("sim", tmp_path / "train.jsonl", text_a="a", text_b="b", label="score", regression=True)
    assert t.is_regression and t.metrics == ["pearson", "spearman"]
    assert [e.label for e in t.examples("train")] == [1.5, 4.0]
    cls = [{"text": "good", "label": 1}, {"text": "bad", "label": 0}, {"text": "so so", "label": True}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in cls))
    with pytest.raises(CramkitError, match=r"c.jsonl, line 3: label 'true' is not one of \['0', '1'\]"):
        task_from_file("cls", tmp_path / "c.jsonl", text_a="text", labels=["0", "1"]).examples("train")
    inferred = task_from_file("cls", tmp_path / "c.jsonl", text_a="text")  # JSON true reads as "true"
    assert inferred.labels == ["0", "1", "true"] and [e.label for e in inferred.examples("train")] == [
        1,
        0,
        2,
    ]


def test_bad_rows_with_and_without_skip(tmp_path):
    csv_file = tmp_path / "t.csv"
    csv_file.write_text("text,label\nfine,a\ntoo,many,columns\nworse,z\nok,b\n")
    t = task_from_file("bad", csv_file, dev=csv_file, text_a="text", labels=["a", "b"])
    with pytest.raises(
        CramkitError, match=r"t.csv, line 3: expected 2 columns \(as the header\), found 3.*--skip-bad-rows"
    ):
        t.examples("train")
    t = task_from_file("bad", csv_file, text_a="text", labels=["a", "b"], skip_bad_rows=True)
    assert [e.text_a for e in t.examples("train")] == ["fine", "ok"] and t.skipped["train"] == 2
    from cramkit.tasks.registry import hold_out

    for first in ("dev", "train"):  # a held-out dev split keeps the count of the rows skipped in the file
        held = hold_out(task_from_file("bad", csv_file, text_a="text", labels=["a", "b"], skip_bad_rows=True), 0.5)
        held.examples(first)
        held.examples("train")
        assert held.skipped["train"] == 2 and held.skipped.get("dev", 0) == 0
    jl = tmp_path / "j.jsonl"
    jl.write_text('{"text": "a", "label": "x"}\n{not json\n["list"]\n{"label": "x"}\n')
    with pytest.raises(CramkitError, match=r"j.jsonl, line 2: not valid JSON"):
        task_from_file("j", jl, text_a="text", labels=["x", "y"]).examples("train")
    t = task_from_file("j", jl, text_a="text", labels=["x", "y"], skip_bad_rows=True)
    assert len(t.examples("train")) == 1 and t.skipped["train"] == 3
    missing = tmp_path / "k.jsonl"
    missing.write_text('{"text": "a", "label": "x"}\n\n\n{"label": "x"}\n')
    with pytest.raises(CramkitError, match=r"k.jsonl, line 4: no value for 'text' \(the row has: label\)"):
        task_from_file("k", missing, text_a="text", labels=["x", "y"]).examples("train")


def test_file_errors(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text("sentence,label\nhi,a\nyo,b\n")
    with pytest.raises(CramkitError, match=r"no column 'text' \(given as text_a\); its columns: sentence, label"):
        task_from_file("e", f, text_a="text").examples("train")
    with pytest.raises(CramkitError, match="no label column 'y'.*--label"):
        task_from_file("e", f, text_a="sentence", label="y")
    with pytest.raises(CramkitError, match="does not exist"):
        task_from_file("e", tmp_path / "nope.csv", text_a="sentence")
    odd = tmp_path / "d.txt"
    odd.write_text("sentence|label\nhi|a\nyo|b\n")
    with pytest.raises(CramkitError, match=r"extension '\.txt'.*--delimiter"):
        task_from_file("e", odd, text_a="sentence")
    t = task_from_file("pipe", odd, text_a="sentence", delimiter="|")
    assert t.labels == ["a", "b"] and len(t.examples("train")) == 2
    arr = tmp_path / "arr.json"
    arr.write_text('[{"sentence": "hi", "label": "a"}]')
    with pytest.raises(CramkitError, match="JSON array; write one JSON object per line"):
        task_from_file("e", arr, text_a="sentence", labels=["a", "b"]).examples("train")
    with pytest.raises(CramkitError, match="not both"):
        task_from_file("e", f, text_a="sentence", labels=["a", "b"], regression=True)
    one = tmp_path / "one.csv"
    one.write_text("sentence,label\nhi,a\n")
    with pytest.raises(CramkitError, match="at least two labels"):
        task_from_file("e", one, text_a="sentence")
    with pytest.raises(CramkitError, match="has no split 'test'"):
        task_from_file("e", f, text_a="sentence").examples("test")
    t = task_from_file("other/name", f, text_a="sentence", register=False)
    assert t.name == "other/name" and "other/name" not in registry._TASKS


def test_own_files_find_the_usual_text_columns(tmp_path, capsys):
    """--train without --text-a finds the text column as predict does (sentence; sentence1 + sentence2)."""
    from cramkit.tasks.resolve import resolve_task

    one = tmp_path / "one.csv"
    one.write_text("label,sentence\n1,a fine film\n0,a dull film\n" * 10)
    task = resolve_task(train=one, dev=one)
    assert task.examples("train")[0].text_a == "a fine film" and task.examples("train")[0].text_b is None
    assert "one.csv: text from the column 'sentence' (--text-a/--text-b" in capsys.readouterr().err
    pair = tmp_path / "pair.tsv"
    pair.write_text("sentence1\tsentence2\tlabel\nthe cat sat\ta cat sat\t1\n" * 10)
    ex = resolve_task(train=pair, dev=pair).examples("train")[0]
    assert (ex.text_a, ex.text_b) == ("the cat sat", "a cat sat")
    odd = tmp_path / "odd.csv"
    odd.write_text("words,label\nx,1\n")
    with pytest.raises(CramkitError, match=r"odd.csv: no usual text column among words, label; name it with --text-a"):
        resolve_task(train=odd, dev=odd)


def test_max_eval_examples_scores_the_first_dev_rows(tiny_run, glue_dir):
    """finetune --set max_eval_examples=N: each dev split cut to its first N rows (a quicker, rougher score)."""
    import cramkit

    res = cramkit.finetune(
        tiny_run,
        task="glue/sst2",
        data_dir=glue_dir,
        max_train_examples=64,
        max_eval_examples=40,
        min_steps=0,
        epochs=1,
        batch_size=16,
        eval_every="never",
        progress=False,
    )
    assert res["dev_examples"] == {"dev": 40}
    acc = res["median"]["dev"]["metrics"]["accuracy"]
    assert acc == pytest.approx(round(acc * 40 / 100) * 100 / 40)  # a share of 40 rows
