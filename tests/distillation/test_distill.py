"""`cramkit distill` end to end (a real pretrain -> finetune teacher), the teacher cache, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import cramkit
from cramkit.cli import main
from cramkit.errors import CramkitError
from cramkit.loading import MODEL_FILE

from .conftest import SMALL
from .conftest import cramkit as run_cli


def _dev(sst_csv) -> list[str]:
    import csv

    with open(sst_csv["dev"], encoding="utf-8") as f:
        return [r["sentence"] for r in csv.DictReader(f)]


@pytest.mark.parametrize("student", ["bilstm", "encoder"])
def test_distilled_student_loads_predicts_and_follows_the_teacher(student, distilled, teacher, sst_csv, tmp_path):
    from cramkit.infer.engine import Engine

    out, proc = distilled[student]
    assert "CPU examples/s" in proc.stdout
    loaded = cramkit.load(out)
    t = cramkit.load(teacher)
    assert loaded.architecture == ("bilstm" if student == "bilstm" else "encoder")
    assert loaded.kind == "classifier" and loaded.labels == t.labels == ["0", "1"]
    dev = _dev(sst_csv)
    got = Engine(loaded, device="cpu").classify(dev)
    assert got.probs.shape == (len(dev), 2) and set(got.labels) <= {"0", "1"}
    # distillation moved the student's logits towards the teacher's: closer than a fresh student's
    from cramkit.distillation.config import DistillConfig
    from cramkit.distillation.students import build_student

    cfg = DistillConfig(lstm_hidden=32, fc_hidden=32, layers=1).resolved(student)
    fresh = build_student(student, t, cfg, pairs=False)
    tl = Engine(t, device="cpu", max_length=loaded.max_length).logits(dev)
    before = np.mean((Engine(fresh, device="cpu", max_length=loaded.max_length).logits(dev) - tl) ** 2)
    after = np.mean((got.logits - tl) ** 2)
    assert after < before
    # the report: scores, parameters, speed measured in this run, the transfer set
    rep = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert set(rep["scores"]) == {"teacher", "student", "labels_only"}
    for v in rep["scores"].values():
        assert 0 <= v["score"] <= 100
    assert rep["parameters"]["student"]["total"] == sum(p.numel() for p in loaded.model.parameters())
    assert rep["cpu_examples_per_s"]["teacher"] > 0 and rep["cpu_examples_per_s"]["student"] > 0
    assert rep["transfer_set"]["originals"] == 300 and rep["transfer_set"]["rows"] > 600
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "| teacher |" in md
    # augmentation's share of the run, or (the second student, same cache) that it was reused
    first = student == "bilstm"
    assert rep["transfer_set"]["cached"] is not first
    assert ("% of the total time" in md) is first and ("reused" in md) is not first
    # cramkit predict through the CLI
    pred = run_cli(
        "predict",
        "--from",
        str(out),
        str(sst_csv["dev"]),
        "--text-a",
        "sentence",
        "--out",
        str(tmp_path / "p.jsonl"),
    )
    assert pred.returncode == 0, pred.stderr
    rows = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["label"] for r in rows] == list(got.labels)


def test_second_student_reused_the_cached_transfer_set_and_teacher_logits(distilled):
    reps = [json.loads((distilled[s][0] / "report.json").read_text(encoding="utf-8")) for s in ("bilstm", "encoder")]
    assert reps[0]["teacher_logits"]["cached"] is False
    assert reps[1]["teacher_logits"]["cached"] is True
    assert reps[0]["transfer_set"]["root"] == reps[1]["transfer_set"]["root"]
    enc = cramkit.load(distilled["encoder"][0])
    assert enc.config.layers == 1 and enc.extra["init"] == "teacher"


def test_bilstm_round_trips_through_save_and_load(distilled, tmp_path):
    import torch

    loaded = cramkit.load(distilled["bilstm"][0])
    loaded.save(tmp_path / "copy")
    again = cramkit.load(tmp_path / "copy")
    ids = torch.tensor([[2, 50, 60, 70, 3]])
    with torch.inference_mode():
        assert torch.equal(loaded.model(ids)[1], again.model(ids)[1])
    # a crafted description cannot name anything outside the fixed architecture table
    meta = json.loads((tmp_path / "copy" / MODEL_FILE).read_text(encoding="utf-8"))
    meta["architecture"] = "os:system"
    (tmp_path / "copy" / MODEL_FILE).write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(CramkitError, match="unknown architecture"):
        cramkit.load(tmp_path / "copy")
    meta["architecture"] = "bilstm"
    meta["model"]["__class__"] = "x"
    (tmp_path / "copy" / MODEL_FILE).write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(CramkitError, match="unknown setting"):
        cramkit.load(tmp_path / "copy")


def test_teacher_logits_resume_after_an_interruption(teacher, tmp_path, monkeypatch):
    from cramkit.distillation import teacher as tmod
    from cramkit.infer.engine import Engine

    t = cramkit.load(teacher)
    texts = [f"the film number {i} is {'good' if i % 2 else 'bad'}" for i in range(50)]
    full = Engine(t, device="cpu").logits(texts)
    calls = {"n": 0}
    real = Engine.logits

    def dying(self, inputs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, inputs)

    monkeypatch.setattr(Engine, "logits", dying)
    with pytest.raises(KeyboardInterrupt):
        tmod.teacher_logits(t, texts, [None] * 50, tmp_path, max_length=512, chunk=10, device="cpu", progress=False)
    assert not list(tmp_path.glob("teacher-*[0-9a-f].npy")), "an interrupted cache must not look complete"
    state = json.loads(next(tmp_path.glob("teacher-*.progress.json")).read_text(encoding="utf-8"))
    assert state["done"] == 20
    monkeypatch.setattr(Engine, "logits", real)
    got, stats = tmod.teacher_logits(
        t, texts, [None] * 50, tmp_path, max_length=512, chunk=10, device="cpu", progress=False
    )
    assert stats["resumed_from"] == 20 and stats["rows_computed"] == 30
    np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-5)
    again, stats = tmod.teacher_logits(t, texts, [None] * 50, tmp_path, max_length=512, progress=False)
    assert stats["cached"] and np.array_equal(again, got)
    # a crafted cache (a pickled object array) is never unpickled: it is computed again (tests/hostile/test_readback.py)
    final = next(tmp_path.glob("teacher-*.npy"))
    np.save(final, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    again, stats = tmod.teacher_logits(t, texts, [None] * 50, tmp_path, max_length=512, progress=False)
    assert not stats["cached"] and stats["rows_computed"] == 50
    np.testing.assert_allclose(again, full, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ bad input


def _fails(capsys, *argv: str) -> str:
    code = main(["distill", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def _args(teacher, sst_csv, out: Path, *extra: str) -> list[str]:
    return [
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
        "--no-progress",
        *SMALL,
        *extra,
    ]


def test_bad_students_and_options(teacher, sst_csv, nltk_data, tmp_path, capsys):
    out = tmp_path / "o"
    assert "did you mean bilstm" in _fails(capsys, *_args(teacher, sst_csv, out, "--student", "bilstmm"))
    assert "unknown setting 'distill.epoch'" in _fails(
        capsys, *_args(teacher, sst_csv, out, "--student", "bilstm", "--set", "epoch=3")
    )
    err = _fails(capsys, *_args(teacher, sst_csv, out, "--student", "encoder", "--set", "hidden=32"))
    assert "differs from the teacher's width 64" in err and "init=" in err
    err = _fails(capsys, *_args(teacher, sst_csv, out, "--student", "encoder", "--set", "layers=5"))
    assert "has only 2 layers" in err
    err = _fails(capsys, *_args(teacher, sst_csv, out, "--student", "encoder", "--set", "layer_map=[0,7]"))
    assert "layer_map" in err
    err = _fails(capsys, *_args(teacher, sst_csv, out, "--student", "bilstm", "--set", "hidden_weight=1"))
    assert "encoder" in err
    assert not (out / MODEL_FILE).exists()


def test_teacher_without_head_and_label_mismatch(pretrained_run, teacher, sst_csv, nltk_data, tmp_path, capsys):
    out = tmp_path / "o"
    err = _fails(capsys, *_args(pretrained_run, sst_csv, out, "--student", "bilstm"))
    assert "no classification or regression head" in err and "cramkit finetune" in err
    # the same sentences with the labels named differently: never a silent remap
    for name in ("train", "dev"):
        text = sst_csv[name].read_text(encoding="utf-8").replace(",0\n", ",neg\n").replace(",1\n", ",pos\n")
        (tmp_path / f"{name}.csv").write_text(text, encoding="utf-8")
    renamed = {"train": tmp_path / "train.csv", "dev": tmp_path / "dev.csv"}
    err = _fails(capsys, *_args(teacher, renamed, out, "--student", "bilstm"))
    assert "labels ['0', '1']" in err and "no silent remap" in err
    err = _fails(capsys, *_args(teacher, sst_csv, out, "--student", "bilstm", "--regression"))
    assert "regression" in err
    assert not out.exists() or not (out / MODEL_FILE).exists()


def test_empty_or_unlabelled_train_file(teacher, sst_csv, nltk_data, tmp_path, capsys):
    out = tmp_path / "o"
    empty = tmp_path / "empty.csv"
    empty.write_text("sentence,label\n", encoding="utf-8")
    err = _fails(capsys, *_args(teacher, {"train": empty, "dev": sst_csv["dev"]}, out, "--student", "bilstm"))
    assert "empty" in err
    nolabel = tmp_path / "nolabel.csv"
    nolabel.write_text("sentence\na fine film\na dull film\n", encoding="utf-8")
    err = _fails(capsys, *_args(teacher, {"train": nolabel, "dev": sst_csv["dev"]}, out, "--student", "bilstm"))
    assert "label" in err
    assert not (out / MODEL_FILE).exists()


@pytest.mark.integration
def test_missing_tagger_through_the_cli(teacher, sst_csv, tmp_path):
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "NLTK_DATA": str(tmp_path / "no-nltk"),
        "HOME": str(tmp_path),
        "OMP_NUM_THREADS": "1",
    }
    argv = _args(teacher, sst_csv, tmp_path / "o", "--student", "bilstm")
    p = subprocess.run(
        [sys.executable, "-m", "cramkit", "distill", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert p.returncode == 2 and "nltk.download('averaged_perceptron_tagger_eng')" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o" / MODEL_FILE).exists()


def _small_cfg(**kw):
    from cramkit.distillation.config import DistillConfig

    base = dict(n_iter=2, epochs=1, baseline_epochs=1, speed_seconds=0.05, lstm_hidden=16, fc_hidden=16, device="cpu")
    return DistillConfig(**(base | kw))


def test_multilabel_teacher_with_kl_alpha_and_unlabelled_text(teacher, sst_csv, nltk_data, tmp_path):
    """A multi-label teacher (sigmoid outputs): BCE-with-temperature soft targets mixed with one-hot labels;
    unlabelled text joins the transfer set."""
    from cramkit.distillation import distill
    from cramkit.tasks.files import task_from_file

    t = cramkit.load(teacher)
    t.kind = "multilabel"
    t.model.multilabel = True
    t.save(tmp_path / "ml-teacher")
    task = task_from_file("ml", sst_csv["train"], sst_csv["dev"], text_a="sentence")
    extra = ["an unlabelled sentence about a film", "another one , with words", "  "]
    rep = distill(
        tmp_path / "ml-teacher",
        task,
        "bilstm",
        _small_cfg(loss="kl", temperature=2.0, alpha=0.5),
        tmp_path / "st",
        unlabelled=extra,
        progress=False,
    )
    assert rep["kind"] == "multilabel" and rep["transfer_set"]["unlabelled"] == 2
    st = cramkit.load(tmp_path / "st")
    assert st.kind == "multilabel" and st.model.multilabel
    from cramkit.infer.engine import Engine

    res = Engine(st, device="cpu").classify(_dev(sst_csv)[:5])
    assert res.probs.shape == (5, 2) and all(isinstance(x, list) for x in res.labels)


@pytest.mark.slow
def test_regression_teacher(pretrained_run, sst_csv, nltk_data, tmp_path):
    """A regression task end to end: finetune --regression, then distil (MSE on the one output)."""
    from cramkit.distillation import distill
    from cramkit.tasks.files import task_from_file

    proc = run_cli(
        "finetune",
        "--from",
        str(pretrained_run),
        "--train",
        str(sst_csv["train"]),
        "--dev",
        str(sst_csv["dev"]),
        "--text-a",
        "sentence",
        "--regression",
        "--out",
        str(tmp_path / "t"),
        "--no-progress",
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
    )
    assert proc.returncode == 0, proc.stderr
    task = task_from_file("reg", sst_csv["train"], sst_csv["dev"], text_a="sentence", regression=True)
    rep = distill(tmp_path / "t", task, "encoder", _small_cfg(layers=1), tmp_path / "st", progress=False)
    assert rep["kind"] == "regression" and "pearson" in rep["scores"]["student"]["metrics"]
    st = cramkit.load(tmp_path / "st")
    assert st.kind == "regression" and st.num_labels == 1


def test_unlabelled_sentences_from_a_token_store(teacher, pretrained_run, sst_csv, nltk_data, tmp_path):
    """--unlabelled STORE: the documents of a token store (here the one `cramkit pretrain` built) are decoded
    with the tokenizer beside it, cut into sentences and join the transfer set, at most max_unlabelled."""
    from cramkit.distillation.unlabelled import read_unlabelled

    store = pretrained_run / "data"
    taken = read_unlabelled(store, limit=40, seed=0)
    assert len(taken) == 40 and all(3 <= len(t.split()) <= 60 for t in taken)
    assert read_unlabelled(store, limit=40, seed=0) == taken  # seeded
    out = tmp_path / "st"
    proc = run_cli(
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
        "bilstm",
        "--out",
        str(out),
        "--unlabelled",
        str(store),
        "--no-progress",
        *SMALL,
        "--set",
        "max_unlabelled=40",
        "--set",
        "baseline=false",
        "--set",
        "lstm_hidden=16",
        "--set",
        "fc_hidden=16",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ts = json.loads((out / "report.json").read_text(encoding="utf-8"))["transfer_set"]
    assert 35 <= ts["unlabelled"] <= 40  # a sentence equal to a training example is kept once
    rows = [json.loads(x) for x in (Path(ts["root"]) / "transfer.jsonl").read_text(encoding="utf-8").splitlines()]
    assert {r[0] for r in rows[-ts["unlabelled"] :]} <= set(taken)
    bad = run_cli(
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
        "bilstm",
        "--out",
        str(tmp_path / "x"),
        "--unlabelled",
        str(tmp_path / "nope"),
    )
    assert bad.returncode == 2 and "--unlabelled" in bad.stderr and "Traceback" not in bad.stderr
