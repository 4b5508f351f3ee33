"""The registry: Task objects, registration, lookup, predictions files."""

from __future__ import annotations

from collections import Counter

import pytest

from cramkit.errors import CramkitError
from cramkit.tasks import registry
from cramkit.tasks.registry import Example, Task, get_task, list_tasks


@pytest.fixture(autouse=True)
def _private_registry(monkeypatch):
    """Each test registers into a copy, so nothing leaks into other tests."""
    monkeypatch.setattr(registry, "_TASKS", dict(registry._TASKS))


def _toy(name="toy/sentiment", n=10, labels=("neg", "pos")):
    calls = Counter()

    def train():
        calls["train"] += 1
        return [Example(f"text {i}", None, i % 2, i) for i in range(n)]

    def dev():
        return [Example("good", None, 1, 0), Example("bad", None, 0, 1)]

    task = Task(name=name, splits={"train": train, "dev": dev}, labels=list(labels), metrics=["accuracy", "f1"])
    return task, calls


def test_python_task_registration_and_caching():
    task, calls = _toy()
    assert registry.register_task(task) is task
    assert "toy/sentiment" in list_tasks() and "glue/cola" in list_tasks()
    got = get_task("toy/sentiment")
    assert got is task and got.num_labels == 2 and not got.is_regression and got.main_metric == "accuracy"
    assert len(got.examples("train")) == 10 and len(got.examples("train")) == 10
    assert calls["train"] == 1  # loaded once
    assert got.skipped == {"train": 0}
    assert got.score({"accuracy": 91.5, "f1": 90.0}) == 91.5
    assert got.compute_metrics([1, 0], [e.label for e in got.examples("dev")]) == {
        "accuracy": 100.0,
        "f1": 100.0,
    }
    with pytest.raises(CramkitError, match="has no split 'test'.*train, dev"):
        got.examples("test")
    with pytest.raises(CramkitError, match="main metric 'accuracy'"):
        got.score({"f1": 3.0})


def test_task_validation():
    split = {"train": lambda: []}
    with pytest.raises(CramkitError, match="unknown metric 'bleu'"):
        Task("x/a", split, ["a", "b"], ["bleu"])
    with pytest.raises(CramkitError, match="metric 'pearson' does not fit a classification task"):
        Task("x/a", split, ["a", "b"], ["pearson"])
    with pytest.raises(CramkitError, match="metric 'accuracy' does not fit a regression task"):
        Task("x/a", split, None, ["accuracy"])
    with pytest.raises(CramkitError, match="main_metric 'mcc' is not in its metrics"):
        Task("x/a", split, ["a", "b"], ["accuracy"], main_metric="mcc")
    with pytest.raises(CramkitError, match="duplicates"):
        Task("x/a", split, ["a", "a"], ["accuracy"])
    reg = Task("x/r", split, None, ["pearson", "spearman"])
    assert reg.is_regression and reg.num_labels == 1 and reg.main_metric == "pearson"


def test_write_predictions_generic_name_and_atomic(tmp_path):
    task, _ = _toy()
    out = task.write_predictions("dev", [(1, 0), (0, "pos")], tmp_path)
    assert out.name == "toy-sentiment-dev.tsv"
    assert out.read_text() == "index\tprediction\n0\tpos\n1\tneg\n"
    explicit = task.write_predictions("dev", [(0, 1), (1, 1)], tmp_path / "mine.tsv")
    assert explicit == tmp_path / "mine.tsv"
    for bad, msg in (
        ([(0, 2), (1, 0)], "label id 2 is outside 0..1"),
        ([(0, "meh"), (1, 0)], "'meh' is not one of"),
    ):
        with pytest.raises(CramkitError, match=msg):
            task.write_predictions("dev", bad, tmp_path)
    with pytest.raises(CramkitError, match="repeat an index"):
        task.write_predictions("dev", [(0, 1), (0, 1)], tmp_path)
    assert out.read_text() == "index\tprediction\n0\tpos\n1\tneg\n"  # untouched by the failed writes
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mine.tsv",
        "toy-sentiment-dev.tsv",
    ]  # no temp files


def test_hold_out_is_deterministic_and_disjoint():
    t, _ = _toy("toy/holdout", n=50)
    held = registry.hold_out(t, 0.2)
    again = registry.hold_out(t, 0.2)
    dev, train = held.examples("dev"), held.examples("train")
    assert len(dev) == 10 and len(train) == 40 and held.dev_splits == ["dev"]
    assert [e.idx for e in dev] == [e.idx for e in again.examples("dev")]
    assert not {e.idx for e in dev} & {e.idx for e in train}
    with pytest.raises(CramkitError, match="dev-fraction"):
        registry.hold_out(t, 1.5)


def test_factories_and_unknown_names():
    seen = {}

    def factory(data_dir=None, skip_bad_rows=False):
        seen.update(data_dir=data_dir, skip=skip_bad_rows)
        return _toy("my/factory")[0]

    registry.register_task(factory, name="my/factory")
    assert get_task("my/factory", data_dir="somewhere", skip_bad_rows=True).name == "my/factory"
    assert seen == {"data_dir": "somewhere", "skip": True}
    with pytest.raises(CramkitError, match="needs an explicit name"):
        registry.register_task(factory)
    with pytest.raises(CramkitError, match="already registered"):
        registry.register_task(factory, name="my/factory", overwrite=False)
    with pytest.raises(CramkitError, match=r"unknown task 'glue/mnli-mm'\. Did you mean 'glue/mnli'\?.*Known tasks: "):
        get_task("glue/mnli-mm")
    with pytest.raises(CramkitError, match="unknown task 'zzzz'. Known tasks: .*glue/qqp"):
        get_task("zzzz")
