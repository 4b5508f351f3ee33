"""A token store truncated under a running `cramkit pretrain` (read in place, memory-mapped: the default) ends
the run with one line naming the file, never a SIGBUS; the checkpoints already saved stay intact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cramkit.data.mlm import PackedSequences
from cramkit.data.tokenstore import TokenStore, TokenStoreWriter
from cramkit.errors import CramkitError


def test_a_truncated_store_is_refused_before_the_read(tmp_path: Path) -> None:
    prefix = tmp_path / "t"
    with TokenStoreWriter(prefix) as w:
        for _ in range(50):
            w.add_document(list(range(5, 105)))
        w.finalize()
    store = TokenStore(prefix)
    seqs = PackedSequences(
        np.asarray(store.tokens), store.pointers // store.dtype.itemsize, store.sizes, 16, 3, check=store.check_intact
    )
    assert seqs.gather(np.array([0, 100, 200])).shape == (3, 16)
    with open(f"{prefix}.bin", "r+b") as f:
        f.truncate(os.path.getsize(f"{prefix}.bin") // 2)
    with pytest.raises(CramkitError, match=r"t\.bin changed under this job \(is now .* bytes"):
        seqs.gather(np.array([250, 300]))


@pytest.mark.integration
def test_pretrain_with_its_store_truncated_ends_with_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cramkit",
            "pretrain",
            "--preset",
            "tiny-cpu",
            "--budget",
            "5000steps",
            "--out",
            str(run),
            "--no-progress",
            "--set",
            "model.layers=1",
            "--set",
            "model.hidden=64",
            "--set",
            "model.heads=2",
            "--set",
            "model.intermediate=128",
            "--set",
            "train.checkpoint_every=2steps",
            "--set",
            "train.log_every=1",
            "--set",
            "train.micro_batch=4",
            "--set",
            "train.batch_size=4",
            "--set",
            "train.eval_every=never",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics, deadline = run / "metrics.jsonl", time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        steps = (
            [json.loads(line).get("step", 0) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        )
        if max(steps, default=0) >= 6:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    store = run / "data" / "train.bin"
    with open(store, "r+b") as f:
        f.truncate(store.stat().st_size // 3)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, (proc.returncode, err)  # not -7 (SIGBUS)
    assert "Traceback" not in err and "train.bin changed under this job" in err, err
    assert any((run / "checkpoints").glob("step-*")), "the checkpoints saved before stay"
