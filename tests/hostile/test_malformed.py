"""Malformed input of the smaller kinds: huge CSV fields, crafted manifests, a tokenizer whose regex makes
the Rust tokenizer panic. Each gets work done or one line, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import cramkit
from cramkit.cli import main
from cramkit.errors import CramkitError


def test_csv_fields_over_the_csv_modules_limit_are_read(ft_model, pretrained_run, tmp_path, capsys) -> None:
    rows = tmp_path / "long.csv"
    rows.write_text('text,label\n"' + "word " * 40_000 + '",0\nshort,1\n')  # a 200,000-character field
    assert main(["predict", "--from", str(ft_model), str(rows), "--out", str(tmp_path / "p.jsonl")]) == 0
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 2
    assert main(["embed", str(rows), "--from", str(pretrained_run), "--out", str(tmp_path / "emb")]) == 0
    assert json.loads((tmp_path / "emb" / "embed.json").read_text())["rows"] == 2


MODEL_CASES = [
    ("architecture", ["bilstm"]),
    ("model", []),
    ("model", {"heads": 0}),
    ("model", {"hidden": "big"}),
    ("head", "first"),
    ("num_labels", "2"),
    ("labels", [1, 2]),
    ("max_length", "512"),
    ("max_length", True),
    ("pooling", ["mean"]),
    ("normalize", "yes"),
    ("with_types", 1),
    ("extra", "x"),
    ("sha256", ["abc"]),
    ("task", 5),
    ("kind", {"a": 1}),
]


def test_crafted_model_manifest_fields_are_one_line(ft_model, tmp_path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(ft_model, bad)
    meta = json.loads((ft_model / "cramkit-model.json").read_text())
    for field, value in MODEL_CASES:
        (bad / "cramkit-model.json").write_text(json.dumps({**meta, field: value}))
        with pytest.raises(CramkitError):
            cramkit.load(bad)


ONNX_CASES = [
    ("pad_id", "0"),
    ("pooling", ["cls"]),
    ("tokenizer", 5),
    ("hidden", "64"),
    ("files", {"model.onnx": 5}),
    ("files", []),
    ("labels", "pos"),
    ("max_length", 2.5),
    ("quantize", "int4"),
    ("normalize", "no"),
    ("with_types", "yes"),
    ("kind", ["classifier"]),
]


def test_crafted_onnx_manifest_fields_are_one_line(ft_onnx, tmp_path) -> None:
    from cramkit.backends import open_export as load_onnx

    bad = tmp_path / "bad"
    shutil.copytree(ft_onnx, bad)
    meta = json.loads((ft_onnx / "cramkit-onnx.json").read_text())
    for field, value in ONNX_CASES:
        (bad / "cramkit-onnx.json").write_text(json.dumps({**meta, field: value}))
        with pytest.raises(CramkitError):
            load_onnx(bad)


@pytest.mark.integration
def test_tokenizer_regex_that_panics_the_rust_tokenizer_is_one_line(ft_model, tmp_path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(ft_model, bad)
    file = bad / "tokenizer" / "tokenizer.json"
    tok = json.loads(file.read_text())
    split = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, tok["pre_tokenizer"]]}
    file.write_text(json.dumps(tok))
    rows = tmp_path / "rows.txt"
    rows.write_text("a" * 5000 + "b\nfine\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RUST_BACKTRACE": "0"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cramkit",
            "predict",
            "--from",
            str(bad),
            str(rows),
            "--out",
            str(tmp_path / "p"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("cramkit: error:")]
    assert len(errors) == 1 and "tokenizer" in errors[0] and "Traceback" not in proc.stderr, proc.stderr
