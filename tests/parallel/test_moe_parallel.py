"""A mixture-of-experts model on 2 processes (torchrun, gloo, CPU): DDP and FSDP2 follow the single-process
loss curve (each micro-batch is routed on its own, so the split of the global batch does not change it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .test_pretrain_parallel import _close, _rewind, cramkit, losses, pretrain, store  # noqa: F401  # store: a fixture

pytestmark = pytest.mark.dist

MOE = ["--set", "model.moe_experts=4", "--set", "model.moe_top_k=2", "--set", "model.moe_every=1"]


def test_moe_ddp_and_fsdp_follow_one_process(store: Path, tmp_path: Path) -> None:  # noqa: F811
    one = pretrain(1, store, tmp_path / "one", *MOE)
    assert one[max(one)] < one[1]
    _close(pretrain(2, store, tmp_path / "ddp", *MOE), one)
    _close(pretrain(2, store, tmp_path / "fsdp", *MOE, "--set", "parallel.strategy=fsdp"), one)


def test_expert_parallel_follows_one_process_and_resumes_on_one(store: Path, tmp_path: Path) -> None:  # noqa: F811
    # parallel.ep=2: each rank holds 2 of the 4 experts of every MoE layer, tokens exchanged by all-to-all (gloo)
    one = pretrain(1, store, tmp_path / "one", *MOE)
    run = tmp_path / "ep2"
    _close(pretrain(2, store, run, *MOE, "--set", "parallel.ep=2"), one)
    # the checkpoint holds every expert under its full name: resumed on one process (ep=1) from step 3
    _rewind(run, 3)
    cramkit(1, "pretrain", "--resume", str(run), "--set", "parallel.ep=1")
    _close(losses(run), one)
    # and 1 -> 2: the single-process step-3 checkpoint resumed with each rank holding half of the experts
    again = tmp_path / "one-to-ep2"
    shutil.copytree(tmp_path / "one", again)
    _rewind(again, 3)
    cramkit(2, "pretrain", "--resume", str(again), "--set", "parallel.ep=2", launcher="nproc")
    _close(losses(again), one)


def test_expert_parallel_refusals(store: Path, tmp_path: Path) -> None:  # noqa: F811
    from .test_pipeline_parallel import _refused

    line = _refused(1, store, tmp_path, "model.moe_experts=4", "parallel.ep=3")
    assert "must divide model.moe_experts (4)" in line
    assert "the model has none" in _refused(1, store, tmp_path, "parallel.ep=2")
    line = _refused(4, store, tmp_path, "model.moe_experts=4", "parallel.ep=2")
    assert "there are 4" in line and "--nproc 2" in line
