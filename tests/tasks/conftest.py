"""Fixtures of the fine-tuning tests: one intra-op thread, a tiny pretrained run on SST-2 sentences."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .test_finetune import make_tiny_run, sst2_sentences


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: tiny matrices gain nothing from more, and the suite shares 2 cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_run(glue_dir: Path, tmp_path_factory) -> Path:
    return make_tiny_run(tmp_path_factory.mktemp("tiny") / "run", sst2_sentences(glue_dir))
