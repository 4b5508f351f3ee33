"""bench/gpu_day.py's dry run: the GPU day's one call works on the CPU at tiny shapes, every phase, before a
GPU is ever at hand (a failing phase would print a 'failed' line and the rows would be missing)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # bench/gpu_day.py --dry-run in a process

REPO = Path(__file__).resolve().parents[1]


def test_gpu_day_dry_run_writes_every_row(tmp_path: Path, wikitext_dir: Path, glue_dir: Path, minilm_dir: Path) -> None:
    out = tmp_path / "day"
    head_text = tmp_path / "head.txt"  # MiniLM's head: a little text is enough at 2 steps
    lines = (wikitext_dir / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines()[:400]
    head_text.write_text("\n".join(lines) + "\n", encoding="utf-8")
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
            "--minilm",
            str(minilm_dir),
            "--head-corpus",
            str(head_text),
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
    few = {(Path(r["model"]).name, r["method"]): r for r in raw if r["phase"] == "fewshot"}
    assert few.keys() == {(m, x) for m in ("minilm-mlm", "crammed") for x in ("head", "prompt", "ptuning")}
    assert all(len(r["scores"]) == 2 and 0 <= r["mean"] <= 100 for r in few.values())
    assert all("zero_shot" in r for (_, method), r in few.items() if method == "prompt")
    assert re.search(r"\| minilm-mlm \| glue/sst2 \| \d+\.\d ± \d+\.\d \|", md), md


def test_gpu_day_packs_what_a_device_call_carries(
    tmp_path: Path, wikitext_dir: Path, glue_dir: Path, minilm_dir: Path
) -> None:
    """--pack: GLUE's three tasks, the corpus up to its size, MiniLM in float16 that cramkit reads back as the
    same model (the device call carries at most 64 MiB)."""
    import numpy as np

    import cramkit
    from cramkit.infer import Engine

    out = tmp_path / "carry"
    cmd = [sys.executable, str(REPO / "bench" / "gpu_day.py"), "--pack", str(out), "--corpus", str(wikitext_dir)]
    cmd += ["--glue", str(glue_dir), "--minilm", str(minilm_dir), "--corpus-mb", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (out / "glue").iterdir()) == ["CoLA", "MRPC", "SST-2"]
    corpus = sum(f.stat().st_size for f in (out / "corpus").iterdir())
    assert 0 < corpus <= 3e6
    assert (out / "minilm" / "model.safetensors").stat().st_size < 0.55 * (
        minilm_dir / "model.safetensors"
    ).stat().st_size
    texts = ["a gripping, funny film", "the capital of France"]
    a, b = (
        Engine(cramkit.load(f"hf:{minilm_dir}")).embed(texts),
        Engine(cramkit.load(f"hf:{out / 'minilm'}")).embed(texts),
    )
    assert np.all((a * b).sum(1) > 0.9999)
