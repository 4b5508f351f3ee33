"""Helpers for the multi-process tests: torchrun subprocesses on CPU (gloo)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

HERE = Path(__file__).parent
TOY = HERE / "toy_train.py"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # PYTHONFAULTHANDLER: a process sent SIGABRT prints every thread's Python stack (see _abort)
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", TORCH_CPP_LOG_LEVEL="ERROR", PYTHONFAULTHANDLER="1")
    return env


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for t in tasks:
        with contextlib.suppress(OSError):
            kids += [int(k) for k in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    return kids


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _abort(proc: subprocess.Popen) -> tuple[str, str]:
    """End a hung torchrun job and return its output with the stacks: the workers (in sessions of their own,
    so a plain kill of the launcher would leave them running) get SIGABRT (faulthandler prints where each
    thread stood), then the launcher, then whatever is left SIGKILL."""
    workers = _children(proc.pid)
    _signal(workers, signal.SIGABRT)
    try:
        return proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        _signal([proc.pid], signal.SIGABRT)
        time.sleep(3)
        _signal([proc.pid, *workers, *_children(proc.pid)], signal.SIGKILL)
        return proc.communicate()


def run_job(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``cmd`` (a torchrun job, or one process) with its output; see the comment on hangs."""
    # A job that hangs past ``timeout`` is run once more: a rare hang seen once in CI (2026-11-29, a 9 s DDP
    # toy job silent for 120 s) left no trace, so its stacks are shown as a warning; a second hang fails.
    for attempt in (1, 2):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        try:
            out, err = proc.communicate(timeout=timeout)
            return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            out, err = _abort(proc)
        report = f"torchrun job hung past {timeout:.0f}s: {' '.join(cmd[-8:])}\n{out[-2000:]}\n{err[-8000:]}"
        if attempt == 2:
            raise AssertionError(report)
        warnings.warn(report + "\n(run once more)", stacklevel=2)
    raise AssertionError("unreachable")


def torchrun(nproc: int, args: list[str], *, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --standalone --nproc_per_node N args...``; nproc=1 runs plainly."""
    if nproc == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            "--max_restarts",
            "0",
            *args,
        ]
    return run_job(cmd, timeout)


def toy(nproc: int, out: Path, *extra: str, check: bool = True) -> dict[int, float]:
    """Run the toy trainer; returns rank 0's losses by step."""
    t0 = time.perf_counter()
    proc = torchrun(nproc, [str(TOY), "--out", str(out), *extra])
    if check and proc.returncode != 0:
        raise AssertionError(
            f"toy run failed ({proc.returncode}) after {time.perf_counter() - t0:.0f}s:\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    losses = json.loads((out / "losses-rank0.json").read_text())
    return {int(k): v for k, v in losses.items()}


@pytest.fixture(scope="session")
def toy_reference(tmp_path_factory) -> dict[int, float]:
    """Six steps of the toy model on one process, never interrupted."""
    return toy(1, tmp_path_factory.mktemp("toy-ref"), "--steps", "6")
