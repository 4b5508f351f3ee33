"""Fixtures of the fine-tuning tests: one intra-op thread, a tiny pretrained run on SST-2 sentences."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_finetune import make_tiny_run, sst2_sentences


@pytest.fixture(scope="module")
def tiny_run(glue_dir: Path, tmp_path_factory) -> Path:
    return make_tiny_run(tmp_path_factory.mktemp("tiny") / "run", sst2_sentences(glue_dir))
