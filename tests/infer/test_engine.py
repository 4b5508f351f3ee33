"""The engine: per-input truncation, backends, token budgets (real models from real commands)."""

from __future__ import annotations

import numpy as np
import pytest

import cramkit
from cramkit.errors import CramkitError
from cramkit.infer import Engine

from .models import sst2


def test_truncation_is_reported_per_input_and_can_be_refused(ft_model) -> None:
    eng = Engine(ft_model, device="cpu")
    long = "the film is long and " * 200
    res = eng.classify(["a fine film", long, "dull"])
    assert res.truncated.tolist() == [False, True, False]
    vectors, cut = eng.embed_truncated([long, "short"])
    assert vectors.shape[0] == 2 and cut.tolist() == [True, False] and not hasattr(eng, "truncated")
    with pytest.raises(CramkitError, match="input 1 is longer than the model's limit"):
        eng.classify(["fine", long], truncate=False)
    assert not eng.classify(["fine", "also fine"], truncate=False).truncated.any()


def test_results_do_not_depend_on_the_token_budget(ft_model, glue_dir) -> None:
    texts = [s for s, _ in sst2(glue_dir, "dev")[:60]]
    big = Engine(ft_model, device="cpu").logits(texts)
    small = Engine(ft_model, device="cpu", max_batch_tokens=40).logits(texts)
    assert np.abs(big - small).max() < 1e-4
    assert Engine(ft_model, device="cpu").embed([]).shape[0] == 0


def test_backend_choice_and_bad_arguments(ft_model, ft_onnx) -> None:
    assert Engine(ft_onnx).backend == "onnx"  # auto: an ONNX export runs on ONNX Runtime
    assert Engine(str(ft_model)).backend == "torch"
    with pytest.raises(CramkitError, match="backend must be"):
        Engine(ft_model, backend="tensorrt")
    with pytest.raises(CramkitError, match="is an export in the ONNX format"):
        Engine(ft_onnx, backend="torch")
    with pytest.raises(CramkitError, match="fill-mask needs"):
        Engine(ft_onnx).fill_mask(["a [MASK]"])
    with pytest.raises(CramkitError, match="input 1 is a int"):
        Engine(cramkit.load(ft_model)).classify(["ok", 3])


def test_the_default_token_budget_depends_on_the_device(ft_model) -> None:
    from cramkit.infer.engine import CPU_BATCH_TOKENS, default_batch_tokens, fits

    assert Engine(ft_model, device="cpu").max_batch_tokens == CPU_BATCH_TOKENS == 2048  # bench/RESULTS.md
    assert default_batch_tokens("cuda:0") == 16384 and default_batch_tokens("cpu") == 2048
    assert Engine(ft_model, device="cpu", max_batch_tokens=300).max_batch_tokens == 300
    enc = Engine(ft_model, device="cpu", max_batch_tokens=64).tokenize(["a film"] * 10 + ["word " * 60])
    batches = Engine(ft_model, device="cpu", max_batch_tokens=64).batches(enc)
    assert all(fits(len(b), int(enc.lengths[b].max()), 64) for b in batches) and len(batches[-1]) == 1
