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

    from cramkit.backends import open_export as load_onnx
    from cramkit.errors import CramkitError

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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
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


def _ct2_variables(data: bytes) -> tuple[bytes, list[tuple[str, tuple[int, ...], int, bytes]]]:
    """(header, [(name, shape, dtype, bytes)]) of a CTranslate2 model.bin, aliases left out (none here)."""
    import struct

    pos = 0

    def take(fmt):
        nonlocal pos
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    def text():
        nonlocal pos
        n = take("<H")
        pos += n
        return data[pos - n : pos - 1].decode()

    take("<I")
    text()
    take("<I")
    header = data[:pos]
    out = []
    for _ in range(take("<I")):
        name = text()
        shape = tuple(take("<I") for _ in range(take("<B")))
        dtype, nbytes = take("<B"), take("<I")
        out.append((name, shape, dtype, data[pos : pos + nbytes]))
        pos += nbytes
    return header, out


def _ct2_write(header: bytes, variables) -> bytes:
    import struct

    def text(s):
        return struct.pack("<H", len(s) + 1) + s.encode() + b"\0"

    body = b"".join(
        text(n)
        + struct.pack("<B", len(sh))
        + b"".join(struct.pack("<I", d) for d in sh)
        + struct.pack("<BI", dt, len(b))
        + b
        for n, sh, dt, b in variables
    )
    return header + struct.pack("<I", len(variables)) + body + struct.pack("<I", 0)


def test_crafted_ctranslate2_exports_are_refused_before_they_run(tok, tmp_path) -> None:
    """issue 30, item 1: CTranslate2 gathers ids from its tables without a bound check. A manifest's pad_id
    past the vocabulary, a model.bin whose table has fewer rows than the tokenizer, a feed-forward weight of
    the wrong inner size, a position table shorter than max_length: one line each (the attacker rewrites the
    SHA-256s too), before CTranslate2 sees the file; the server refuses to start, nothing crashes."""
    pytest.importorskip("ctranslate2")
    import numpy as np
    import torch

    import cramkit
    from cramkit.errors import CramkitError
    from cramkit.loading import LoadedModel
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import MaskedLM

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), hidden=64, layers=2, heads=2, intermediate=128)
    loaded = LoadedModel(model=MaskedLM(cfg).eval(), kind="mlm", config=cfg, tokenizer=tok, source="tiny")
    good = cramkit.export(loaded, tmp_path / "good", format="ct2")
    header, variables = _ct2_variables((good / "model.bin").read_bytes())

    def crafted(name: str, change=None, manifest=None) -> Path:
        bad = tmp_path / name
        shutil.copytree(good, bad)
        man = json.loads((bad / "cramkit-ct2.json").read_text())
        if change is not None:
            (bad / "model.bin").write_bytes(_ct2_write(header, [change(*v) for v in variables]))
            man["files"]["model.bin"] = hashlib.sha256((bad / "model.bin").read_bytes()).hexdigest()
        man.update(manifest or {})
        (bad / "cramkit-ct2.json").write_text(json.dumps(man))
        return bad

    def fewer_rows(n, sh, dt, b):
        if n == "encoder/embeddings_0/weight":
            return n, (100, sh[1]), dt, b[: 100 * sh[1] * 4]
        return n, sh, dt, b

    def wrong_inner(n, sh, dt, b):
        if n == "encoder/layer_1/ffn/linear_1/weight":
            return n, (sh[0], sh[1] // 2), dt, b[: len(b) // 2]
        return n, sh, dt, b

    def short_positions(n, sh, dt, b):
        if n == "encoder/position_encodings/encodings":
            return n, (8, sh[1]), dt, b[: 8 * sh[1] * 4]
        return n, sh, dt, b

    def lying_size(n, sh, dt, b):
        return (n, sh, dt, b[:-4]) if n == "encoder/layer_0/ffn/layer_norm/gamma" else (n, sh, dt, b)

    cases = {
        "pad": (crafted("pad", manifest={"pad_id": 1_000_000_000}), "pad_id 1000000000 is outside"),
        "rows": (crafted("rows", fewer_rows), "token id"),
        "inner": (crafted("inner", wrong_inner), "ffn/linear_1/weight has shape"),
        "positions": (crafted("positions", short_positions), "position_encodings/encodings has shape"),
        "size": (crafted("size", lying_size), "bytes"),
    }
    texts = ["the value of the key is returned", "a list"]
    for name, (bad, said) in cases.items():
        if name == "rows":  # the table is consistent in itself: refused when an id would fall outside it
            with pytest.raises(CramkitError, match=said):
                cramkit.infer.Engine(bad).embed(texts)
            continue
        with pytest.raises(CramkitError, match=said):
            cramkit.load(bad)
    rows = tmp_path / "rows.txt"
    rows.write_text("\n".join(texts) + "\n")
    for name, (bad, said) in cases.items():
        proc = cli("embed", str(rows), "--from", str(bad), "--out", str(tmp_path / f"emb-{name}"))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (name, proc.returncode, proc.stderr[-800:])
        assert said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    got = cramkit.infer.Engine(good).embed(texts)
    assert got.shape == (2, 64) and np.isfinite(got).all()
