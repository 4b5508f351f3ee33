"""bench/gpu_day.py's dry run: the GPU day's one call works on the CPU at tiny shapes, every phase, before a
GPU is ever at hand (a failing phase would print a 'failed' line and the rows would be missing)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_day_dry_run_writes_every_row(tmp_path: Path, wikitext_dir: Path, glue_dir: Path) -> None:
    out = tmp_path / "day"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "gpu_day.py"),
            "--dry-run",
            "--corpus",
            str(wikitext_dir),
            "--glue",
            str(glue_dir),
            "--out",
            str(out),
            "--fp8-recipes",
            "tensorwise,rowwise",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "gpu_day.md").read_text()
    assert "failed" not in md and "skipped" not in md, md
    raw = [json.loads(line) for line in (out / "gpu_day.jsonl").read_text().splitlines()]
    steps = {r["model"]: r for r in raw if r["phase"] == "step"}
    assert any("HF BertForMaskedLM" in m for m in steps) and "cramkit MaskedLM, engine, bf16" in steps
    try:
        import torchao.float8  # noqa: F401

        assert {"cramkit MaskedLM, engine, fp8 tensorwise", "cramkit MaskedLM, engine, fp8 rowwise"} <= steps.keys()
    except ImportError:
        assert "fp8 not measured: torchao is not importable" in md
    assert all(r["tokens_per_s"] > 0 and 0 < r["loss"] < 10 for r in steps.values())
    loop = next(r for r in raw if r["phase"] == "loop")
    assert loop["steps"] == 12 and loop["tokens"] > 0 and loop["val_loss"] > 0
    quality = {r["task"]: r["score"] for r in raw if r["phase"] == "quality"}
    assert quality.keys() == {"glue/mrpc", "glue/cola", "glue/sst2"}
    assert re.search(r"\| SST-2 acc \| \d+\.\d \| 64 \|", md), md
