"""LM-BFF's few-shot protocol (``--few-shot K --splits S``) for any registered task, on the real GLUE and
FewCLUE files and through the real command."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

import cramkit
from cramkit.errors import CramkitError
from cramkit.tasks.fewshot import FEWSHOT_DEV, few_shot_task
from cramkit.tasks.registry import get_task
from infer.models import cli


@pytest.fixture(scope="module")
def fewclue_dir(shared_data: Path) -> Path:
    from conftest import _need

    return _need(shared_data / "fewclue")


def test_k_per_class_disjoint_deterministic_and_different_per_split(glue_dir: Path, fewclue_dir: Path) -> None:
    for task in (get_task("glue/sst2", data_dir=glue_dir), get_task("clue/eprstmt", data_dir=fewclue_dir)):
        view = few_shot_task(task, 8, 0)
        train, dev = view.examples("train"), view.examples(FEWSHOT_DEV)
        assert collections.Counter(e.label for e in train) == {0: 8, 1: 8}
        assert collections.Counter(e.label for e in dev) == {0: 8, 1: 8}
        assert not {e.idx for e in train} & {e.idx for e in dev}
        assert view.selection_splits == [FEWSHOT_DEV] and view.scored_splits == task.scored_splits
        assert len(view.examples(view.scored_splits[0])) == len(task.examples(task.scored_splits[0]))
        again = few_shot_task(task, 8, 0).examples("train")
        assert [e.idx for e in again] == [e.idx for e in train]
        other = few_shot_task(task, 8, 1).examples("train")
        assert {e.idx for e in other} != {e.idx for e in train}
        assert task.examples(task.train_split) is not train  # the task itself is untouched
    assert get_task("clue/eprstmt", data_dir=fewclue_dir).scored_splits == ["test_public"]


def test_k_larger_than_a_class_is_one_line(fewclue_dir: Path) -> None:
    task = get_task("clue/eprstmt", data_dir=fewclue_dir)
    with pytest.raises(CramkitError, match=r"class Negative of task clue/eprstmt has \d+ .* the largest K"):
        few_shot_task(task, 1000, 0)


def test_the_command_reports_each_split_the_mean_and_the_spread(tiny_run: Path, glue_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "fs"
    proc = cli(
        "finetune",
        "--task",
        "glue/sst2",
        "--from",
        str(tiny_run),
        "--data-dir",
        str(glue_dir),
        "--few-shot",
        "4",
        "--splits",
        "2",
        "--out",
        str(out),
        "--set",
        "min_steps=8",
        "--set",
        "max_length=64",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "results.json").read_text())
    few = res["fewshot"]
    assert few["protocol"] == "lm-bff" and few["k"] == 4 and few["splits"] == ["0", "1"]
    scores = [few["per_split"][s]["score"] for s in ("0", "1")]
    assert abs(few["mean"] - sum(scores) / 2) < 1e-9 and few["std"] >= 0
    assert "± " in proc.stdout and "K=4 per class" in proc.stdout
    for s in ("0", "1"):
        split = json.loads((out / f"split-{s}" / "results.json").read_text())
        assert split["config"]["keep"] == "best"  # the sampled dev set picks the checkpoint
        assert split["train_examples"] == 8 and split["dev_examples"] == {FEWSHOT_DEV: 8, "dev": 872}
        assert split["seeds"][0]["steps"] == 8
    assert (out / "results.md").is_file() and (out / "scores.png").is_file()


def test_bad_few_shot_requests_are_one_line_and_write_nothing(tiny_run: Path, glue_dir: Path, tmp_path: Path) -> None:
    base = ["finetune", "--task", "glue/sst2", "--from", str(tiny_run), "--data-dir", str(glue_dir)]
    for extra, needle in (
        (["--few-shot", "40000"], "the largest K for this task is"),
        (["--few-shot", "4", "--fewshot-splits", "0"], "two protocols"),
        (["--few-shot", "4", "--splits", "0"], "--splits must be at least 1"),
    ):
        out = tmp_path / "x"
        proc = cli(*base, *extra, "--out", str(out))
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not out.exists()
    rows = (glue_dir / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[:200]
    (tmp_path / "reg.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    proc = cli(
        "finetune",
        "--from",
        str(tiny_run),
        "--train",
        str(tmp_path / "reg.tsv"),
        "--text-a",
        "sentence",
        "--regression",
        "--few-shot",
        "4",
        "--out",
        str(tmp_path / "y"),
    )
    assert proc.returncode == 2 and "regression" in proc.stderr and not (tmp_path / "y").exists()


def test_python_and_command_line_agree(tiny_run: Path, glue_dir: Path, tmp_path: Path) -> None:
    res = cramkit.finetune(
        tiny_run,
        task="glue/sst2",
        data_dir=glue_dir,
        few_shot=4,
        splits=1,
        out=tmp_path / "py",
        min_steps=8,
        max_length=64,
        progress=False,
    )
    proc = cli(
        "finetune",
        "--task",
        "glue/sst2",
        "--from",
        str(tiny_run),
        "--data-dir",
        str(glue_dir),
        "--few-shot",
        "4",
        "--splits",
        "1",
        "--out",
        str(tmp_path / "cli"),
        "--set",
        "min_steps=8",
        "--set",
        "max_length=64",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    cli_res = json.loads((tmp_path / "cli" / "results.json").read_text())
    assert res["fewshot"]["per_split"]["0"]["score"] == cli_res["fewshot"]["per_split"]["0"]["score"]


def test_another_k_into_the_same_out_is_refused_not_reused(tiny_run: Path, glue_dir: Path, tmp_path: Path) -> None:
    args = [
        "finetune",
        "--task",
        "glue/sst2",
        "--from",
        str(tiny_run),
        "--data-dir",
        str(glue_dir),
        "--splits",
        "1",
        "--out",
        str(tmp_path / "fs"),
        "--set",
        "min_steps=4",
        "--set",
        "max_length=32",
        "--no-progress",
    ]
    assert cli(*args, "--few-shot", "4").returncode == 0
    first = (tmp_path / "fs" / "results.json").read_text()
    proc = cli(*args, "--few-shot", "5")
    assert proc.returncode == 2 and "another draw (K=4, not K=5" in proc.stderr
    assert (tmp_path / "fs" / "results.json").read_text() == first
