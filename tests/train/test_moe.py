"""`cramkit pretrain` with mixture-of-experts layers on real text (WikiText-2): it learns and logs the experts'
load, resumes bit for bit, compiles; upcycling a dense run; the refusals; the model loads, embeds, fine-tunes."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from cramkit.cli import main as cli_main
from cramkit.errors import CramkitError
from cramkit.recipes.pretrain import pretrain
from cramkit.train.metrics import read_metrics

MOE = ["model.moe_experts=4", "model.moe_top_k=2", "model.moe_every=2"]
KEYS = ("step", "tokens", "loss", "lr", "grad_norm", "val_loss", "moe_load", "moe_dropped", "moe_aux")


def _curve(run: Path) -> list[dict]:
    return [{k: r[k] for k in KEYS if k in r} for r in read_metrics(run)]


def _rewind(run: Path, step: int) -> None:
    """Pretend the run died right after checkpoint ``step``."""
    root = run / "checkpoints"
    for ckpt in root.glob("step-*"):
        if int(ckpt.name.split("-")[1].split(".")[0]) > step:
            shutil.rmtree(ckpt)
    (root / "latest").write_text(f"step-{step:06d}\n")


@pytest.mark.integration
def test_moe_pretrain_learns_logs_load_and_resumes_bit_exact(
    tmp_path: Path, tiny: list[str], small_store: Path, glue_dir: Path
) -> None:
    settings = [*tiny, *MOE, "train.lr=3e-3", "train.eval_every=50steps", "train.checkpoint_every=50steps"]
    settings += ["train.micro_batch=16", "train.batch_size=16", "train.keep_checkpoints=3"]
    run = pretrain(str(small_store), budget="150steps", out=tmp_path / "run", overrides=settings)
    records = read_metrics(run)
    train = [r for r in records if "loss" in r]
    val = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(train) == 150 and len(val) == 3
    assert val[0] > val[1] > val[2] and val[2] < math.log(1000) - 1.0  # it learns
    assert sum(r["loss"] for r in train[-10:]) < sum(r["loss"] for r in train[:10]) - 5.0
    for r in train:  # the experts' figures, every logged step
        assert 1.0 <= r["moe_load"] <= 4.0 and 0.0 <= r["moe_dropped"] < 1.0 and r["moe_aux"] >= 1.0 - 1e-6
    assert train[0]["moe_dropped"] > 0.0  # a fresh router overfills some experts: the capacity drops
    # the checkpoint holds the experts; a run killed after step 50 resumes to the same floats
    from safetensors.torch import load_file

    weights = load_file(str(run / "checkpoints" / "step-000150" / "model.safetensors"))
    assert weights["encoder.layers.1.mlp.w_in"].shape == (4, 128, 64) and "encoder.layers.0.mlp.fc_in.weight" in weights
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    _rewind(copy, 50)
    assert pretrain(resume=copy) == copy
    assert _curve(copy) == _curve(run)

    # resuming it as a dense model (or with other experts) is refused in one line
    for change in ("model.moe_experts=0", "model.moe_every=1"):
        with pytest.raises(CramkitError, match="a checkpoint keeps its experts") as info:
            pretrain(resume=run, budget="170steps", overrides=[change])
        assert "\n" not in str(info.value)

    # the saved model: cramkit.load, embeddings and fill-mask (no capacity dropping at inference)
    import cramkit
    from cramkit.infer.engine import Engine

    engine = Engine(cramkit.load(run), device="cpu")
    texts = ["the cat sat on the mat", "a second, rather longer sentence about the history of the valley"]
    vectors = engine.embed(texts)
    assert vectors.shape == (2, 64)
    again = engine.embed(texts[:1])
    assert abs(again[0] - vectors[0]).max() < 1e-5  # alone or in a batch: routing drops nothing
    assert engine.fill_mask(["the [MASK] of the valley"], top_k=2)[0][0]
    # fine-tuning a classifier on it (its blocks keep their experts)
    res = cramkit.finetune(
        run,
        task="glue/sst2",
        data_dir=glue_dir,
        max_train_examples=64,
        max_eval_examples=40,
        min_steps=0,
        epochs=1,
        batch_size=16,
        eval_every="never",
        progress=False,
    )
    assert 0.0 <= res["median"]["dev"]["metrics"]["accuracy"] <= 100.0  # (a percentage)
    # export: Hugging Face BERT (and CTranslate2) have no routed experts: one line; ONNX computes every expert
    with pytest.raises(CramkitError, match="cannot express its routed experts"):
        cramkit.export(run, tmp_path / "hf")
    cramkit.export(run, tmp_path / "onnx", format="onnx", progress=False)
    exported = Engine(cramkit.load(tmp_path / "onnx"), device="cpu").embed(texts)
    assert abs(exported - vectors).max() < 1e-4


def test_moe_compiles(tmp_path: Path, tiny: list[str], small_store: Path) -> None:
    settings = [*tiny, *MOE, "train.compile=true", "train.eval_batches=1"]
    run = pretrain(str(small_store), budget="2steps", out=tmp_path / "c", overrides=settings)
    eager = pretrain(
        str(small_store), budget="2steps", out=tmp_path / "e", overrides=[*tiny, *MOE, "train.eval_batches=1"]
    )
    got, want = read_metrics(run), read_metrics(eager)
    assert [r["step"] for r in got if "loss" in r] == [1, 2]
    assert abs(got[0]["loss"] - want[0]["loss"]) < 1e-4


def test_upcycle_a_dense_run(tmp_path: Path, tiny: list[str], small_store: Path, capsys: pytest.CaptureFixture) -> None:
    dense = pretrain(str(small_store), budget="30steps", out=tmp_path / "dense", overrides=[*tiny, "train.lr=3e-3"])
    capsys.readouterr()
    # without --upcycle: one line, exit 2
    argv = ["pretrain", str(small_store), "--from", str(dense), "--budget", "2steps", "--out", str(tmp_path / "x")]
    assert cli_main([*argv, "--set", "model.moe_experts=4"]) == 2
    err = capsys.readouterr().err
    assert "add --upcycle" in err and len(err.strip().splitlines()) == 1
    # --upcycle without experts, or without --from
    assert cli_main([*argv, "--upcycle"]) == 2
    assert "model.moe_experts=E" in capsys.readouterr().err
    # upcycled, with no capacity limit and no auxiliary losses: its first step's loss is the dense model's on the
    # same batch (every expert a copy of the MLP, the gates summing to 1: the same function)
    same = ["train.lr=1e-3", "train.eval_every=never"]
    plain = pretrain(
        str(small_store), init=str(dense), budget="5steps", out=tmp_path / "plain", overrides=[*tiny, *same]
    )
    moe = [*tiny, *same, "model.moe_experts=4", "model.moe_capacity=0", "model.moe_aux=0", "model.moe_z_loss=0"]
    up = pretrain(str(small_store), init=str(dense), upcycle=True, budget="5steps", out=tmp_path / "up", overrides=moe)
    a, b = [r for r in read_metrics(plain) if "loss" in r], [r for r in read_metrics(up) if "loss" in r]
    assert abs(a[0]["loss"] - b[0]["loss"]) < 1e-4
    assert json.loads((up / "run.json").read_text())["upcycle"] is True
    # it resumes (the starting model upcycled again for the drift reference)
    assert pretrain(resume=up, budget="7steps") == up
    assert [r["step"] for r in read_metrics(up) if "loss" in r][-1] == 7


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("model.moe_top_k=5", "moe_top_k=5 must be between 1 and model.moe_experts"),
        ("model.moe_every=0", "moe_every=0 must be at least 1"),
        ("model.moe_aux=-1", "moe_aux must not be negative"),
    ],
)
def test_bad_moe_settings_exit_2_with_one_line(
    setting: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["pretrain", "--out", str(tmp_path / "r"), "--set", "model.moe_experts=4", "--set", setting]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert cli_main(["pretrain", "--out", str(tmp_path / "r"), "--set", "model.moe_experts=1"]) == 2
    assert "at least 2 experts" in capsys.readouterr().err
