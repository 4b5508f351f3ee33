"""`cramkit distill --student layers:N`: an embedding student of fewer of the teacher's layers, trained on text alone
to give the teacher's vectors; its agreement with the teacher on held-out text; the output an embedding model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clirun import cli as cramkit
from clirun import one_line


def _sentences(docs: list[str], n: int) -> list[str]:
    out: list[str] = []
    for doc in docs:
        for line in doc.splitlines():
            words = line.split()
            if 4 <= len(words) <= 30 and line.strip() not in out:
                out.append(" ".join(words))
                if len(out) == n:
                    return out
    return out


@pytest.fixture(scope="module")
def texts_file(builtin_docs, tmp_path_factory) -> Path:
    """600 lines of the stdlib docstrings, one text per line."""
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    lines = _sentences(builtin_docs, 600)
    assert len(lines) >= 400
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def student(pretrained_run: Path, texts_file: Path, tmp_path_factory):
    """`cramkit distill --student layers:1` from the real 2-layer pretraining run, through the command line."""
    out = tmp_path_factory.mktemp("emb") / "student"
    proc = cramkit(
        "distill",
        "--teacher",
        str(pretrained_run),
        "--student",
        "layers:1",
        "--unlabelled",
        str(texts_file),
        "--out",
        str(out),
        "--no-progress",
        "--set",
        "epochs=4",
        "--set",
        "batch_size=32",
        "--set",
        "lr=3e-4",
        "--set",
        "held_out=100",
        "--set",
        "checkpoint_every=never",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc


def test_the_student_keeps_the_layers_asked_and_records_its_teacher(student, pretrained_run: Path) -> None:
    from cramkit.loading import load_torch

    out, _ = student
    st, teacher = load_torch(out), load_torch(pretrained_run)
    assert st.kind == "encoder" and st.config.layers == 1 and teacher.config.layers == 2
    assert st.extra["teacher_layers"] == [0] and st.extra["distilled_from"] == str(teacher.source)
    assert st.pooling == teacher.pooling and st.normalize == teacher.normalize
    assert st.tokenizer.get_vocab() == teacher.tokenizer.get_vocab()
    # the embeddings table is the teacher's start: the same width, the same vocabulary
    assert st.encoder.embeddings.word.weight.shape == teacher.encoder.embeddings.word.weight.shape


def test_training_brings_the_student_closer_to_its_teacher(student) -> None:
    out, proc = student
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    before, after = report["agreement"]["untrained"], report["agreement"]["trained"]
    assert report["held_out_texts"] == 100 and report["train_texts"] == report["texts"] - 100
    # a 10-step pretraining run's vectors all lie close together (cosine 0.99 untrained): the distance to the
    # teacher's is what training shrinks; its neighbours (the small differences) stay found
    assert 1 - after["mean_cosine"] < 0.5 * (1 - before["mean_cosine"]), report["agreement"]
    assert after["recall_at_10"] > 0.9, report["agreement"]
    # the command ends with the one line of agreement, then where the student is
    lines = proc.stdout.strip().splitlines()
    assert lines[-2] == report["summary"] and "held-out texts: mean cosine" in lines[-2]
    assert "cramkit embed" in lines[-1]


def test_cramkit_embed_takes_the_student(student, texts_file: Path, tmp_path: Path) -> None:
    out, _ = student
    proc = cramkit("embed", str(texts_file), "--from", str(out), "--out", str(tmp_path / "vec"))
    assert proc.returncode == 0, proc.stderr
    vecs = np.load(tmp_path / "vec" / "embeddings.npy")
    assert vecs.shape[0] == len(texts_file.read_text(encoding="utf-8").splitlines()) and np.isfinite(vecs).all()


def test_the_same_command_again_keeps_the_finished_student(student, pretrained_run: Path, texts_file: Path) -> None:
    out, first = student
    again = cramkit(
        "distill", "--teacher", str(pretrained_run), "--student", "layers:1", "--unlabelled", str(texts_file),
        "--out", str(out), "--no-progress", "--set", "epochs=4", "--set", "batch_size=32", "--set", "lr=3e-4",
        "--set", "held_out=100", "--set", "checkpoint_every=never",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "distilled earlier" in again.stderr and again.stdout.splitlines()[-2] == first.stdout.splitlines()[-2]


def test_export_cpu_serves_the_student_and_times_it_against_its_teacher(
    pretrained_run: Path, texts_file: Path, tmp_path: Path, monkeypatch
) -> None:
    """`--set export=cpu`: the student exported beside OUT to the path --target cpu picks (here the CPU flags'
    rule, CRAMKIT_RACE=0: the race itself is tested with the exports), the teacher in that same format, both timed;
    the last line sends `cramkit embed` to the export, which gives the student's vectors."""
    from cramkit import backends
    from cramkit.infer import Engine

    monkeypatch.setenv("CRAMKIT_RACE", "0")
    out = tmp_path / "student"
    argv = (
        "distill", "--teacher", str(pretrained_run), "--student", "layers:1", "--unlabelled", str(texts_file),
        "--out", str(out), "--no-progress", "--set", "epochs=1", "--set", "held_out=40", "--set", "export=cpu",
        "--set", "checkpoint_every=never",
    )  # fmt: skip
    proc = cramkit(*argv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    served = json.loads((out / "report.json").read_text(encoding="utf-8"))["served"]
    where = tmp_path / "student-cpu"
    assert served["export"] == str(where) and backends.kind_of(where) is not None
    assert served["format"].split()[0] == backends.kind_of(where)
    assert served["texts"] >= 256 and set(served["speedup"]) >= {"1 thread"}
    for speeds in served["texts_per_s"].values():  # both sides measured, the ratio theirs
        assert speeds["teacher"] > 0 and speeds["student"] > 0
    first = served["texts_per_s"]["1 thread"]
    assert served["speedup"]["1 thread"] == round(first["student"] / first["teacher"], 2)
    assert f"served as {served['format']} ({where})" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].endswith(f"--from {where} --out VECTORS")
    texts = texts_file.read_text(encoding="utf-8").splitlines()[:20]
    a, b = Engine(out, device="cpu").embed(texts), Engine(where).embed(texts)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert cos.min() > 0.98, cos
    # an export lost (deleted, or stopped half way): the same command makes it again, the student kept as trained
    import shutil

    shutil.rmtree(where)
    again = cramkit(*argv)
    assert again.returncode == 0 and "distilled earlier" in again.stderr, again.stderr
    assert backends.kind_of(where) is not None and "served as" in again.stdout
    # a folder of the user's where the export would go: one line before anything trains
    other, notes = tmp_path / "other", tmp_path / "other-cpu" / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("mine", encoding="utf-8")
    one_line(cramkit(*[str(other) if x == str(out) else x for x in argv]), "other-cpu")
    assert notes.read_text(encoding="utf-8") == "mine" and not (other / "runs").exists()
    # a teacher that cannot be exported in the student's format: the student is served all the same, and says so
    from cramkit.errors import CramkitError
    from cramkit.infer import export as exporting

    real = exporting.export

    def no_teacher(*args, **kw):
        if not isinstance(kw.get("model"), (str, Path)):
            raise CramkitError("this format cannot hold the teacher")
        return real(*args, **kw)

    monkeypatch.setattr(exporting, "export", no_teacher)
    third = tmp_path / "third"
    proc = cramkit(*[str(third) if x == str(out) else x for x in argv])
    assert proc.returncode == 0, proc.stderr
    served = json.loads((third / "report.json").read_text(encoding="utf-8"))["served"]
    assert served["speedup"] == {} and "cannot hold the teacher" in served["teacher_error"]
    assert "the teacher could not be exported" in proc.stdout and backends.kind_of(tmp_path / "third-cpu")


@pytest.mark.slow
def test_a_minilm_student_agrees_better_after_training(minilm_dir: Path, texts_file: Path, tmp_path: Path) -> None:
    """The real all-MiniLM-L6-v2 (6 layers, normalised mean-pooled vectors) into 2 of its layers: trained, the
    student's vectors and its nearest neighbours are closer to the teacher's than the same layers untrained."""
    out = tmp_path / "minilm-l2"
    proc = cramkit(
        "distill", "--teacher", f"hf:{minilm_dir}", "--student", "layers:2", "--unlabelled", str(texts_file),
        "--out", str(out), "--no-progress", "--set", "epochs=3", "--set", "batch_size=32", "--set", "lr=2e-4",
        "--set", "held_out=100", "--set", "checkpoint_every=never", "--set", "matryoshka=128",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    before, after = report["agreement"]["untrained"], report["agreement"]["trained"]
    assert report["teacher_layers"] == [0, 5] and report["matryoshka"] == [128]
    assert after["mean_cosine"] > before["mean_cosine"] + 0.01, report["agreement"]
    assert after["recall_at_10"] > before["recall_at_10"], report["agreement"]
    from cramkit.infer import Engine

    eng = Engine(out, device="cpu")
    assert eng.normalize and eng.dimensions == [384, 128] and eng.embed(["a test"], dimensions=128).shape == (1, 128)


def _bilstm_dir(tok_dir: Path, out: Path) -> Path:
    """A model directory with no transformer encoder (a BiLSTM)."""
    from cramkit.loading import LoadedModel
    from cramkit.model.students import BiLSTMConfig, BiLSTMStudent, bilstm_meta
    from cramkit.text.tokenizer import load_tokenizer

    tok = load_tokenizer(tok_dir)
    cfg = BiLSTMConfig(vocab_size=tok.get_vocab_size(), embedding_dim=8, lstm_hidden=8, fc_hidden=8)
    LoadedModel(
        model=BiLSTMStudent(cfg, 2), kind="classifier", config=bilstm_meta(cfg), tokenizer=tok, labels=["0", "1"],
        architecture="bilstm",
    ).save(out)  # fmt: skip
    return out


def test_bad_inputs_are_one_line_before_anything_trains(
    pretrained_run: Path, texts_file: Path, tok_dir: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")

    def run(teacher: Path, student: str, texts: Path, *extra: str):
        return cramkit(
            "distill", "--teacher", str(teacher), "--student", student, "--unlabelled", str(texts),
            "--out", str(tmp_path / "out"), "--no-progress", *extra,
        )  # fmt: skip

    one_line(run(pretrained_run, "layers:1", empty), "--unlabelled", "no text")
    one_line(run(pretrained_run, "layers:2", texts_file), "layers:2", "has 2 layers", "layers:1")
    one_line(run(pretrained_run, "layers:5", texts_file), "layers:5", "has 2 layers")
    one_line(run(pretrained_run, "layers:0", texts_file), "layers:0", "at least 1")
    one_line(run(pretrained_run, "layers:x", texts_file), "layers:x")
    one_line(run(_bilstm_dir(tok_dir, tmp_path / "bilstm"), "layers:1", texts_file), "no transformer encoder")
    one_line(run(pretrained_run, "layers:1", texts_file, "--train", str(texts_file)), "--train", "--unlabelled")
    one_line(
        cramkit("distill", "--teacher", str(pretrained_run), "--student", "layers:1", "--out", str(tmp_path / "o")),
        "--unlabelled",
    )
    assert not (tmp_path / "out" / "runs").exists()  # nothing trained


def test_layers_kept_are_spread_from_the_first_to_the_last() -> None:
    from cramkit.distillation.embedding_student import agreement, pick_layers

    assert pick_layers(6, 3, [], "t") == [0, 2, 5]
    assert pick_layers(12, 4, [], "t") == [0, 4, 7, 11]
    assert pick_layers(6, 1, [], "t") == [0]
    assert pick_layers(6, 3, [4, 0, 2], "t") == [0, 2, 4]
    x = np.random.default_rng(0).normal(size=(50, 16)).astype(np.float32)
    same = agreement(x, x)
    assert abs(same["mean_cosine"] - 1) < 1e-5 and same["recall_at_10"] == 1.0
