"""Single-process checks of the parallel layer: launcher command lines, safe checkpoint metadata,
consolidation of a sharded checkpoint, gradient-sync control, clear errors."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest
import torch

from cramkit.errors import CramkitError
from cramkit.model.encoder import ModelConfig
from cramkit.model.heads import MaskedLM
from cramkit.train import dcp
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
    model = MaskedLM(
        ModelConfig(vocab_size=64, hidden=16, layers=2, heads=2, intermediate=32, max_position=8)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(5, 64, (2, 8))
    model(ids, ids).loss.backward()
    opt.step()
    return model, opt


def test_sharded_checkpoint_roundtrip_and_consolidate(tmp_path: Path):
    model, opt = _tiny()
    writer = dcp.ShardedCheckpointer(tmp_path / "checkpoints", P.DistContext(), keep=1)
    writer.save(1, model, opt, {"next": 1})
    writer.save(2, model, opt, {"next": 2})  # waits for the first, then keeps only the newest
    writer.close()
    root = tmp_path / "checkpoints"
    assert [p.name for p in root.iterdir() if p.is_dir()] == ["step-000002"]
    assert (root / "latest").read_text().strip() == "step-000002"
    # consolidated: one safetensors file with every weight (tied ones under both names)
    from safetensors.torch import load_file

    out = dcp.consolidate(tmp_path, tmp_path / "export")
    weights = load_file(str(out))
    assert out.name == "model.safetensors" and set(weights) == set(model.state_dict())
    for name, tensor in model.state_dict().items():
        assert torch.equal(weights[name], tensor), name
    # and back into a fresh model + optimizer: identical state, and the trainer state returned
    fresh, fresh_opt = _tiny()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    assert dcp.load(tmp_path, fresh, fresh_opt) == {"next": 2}
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    sa, sb = opt.state_dict(), fresh_opt.state_dict()
    assert sb["param_groups"][0]["betas"] == sa["param_groups"][0]["betas"]
    for pid, state in sa["state"].items():
        assert torch.equal(state["exp_avg_sq"], sb["state"][pid]["exp_avg_sq"])


def test_checkpoint_metadata_cannot_run_code(tmp_path: Path):
    model, opt = _tiny()
    writer = dcp.ShardedCheckpointer(tmp_path, P.DistContext(), async_save=False)
    ckpt = writer.save(5, model, opt)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (ckpt / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CramkitError, match="not a valid cramkit checkpoint"):
        dcp.load_model_state(ckpt)


def test_missing_and_incomplete_checkpoints_are_clear_errors(tmp_path: Path):
    with pytest.raises(CramkitError, match="no complete sharded checkpoint"):
        dcp.load_model_state(tmp_path)
    (tmp_path / "step-000003.tmp").mkdir()
    with pytest.raises(CramkitError, match="incomplete checkpoint"):
        dcp.resolve_checkpoint(tmp_path / "step-000003.tmp")


def test_single_process_needs_no_process_group():
    ctx = P.init_distributed("cpu")
    assert (ctx.world, ctx.rank, ctx.is_main, ctx.distributed) == (1, 0, True, False)
    model, _ = _tiny()
    assert P.apply_parallel(model, P.ParallelConfig(strategy="fsdp"), ctx) is model
    with P.sync_gradients(model, False):  # a plain model has nothing to hold back
        pass
    assert float(P.all_reduce(torch.ones(()), ctx)) == 1.0
    with pytest.raises(CramkitError, match="cpu_offload"):
        P.apply_parallel(model, P.ParallelConfig(cpu_offload=True), ctx)
    with pytest.raises(CramkitError, match="parallel.timeout"):
        P.ParallelConfig(timeout=0).validate()
