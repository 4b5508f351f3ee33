"""Multi-task weighting (``cramkit finetune --mixture ... --weighting sum|gradnorm|pcgrad [--primary TASK]``):
the combination rules on real gradients of a model `cramkit pretrain` made, on real GLUE batches; then real
runs through the CLI (figures in metrics.jsonl, a killed run resumed bit for bit) and the bad inputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cramkit.recipes.weighting import combine, gradient_figures, pcgrad_order

from .test_mixtures import cli


def _batch(task_name: str, glue_dir: Path, loaded, n: int, flip: bool = False) -> dict:
    """A real batch of ``n`` training rows of a GLUE task (labels flipped with ``flip``: a task that conflicts)."""
    from cramkit.data.batching import BatchLoader
    from cramkit.recipes.finetune_model import encode_task_examples
    from cramkit.tasks import get_task

    task = get_task(task_name, data_dir=glue_dir)
    enc = encode_task_examples(task, loaded.tokenizer, task.examples("train")[:n], 48)
    labels = 1 - enc.labels if flip else enc.labels
    loader = BatchLoader(
        enc,
        n,
        n,
        0,
        1,
        seed=0,
        chunk=0,
        pad_id=loaded.pad_id,
        with_types=loaded.with_types,
        columns={"labels": torch.from_numpy(np.ascontiguousarray(labels))},
    )
    return next(loader)


@pytest.fixture(scope="module")
def real(tiny_run: Path, glue_dir: Path):
    """A multi-task model on the pretrained run's encoder (heads: mrpc, cola, mrpc with flipped labels), an
    objective over it, one real batch of each task, and each task's gradient on the encoder (rows)."""
    from cramkit.loading import load_torch
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.multitask import MixtureObjective, build_multitask

    loaded = load_torch(tiny_run, purpose="fine-tuning")
    cfg = FinetuneConfig(dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = build_multitask(loaded, [2, 2, 2], cfg)
    model.heads[2].load_state_dict(model.heads[0].state_dict())  # the flipped task: MRPC's head, opposite labels
    batches = {
        0: _batch("glue/mrpc", glue_dir, loaded, 16),
        1: _batch("glue/cola", glue_dir, loaded, 16),
        2: _batch("glue/mrpc", glue_dir, loaded, 16, flip=True),
    }
    from cramkit.tasks import get_task

    tasks = [get_task(n, data_dir=glue_dir) for n in ("glue/mrpc", "glue/cola", "glue/mrpc")]
    objective = MixtureObjective(loaded, tasks, [], np.ones(3) / 3, cfg, 0, "t", "", "sum")
    objective.names = ["mrpc", "cola", "flipped"]
    rows = []
    shared = list(model.encoder.parameters())
    for i, b in batches.items():
        loss = objective._task_loss(model, b, i, torch.device("cpu"))
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, shared)]))
    return model, objective, batches, torch.stack(rows)


def test_pcgrad_never_opposes_a_task(real):
    _, _, _, rows = real
    a, b = rows[0], rows[2]  # MRPC and MRPC with flipped labels: real gradients that conflict
    assert torch.dot(a, b) < 0
    # scale b so that the plain sum opposes a by construction (whatever tiny model this clone built):
    # with k = 2|a|^2 / -(a.b), (a + kb).a = -|a|^2 < 0 and (a + kb).kb = k(k|b|^2 + a.b) > 0 by Cauchy-Schwarz
    two = torch.stack([a, b * (2 * a.dot(a) / -a.dot(b))])
    assert torch.dot(two.sum(0), two[0]) * torch.dot(two.sum(0), two[1]) < 0  # the plain sum opposes one
    combined = combine(two, "pcgrad")
    scale = two.norm(dim=1).max() ** 2
    for g in two:
        assert torch.dot(combined, g) >= -1e-5 * scale
    # no conflict, no surgery: PCGrad of one task with itself (scaled) is their sum
    same = torch.stack([rows[0], 2 * rows[0]])
    assert torch.allclose(combine(same, "pcgrad"), same.sum(0), rtol=1e-5, atol=1e-7)
    # the order of projection is a function of (seed, batch): a resumed run draws the same
    assert pcgrad_order(3, 17, 3) == pcgrad_order(3, 17, 3)
    assert all(sorted(o) == [j for j in range(3) if j != i] for i, o in enumerate(pcgrad_order(3, 17, 3)))


def test_primary_keeps_auxiliary_only_where_it_does_not_oppose(real):
    _, _, _, rows = real
    g_p = rows[0]
    assert torch.dot(rows[2], g_p) < 0  # the flipped task opposes the primary
    for weighting in ("sum", "gradnorm"):
        combined = combine(rows, weighting, primary=0)
        primary_part = rows[0] if weighting == "sum" else rows[0] * rows.norm(dim=1).mean() / rows[0].norm()
        aux = combined - primary_part  # what the auxiliary tasks add
        assert torch.dot(aux, g_p) >= -1e-5 * g_p.norm() ** 2
        assert torch.dot(combined, g_p) >= (1 - 1e-4) * torch.dot(primary_part, g_p)
    # an auxiliary gradient that agrees with the primary is kept whole
    agree = torch.stack([g_p, rows[1] if torch.dot(rows[1], g_p) > 0 else -rows[1]])
    assert torch.allclose(combine(agree, "sum", primary=0), agree.sum(0), rtol=1e-5, atol=1e-7)


def test_gradnorm_is_invariant_to_a_task_loss_scale(real):
    _, _, _, rows = real
    scaled = rows.clone()
    scaled[1] *= 1000.0  # task 1's loss 1000 times larger: with gradnorm it pulls no harder
    a, b = combine(rows, "gradnorm"), combine(scaled, "gradnorm")
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 1 - 1e-5
    normed = rows / rows.norm(dim=1, keepdim=True)
    assert torch.allclose(a / a.norm(), normed.sum(0) / normed.sum(0).norm(), atol=1e-5)
    from cramkit.recipes.weighting import task_weights

    figures = gradient_figures(rows @ rows.T, task_weights(rows @ rows.T, "gradnorm"))
    assert torch.allclose(figures[:3], rows.norm(dim=1), rtol=1e-4)  # norms, then the pairs' cosines, then combined's
    cos = torch.nn.functional.cosine_similarity
    assert figures[3] == pytest.approx(float(cos(rows[0], rows[1], dim=0)), abs=1e-4)
    assert figures[-1] == pytest.approx(float(cos(a, rows[2], dim=0)), abs=1e-4)


@pytest.mark.parametrize("weighting,primary", [("pcgrad", None), ("sum", 0)])
def test_the_objective_puts_the_combined_gradient_in_grad(real, weighting: str, primary: int | None):
    """The engine's backward pass of the objective's loss leaves the combined gradient on the encoder and
    each task's own gradient on its head."""
    model, objective, batches, rows = real
    objective.weighting, objective.primary = weighting, primary
    model.zero_grad(set_to_none=True)
    loss = objective.loss(model, {"parts": batches, "batch": 5}, torch.device("cpu"))
    loss.backward()
    got = torch.cat([p.grad.reshape(-1) for p in model.encoder.parameters()])
    order = pcgrad_order(0, 5, 3) if weighting == "pcgrad" else None
    assert torch.allclose(got, combine(rows, weighting, primary, order), rtol=1e-4, atol=1e-7)
    head_loss = objective._task_loss(model, batches[1], 1, torch.device("cpu"))
    head = list(model.heads[1].parameters())
    for p, g in zip(head, torch.autograd.grad(head_loss, head), strict=True):
        assert torch.allclose(p.grad, g, rtol=1e-4, atol=1e-7)
    figures = objective.step_metrics()
    assert set(figures) >= {"loss.mrpc", "grad_norm.cola", "grad_cos.mrpc~cola", "grad_cos.combined~mrpc"}
    model.zero_grad(set_to_none=True)


def _argv(tiny_run: Path, glue_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        "finetune",
        "--mixture",
        "glue/mrpc,glue/cola",
        "--from",
        str(tiny_run),
        "--data-dir",
        str(glue_dir),
        "--out",
        str(out),
        "--set",
        "max_train_examples=96",
        "--set",
        "epochs=2",
        "--set",
        "max_length=48",
        "--set",
        "batch_size=8",
        "--no-progress",
        *extra,
    ]


def _metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.integration
def test_pcgrad_and_primary_through_the_cli(tiny_run: Path, glue_dir: Path, tmp_path: Path):
    out = tmp_path / "pcgrad"
    r = cli(*_argv(tiny_run, glue_dir, out, "--weighting", "pcgrad"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "weighting pcgrad" in r.stdout and "s/step" in r.stdout
    res = json.loads((out / "results.json").read_text())
    assert res["weighting"] == "pcgrad" and res["primary"] is None
    assert res["steps"] == 2 * (192 // 16)  # every step: a batch of 8 of each task
    assert all(t["batches"] == res["steps"] for t in res["tasks"].values())
    assert res["seconds_per_step"] > 0
    rows = [m for m in _metrics(out) if "loss" in m]
    assert len(rows) == res["steps"]
    for m in rows:
        assert {"loss.mrpc", "loss.cola", "grad_norm.mrpc", "grad_norm.cola", "grad_cos.mrpc~cola"} <= set(m)
        assert m["loss"] == pytest.approx(m["loss.mrpc"] + m["loss.cola"], rel=1e-4)
        # two tasks: PCGrad's step never opposes either task
        assert m["grad_cos.combined~mrpc"] >= -1e-4 and m["grad_cos.combined~cola"] >= -1e-4

    out = tmp_path / "primary"
    r = cli(*_argv(tiny_run, glue_dir, out, "--primary", "mrpc"))
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["weighting"] == "sum" and res["primary"] == "glue/mrpc"
    for m in (m for m in _metrics(out) if "loss" in m):
        assert m["grad_cos.combined~mrpc"] > 0  # the auxiliary task never pulls against the primary
    # a plain sum: one backward pass, the tasks' losses logged
    out = tmp_path / "sum"
    r = cli(*_argv(tiny_run, glue_dir, out, "--weighting", "sum"))
    assert r.returncode == 0, r.stderr[-2000:]
    m = [m for m in _metrics(out) if "loss" in m][-1]
    assert "loss.cola" in m and "grad_norm.cola" not in m


@pytest.mark.integration
def test_weighted_mixture_killed_midway_resumes_bit_for_bit(tiny_run: Path, glue_dir: Path, tmp_path: Path):
    extra = ("--weighting", "pcgrad", "--set", "checkpoint_every=4steps", "--set", "epochs=3")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed = tmp_path / "killed"
    argv = [sys.executable, "-m", "cramkit", *_argv(tiny_run, glue_dir, killed, *extra)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    latest = killed / "run" / "checkpoints" / "latest"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not latest.is_file():
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    r = cli(*_argv(tiny_run, glue_dir, killed, *extra))
    assert r.returncode == 0 and "resuming" in r.stderr, r.stderr[-2000:]
    straight = tmp_path / "straight"
    r = cli(*_argv(tiny_run, glue_dir, straight, *extra))
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = (json.loads((d / "results.json").read_text()) for d in (killed, straight))
    assert a["tasks"] == b["tasks"] and a["loss_curve"] == b["loss_curve"] and a["steps"] == b["steps"]
    keys = ("loss.mrpc", "loss.cola", "grad_norm.mrpc", "grad_cos.mrpc~cola", "grad_cos.combined~cola")
    ma, mb = ([{k: m[k] for k in keys} for m in _metrics(d) if "loss" in m] for d in (killed, straight))
    assert ma == mb


def test_bad_weighting_inputs_one_line(tiny_run: Path, glue_dir: Path, tmp_path: Path):
    mix = ["--mixture", "glue/mrpc,glue/cola"]
    for args, words in [
        ([*mix, "--primary", "glue/sst2"], "--primary glue/sst2: not a task of the mixture"),
        ([*mix, "--weighting", "mean"], "choose one of sum, gradnorm, pcgrad"),
        (["--task", "glue/mrpc", "--weighting", "sum"], "--weighting applies to --mixture"),
        (["--task", "glue/mrpc", "--primary", "glue/mrpc"], "--primary applies to --mixture"),
        ([*mix, "--weighting", "pcgrad", "--primary", "mrpc"], "not pcgrad"),
        ([*mix, "--weighting", "pcgrad", "--nproc", "2"], "leave out --nproc"),
        ([*mix, "--weighting", "gradnorm", "--set", "batch_size=8", "--set", "micro_batch=4"], "micro_batch"),
        ([*mix, "--weighting", "sum", "--rates", "equal"], "give one of them"),
        ([*mix, "--primary", "mrpc", "--set", "precision=fp16"], "not fp16"),
    ]:
        r = cli("finetune", *args, "--from", str(tiny_run), "--data-dir", str(glue_dir), "--out", str(tmp_path / "o"))
        assert r.returncode == 2, (args, r.stderr)
        assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
