"""Fixtures of the server tests: one thread, a fine-tuned classifier and its ONNX exports."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infer.models import finetuned, onnx_export


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def models_base(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "infer-models"


@pytest.fixture(scope="session")
def ft_model(models_base, pretrained_run, glue_dir) -> Path:
    models_base.mkdir(exist_ok=True)
    return finetuned(models_base, pretrained_run, glue_dir)


@pytest.fixture(scope="session")
def ft_onnx(models_base, ft_model) -> Path:
    return onnx_export(models_base, ft_model, quantize=False)


@pytest.fixture(scope="session")
def ft_onnx_int8(models_base, ft_model) -> Path:
    return onnx_export(models_base, ft_model, quantize=True)
