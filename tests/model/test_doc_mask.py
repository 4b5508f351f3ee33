"""data.doc_mask: attention that stays inside each document of a packed sequence (the sparse MLM head
unchanged): segments from the packer, masks in the encoder, the same logits by the dense and sparse paths."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from cramkit.data.mlm import PackedSequences
from cramkit.model import MaskedLM
from cramkit.train.config import resolve_config


def test_the_packer_gives_each_position_its_document() -> None:
    tokens = np.arange(10, 20)  # documents of 3, 5 and 2 tokens, each followed by [SEP] (id 1)
    packed = PackedSequences(tokens, np.array([0, 3, 8]), np.array([3, 5, 2]), seq_len=4, sep=1)
    ids, seg = packed.gather_with_segments(np.array([0, 1, 2]))
    assert ids.tolist() == [[10, 11, 12, 1], [13, 14, 15, 16], [17, 1, 18, 19]]
    assert seg.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 1]]
    with_cls = PackedSequences(tokens, np.array([0, 3, 8]), np.array([3, 5, 2]), seq_len=5, sep=1, cls=2)
    ids, seg = with_cls.gather_with_segments(np.array([0]))
    assert ids.tolist() == [[2, 10, 11, 12, 1]] and seg.tolist() == [[0, 0, 0, 0, 0]]
    ids, seg = with_cls.gather_with_segments(np.array([1]))
    assert ids.tolist() == [[2, 13, 14, 15, 16]] and seg.tolist() == [[0, 0, 0, 0, 0]]
    assert np.array_equal(packed.gather(np.array([2])), packed.gather_with_segments(np.array([2]))[0])


def _model() -> MaskedLM:
    cfg = resolve_config("tiny-cpu").model.replace(vocab_size=64, layers=2, hidden=32, heads=2, intermediate=64)
    torch.manual_seed(0)
    return MaskedLM(cfg).eval()


def test_a_document_does_not_see_its_neighbour() -> None:
    model = _model()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 64, (2, 12), generator=g)
    seg = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])
    other = ids.clone()
    other[0, 5:] = torch.randint(5, 64, (7,), generator=g)  # the second document of row 0 changed
    labels = torch.full_like(ids, -100)
    labels[0, [1, 3, 6]] = ids[0, [1, 3, 6]]
    labels[1, [0, 11]] = ids[1, [0, 11]]
    with torch.no_grad():
        dense = model(ids, segments=seg).logits
        dense_other = model(other, segments=seg).logits
        sparse = model(ids, labels, segments=seg).logits
        sparse_other = model(other, labels, segments=seg).logits
        plain = model(ids).logits
    assert torch.allclose(dense[0, :5], dense_other[0, :5], atol=1e-5)  # the first document never saw the second
    assert not torch.allclose(dense[0, 5:], dense_other[0, 5:], atol=1e-3)
    assert not torch.allclose(dense[0, :5], plain[0, :5], atol=1e-3)  # without the mask it does
    assert torch.allclose(dense[1], plain[1], atol=1e-5)  # one segment: the same as no mask
    keep = labels != -100
    assert torch.allclose(sparse, dense[keep], atol=1e-5)  # sparse prediction: the same values
    assert torch.allclose(sparse[:2], sparse_other[:2], atol=1e-5)  # (positions 1 and 3: the first document)


@pytest.mark.integration
def test_pretrain_with_doc_mask_runs(tmp_path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cramkit",
            "pretrain",
            "--preset",
            "tiny-cpu",
            "--budget",
            "3steps",
            "--out",
            str(out),
            "--no-progress",
            "--set",
            "data.doc_mask=true",
            "--set",
            "model.layers=1",
            "--set",
            "model.hidden=64",
            "--set",
            "model.heads=2",
            "--set",
            "model.intermediate=128",
            "--set",
            "train.micro_batch=4",
            "--set",
            "train.batch_size=4",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "validation loss" in proc.stderr
