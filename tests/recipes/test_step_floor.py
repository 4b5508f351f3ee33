"""The few-labels step floor (500 steps) is a default, never an override (issue 50): `--set epochs=1` trains one
epoch however few the rows; with neither epochs nor min_steps set the floor applies and the first line says so."""

from __future__ import annotations

import json
from pathlib import Path

from clirun import cli
from cramkit.train.metrics import read_metrics


def _finetune(tiny_run: Path, glue_dir: Path, out: Path, *settings: str):
    args = ["finetune", "--task", "glue/sst2", "--data-dir", glue_dir, "--from", tiny_run, "--out", out]
    for s in ("max_train_examples=48", "max_eval_examples=16", "max_length=32", "eval_every=never", *settings):
        args += ["--set", s]
    proc = cli(*args, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    return proc


def _steps(out: Path) -> tuple[int, int]:
    """The steps the results report and the optimizer steps the run's metrics logged."""
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    logged = [r["step"] for r in read_metrics(out / "seeds" / "seed-0") if "loss" in r]
    return results["seeds"][0]["steps"], max(logged)


def test_explicit_epochs_win_over_the_step_floor(tiny_run: Path, glue_dir: Path, tmp_path: Path) -> None:
    proc = _finetune(tiny_run, glue_dir, tmp_path / "one", "epochs=1")
    assert _steps(tmp_path / "one") == (3, 3)  # 48 rows, batch 16: one epoch, not 500 steps
    assert "step floor" not in proc.stderr
    proc = _finetune(tiny_run, glue_dir, tmp_path / "floor", "epochs=1", "min_steps=7")  # both set: the floor
    assert _steps(tmp_path / "floor") == (7, 7)
    assert proc.stderr.splitlines()[0].startswith("finetune: training 7 steps") and "min_steps=7" in proc.stderr


def test_the_default_floor_says_it_chose_the_steps(tiny_run: Path, glue_dir: Path, tmp_path: Path) -> None:
    proc = _finetune(tiny_run, glue_dir, tmp_path / "default")
    assert _steps(tmp_path / "default") == (500, 500)
    first = proc.stderr.splitlines()[0]
    assert first.startswith("finetune: training 500 steps") and "step floor" in first, proc.stderr
    assert "neither epochs nor min_steps is set" in first and "--set epochs=N" in first
