"""A mixture-of-experts model on 2 processes (torchrun, gloo, CPU): DDP and FSDP2 follow the single-process
loss curve (each micro-batch is routed on its own, so the split of the global batch does not change it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_pretrain_parallel import _close, pretrain, store  # noqa: F401  # store: a fixture

pytestmark = pytest.mark.dist

MOE = ["--set", "model.moe_experts=4", "--set", "model.moe_top_k=2", "--set", "model.moe_every=1"]


def test_moe_ddp_and_fsdp_follow_one_process(store: Path, tmp_path: Path) -> None:  # noqa: F811
    one = pretrain(1, store, tmp_path / "one", *MOE)
    assert one[max(one)] < one[1]
    _close(pretrain(2, store, tmp_path / "ddp", *MOE), one)
    _close(pretrain(2, store, tmp_path / "fsdp", *MOE, "--set", "parallel.strategy=fsdp"), one)
