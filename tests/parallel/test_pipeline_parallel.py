"""Pipeline parallelism (``parallel.pp``) through `cramkit pretrain` on CPU processes (torchrun, gloo) against one
process, on a real token store (WikiText-2): the same loss curve, checkpoints that resume on another pipeline
degree (2 -> 1 and 1 -> 2), and one line for the settings it refuses."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cramkit.train import checkpoint as dcp
from cramkit.train.metrics import read_metrics

from .conftest import _env
from .test_pretrain_parallel import TINY, _close, _rewind, cramkit, losses, pretrain, reference, store  # noqa: F401

pytestmark = pytest.mark.dist


def val_losses(run: Path) -> dict[int, float]:
    found = {r["step"]: r["val_loss"] for r in read_metrics(run) if "val_loss" in r}
    assert found
    return found


@pytest.mark.slow
def test_pp2_by_dp2_on_four_processes(store, reference, tmp_path):  # noqa: F811
    # a 2-D ("dp", "pp") mesh: two pipelines of two stages, each reading half of every global batch
    run = tmp_path / "pp2dp2"
    _close(pretrain(4, store, run, "--set", "parallel.pp=2"), losses(reference))
    # (its validation loss is over other batches: train.eval_batches is per data-parallel rank)
    assert (dcp.find_latest(run) / "__3_0.distcp").is_file()


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pp2_follows_one_process_and_resumes_on_one(store, reference, tmp_path, schedule):  # noqa: F811
    run = tmp_path / "pp2"
    # two stages (one block each; the embeddings with the first, the head and loss on the last), the 4 micro-batches
    # of each step through the schedule: the single-process curve (same seed, same batches)
    curve = pretrain(2, store, run, "--set", "parallel.pp=2", "--set", f"parallel.pp_schedule={schedule}")
    _close(curve, losses(reference))
    # the final evaluation (forward only, stage to stage): the single-process validation loss, on every rank
    _close(val_losses(run), val_losses(reference))
    # the checkpoint is the whole model under its full names (each stage wrote its part, the tied embedding once)
    ckpt = dcp.find_latest(run)
    from safetensors.torch import load_file

    ref = load_file(str(reference / "checkpoints" / ckpt.name / "model.safetensors"))
    full = load_file(str(ckpt / "model.safetensors"))
    assert set(full) == set(ref)
    assert max(float((full[k] - ref[k]).abs().max()) for k in ref) < 1e-4
    if schedule == "gpipe":
        return
    # pp=2 -> 1: the step-3 checkpoint resumed on one process continues the single-process curve
    _rewind(run, 3)
    cramkit(1, "pretrain", "--resume", str(run), "--set", "parallel.pp=1")
    _close(losses(run), losses(reference))


def test_pp2_with_document_masks_follows_one_process(store, tmp_path):  # noqa: F811
    # data.doc_mask: the documents' segments cross the stages with the labels; each stage builds its attention
    # masks from them (the last block's for its masked-position queries only)
    doc = ("--set", "data.doc_mask=true")
    one = pretrain(1, store, tmp_path / "one", *doc)
    _close(pretrain(2, store, tmp_path / "pp2", *doc, "--set", "parallel.pp=2"), one)
    _close(val_losses(tmp_path / "pp2"), val_losses(tmp_path / "one"))


def test_interleaved_schedule_follows_one_process_and_resumes_on_one(store, tmp_path):  # noqa: F811
    # four blocks in four stages on two processes (Megatron's interleaving, looped: rank 0 holds stages 0 and
    # 2, rank 1 stages 1 and 3, the embeddings on the first and the head on the last), each step's 4
    # micro-batches through torch's interleaved 1F1B schedule: the single-process curve
    four = ("--set", "model.layers=4")
    one = pretrain(1, store, tmp_path / "one", *four)
    run = tmp_path / "inter"
    _close(pretrain(2, store, run, *four, "--set", "parallel.pp=2", "--set", "parallel.pp_schedule=interleaved"), one)
    # evaluation goes round the two ranks twice (stage to stage)
    _close(val_losses(run), val_losses(tmp_path / "one"))
    # the checkpoint is the whole model: resumed on one process, it continues the single-process curve
    _rewind(run, 3)
    cramkit(1, "pretrain", "--resume", str(run), "--set", "parallel.pp=1", "--set", "parallel.pp_schedule=1f1b")
    _close(losses(run), one)


def test_pp2_checkpoint_resumes_on_tp2_and_an_impossible_degree_is_one_line(store, reference, tmp_path):  # noqa: F811
    # a pipeline checkpoint resumed with tensor parallelism: the optimizer's group settings are keyed by each
    # group's first parameter, another one in each layout (was a KeyError on every rank under ChildFailedError)
    from clirun import cli, one_line

    run = tmp_path / "pp2"
    pretrain(2, store, run, "--set", "parallel.pp=2")
    _rewind(run, 3)
    cramkit(2, "pretrain", "--resume", str(run), "--set", "parallel.pp=1", "--set", "parallel.tp=2")
    _close(losses(run), losses(reference), tol=1e-4)
    # pp=3 for a 2-layer model, under --nproc 2: one line before torchrun starts, naming the checkpoint's degrees
    line = one_line(cli("pretrain", "--resume", str(run), "--nproc", "2", "--set", "parallel.pp=3"), "parallel.pp=3")
    assert "written with parallel.pp=1, parallel.tp=2" in line and "on 2 processes" in line, line
    assert "a resume may change parallel.pp, parallel.tp" in line


def test_pp2_with_fsdp_follows_one_process(store, reference, tmp_path):  # noqa: F811
    # FSDP2 inside the pipeline: each stage sharded as a root of its own (its blocks one by one) over the
    # data-parallel ranks (here one: the DTensor path with its gradient sync, tied copies and clipping)
    run = tmp_path / "ppfsdp"
    _close(pretrain(2, store, run, "--set", "parallel.pp=2", "--set", "parallel.strategy=fsdp"), losses(reference))
    _close(val_losses(run), val_losses(reference))
    # its checkpoint (DTensor shards) resumes on one process
    _rewind(run, 3)
    cramkit(1, "pretrain", "--resume", str(run), "--set", "parallel.pp=1", "--set", "parallel.strategy=ddp")
    _close(losses(run), losses(reference))


@pytest.mark.slow
def test_pp2_by_tp2_on_four_processes(store, reference, tmp_path):  # noqa: F811
    # a ("dp", "pp", "tp") mesh of 1 x 2 x 2: each stage's blocks split over two tensor-parallel ranks
    run = tmp_path / "pptp"
    _close(pretrain(4, store, run, "--set", "parallel.pp=2", "--set", "parallel.tp=2"), losses(reference))
    _close(val_losses(run), val_losses(reference))


@pytest.mark.slow
def test_3d_mesh_on_eight_processes(store, reference, tmp_path):  # noqa: F811
    # dp 2 x pp 2 x tp 2, FSDP2 over the data-parallel ranks: the single-process curve
    run = tmp_path / "3d"
    sets = ("--set", "parallel.pp=2", "--set", "parallel.tp=2", "--set", "parallel.strategy=fsdp")
    _close(pretrain(8, store, run, *sets), losses(reference))
    # and it resumes on one process
    _rewind(run, 3)
    cramkit(1, "pretrain", "--resume", str(run), "--set", "parallel.pp=1", "--set", "parallel.tp=1")
    _close(losses(run), losses(reference))


def test_one_process_checkpoint_resumes_at_pp2(store, reference, tmp_path):  # noqa: F811
    run = tmp_path / "resumed"
    shutil.copytree(reference, run)
    _rewind(run, 3)
    cramkit(2, "pretrain", "--resume", str(run), "--set", "parallel.pp=2", launcher="nproc")
    _close(losses(run), losses(reference))


def _refused(nproc: int, store: Path, tmp_path: Path, *sets: str) -> str:  # noqa: F811
    args = ["pretrain", str(store), "--out", str(tmp_path / "r"), "--budget", "2steps"]
    args += [x for s in (*TINY, *sets) for x in ("--set", s)]
    if nproc > 1:  # cramkit's own launcher: the settings are checked before any process starts
        args += ["--nproc", str(nproc)]
    proc = subprocess.run(
        [sys.executable, "-m", "cramkit", *args], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cramkit: error: parallel."), proc.stderr[-3000:]
    return lines[0]


def test_refusals(store, tmp_path):  # noqa: F811
    # pp not dividing the layers: at configuration time, before any process group
    line = _refused(1, store, tmp_path, "parallel.pp=3")
    assert "must divide model.layers (2)" in line
    # pp on one process
    line = _refused(1, store, tmp_path, "parallel.pp=2")
    assert "this is one process" in line and "--nproc 2" in line
    # pp x tp not dividing the processes (a 3-D mesh needs a multiple of pp x tp)
    line = _refused(2, store, tmp_path, "parallel.pp=2", "parallel.tp=2")
    assert "must divide the number of processes (2)" in line and "multiple of 4" in line
    # interleaving: stages per process that do not divide the layers, or that the schedule cannot run
    line = _refused(2, store, tmp_path, "parallel.pp=2", "parallel.pp_schedule=interleaved")
    assert "into 4 stages (2 processes x 2 stages each)" in line and "model.layers (2)" in line
    line = _refused(2, store, tmp_path, "parallel.pp=2", "parallel.pp_virtual=2")
    assert "needs parallel.pp_schedule=interleaved" in line
    line = _refused(2, store, tmp_path, "parallel.pp=2", "parallel.pp_schedule=interleaved", "parallel.pp_virtual=1")
    assert "at least 2 stages per process" in line
    # pipelining keeps a stage's parameters on its device
    sets = ("parallel.pp=2", "parallel.strategy=fsdp", "parallel.cpu_offload=true")
    assert "cpu_offload" in _refused(2, store, tmp_path, *sets)
    # pp not dividing the processes (3 processes, two stages)
    line = _refused(3, store, tmp_path, "parallel.pp=2")
    assert "must divide the number of processes (3)" in line
