"""`cramkit predict` and `cramkit export` from their requests (issue 64): each verb's checks and
defaults are its request's, so the command line and the Python function give the same line for the same mistake,
decide the same default output, and the function takes a request as well as its fields."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cramkit
from clirun import cli, one_line
from cramkit.errors import CramkitError
from cramkit.infer.export import export
from cramkit.infer.requests import ExportRequest, PredictRequest
from infer.models import sst2


def _same_line(args: list[Any], *calls: Callable[[], Any]) -> str:
    """The command's one error line, and each call's CramkitError is the same line."""
    line = one_line(cli(*args))
    for call in calls:
        with pytest.raises(CramkitError) as exc:
            call()
        assert line == f"cramkit: error: {exc.value}"
    return line


def test_export_refuses_what_does_not_combine_from_both_doors(tmp_path: Path) -> None:
    """Checked before the model is read: a model that does not exist is never reached."""
    model, out = str(tmp_path / "nowhere"), str(tmp_path / "out")
    said = _same_line(
        ["export", model, "--out", out, "--race"],
        lambda: cramkit.export(model, out, race=True),
        lambda: export(ExportRequest(model, out, race=True)),
    )
    assert "--race and --no-race apply to --target" in said
    said = _same_line(
        ["export", model, "--out", out, "--target", "cpu", "--format", "onnx"],
        lambda: cramkit.export(model, out, target="cpu", format="onnx"),
    )
    assert "picks the format and quantization itself" in said
    said = _same_line(
        ["export", model, "--out", out, "--format", "onnx", "--quantize", "int4"],
        lambda: cramkit.export(ExportRequest(model, out, format="onnx", quantize="int4")),
    )
    assert "quantize must be one of" in said
    with pytest.raises(CramkitError, match="the hf format takes no quantize or options"):
        cramkit.export(model, out, opset=17)  # a format's own option, given to hf
    assert not (tmp_path / "out").exists()


def test_predict_refuses_what_does_not_combine_from_both_doors(tmp_path: Path) -> None:
    rows = tmp_path / "rows.txt"
    rows.write_text("a film\n")
    model = str(tmp_path / "nowhere")
    said = _same_line(
        ["predict", rows, "--from", model, "--expert-cache", "2"],
        lambda: cramkit.predict(model, rows, expert_cache=2),
        lambda: cramkit.predict(PredictRequest(model, rows, expert_cache="2")),
    )
    assert "--expert-cache applies with --offload-experts" in said
    said = _same_line(
        ["predict", rows, "--from", model, "--choices", " , "], lambda: cramkit.predict(model, rows, choices=" , ")
    )
    assert "name the column(s)" in said
    assert not (tmp_path / "rows.predictions.jsonl").exists()


def test_predict_takes_a_request_and_decides_the_same_default_output(
    ft_model: Path, glue_dir: Path, tmp_path: Path
) -> None:
    rows = tmp_path / "dev.tsv"
    rows.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in sst2(glue_dir, "dev")[:12]))
    default = tmp_path / "dev.predictions.jsonl"
    summary = cramkit.predict(PredictRequest(ft_model, rows, label="none", choices=None, device="cpu"))
    assert summary["out"] == str(default) and summary["rows"] == 12 and "metrics" not in summary  # label none
    from_python = default.read_text()
    default.unlink()
    proc = cli("predict", rows, "--from", ft_model, "--label", "none", "--device", "cpu")
    assert proc.returncode == 0 and str(default) in proc.stdout, proc.stderr
    labels = [json.loads(x)["label"] for x in default.read_text().splitlines()]
    assert labels == [json.loads(x)["label"] for x in from_python.splitlines()]
