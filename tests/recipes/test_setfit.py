"""``finetune --method setfit`` (SetFit): the pairs it trains on, the head it fits, and the model it makes, through
the real commands from a run that `cramkit pretrain` made and from all-MiniLM-L6-v2 (no MLM head)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import cramkit
from cramkit.errors import CramkitError
from cramkit.recipes.setfit import make_pairs
from infer.models import cli


def test_pairs_are_setfits_rounds_of_one_positive_and_one_negative_per_row() -> None:
    labels = np.array([0, 0, 0, 1, 1, 2])  # label 2 has one row: its positive is itself
    pairs, targets = make_pairs(labels, 5, seed=3)
    assert pairs.shape == (2 * 5 * 6, 2) and targets.shape == (60,)
    same = labels[pairs[:, 0]] == labels[pairs[:, 1]]
    assert (same == (targets == 1.0)).all() and targets.sum() == 30  # half positive, half negative
    for i, j in pairs[targets == 1.0]:
        assert i != j or i == 5  # another row of the label whenever the label has one
    assert set(pairs[:, 0].tolist()) == set(range(6))  # every row anchors its pairs
    again, _ = make_pairs(labels, 5, seed=3)
    assert (again == pairs).all() and not (make_pairs(labels, 5, seed=4)[0] == pairs).all()


def test_one_label_only_is_one_line() -> None:
    with pytest.raises(CramkitError) as err:
        make_pairs(np.array([1, 1, 1]), 2, seed=0)
    assert "every training row has label" in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(scope="module")
def sst2_files(glue_dir: Path, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sst2-setfit")
    lines = (glue_dir / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], lines[1:]
    (root / "train.tsv").write_text("\n".join([header, *rows[:40]]) + "\n", encoding="utf-8")
    dev = rows[2000:2064] or rows[-64:]  # the built-in GLUE-shaped SST-2 (a clone without ../shared) is shorter
    (root / "dev.tsv").write_text("\n".join([header, *dev]) + "\n", encoding="utf-8")
    return root / "train.tsv", root / "dev.tsv"


def _args(source: str, files: tuple[Path, Path], out: Path, *args: str) -> list[str]:
    return [
        "finetune",
        "--from",
        source,
        "--train",
        str(files[0]),
        "--dev",
        str(files[1]),
        "--text-a",
        "sentence",
        "--method",
        "setfit",
        "--out",
        str(out),
        "--no-progress",
        *args,
    ]


def _setfit(source: str, files: tuple[Path, Path], out: Path, *args: str):
    return cli(*_args(source, files, out, *args))


def test_setfit_trains_the_body_on_pairs_and_fits_a_head_that_predict_and_load_agree_with(
    tiny_run: Path, sst2_files, tmp_path: Path
) -> None:
    out = tmp_path / "setfit"
    proc = _setfit(str(tiny_run), sst2_files, out, "--set", "setfit_pairs=10", "--set", "batch_size=8")
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["method"] == "setfit" and res["seeds"][0]["steps"] == 2 * 10 * 40 // 8  # one pass over the pairs
    assert res["seeds"][0]["last_loss"] < 0.7 * res["seeds"][0]["first_loss"]  # the body learned the pairs
    assert res["seeds"][0]["lr"] == 1e-3  # auto below width 384
    model = cramkit.load(out)
    assert model.kind == "classifier" and model.pooling == "mean" and model.labels == ["0", "1"]
    # the body moved (the pairs trained it) and the head is a logistic regression: no bias, fitted weights
    weights = load_file(str(out / "model.safetensors"))
    assert np.abs(weights["classifier.bias"]).max() == 0 and np.abs(weights["classifier.weight"]).max() > 0
    start = cramkit.load(tiny_run).encoder.state_dict()
    moved = [k for k, v in model.encoder.state_dict().items() if not np.allclose(v.numpy(), start[k].numpy())]
    assert len(moved) > len(start) // 2
    # predict gives the dev score the run reported: the saved head is the one that was scored
    pred = tmp_path / "dev.jsonl"
    proc = cli("predict", "--from", str(out), str(sst2_files[1]), "--out", str(pred))
    assert proc.returncode == 0, proc.stderr
    assert f"accuracy {res['median']['dev']['metrics']['accuracy']:.2f}" in proc.stdout
    rows = [json.loads(line) for line in pred.read_text().splitlines()]
    assert len(rows) == 64 and all(abs(sum(r["probabilities"].values()) - 1) < 1e-4 for r in rows)
    # the training rows themselves: the head separates what the body was trained to pull apart
    proc = cli("predict", "--from", str(out), str(sst2_files[0]), "--out", str(tmp_path / "train.jsonl"))
    assert proc.returncode == 0, proc.stderr
    train_acc = float(proc.stdout.split("accuracy ")[1].split()[0].rstrip(","))
    assert train_acc >= 85, proc.stdout


@pytest.mark.integration
def test_minilm_without_an_mlm_head_takes_setfit_where_a_prompt_is_refused(
    minilm_dir: Path, sst2_files, tmp_path: Path
) -> None:
    args = ("--set", "setfit_pairs=1", "--set", "batch_size=16", "--set", "max_train_examples=16")
    proc = _setfit(f"hf:{minilm_dir}", sst2_files, tmp_path / "m", *args)
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "m" / "results.json").read_text())
    assert res["seeds"][0]["steps"] == 2 and res["seeds"][0]["lr"] == 2e-5  # SetFit's rate at MiniLM's width
    assert cramkit.load(tmp_path / "m").pooling == "mean"  # MiniLM's own pooling, without BERT's pooler


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--regression",), "needs a classification task"),
        (("--prompt", "{sentence} It was [MASK] ."), "not method=setfit"),
        (("--set", "setfit_pairs=0"), "setfit_pairs and setfit_lr must be positive"),
        (("--prefix-len", "8"), "give it with --method ptuning"),
    ],
)
def test_setfit_bad_input_is_one_line(tiny_run: Path, sst2_files, tmp_path: Path, args, needle) -> None:
    out = tmp_path / "bad"
    proc = _setfit(str(tiny_run), sst2_files, out, *args)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (out / "model.safetensors").exists()


@pytest.mark.integration
def test_setfit_killed_midway_resumes_to_the_same_model(tiny_run: Path, sst2_files, tmp_path: Path) -> None:
    """kill -9 after a checkpoint of the body: the same command resumes from it and ends with the model and
    scores of an uninterrupted run, bit for bit (the pairs and their batches follow from the seed)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    def argv(out: Path) -> list[str]:
        settings = ("--set", "setfit_pairs=10", "--set", "batch_size=8", "--set", "checkpoint_every=20steps")
        return [sys.executable, "-m", "cramkit", *_args(str(tiny_run), sst2_files, out, *settings)]

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed = tmp_path / "killed"
    proc = subprocess.Popen(argv(killed), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    latest = killed / "seeds" / "seed-0" / "checkpoints" / "latest"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not latest.is_file():
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = subprocess.run(argv(killed), capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0 and "resuming" in resumed.stderr, resumed.stderr[-2000:]
    straight = subprocess.run(argv(tmp_path / "straight"), capture_output=True, text=True, env=env, timeout=300)
    assert straight.returncode == 0, straight.stderr[-2000:]
    a = json.loads((killed / "results.json").read_text())
    b = json.loads((tmp_path / "straight" / "results.json").read_text())
    assert a["median"] == b["median"] and a["seeds"][0]["steps"] == b["seeds"][0]["steps"] == 100
    wa, wb = load_file(str(killed / "model.safetensors")), load_file(str(tmp_path / "straight" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)
