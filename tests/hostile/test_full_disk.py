"""A full disk (a 1 MiB tmpfs, nearly filled, mounted in a private mount namespace): one line naming the
path and the fix, never a SIGBUS or a traceback."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # commands run on a small filesystem through a shell


def _on_full_disk(tmp_path: Path, *args: str, free_kb: int = 8, size_kb: int = 1024) -> subprocess.CompletedProcess:
    """`cramkit ARGS` with DISK (a ``size_kb`` KiB tmpfs with ``free_kb`` KiB left) mounted at tmp_path/disk."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir(exist_ok=True)
    probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "tmpfs", str(disk)], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here ({probe.stderr.decode().strip()})")
    cramkit = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "cramkit", *args])
    script = (
        f"mount -t tmpfs -o size={size_kb}k tmpfs {disk} && head -c {1024 * (size_kb - free_kb)} /dev/zero > "
        f"{disk}/filler"
        f" && exec {cramkit}"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=300)


def _one_line(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    err = [line for line in proc.stderr.splitlines() if line.startswith("cramkit: error:")]
    assert len(err) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for needle in needles:
        assert needle.lower() in err[0].lower(), err[0]


def test_embed_and_index_build_on_a_full_disk(pretrained_run, tmp_path) -> None:
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(f"line {i} about topic {i % 7} and more words" for i in range(200)))
    out = tmp_path / "disk" / "emb"
    proc = _on_full_disk(tmp_path, "embed", str(docs), "--from", str(pretrained_run), "--out", str(out))
    _one_line(proc, "embeddings.npy", "no space left")
    idx = tmp_path / "disk" / "idx"
    proc = _on_full_disk(
        tmp_path,
        "index",
        "build",
        str(docs),
        "--encoder",
        str(pretrained_run),
        "--out",
        str(idx),
        "--chunk-tokens",
        "16",
        "--overlap",
        "0",
        "--device",
        "cpu",
    )
    _one_line(proc, "no space left")


def test_export_on_a_full_disk(ft_model, tmp_path) -> None:
    for fmt in ("hf", "onnx"):
        out = tmp_path / "disk" / fmt
        proc = _on_full_disk(tmp_path, "export", str(ft_model), "--format", fmt, "--out", str(out), free_kb=64)
        _one_line(proc, "no space left", "free space")


def test_finetune_and_distill_on_a_full_disk(ft_model, pretrained_run, glue_dir, tmp_path) -> None:
    from infer.models import sst2

    train = tmp_path / "train.tsv"
    rows = sst2(glue_dir, "train")[:40]
    train.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows), encoding="utf-8")
    common = ("--train", str(train), "--text-a", "sentence", "--no-progress")
    proc = _on_full_disk(
        tmp_path,
        "finetune",
        "--from",
        str(pretrained_run),
        *common,
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--out",
        str(tmp_path / "disk" / "ft"),
        free_kb=4,
    )
    _one_line(proc, "no space left")
    proc = _on_full_disk(
        tmp_path,
        "distill",
        "--teacher",
        str(ft_model),
        "--student",
        "bilstm",
        *common,
        "--dev",
        str(train),
        "--set",
        "p_pos=0",
        "--out",
        str(tmp_path / "disk" / "st"),
        free_kb=4,
    )
    _one_line(proc, "no space left")


def test_continued_pretraining_on_a_full_disk_says_so(minilm_dir, tmp_path) -> None:
    """The first checkpoint of `pretrain --from` does not fit: the line says the disk is full, and (no checkpoint
    exists yet) to run the same command again, not --resume."""
    out = tmp_path / "disk" / "run"
    args = ["pretrain", "--from", f"hf:{minilm_dir}", "--budget", "2steps", "--out", str(out), "--no-progress"]
    args += ["--set", "train.micro_batch=2", "--set", "train.batch_size=2"]
    proc = _on_full_disk(tmp_path, *args, free_kb=20 * 1024, size_kb=20 * 1024)
    _one_line(proc, "could not write a checkpoint", "disk is full", "run the same command again")
    assert "--resume" not in proc.stderr


def test_milvus_lite_export_on_a_full_disk(pretrained_run, tmp_path) -> None:
    """Milvus Lite fills the disk while the rows go in: cramkit's one line and nothing else (the library's
    logged tracebacks are kept from the terminal), at two points (the first write, the inserts)."""
    pytest.importorskip("milvus_lite")
    from clirun import cli

    docs = tmp_path / "docs.txt"
    docs.write_text("\n\n".join(f"document {i} about topic {i % 7} and several more words" for i in range(30)))
    idx = tmp_path / "idx"
    assert cli("index", "build", docs, "--encoder", pretrained_run, "--out", idx, "--device", "cpu").returncode == 0
    for free_kb in (8, 1):
        proc = _on_full_disk(
            tmp_path, "index", "export", str(idx), "--to", "milvus", "--uri", str(tmp_path / "disk" / "v.db"),
            free_kb=free_kb,
        )  # fmt: skip
        _one_line(proc, "no space left", "free space")
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
