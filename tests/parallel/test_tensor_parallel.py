"""Tensor parallelism (``parallel.tp``) on CPU processes (torchrun, gloo): the same losses as one process,
checkpoints that move between degrees, the 2-D mesh tp x dp, and a TP run through the real commands.

By default only the toy model runs (tp=2 against one process over 20 steps, then resumed on one process);
the 4-process mesh and the `cramkit pretrain --nproc 2` run are ``-m slow``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable

import pytest
import torch
from safetensors.torch import load_file

from cramkit.train import checkpoint as dcp

from .conftest import toy
from .test_pretrain_parallel import _rewind, cramkit, losses, pretrain, reference, store  # noqa: F401

pytestmark = pytest.mark.dist
STEPS = 20


def _close(a: dict[int, float], b: dict[int, float], tol: float) -> None:
    assert sorted(a) == sorted(b)
    for step in a:
        assert abs(a[step] - b[step]) <= tol * abs(b[step]), (step, a[step], b[step])


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[int, float]]:
    """20 steps of the toy model (with these extra toy_train.py options) on one process, never interrupted."""
    done: dict[tuple[str, ...], dict[int, float]] = {}

    def curve(*extra: str) -> dict[int, float]:
        if extra not in done:
            done[extra] = toy(1, tmp_path_factory.mktemp("tp-ref"), "--steps", str(STEPS), *extra)
        return done[extra]

    return curve


@pytest.fixture(scope="module")
def reference20(references) -> dict[int, float]:
    return references()


def _toy_model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import MaskedLM

    model = MaskedLM(ModelConfig(vocab_size=96, hidden=32, layers=2, heads=2, intermediate=64, max_position=16))
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)


def test_tp2_follows_one_process_and_resumes_on_one(tmp_path, reference20):
    run = tmp_path / "tp2"
    # tp=2 on 2 processes: the same loss curve as 1 process (reductions in another order: within 1e-5)
    curve = toy(2, run, "--steps", str(STEPS), "--tp", "2", "--save-every", "10", "--sync-save")
    _close(curve, reference20, 1e-5)
    assert curve[STEPS - 1] < curve[0]
    ckpt = run / "checkpoints" / "step-000010"
    assert {"__0_0.distcp", "__1_0.distcp", "model.safetensors"} <= {p.name for p in ckpt.iterdir()}
    # the checkpoint is the whole model: loaded on one process (no process group), every weight and every
    # optimizer moment is exactly what the two ranks held, the per-head split Q/K/V weights included
    model, opt = _toy_model_and_optimizer()
    dcp.load(ckpt, model, opt)
    saved = load_file(str(ckpt / "model.safetensors"))
    for name, tensor in model.state_dict().items():
        if name in saved:
            assert torch.equal(tensor, saved[name]), name
    assert all(s["exp_avg"].abs().sum() > 0 for s in opt.state.values())
    # tp=2 -> tp=1: resumed on one process from step 10, it continues the uninterrupted one-process curve
    # (not bit for bit: the tp=2 steps summed partial results in another order; measured ~1e-7)
    _rewind(run, 10)
    resumed = toy(1, run, "--steps", str(STEPS), "--resume")
    _close(resumed, {s: v for s, v in reference20.items() if s >= 10}, 1e-6)


@pytest.mark.slow
def test_tp1_checkpoint_resumes_at_tp2(tmp_path, references):
    # BERT's layout (biases: the Q/K/V bias split per part too; no GLU; post-LN; learned positions) and a
    # vocabulary that tp does not divide (split 48 + 47)
    model = ("--bert", "--vocab", "95")
    expected = references(*model)
    run = tmp_path / "one"
    toy(1, run, "--steps", "10", "--save-every", "10", "--sync-save", *model)
    resumed = toy(2, run, "--steps", str(STEPS), "--resume", "--tp", "2", *model)
    _close(resumed, {s: v for s, v in expected.items() if s >= 10}, 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, model", [("fsdp", "--bert"), ("ddp", None)])
def test_tp2_by_dp2_on_four_processes(tmp_path, references, strategy, model):
    # a 2-D mesh: two tensor-parallel groups of two ranks, data parallel across the groups
    extra = (model,) if model else ()
    expected = references(*extra)
    curve = toy(
        4,
        tmp_path,
        "--steps",
        str(STEPS),
        "--tp",
        "2",
        "--strategy",
        strategy,
        "--save-every",
        "10",
        "--sync-save",
        *extra,
    )
    _close(curve, expected, 1e-5)
    # and its checkpoint (with FSDP: shards of tensor-parallel shards) resumes on one process
    _rewind(tmp_path, 10)
    resumed = toy(1, tmp_path, "--steps", str(STEPS), "--resume", *extra)
    _close(resumed, {s: v for s, v in expected.items() if s >= 10}, 1e-5)


@pytest.mark.slow
def test_pretrain_tp2_export_load_and_finetune(store, reference, tmp_path):  # noqa: F811
    import cramkit as ck
    from cramkit.cli import main as cli_main
    from cramkit.model.heads import MaskedLM
    from cramkit.train.config import build_config

    run = tmp_path / "tp"
    # `cramkit pretrain --nproc 2 --set parallel.tp=2` follows the one-process run
    _close(pretrain(2, store, run, "--set", "parallel.tp=2", launcher="nproc"), losses(reference), 2e-5)
    # its export is the full model: cramkit.load gives the logits of the whole weights in the DCP shards
    assert cli_main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    exported = ck.load(tmp_path / "hf")
    config = build_config(__import__("yaml").safe_load((run / "config.yaml").read_text()))
    whole = MaskedLM(config.model)
    whole.load_state_dict(dcp.load_model_state(run))
    ids = torch.randint(5, 1000, (2, 16))
    assert isinstance(exported.model, MaskedLM)
    with torch.no_grad():
        want, got = whole.eval()(ids).logits, exported.model.eval()(ids).logits
    assert torch.equal(got, want)
    # tp=2 -> tp=1 through the CLI: resumed from step 3 on one process, it continues the reference
    _rewind(run, 3)
    cramkit(1, "pretrain", "--resume", str(run), "--set", "parallel.tp=1")
    _close(losses(run), losses(reference), 2e-5)
    # fine-tuning starts from the TP-pretrained run like from any other
    rows = [("a fine film", "pos"), ("awful", "neg")] * 10
    data = tmp_path / "train.csv"
    with open(data, "w", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *rows])
    out = tmp_path / "ft"
    cramkit(
        1,
        "finetune",
        "--from",
        str(run),
        "--train",
        str(data),
        "--dev",
        str(data),
        "--text-a",
        "text",
        "--label",
        "label",
        "--out",
        str(out),
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--no-progress",
    )
    assert json.loads((out / "results.json").read_text())["train_examples"] == 20


def test_tp_that_does_not_divide_is_one_clear_line(store, tmp_path):  # noqa: F811
    import subprocess
    import sys

    from .conftest import _env

    for setting, words in [
        ("parallel.tp=3", "parallel.tp=3 must divide model.heads (2)"),
        ("parallel.tp=0", "parallel.tp must be at least 1"),
        ("parallel.tp=2", "launch with --nproc 2"),
    ]:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "cramkit",
                "pretrain",
                str(store),
                "--out",
                str(tmp_path / "r"),
                "--budget",
                "1steps",
                "--set",
                "model.heads=2",
                "--set",
                "model.hidden=64",
                "--set",
                setting,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(),
        )
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
