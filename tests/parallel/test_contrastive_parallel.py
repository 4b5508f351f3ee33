"""Negatives across torchrun ranks (issue 29): `cramkit finetune --objective contrastive --nproc 2` on two CPU
(gloo) processes gathers every rank's vectors, so each anchor is scored against the whole global batch: its
losses (and, through them, its gradients: later steps follow the updates) equal those of one process with the
whole batch. Without gathering each rank's anchors see only their own half, and the loss is not the same."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # torchrun

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR"}


@pytest.fixture(scope="module")
def pairs(builtin_docs, tmp_path_factory) -> Path:
    """Real triples: the first, second and third sentence of 200 standard-library docstrings (an anchor, its
    positive and a hard negative)."""
    rows = []
    for doc in builtin_docs:
        parts = [s.strip().replace("\t", " ").replace("\n", " ") for s in doc.split(". ") if len(s.split()) > 3]
        if len(parts) >= 3 and len(set(parts[:3])) == 3:
            rows.append(tuple(parts[:3]))
        if len(rows) == 200:
            break
    assert len(rows) == 200
    path = tmp_path_factory.mktemp("pairs") / "triples.tsv"
    path.write_text("a\tb\tc\n" + "".join(f"{a}\t{b}\t{c}\n" for a, b, c in rows), encoding="utf-8")
    return path


def _train(run: Path, pairs: Path, out: Path, nproc: int, *more: str) -> list[dict]:
    cmd = [
        *(sys.executable, "-m", "cramkit", "finetune", "--from", str(run), "--objective", "contrastive"),
        *("--train", str(pairs), "--text-a", "a", "--text-b", "b", "--negative", "c", "--out", str(out)),
        "--no-progress",
        *("--budget", "6steps", "--set", "batch_size=16", "--set", "dropout=0", "--set", "lr=1e-3"),
        *("--set", "dev_fraction=0.1", "--set", "symmetric=true", "--set", "device=cpu"),
        *(("--nproc", str(nproc)) if nproc > 1 else ()),
        *more,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if isinstance(r.get("loss"), float)]


def test_gathered_negatives_train_as_one_process_with_the_whole_batch(pretrained_run: Path, pairs: Path, tmp_path):
    one = _train(pretrained_run, pairs, tmp_path / "one", 1)
    # two processes, each embedding its share in micro-batches of 4 texts (cached negatives under DDP)
    two = _train(pretrained_run, pairs, tmp_path / "two", 2, "--set", "micro_batch=4")
    assert [r["step"] for r in one] == [r["step"] for r in two] and len(one) >= 2
    for a, b in zip(one, two, strict=True):  # step 1: the loss; later steps: the updates were the same too
        assert math.isclose(a["loss"], b["loss"], rel_tol=1e-4), (one, two)
    res = json.loads((tmp_path / "two" / "results.json").read_text())
    # the batch's other 15 positives and its 16 hard negatives, half of them embedded by the other process
    assert res["negatives_per_anchor"] == 2 * 16 - 1 and res["processes"] == 2
    one_res = json.loads((tmp_path / "one" / "results.json").read_text())
    assert res["after"] == pytest.approx(one_res["after"], rel=1e-3, abs=1e-3)

    # gathering off: each rank's 8 anchors see only their own 8 positives; another (easier) loss
    alone = _train(pretrained_run, pairs, tmp_path / "alone", 2, "--set", "gather_negatives=false")
    print({"one": [r["loss"] for r in one], "two": [r["loss"] for r in two], "alone": [r["loss"] for r in alone]})
    assert alone[0]["loss"] < one[0]["loss"] - 0.05, (alone, one)
    assert json.loads((tmp_path / "alone" / "results.json").read_text())["negatives_per_anchor"] == 2 * 8 - 1


def test_the_gathered_loss_of_each_share_averages_to_the_whole_batchs() -> None:
    """info_nce on each process's share of the anchors against every candidate (the gathered ones), with the
    whole batch's duplicate mask and symmetric and Matryoshka terms: the mean over the shares is the loss of
    one process with the whole batch."""
    import torch

    from cramkit.recipes import contrastive_data, contrastive_loss

    rows = [("a", "x", "n1"), ("b", "x", "n2"), ("c", "y", "n3"), ("y", "z", "n4")]  # duplicates on purpose
    same = torch.from_numpy(contrastive_data.same_text(contrastive_data.make_pairs(rows)))
    assert same[0, 1] and same[1, 0] and same[3, 2]  # "x" twice; row 3's anchor is row 2's positive
    gen = torch.Generator().manual_seed(0)
    a, p, n = (torch.randn(4, 8, generator=gen) for _ in range(3))
    scale = torch.tensor(20.0)
    whole = contrastive_loss.info_nce(a, torch.cat([p, n]), scale, same=same, symmetric=True, dims=[4])
    shares = [
        contrastive_loss.info_nce(
            a[r * 2 : r * 2 + 2], torch.cat([p, n]), scale, same=same, symmetric=True, dims=[4], offset=r * 2,
            all_anchors=a,
        )
        for r in (0, 1)
    ]  # fmt: skip
    assert torch.allclose(torch.stack(shares).mean(), whole, atol=1e-6)


def test_a_batch_that_does_not_divide_over_the_processes_is_one_line(pretrained_run: Path, pairs: Path, tmp_path):
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "cramkit", "finetune", "--from", str(pretrained_run), "--objective"),
            *("contrastive", "--train", str(pairs), "--text-a", "a", "--text-b", "b", "--nproc", "2"),
            *("--set", "batch_size=15", "--out", str(tmp_path / "x")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert proc.returncode == 2 and "batch_size 15 does not divide over --nproc 2" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
