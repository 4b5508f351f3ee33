"""DDP / FSDP2 and sharded checkpoints on a tiny MaskedLM with synthetic batches (2 processes, gloo).

The parallel layer alone, without the trainer: the same checks through `cramkit pretrain` are in
test_pretrain_parallel.py, so only the mid-write kill runs by default here (the rest: -m slow).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

from cramkit.train import checkpoint as dcp

from .conftest import TOY, _env, torchrun, toy

pytestmark = pytest.mark.dist


def _close(a: dict[int, float], b: dict[int, float], tol: float = 1e-5) -> None:
    assert sorted(a) == sorted(b)
    for step in a:
        assert abs(a[step] - b[step]) <= tol * max(1.0, abs(a[step])), (step, a[step], b[step])


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_follow_the_one_process_curve(tmp_path, toy_reference, strategy):
    losses = toy(2, tmp_path, "--steps", "6", "--strategy", strategy)
    _close(losses, toy_reference)
    assert losses[5] < losses[0]  # and it learns


@pytest.mark.slow
def test_resume_fsdp_two_processes_on_one(tmp_path, toy_reference):
    toy(2, tmp_path, "--steps", "3", "--save-every", "3", "--strategy", "fsdp")
    ckpt = dcp.find_latest(tmp_path)
    assert ckpt is not None and ckpt.name == "step-000003"
    assert {p.name for p in ckpt.iterdir()} >= {
        "metadata.json",
        "model.safetensors",
        "__0_0.distcp",
        "__1_0.distcp",
        dcp.STATE_FILE,
    }
    resumed = toy(1, tmp_path, "--steps", "6", "--resume")
    _close(resumed, {s: v for s, v in toy_reference.items() if s >= 3})


@pytest.mark.slow
def test_resume_one_process_on_two(tmp_path, toy_reference):
    toy(1, tmp_path, "--steps", "3", "--save-every", "3", "--sync-save")
    resumed = toy(2, tmp_path, "--steps", "6", "--resume", "--strategy", "fsdp")
    _close(resumed, {s: v for s, v in toy_reference.items() if s >= 3})


def test_checkpoint_killed_mid_write_is_never_chosen(tmp_path, toy_reference):
    # a complete checkpoint at step 3, then a process killed while the step-6 shards are being written
    toy(1, tmp_path, "--steps", "3", "--save-every", "3")
    script = f"""
import os, sys, time
import torch.distributed.checkpoint.filesystem as fs
slow = fs.FileSystemWriter.write_data
def write_data(self, plan, planner):
    time.sleep(0.5)  # the background write is under way ...
    os._exit(9)      # ... when the process dies
fs.FileSystemWriter.write_data = write_data
sys.argv = ["toy", "--out", {str(tmp_path)!r}, "--resume", "--steps", "6", "--save-every", "3"]
exec(open({str(TOY)!r}).read())
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=_env())
    assert proc.returncode == 9, proc.stderr[-3000:]
    root = tmp_path / "checkpoints"
    assert (root / "step-000006.tmp").is_dir() and not (root / "step-000006").exists()
    assert (root / "latest").read_text().strip() == "step-000003"
    # a torn pointer (naming the unfinished checkpoint) is not trusted either
    (root / "latest").write_text("step-000006\n")
    (root / "step-000009").mkdir()  # a directory without metadata is no checkpoint
    assert dcp.find_latest(tmp_path) == root / "step-000003"
    resumed = toy(1, tmp_path, "--steps", "6", "--resume")
    _close(resumed, {s: v for s, v in toy_reference.items() if s >= 3})
    shutil.rmtree(root / "step-000009")
    assert not (root / "step-000006.tmp").exists()  # stale .tmp directories are cleaned at the next start


@pytest.mark.slow
def test_a_dead_rank_ends_the_job_quickly(tmp_path):
    t0 = time.perf_counter()
    proc = torchrun(2, [str(TOY), "--out", str(tmp_path), "--steps", "50", "--die-at", "2", "--timeout", "20"])
    took = time.perf_counter() - t0
    assert proc.returncode != 0
    assert took < 40, f"the surviving rank hung for {took:.0f}s"
    err = proc.stdout + proc.stderr
    assert "exitcode  : 3" in err and "rank      : 1" in err  # torchrun names the rank that died


@pytest.mark.slow
def test_a_hung_rank_times_out_with_a_message(tmp_path):
    t0 = time.perf_counter()
    proc = torchrun(2, [str(TOY), "--out", str(tmp_path), "--steps", "50", "--hang-at", "2", "--timeout", "8"])
    took = time.perf_counter() - t0
    assert proc.returncode != 0 and took < 60, took
    err = proc.stdout + proc.stderr
    assert "rank 0/2: lost contact with the other ranks" in err and "Timed out" in err
