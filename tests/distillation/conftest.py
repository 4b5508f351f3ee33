"""Fixtures of the distillation tests: NLTK's tagger from ../shared, SST-2 slices, a real fine-tuned teacher."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from clirun import cli as cramkit
from conftest import _need

TRAIN_ROWS, DEV_ROWS = 300, 100


@pytest.fixture(scope="session")
def nltk_data(shared_data: Path) -> Path:
    """../shared/data/nltk_data (see its SOURCE.md) on NLTK's search path, for this process and children."""
    import nltk

    root = _need(shared_data / "nltk_data" / "taggers" / "averaged_perceptron_tagger_eng").parents[1]
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    os.environ["NLTK_DATA"] = str(root)
    return root


def _tsv(path: Path) -> list[tuple[str, str]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        text, label = line.rsplit("\t", 1)
        rows.append((text, label))
    return rows


@pytest.fixture(scope="session")
def sst2_rows(glue_dir: Path) -> dict[str, list[tuple[str, str]]]:
    return {"train": _tsv(glue_dir / "SST-2" / "train.tsv"), "dev": _tsv(glue_dir / "SST-2" / "dev.tsv")}


@pytest.fixture(scope="session")
def sst_csv(sst2_rows, tmp_path_factory) -> dict[str, Path]:
    """train.csv / dev.csv: the first rows of SST-2's train and dev files (columns sentence, label)."""
    root = tmp_path_factory.mktemp("sst")
    out = {}
    for name, rows in (("train", sst2_rows["train"][:TRAIN_ROWS]), ("dev", sst2_rows["dev"][:DEV_ROWS])):
        out[name] = root / f"{name}.csv"
        with open(out[name], "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["sentence", "label"])
            w.writerows(rows)
    return out


@pytest.fixture(scope="session")
def teacher(pretrained_run: Path, sst_csv, tmp_path_factory) -> Path:
    """A real teacher: `cramkit finetune --out` from a real `cramkit pretrain` run on the SST-2 slice."""
    out = tmp_path_factory.mktemp("teacher") / "sst"
    proc = cramkit(
        "finetune",
        "--from",
        str(pretrained_run),
        "--train",
        str(sst_csv["train"]),
        "--dev",
        str(sst_csv["dev"]),
        "--text-a",
        "sentence",
        "--out",
        str(out),
        "--no-progress",
        "--set",
        "epochs=2",
        "--set",
        "min_steps=0",
        "--set",
        "max_length=48",
        "--set",
        "lr=3e-4",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


SMALL = [
    "--set",
    "n_iter=3",
    "--set",
    "epochs=1",
    "--set",
    "baseline_epochs=1",
    "--set",
    "speed_seconds=0.05",
]


@pytest.fixture(scope="session")
def distilled(teacher: Path, sst_csv, nltk_data, tmp_path_factory):
    """`cramkit distill` through the CLI for each student, sharing one cache (transfer set + teacher logits)."""
    root = tmp_path_factory.mktemp("distilled")
    cache = root / "cache"
    done = {}
    for student, extra in (
        ("bilstm", ["--set", "lstm_hidden=32", "--set", "fc_hidden=32"]),
        ("encoder", ["--set", "layers=1", "--set", "hidden_weight=0.5", "--set", "batch_size=32"]),
    ):
        out = root / student
        proc = cramkit(
            "distill",
            "--teacher",
            str(teacher),
            "--train",
            str(sst_csv["train"]),
            "--dev",
            str(sst_csv["dev"]),
            "--text-a",
            "sentence",
            "--student",
            student,
            "--out",
            str(out),
            "--cache",
            str(cache),
            "--no-progress",
            *SMALL,
            *extra,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        done[student] = (out, proc)
    return done
