"""cramkit.runtime: the one rule for device and precision, and torchrun's facts."""

from __future__ import annotations

import pytest
import torch

from cramkit import runtime
from cramkit.errors import CramkitError

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_precision_rule() -> None:
    assert runtime.resolve_precision("auto", CPU) == "fp32"
    assert runtime.resolve_precision("auto", CUDA) == "bf16"
    assert runtime.resolve_precision("bf16", CPU) == "bf16"
    assert runtime.resolve_precision("fp16", CUDA) == "fp16"
    with pytest.raises(CramkitError, match="fp16 needs a CUDA device"):
        runtime.resolve_precision("fp16", CPU)
    with pytest.raises(CramkitError, match="auto, fp32, bf16, fp16, fp8; got 'half'"):
        runtime.resolve_precision("half", CPU)


def test_autocast_follows_the_precision() -> None:
    x = torch.ones(2, 2)
    with runtime.autocast("bf16", CPU):
        assert (x @ x).dtype == torch.bfloat16
    with runtime.autocast("fp32", CPU):
        assert (x @ x).dtype == torch.float32


def test_device_names() -> None:
    assert runtime.resolve_device("cpu") == CPU
    assert runtime.resolve_device("auto") == runtime.resolve_device(None)
    with pytest.raises(CramkitError, match="unknown device 'gpu0'"):
        runtime.resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(CramkitError, match="CUDA is not available here"):
            runtime.resolve_device("cuda:1")


def test_torchrun_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    assert runtime.torchrun() == runtime.Torchrun(0, 0, 1) and runtime.torchrun().is_main
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(CramkitError, match="RANK/MASTER_ADDR are not"):
        runtime.torchrun()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    job = runtime.torchrun()
    assert (job.rank, job.local_rank, job.world, job.is_main) == (3, 1, 4, False)
    assert runtime.cpu_cores() >= 1
