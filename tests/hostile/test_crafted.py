"""Crafted files in an ONNX export, an index or a model directory: refused with one line, nothing read
outside the directory, nothing huge allocated."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from infer.models import cli


def _rehash(export: Path, name: str) -> None:
    """What an attacker does after editing a file: write its SHA-256 into the manifest too."""
    man = json.loads((export / "cramkit-onnx.json").read_text())
    man["files"][name] = hashlib.sha256((export / name).read_bytes()).hexdigest()
    (export / "cramkit-onnx.json").write_text(json.dumps(man))


def _external(name: str, location: str, size: int):
    import onnx

    t = onnx.TensorProto(name=name, data_type=onnx.TensorProto.UINT8, dims=[size])
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(size))):
        t.external_data.add(key=key, value=value)
    return t


def test_onnx_export_with_external_data_under_the_cwd_is_refused(ft_onnx, tmp_path, glue_dir) -> None:
    import onnx
    from onnx import helper

    secret = b"API_KEY=hunter2hunter2\n"
    work = tmp_path / "cwd"
    work.mkdir()
    (work / ".env").write_bytes(secret)
    bad = tmp_path / "bad"
    shutil.copytree(ft_onnx, bad)
    model = onnx.load(str(bad / "model.onnx"), load_external_data=False)
    g = model.graph
    # the secret, cast to float and summed into the logits (broadcast): it comes back as scores
    g.initializer.append(_external("leak", ".env", len(secret)))
    logits = next(o for o in g.output if o.name == "logits")
    g.node.extend(
        [
            helper.make_node("Cast", ["leak"], ["leak_f"], to=onnx.TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["leak_f"], ["leak_sum"], keepdims=0),
        ]
    )
    for node in g.node:
        node.output[:] = ["logits_raw" if o == "logits" else o for o in node.output]
    g.node.append(helper.make_node("Add", ["logits_raw", "leak_sum"], ["logits"]))
    del logits
    onnx.save(model, str(bad / "model.onnx"))
    _rehash(bad, "model.onnx")
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\nawful\n")
    proc = cli("predict", "--from", str(bad), str(rows), "--out", str(tmp_path / "p.jsonl"), cwd=work)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "external file" in proc.stderr and "'.env'" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p.jsonl").exists()


def test_external_data_in_a_subgraph_or_function_is_refused(ft_onnx, tmp_path) -> None:
    import onnx
    from onnx import helper

    from cramkit.errors import CramkitError
    from cramkit.infer.backends import open_export as load_onnx

    for where in ("subgraph", "function"):
        bad = tmp_path / where
        shutil.copytree(ft_onnx, bad)
        model = onnx.load(str(bad / "model.onnx"), load_external_data=False)
        const = helper.make_node("Constant", [], ["c"], value=_external("deep", ".ssh/id_ed25519", 4))
        if where == "subgraph":
            branch = helper.make_graph([const], "then", [], [helper.make_tensor_value_info("c", 2, [4])])
            cond = helper.make_node("Constant", [], ["cond"], value=helper.make_tensor("t", 9, [], [True]))
            model.graph.node.extend(
                [cond, helper.make_node("If", ["cond"], ["unused"], then_branch=branch, else_branch=branch)]
            )
        else:
            model.functions.append(
                helper.make_function("crafted", "Leak", [], ["c"], [const], [helper.make_opsetid("", 18)])
            )
        onnx.save(model, str(bad / "model.onnx"))
        _rehash(bad, "model.onnx")
        with pytest.raises(CramkitError, match="external file"):
            load_onnx(bad)


def _limited(*args: str, cwd: Path | None = None):
    """`cramkit ARGS` with its address space capped at 16 GiB: a regression that does allocate what a
    crafted file asks for fails at once instead of swapping the machine."""
    import os
    import resource
    import subprocess
    import sys

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "cramkit", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
        preexec_fn=cap,
    )


def _one_line_error(proc, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_model_config_asking_for_terabytes_is_refused_before_allocating(ft_model, tmp_path) -> None:
    bad = tmp_path / "huge"
    shutil.copytree(ft_model, bad)
    meta = json.loads((bad / "cramkit-model.json").read_text())
    meta["model"].update(hidden=16384, heads=16, layers=200, intermediate=65536)
    (bad / "cramkit-model.json").write_text(json.dumps(meta))
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\n")
    proc = _limited("predict", "--from", str(bad), str(rows), "--out", str(tmp_path / "p.jsonl"))
    _one_line_error(proc, "cramkit-model.json", "parameters", "GiB")


def test_student_config_asking_for_terabytes_is_refused_before_allocating(tmp_path) -> None:
    from safetensors.numpy import save_file

    bad = tmp_path / "student"
    bad.mkdir()
    save_file({}, str(bad / "model.safetensors"))
    meta = {
        "format": "cramkit-model-1",
        "architecture": "bilstm",
        "kind": "classifier",
        "labels": ["0", "1"],
        "model": {"vocab_size": 2_000_000_000, "embedding_dim": 4096},
    }
    (bad / "cramkit-model.json").write_text(json.dumps(meta))
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\n")
    proc = _limited("predict", "--from", str(bad), str(rows), "--out", str(tmp_path / "p.jsonl"))
    _one_line_error(proc, "cramkit-model.json", "parameters", "GiB")


def test_model_directory_links_to_files_outside_are_refused(ft_model, tmp_path) -> None:
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    # the vocabulary (a file outside, e.g. ~/.env, whose lines would come back as tokens)
    bad = tmp_path / "vocab-link"
    shutil.copytree(ft_model, bad)
    (bad / "tokenizer" / "tokenizer.json").unlink()
    shutil.move(bad / "tokenizer" / "vocab.txt", outside / "vocab.txt")
    (bad / "tokenizer" / "vocab.txt").symlink_to(outside / "vocab.txt")
    proc = _limited("predict", "--from", str(bad), str(rows), "--out", str(tmp_path / "p.jsonl"))
    _one_line_error(proc, "vocab.txt", "outside")
    # the weights
    bad = tmp_path / "weights-link"
    shutil.copytree(ft_model, bad)
    shutil.move(bad / "model.safetensors", outside / "model.safetensors")
    (bad / "model.safetensors").symlink_to(outside / "model.safetensors")
    proc = _limited("predict", "--from", str(bad), str(rows), "--out", str(tmp_path / "p.jsonl"))
    _one_line_error(proc, "model.safetensors", "outside")
