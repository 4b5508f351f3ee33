"""Helpers for the multi-process tests: torchrun subprocesses on CPU (gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
TOY = HERE / "toy_train.py"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", TORCH_CPP_LOG_LEVEL="ERROR")
    return env


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
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


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
