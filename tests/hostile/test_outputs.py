"""Commands that write: never over their own input, never a directory replaced by a file, never a run or a
model replaced without naming it; --force says what it removes."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from cramkit.cli import main
from infer.models import sst2


def _digest(d: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in d.rglob("*") if p.is_file() and p.name != ".lock"):
        h.update(str(f.relative_to(d)).encode() + f.read_bytes())
    return h.hexdigest()


@pytest.fixture
def refused(capsys):
    """Run the CLI in-process; it must fail with one `cramkit: error:` line naming ``needles``, exit 2."""

    def check(args: list[str], *needles: str) -> None:
        capsys.readouterr()
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith("cramkit: error: ") and len(err.strip().splitlines()) == 1, err
        for needle in needles:
            assert needle in err, err

    return check


def test_predict_never_replaces_a_directory(ft_model, pretrained_run, tmp_path, refused, monkeypatch) -> None:
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\nawful\n")
    run = tmp_path / "run"
    shutil.copytree(pretrained_run, run)
    before = _digest(run), _digest(ft_model)
    refused(["predict", "--from", str(ft_model), str(rows), "--out", str(run)], "is a directory")
    refused(["predict", "--from", str(ft_model), str(rows), "--out", str(ft_model)], "is a directory")
    monkeypatch.chdir(tmp_path)
    refused(["predict", "--from", str(ft_model), str(rows), "--out", "."], "is a directory")
    refused(["predict", "--from", str(ft_model), str(rows), "--out", str(rows)], "destroy the source")
    assert (_digest(run), _digest(ft_model)) == before and rows.read_text() == "a fine film\nawful\n"


def test_finetune_and_distill_never_write_over_their_input_or_another_model(
    ft_model, ft_onnx, pretrained_run, glue_dir, tmp_path, refused
) -> None:
    data = sst2(glue_dir, "train")[:40]
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in data), encoding="utf-8")
    run, onnx_dir, teacher = tmp_path / "run", tmp_path / "onnx", tmp_path / "teacher"
    shutil.copytree(pretrained_run, run)
    shutil.copytree(ft_onnx, onnx_dir)
    shutil.copytree(ft_model, teacher)
    before = _digest(run), _digest(onnx_dir), _digest(teacher)
    ft = (
        "finetune",
        "--train",
        str(train),
        "--text-a",
        "sentence",
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--no-progress",
    )
    refused([*ft, "--from", str(run), "--out", str(run)], "destroy the source")
    refused([*ft, "--from", str(run), "--out", str(onnx_dir)], "an ONNX export")
    model = tmp_path / "model"  # a model directory no fine-tuning claims (saved by cramkit.load(...).save)
    shutil.copytree(ft_model, model, ignore=shutil.ignore_patterns("finetune.json"))
    refused([*ft, "--from", str(run), "--out", str(model)], "a model directory")
    assert not (model / "finetune.json").exists()
    dist = (
        "distill",
        "--student",
        "bilstm",
        "--train",
        str(train),
        "--dev",
        str(train),
        "--text-a",
        "sentence",
        "--set",
        "p_pos=0",
        "--no-progress",
    )
    refused([*dist, "--teacher", str(teacher), "--out", str(teacher)], "destroy the source")
    refused([*dist, "--teacher", str(teacher), "--out", str(run)], "a pretraining run")
    assert (_digest(run), _digest(onnx_dir), _digest(teacher)) == before


def test_export_force_never_removes_what_it_did_not_write(ft_model, tmp_path, refused) -> None:
    out = tmp_path / "mixed"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "old-run").mkdir()
    refused(["export", str(ft_model), "--out", str(out)], "--force", "notes.txt")
    refused(["export", str(ft_model), "--out", str(out), "--force"], "notes.txt", "never replaces")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "old-run"]
    assert (out / "notes.txt").read_text() == "mine"


def test_embed_and_index_take_the_directory_lock(pretrained_run, tmp_path, refused) -> None:
    """A second writer on the same --out (here: this test holding the lock) is refused with one line instead
    of truncating the first one's memory-mapped file under it."""
    from cramkit.io import dir_lock

    docs = tmp_path / "docs.txt"
    docs.write_text("\n\n".join(f"document {i} about topic {i % 7} and more words" for i in range(40)))
    emb, idx = tmp_path / "emb", tmp_path / "idx"
    with dir_lock(emb):
        refused(["embed", str(docs), "--from", str(pretrained_run), "--out", str(emb)], "in use")
    with dir_lock(idx):
        build = ["index", "build", str(docs), "--encoder", str(pretrained_run), "--out", str(idx)]
        refused([*build, "--device", "cpu"], "in use")
    assert main([*build, "--device", "cpu"]) == 0
    with dir_lock(idx):
        refused(["index", "add", str(idx), str(docs), "--device", "cpu"], "in use")


@pytest.mark.integration
def test_rerun_cleans_what_a_killed_export_left(ft_model, tmp_path) -> None:
    """kill -9 during `export --format onnx` leaves its temporary directory; the same command again removes
    it (and those of other killed writers: a predictions file's, an HF export's)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "onnx"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "cramkit", "export", str(ft_model), "--format", "onnx", "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".onnx.tmp-*")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list(tmp_path.glob(".onnx.tmp-*")), "the export was not caught mid-way"
    dead = proc.pid  # other writers killed the same way, with the names they use
    (tmp_path / f".hf.tmp-{dead}-x1y2z3").mkdir()
    (tmp_path / f".hf.old-{dead}").mkdir()
    (tmp_path / f".p.jsonl.tmp-{dead}").write_text("half")
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    assert subprocess.run([*cmd[:5], "--out", str(tmp_path / "hf")], env=env, capture_output=True).returncode == 0
    rows = tmp_path / "rows.txt"
    rows.write_text("fine\n")
    assert main(["predict", "--from", str(ft_model), str(rows), "--out", str(tmp_path / "p.jsonl")]) == 0
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert left == [], left


def test_export_force_never_deletes_a_run_or_a_folder_of_runs(ft_model, pretrained_run, tmp_path, refused) -> None:
    """--force replaces a folder of other files, never a run, a model or an index, nor a folder holding one."""
    import shutil

    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copytree(pretrained_run, runs / "mine")
    before = _digest(runs)
    refused(["export", str(ft_model), "--out", str(runs), "--force"], "mine/, a pretraining run", "never replaces")
    refused(["export", str(ft_model), "--out", str(runs / "mine"), "--force"], "a pretraining run", "never replaces")
    assert _digest(runs) == before
