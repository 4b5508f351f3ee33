"""Fine-tuning feedback through `cramkit finetune`: dev metrics after every epoch (metrics.jsonl and the
plot), the best epoch's model kept on request, and a labelled test file scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cramkit
from clirun import cli


def _files(glue_dir: Path, root: Path) -> tuple[Path, Path, Path]:
    rows = (glue_dir / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    head, body = rows[0], rows[1:]
    files = []
    for name, part in (("train", body[:96]), ("dev", body[96:160]), ("test", body[160:200])):
        f = root / f"{name}.tsv"
        f.write_text("\n".join([head, *part]) + "\n", encoding="utf-8")
        files.append(f)
    return tuple(files)  # type: ignore[return-value]


def test_dev_after_every_epoch_best_kept_and_labelled_test_scored(tiny_run: Path, glue_dir: Path, tmp_path: Path):
    train, dev, test = _files(glue_dir, tmp_path)
    out = tmp_path / "ft"
    r = cli(
        "finetune",
        "--from",
        str(tiny_run),
        "--train",
        str(train),
        "--dev",
        str(dev),
        "--test",
        str(test),
        "--text-a",
        "sentence",
        "--out",
        str(out),
        "--set",
        "epochs=3",
        "--set",
        "min_steps=0",
        "--set",
        "batch_size=16",
        "--set",
        "max_length=48",
        "--set",
        "keep=best",
        "--set",
        "lr=3e-4",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    records = [json.loads(x) for x in (out / "seeds" / "seed-0" / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in records if "dev_score" in x]
    assert [x["step"] for x in evals] == [6, 12, 18]  # 96 rows / 16 = 6 steps an epoch, 3 epochs
    assert all({"val_loss", "dev_accuracy"} <= set(x) for x in evals)
    res = json.loads((out / "results.json").read_text())
    seed = res["seeds"][0]
    top = max(x["dev_score"] for x in evals)  # the best score; of equal ones the lowest dev loss
    best = min((x for x in evals if x["dev_score"] == top), key=lambda x: x["val_loss"])
    assert seed["best_step"] == best["step"] and [x["step"] for x in seed["dev_curve"]] == [6, 12, 18]
    # the kept model is the best epoch's: its dev accuracy is the best logged one (and the reported one)
    assert res["median"]["dev"]["metrics"]["accuracy"] == pytest.approx(best["dev_accuracy"], abs=1e-6)
    from cramkit.infer import Engine

    rows = [line.split("\t") for line in dev.read_text(encoding="utf-8").splitlines()[1:]]
    logits = Engine(cramkit.load(out), max_length=48).logits([s for s, _ in rows])
    acc = 100 * (logits.argmax(-1) == [int(y) for _, y in rows]).mean()
    assert acc == pytest.approx(best["dev_accuracy"], abs=1e-6)
    assert "test" in res["test"] and 0 <= res["test"]["test"]["metrics"]["accuracy"] <= 100
    assert "(labelled test file): accuracy" in r.stdout and "best dev score" in r.stdout
    assert (out / "seeds" / "seed-0" / "loss.png").stat().st_size > 0
    assert not (out / "seeds" / "seed-0" / "best.safetensors").exists()  # cleaned with the checkpoints


def test_eval_every_never_and_bad_keep(tiny_run: Path, glue_dir: Path, tmp_path: Path):
    train, dev, _ = _files(glue_dir, tmp_path)
    r = cli(
        "finetune",
        "--from",
        str(tiny_run),
        "--train",
        str(train),
        "--dev",
        str(dev),
        "--text-a",
        "sentence",
        "--out",
        str(tmp_path / "o"),
        "--set",
        "keep=best",
        "--set",
        "eval_every=never",
    )
    assert r.returncode == 2 and "keep=best" in r.stderr and "Traceback" not in r.stderr
    r = cli(
        "finetune",
        "--from",
        str(tiny_run),
        "--train",
        str(train),
        "--dev",
        str(dev),
        "--text-a",
        "sentence",
        "--out",
        str(tmp_path / "o"),
        "--set",
        "keep=first",
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_equal_dev_scores_keep_the_lower_dev_loss():
    """A few dev rows score checkpoints alike (32 rows: steps of 3 points); the lower loss then decides, and an
    earlier best kept from a resumed run's best.json (written before losses were kept) yields to an equal score."""
    from cramkit.recipes.finetune_objective import rank

    assert rank(84.375, 0.261) > rank(84.375, 0.296) > rank(81.25, 0.1)
    assert rank(84.375, 0.5) > rank(84.375, float("inf"))


def test_few_labelled_rows_name_the_few_label_methods_before_training(
    tiny_run: Path, glue_dir: Path, tmp_path: Path
) -> None:
    """96 labelled rows and the default method: the first lines say what the few-label methods offer; a method
    chosen already is left alone."""
    train, dev, _ = _files(glue_dir, tmp_path)
    common = ["--from", str(tiny_run), "--train", str(train), "--dev", str(dev), "--text-a", "sentence"]
    proc = cli("finetune", *common, "--out", str(tmp_path / "head"), "--set", "epochs=1", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    said = next(line for line in proc.stderr.splitlines() if "labelled rows" in line)
    assert "96 labelled rows" in said and "--method auto" in said and "--few-shot K" in said
    assert proc.stderr.index(said) < proc.stderr.index("done:")  # before it trains
    chosen = cli("finetune", *common, "--out", str(tmp_path / "setfit"), "--method", "setfit", "--set", "epochs=1")
    assert chosen.returncode == 0, chosen.stderr
    assert "labelled rows train a fresh head" not in chosen.stderr
