"""`cramkit.distill` is DistillRequest's function: it takes one request or its fields (settings as keywords), a
rule of what combines gives the same line from the command line and from Python, and torchrun's workers read the
request the launcher wrote (`--request FILE`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cramkit
from cramkit.cli import main
from cramkit.distillation.request import DistillRequest
from cramkit.errors import CramkitError
from cramkit.request import write_request

TINY = {"n_iter": 1, "epochs": 1, "baseline": False, "speed_seconds": 0.05, "lstm_hidden": 8, "fc_hidden": 8}


def test_a_rule_is_the_same_line_from_both_doors(tmp_path: Path, capsys) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("one text\nanother text\n", encoding="utf-8")
    argv = ["--teacher", "hf:x", "--student", "layers:2", "--out", str(tmp_path / "o"), "--task", "glue/sst2"]
    assert main(["distill", *argv, "--unlabelled", str(texts)]) == 2
    line = capsys.readouterr().err.strip()
    with pytest.raises(CramkitError) as python:
        cramkit.distill("hf:x", student="layers:2", out=tmp_path / "o", task="glue/sst2", unlabelled=texts)
    assert line == f"cramkit: error: {python.value}" and "drop --task" in line
    assert main(["distill", *argv[:6], "--unlabelled", str(texts), "--nproc", "2"]) == 2  # checked before torchrun
    assert "trains in one process; drop --nproc" in capsys.readouterr().err
    assert main(["distill", "--teacher", "hf:x", "--student", "bilstm", "--out", str(tmp_path / "o"),
                 "--task", "glue/sst2", "--set", "export=cpu"]) == 2  # fmt: skip
    assert "export=cpu exports an embedding student" in capsys.readouterr().err
    with pytest.raises(CramkitError, match="unknown setting 'distill.epoch'"):
        cramkit.distill(DistillRequest("hf:x", student="bilstm", out=tmp_path / "o", settings={"epoch": 3}))


def test_a_request_or_its_fields(teacher, sst_csv, nltk_data, tmp_path: Path) -> None:
    files = {"train": sst_csv["train"], "dev": sst_csv["dev"], "text_a": "sentence", "cache": tmp_path / "cache"}
    one = cramkit.distill(teacher, student="bilstm", out=tmp_path / "one", progress=False, **files, **TINY)
    two = cramkit.distill(
        DistillRequest(teacher, student="bilstm", out=tmp_path / "two", progress=False, settings=TINY, **files)
    )
    assert one["config"] == two["config"] and one["config"]["lstm_hidden"] == 8
    assert json.loads((tmp_path / "two" / "report.json").read_text())["transfer_set"]["cached"]


def test_a_worker_reads_the_request_file(tmp_path: Path, capsys) -> None:
    """What `--nproc N` hands each torchrun process: the request, --config's settings and --set included."""
    req = DistillRequest("hf:x", student="bilstm", out=tmp_path / "o", settings={"epochs": 5}, overrides=["p_pos=0"])
    write_request(req, "distill", tmp_path / "req.yaml")
    argv = ["distill", "--teacher", "t", "--student", "encoder", "--out", "o", "--request", str(tmp_path / "req.yaml")]
    assert main([*argv, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "  epochs: 5.0" in printed and "  p_pos: 0.0" in printed and "  lstm_hidden: 150" in printed
