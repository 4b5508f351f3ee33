"""Single-process checks of the parallel layer: launcher command lines, safe checkpoint metadata,
consolidation of a sharded checkpoint, gradient-sync control, clear errors."""

from __future__ import annotations

import sys

import pytest
import torch

from cramkit.errors import CramkitError
from cramkit.model.encoder import ModelConfig
from cramkit.model.heads import MaskedLM
from cramkit.train import distributed as D
from cramkit.train import parallel as P
from cramkit.train.launch import torchrun_command

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_torchrun_command_lines():
    one = torchrun_command(4, ["pretrain", "--out", "r"])
    assert one[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in one and one[one.index("--nproc_per_node") + 1] == "4"
    assert one[-5:] == ["-m", "cramkit", "pretrain", "--out", "r"]
    two = torchrun_command(2, ["pretrain"], nnodes=2, node_rank=1, rdzv_endpoint="host0:29400")
    assert "--standalone" not in two
    for flag, value in [("--nnodes", "2"), ("--rdzv_backend", "c10d"), ("--rdzv_endpoint", "host0:29400")]:
        assert two[two.index(flag) + 1] == value
    with pytest.raises(CramkitError, match="--rdzv-endpoint"):
        torchrun_command(2, ["pretrain"], nnodes=2)
    with pytest.raises(CramkitError, match="--node-rank"):
        torchrun_command(2, ["pretrain"], nnodes=2, node_rank=2, rdzv_endpoint="h:1")
    with pytest.raises(CramkitError, match="--nproc"):
        torchrun_command(0, ["pretrain"])


def _tiny() -> tuple[MaskedLM, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = MaskedLM(ModelConfig(vocab_size=64, hidden=16, layers=2, heads=2, intermediate=32, max_position=8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(5, 64, (2, 8))
    model(ids, ids).loss.backward()
    opt.step()
    return model, opt


def test_single_process_needs_no_process_group():
    ctx = D.init_distributed("cpu")
    assert (ctx.world, ctx.rank, ctx.is_main, ctx.distributed) == (1, 0, True, False)
    model, _ = _tiny()
    assert P.parallelize(model, D.ParallelConfig(strategy="fsdp"), ctx) is model
    with P.sync_gradients(model, False):  # a plain model has nothing to hold back
        pass
    assert float(D.all_reduce(torch.ones(()), ctx)) == 1.0
    with pytest.raises(CramkitError, match="cpu_offload"):
        P.parallelize(model, D.ParallelConfig(cpu_offload=True), ctx)
    with pytest.raises(CramkitError, match="parallel.timeout"):
        D.ParallelConfig(timeout=0).validate()


def test_tensor_parallel_settings_that_cannot_work_are_one_clear_line():
    from cramkit.train.config import resolve_config

    ctx = D.init_distributed("cpu")
    model, _ = _tiny()
    with pytest.raises(CramkitError, match="launch with --nproc 2"):
        P.parallelize(model, D.ParallelConfig(tp=2), ctx)
    with pytest.raises(CramkitError, match="parallel.cpu_offload"):
        D.ParallelConfig(tp=2, cpu_offload=True, strategy="fsdp").validate()
    heads = ["model.hidden=64", "model.heads=4", "model.intermediate=256", "model.vocab_size=1000"]
    assert resolve_config(overrides=[*heads, "parallel.tp=4"]).parallel.tp == 4
    assert resolve_config(overrides=[*heads, "parallel.tp=2", "model.vocab_size=1001"]).parallel.tp == 2
    for bad, what in [("parallel.tp=3", r"model.heads \(4\)"), ("model.intermediate=202", r"\(101\)")]:
        with pytest.raises(CramkitError, match=f"parallel.tp=.* must divide .*{what}"):
            resolve_config(overrides=[*heads, "parallel.tp=2", bad])
