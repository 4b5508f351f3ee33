"""Crafted values in an export's manifest and crafted mixture rates (issue 30, items 6 and 7): each is checked
on load (against the graph, the tokenizer, model.bin's shapes) or when parsed, and is one line naming the
file and the fix; never an ONNX Runtime or numpy traceback, never a 500 on every request once served."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import cramkit
from cramkit.errors import CramkitError
from test_bad_input import cli, one_line


def _crafted(export: Path, dst: Path, marker: str, **values) -> Path:
    """A copy of ``export`` whose manifest says ``values`` (JSON edits: no file hash changes)."""
    shutil.copytree(export, dst)
    man = json.loads((dst / marker).read_text())
    man.update(values)
    (dst / marker).write_text(json.dumps(man))
    return dst


ONNX_CASES = [
    ({"max_length": 4096}, "does not run on an input of max_length 4096"),  # beyond the position table
    ({"max_length": 10**9}, "'max_length' must be an integer from 3 to 8192"),
    ({"pad_id": 2**63}, f"pad_id {2**63} is outside"),
    ({"pad_id": -1}, "pad_id -1 is outside"),
    ({"labels": ["a", "b", "c", "d"]}, "logits of shape [1, 2] where the manifest says [1, 4]"),
    ({"hidden": 65}, "mean of shape [1, 64] where the manifest says [1, 65]"),
]


def test_crafted_onnx_manifest_values_are_checked_on_load(ft_onnx, tmp_path) -> None:
    for i, (values, said) in enumerate(ONNX_CASES):
        bad = _crafted(ft_onnx, tmp_path / f"bad{i}", "cramkit-onnx.json", **values)
        with pytest.raises(CramkitError, match="cramkit-onnx.json|model.onnx") as err:
            cramkit.load(bad)
        assert said in str(err.value) and "\n" not in str(err.value), (values, str(err.value))
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\nawful\n")
    bad = tmp_path / "bad0"  # through the real command: one line, nothing written
    proc = cli("predict", "--from", bad, rows, "--out", tmp_path / "p.jsonl")
    one_line(proc, "model.onnx", "max_length 4096", "export the model again")
    assert not (tmp_path / "p.jsonl").exists()
    assert cramkit.load(ft_onnx).max_length > 0  # the export as written still loads


def test_crafted_ct2_manifest_values_and_shapes_are_checked_on_load(tok, tmp_path) -> None:
    pytest.importorskip("ctranslate2")
    import hashlib

    import torch

    from cramkit.loading import LoadedModel
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import ClassifierConfig, SequenceClassifier
    from hostile.test_crafted import _ct2_variables, _ct2_write

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), hidden=64, layers=2, heads=2, intermediate=128, max_position=64)
    model = SequenceClassifier(cfg, 2, ClassifierConfig()).eval()
    loaded = LoadedModel(
        model=model, kind="classifier", config=cfg, tokenizer=tok, source="tiny", labels=["a", "b"], max_length=64
    )
    good = cramkit.export(loaded, tmp_path / "good", format="ct2")
    marker = "cramkit-ct2.json"
    head = r"classifier\.(weight has shape \[2, 64\], expected \[4, 64\]|bias has shape \[2\], expected \[4\])"
    cases = [
        (
            {"max_length": 70},
            re.escape("position_encodings/encodings has shape [64, 64], expected [at least max_length 70"),
        ),
        ({"pad_id": 2**63}, re.escape(f"pad_id {2**63} is outside")),
        ({"labels": ["a", "b", "c", "d"]}, head),  # the first of the head's tensors in the file: weight or bias
        ({"hidden": 65}, re.escape("the encoder is 64 wide, the manifest says hidden 65")),
    ]
    for i, (values, said) in enumerate(cases):
        bad = _crafted(good, tmp_path / f"bad{i}", marker, **values)
        with pytest.raises(CramkitError) as err:
            cramkit.load(bad)
        assert re.search(said, str(err.value)), (values, str(err.value))
    # a qkv projection of the wrong shape in model.bin (its SHA-256 rewritten, as an attacker would)
    header, variables = _ct2_variables((good / "model.bin").read_bytes())

    def short_qkv(n, sh, dt, b):
        if n == "encoder/layer_0/self_attention/linear_0/weight":
            return n, (sh[0] - 3, sh[1]), dt, b[: (sh[0] - 3) * sh[1] * 4]
        return n, sh, dt, b

    bad = _crafted(good, tmp_path / "qkv", marker)
    (bad / "model.bin").write_bytes(_ct2_write(header, [short_qkv(*v) for v in variables]))
    man = json.loads((bad / marker).read_text())
    man["files"]["model.bin"] = hashlib.sha256((bad / "model.bin").read_bytes()).hexdigest()
    (bad / marker).write_text(json.dumps(man))
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\nawful\n")
    proc = cli("predict", "--from", bad, rows, "--out", tmp_path / "p.jsonl")
    one_line(proc, "self_attention/linear_0/weight has shape [189, 64], expected [192, 64]", "export the model again")
    bad = tmp_path / "bad3"
    proc = cli("predict", "--from", bad, rows, "--out", tmp_path / "p.jsonl")
    one_line(proc, "model.bin", "hidden 65")


# ------------------------------------------------------------------------------------ 7: --rates


def test_extreme_rates_are_one_line_or_exact() -> None:
    from cramkit.recipes.multitask import draw_task
    from cramkit.tasks.mixtures import mixture_rates

    assert mixture_rates("1e308,1e308", [10, 20]) == pytest.approx([0.5, 0.5])  # their sum overflows
    assert mixture_rates("5e-324,0", [10, 20]) == pytest.approx([1.0, 0.0])
    rates = mixture_rates("temperature:0.01", [10**9, 10**8, 0])  # size ** 100 overflows float64
    assert np.isfinite(rates).all() and rates == pytest.approx([1.0, 0.0, 0.0])
    assert mixture_rates("temperature:1e308", [10, 20]) == pytest.approx([0.5, 0.5])
    assert draw_task(0, 3, mixture_rates("1e308,1e308", [10, 20])) in (0, 1)
    for bad in ("temperature:1e-300", "temperature:0.001"):
        with pytest.raises(CramkitError, match="temperature must be at least 0.01"):
            mixture_rates(bad, [10, 20])


def test_tiny_temperature_is_one_line_from_the_command(pretrained_run, glue_dir, tmp_path) -> None:
    proc = cli(
        "finetune",
        "--mixture",
        "glue/mrpc,glue/cola",
        "--rates",
        "temperature:1e-300",
        "--from",
        pretrained_run,
        "--data-dir",
        glue_dir,
        "--out",
        tmp_path / "o",
    )
    one_line(proc, "--rates 'temperature:1e-300'", "at least 0.01")
