"""`cramkit distill` trains through the engine: killed midway it resumes to the very student an uninterrupted
run gives; a finished run is not redone; other settings on the same --out are refused, not mixed in."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import cramkit
from cramkit.cli import main

from .conftest import SMALL

pytestmark = pytest.mark.integration  # kill -9 of a `cramkit distill` process

BILSTM = ["--student", "bilstm", "--set", "lstm_hidden=32", "--set", "fc_hidden=32"]


def _argv(teacher, sst_csv, out: Path, cache: Path, *extra: str) -> list[str]:
    return [
        "distill",
        "--teacher",
        str(teacher),
        "--train",
        str(sst_csv["train"]),
        "--dev",
        str(sst_csv["dev"]),
        "--text-a",
        "sentence",
        "--out",
        str(out),
        "--cache",
        str(cache),
        "--no-progress",
        *SMALL,
        *BILSTM,
        "--set",
        "epochs=5",
        "--set",
        "checkpoint_every=10steps",
        *extra,
    ]


def test_killed_distill_resumes_to_the_same_student_and_a_finished_one_is_not_redone(
    teacher, sst_csv, nltk_data, tmp_path, capsys
):
    from safetensors.torch import load_file

    from cramkit.io import dir_lock

    cache = tmp_path / "cache"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "cramkit", *_argv(teacher, sst_csv, killed, cache)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    run = killed / "runs" / "distilled"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not (run / "checkpoints" / "latest").is_file():
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "result.json").exists(), "killed after the distilled training had finished"

    # the same command again (here in this process): it resumes; and a run never stopped, to compare with
    assert main(_argv(teacher, sst_csv, killed, cache)) == 0
    err = capsys.readouterr().err
    assert f"resuming {run} from step-" in err
    assert main(_argv(teacher, sst_csv, tmp_path / "straight", cache)) == 0
    assert "resuming" not in capsys.readouterr().err

    # bit for bit what the uninterrupted run gives: weights, scores, the training's losses
    wa, wb = load_file(killed / "model.safetensors"), load_file(tmp_path / "straight" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)
    a, b = (json.loads((d / "report.json").read_text()) for d in (killed, tmp_path / "straight"))
    assert a["scores"] == b["scores"]
    for name in ("distilled", "labels_only"):
        timing = ("seconds", "examples_per_s")
        assert {k: v for k, v in a["training"][name].items() if k not in timing} == {
            k: v for k, v in b["training"][name].items() if k not in timing
        }
    assert a["training"]["distilled"]["steps"] == 75
    # the engine's run directories: metrics and plot kept, checkpoints gone once the student is saved
    for name in ("distilled", "labels-only"):
        assert (killed / "runs" / name / "metrics.jsonl").is_file()
        assert (killed / "runs" / name / "result.json").is_file()
        assert not (killed / "runs" / name / "checkpoints").exists()

    # a rerun of the finished distillation trains nothing: the same report, at once
    report = (killed / "report.json").read_bytes()
    assert main(_argv(teacher, sst_csv, killed, cache)) == 0
    err = capsys.readouterr().err
    assert "distilled earlier with the same settings" in err and "resuming" not in err
    assert (killed / "report.json").read_bytes() == report

    # other settings on the same --out: refused in one line, nothing mixed in
    assert main(_argv(teacher, sst_csv, killed, cache, "--set", "lr=0.01")) == 2
    err = capsys.readouterr().err.strip()
    assert "other settings" in err and "another --out" in err and f"delete {killed}" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert (killed / "report.json").read_bytes() == report

    # a second process on the same --out: refused in one line
    with dir_lock(killed):
        assert main(_argv(teacher, sst_csv, killed, cache)) == 2
    err = capsys.readouterr().err.strip()
    assert "in use by another cramkit process" in err and len(err.splitlines()) == 1


def test_encoder_student_with_hidden_matching_resumes_exactly(teacher, sst_csv, tmp_path, monkeypatch):
    """In process: an encoder student matching the teacher's hidden states (its projection is trained,
    checkpointed and resumed with it), interrupted midway, then trained again in the same run directory,
    ends equal to one trained without a stop."""
    import csv

    import torch

    from cramkit.data.batching import encode_texts
    from cramkit.distillation.config import DistillConfig
    from cramkit.distillation.objective import DistillObjective, train_student
    from cramkit.distillation.students import build_student
    from cramkit.infer.engine import Engine

    t = cramkit.load(teacher)
    with open(sst_csv["train"], encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[:96]
    texts = [r["sentence"] for r in rows]
    labels = np.asarray([int(r["label"]) for r in rows])
    targets = Engine(t, device="cpu").logits(texts)
    labelled = np.arange(len(texts)) % 2 == 0  # half the rows "augmented copies": no hard label
    cfg = DistillConfig(
        layers=1,
        hidden_weight=0.5,
        alpha=0.5,
        loss="kl",
        temperature=2.0,
        epochs=3,
        batch_size=16,
        device="cpu",
        checkpoint_every="4steps",
    ).resolved("encoder")

    def trained(run: Path, stop_at: int | None = None):
        st = build_student("encoder", t, cfg, pairs=False)
        enc = encode_texts(st.tokenizer, texts, None, 48)
        stats = train_student(st, enc, targets, labels, labelled, cfg, cfg.epochs, run, teacher=t, progress=False)
        return st, stats

    real = DistillObjective.loss
    calls = {"n": 0}

    def dying(self, model, batch, device):
        calls["n"] += 1
        if calls["n"] == 11:
            raise KeyboardInterrupt
        return real(self, model, batch, device)

    monkeypatch.setattr(DistillObjective, "loss", dying)
    with pytest.raises(KeyboardInterrupt):
        trained(tmp_path / "stopped")
    monkeypatch.setattr(DistillObjective, "loss", real)
    from cramkit.train import checkpoint as ckpt

    saved = ckpt.find_latest(tmp_path / "stopped")
    assert saved is not None and "proj.weight" in ckpt.model_weights(saved)
    again, stats_a = trained(tmp_path / "stopped")
    straight, stats_b = trained(tmp_path / "straight")
    assert stats_a["steps"] == stats_b["steps"] == 18
    assert stats_a["last_loss"] == stats_b["last_loss"]
    for (k, va), (_, vb) in zip(again.model.state_dict().items(), straight.model.state_dict().items(), strict=True):
        assert torch.equal(va, vb), k
    # the frozen teacher was never trained, and went back to the CPU
    assert all(p.device.type == "cpu" for p in t.model.parameters())


@pytest.mark.slow
def test_distill_on_two_processes(teacher, sst_csv, nltk_data, tmp_path):
    """`cramkit distill --nproc 2` (torchrun, DDP on gloo): rank 0 prepares, scores and reports; both train
    (the encoder student with its hidden-state projection); a rerun redoes nothing."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "o"
    argv = [
        sys.executable,
        "-m",
        "cramkit",
        *_argv(teacher, sst_csv, out, tmp_path / "cache"),
        "--set",
        "device=cpu",
        "--student",
        "encoder",
        "--set",
        "layers=1",
        "--set",
        "hidden_weight=0.5",
        "--nproc",
        "2",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("| teacher |") == 1  # one report, from rank 0
    rep = json.loads((out / "report.json").read_text())
    distilled = rep["training"]["distilled"]
    # 5 epochs of the 951-row transfer set in global batches of 128 (the encoder student's default), 2 ranks
    assert distilled["examples"] == rep["transfer_set"]["rows"] == 951 and rep["config"]["batch_size"] == 128
    assert distilled["steps"] == math.ceil(5 * 951 / 128)
    assert set(rep["scores"]) == {"teacher", "student", "labels_only"}
    assert cramkit.load(out).config.layers == 1
    again = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0 and "distilled earlier" in again.stderr, again.stderr[-3000:]
