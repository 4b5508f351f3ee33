"""`cramkit pretrain` on 2 processes (torchrun, gloo, CPU) against 1, on a real token store (WikiText-2).

One uninterrupted single-process run is the reference; DDP and FSDP2 runs of the same global batch
must follow its loss curve; runs resumed on another world size (2 -> 1, 1 -> 2) must continue it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cramkit.train import checkpoint as dcp
from cramkit.train.metrics import read_metrics

from .conftest import _env, run_job

pytestmark = pytest.mark.dist

TINY = [
    "model.hidden=64",
    "model.layers=2",
    "model.heads=2",
    "model.intermediate=128",
    "data.seq_len=64",
    "data.validation_fraction=0.05",
    "train.micro_batch=4",
    "train.batch_size=16",
    "train.batch_ramp=0",
    "train.eval_batches=2",
    "train.eval_every=never",
    "train.log_every=1",
    "train.progress=false",
    "train.threads=1",
    "train.lr=3e-3",
    "train.checkpoint_every=3steps",
    "train.keep_checkpoints=3",
]
STEPS = 6


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, wikitext_dir: Path) -> Path:
    from cramkit.data.build import build_store
    from cramkit.text.sources import iter_documents
    from cramkit.text.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("pstore")
    files = [str(wikitext_dir / "wiki.test.tokens")]
    tok = train_tokenizer(iter_documents(files), 1000)
    build_store(files, tok, root / "store", name="train", workers=1)
    return root / "store"


def cramkit(nproc: int, *args: str, launcher: str = "torchrun", timeout: float = 180) -> subprocess.CompletedProcess:
    if nproc == 1:
        cmd = [sys.executable, "-m", "cramkit", *args]
    elif launcher == "torchrun":
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            "-m",
            "cramkit",
            *args,
        ]
    else:
        cmd = [sys.executable, "-m", "cramkit", *args, "--nproc", str(nproc)]
    proc = run_job(cmd, timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    )
    return proc


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run) if "loss" in r}


def _close(a: dict[int, float], b: dict[int, float], tol: float = 2e-5) -> None:
    assert sorted(a) == sorted(b)
    for step in a:
        assert abs(a[step] - b[step]) <= tol * max(1.0, abs(a[step])), (step, a[step], b[step])


def pretrain(nproc: int, store: Path, run: Path, *extra: str, launcher: str = "torchrun") -> dict[int, float]:
    sets = [x for s in TINY for x in ("--set", s)]
    cramkit(
        nproc,
        "pretrain",
        str(store),
        "--out",
        str(run),
        "--budget",
        f"{STEPS}steps",
        *sets,
        *extra,
        launcher=launcher,
    )
    return losses(run)


@pytest.fixture(scope="module")
def reference(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("ref") / "run"
    curve = pretrain(1, store, run)
    assert sorted(curve) == list(range(1, STEPS + 1)) and curve[STEPS] < curve[1]
    return run


def _rewind(run: Path, step: int) -> None:
    """Pretend the run died right after checkpoint ``step``: later checkpoints never happened."""
    root = run / "checkpoints"
    for ckpt in root.glob("step-*"):
        if int(ckpt.name.split("-")[1].split(".")[0]) > step:
            shutil.rmtree(ckpt)
    (root / "latest").write_text(f"step-{step:06d}\n")


def test_ddp_two_processes_follow_one_and_resume_on_one(store, reference, tmp_path):
    run = tmp_path / "ddp"
    _close(pretrain(2, store, run), losses(reference))
    # two processes write sharded checkpoints (DCP): each rank its part, then metadata
    ckpt = dcp.find_latest(run)
    assert ckpt.name == f"step-{STEPS:06d}" and (ckpt / "metadata.json").is_file()
    assert dcp.read_state(ckpt)["trainer"]["world"] == 2
    # consolidated into one safetensors file, the weights equal the single-process run's
    from safetensors.torch import load_file

    ref = load_file(str(reference / "checkpoints" / f"step-{STEPS:06d}" / "model.safetensors"))
    full = load_file(str(dcp.consolidate(run, tmp_path / "consolidated")))
    assert set(ref) <= set(full)
    assert max(float((full[k] - ref[k]).abs().max()) for k in ref) < 1e-4
    # and `cramkit export` reads the sharded checkpoint directly
    from cramkit.cli import main as cli_main

    assert cli_main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert len(exported) >= len(ref) - 1
    # 2 -> 1: resume the sharded step-3 checkpoint on one process; it continues the reference curve
    _rewind(run, 3)
    cramkit(1, "pretrain", "--resume", str(run))
    _close(losses(run), losses(reference))


def test_fsdp_through_nproc_from_a_single_process_checkpoint(store, reference, tmp_path):
    # 1 -> 2: the reference's single-file step-3 checkpoint resumed by two FSDP2 processes
    run = tmp_path / "resumed"
    shutil.copytree(reference, run)
    _rewind(run, 3)
    cramkit(2, "pretrain", "--resume", str(run), "--set", "parallel.strategy=fsdp", launcher="nproc")
    _close(losses(run), losses(reference))
    assert (dcp.find_latest(run) / "__1_0.distcp").is_file()
    # and a fresh FSDP2 run started with --nproc follows the single-process curve
    fresh = tmp_path / "fsdp"
    _close(pretrain(2, store, fresh, "--set", "parallel.strategy=fsdp", launcher="nproc"), losses(reference))


def test_a_killed_rank_stops_the_job_with_a_message(store, tmp_path):
    run = tmp_path / "killed"
    sets = [x for s in TINY for x in ("--set", s)]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "cramkit",
        "pretrain",
        str(store),
        "--out",
        str(run),
        "--budget",
        "100000steps",
        *sets,
        "--set",
        "parallel.timeout=30",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    try:
        deadline = time.time() + 120
        while not (run / "metrics.jsonl").is_file() or len(read_metrics(run)) < 4:
            assert proc.poll() is None and time.time() < deadline, "the run did not start"
            time.sleep(0.3)
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) == 2
        os.kill(int(workers[-1]), signal.SIGKILL)
        t0 = time.time()
        output, _ = proc.communicate(timeout=60)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and took < 45, took
    assert "Signal 9 (SIGKILL)" in output or "exitcode  : -9" in output  # torchrun names the dead worker
    # the surviving rank says what happened and how to go on (whether it noticed the lost peer itself
    # or was stopped by torchrun first), instead of hanging
    said = "lost contact with the other ranks" in output or "rank 0/2: stopped by SIGTERM" in output
    assert said and "cramkit pretrain --resume" in output, output[-3000:]
