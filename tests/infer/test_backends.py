"""The export seam: a new format is one file (tests/infer/toy_format.py). Registered in-process it exports,
loads and runs through cramkit.export / cramkit.load / Engine / cramkit.predict; installed as a package's
entry point (a dist-info on PYTHONPATH, as pip would leave it) the command line exports, predicts and
serves it as a real subprocess over HTTP."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import load_file

import cramkit
from clirun import cli_process
from cramkit import backends
from cramkit.errors import CramkitError
from cramkit.infer import Engine
from infer.models import cli, sst2

TOY = Path(__file__).with_name("toy_format.py")


@pytest.fixture
def bag_registered():
    from infer.toy_format import BagBackend

    backends.register(BagBackend)
    yield
    backends._REGISTRY.pop("bag", None)


def _bag_mean(out: Path, texts: list[str]) -> np.ndarray:
    """The toy format's embedding computed here from its files: the mean of the tokens' table rows."""
    from cramkit.text.tokenizer import load_tokenizer

    table = load_file(str(out / "bag.safetensors"))["word"]
    tok = load_tokenizer(out / "tokenizer")
    return np.stack([table[tok.encode(t).ids].mean(0) for t in texts])


def test_a_format_registered_in_process_exports_loads_and_predicts(bag_registered, ft_model, glue_dir, tmp_path):
    out = cramkit.export(ft_model, tmp_path / "bag", format="bag")
    man = json.loads((out / "cramkit-bag.json").read_text())
    assert man["format"] == "cramkit-bag-1" and man["kind"] == "classifier" and man["labels"] == ["0", "1"]
    assert set(man["files"]) == {"bag.safetensors"} and "worst_relative_diff" in man["check"]
    opened = cramkit.load(out)
    assert opened.backend_name == "bag" and opened.kind == "classifier" and opened.labels == ["0", "1"]
    texts = ["a gorgeous, witty film", "dull and far too long"]
    engine = Engine(out)
    assert engine.backend == "bag" and engine.can_embed and engine.can_classify
    np.testing.assert_allclose(engine.embed(texts, pooling="mean"), _bag_mean(out, texts), rtol=1e-5, atol=1e-6)
    assert set(engine.classify(texts).labels) <= {"0", "1"}
    rows = tmp_path / "dev.tsv"
    rows.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in sst2(glue_dir, "dev")[:40]))
    summary = cramkit.predict(out, rows, tmp_path / "pred.jsonl")
    assert summary["rows"] == 40 and 0.0 <= summary["metrics"]["accuracy"] <= 100.0
    assert len((tmp_path / "pred.jsonl").read_text().splitlines()) == 40
    # a torch model run through the format: exported to a temporary directory at start
    assert Engine(ft_model, backend="bag").backend == "bag"
    # what needs torch refuses the export and names where it came from
    with pytest.raises(CramkitError, match=f"is an export .*needs the torch model .*{ft_model.name}"):
        cramkit.finetune(out, task="glue/sst2", data_dir=glue_dir)


def test_registry_refuses_what_it_cannot_tell_apart(bag_registered):
    from infer.toy_format import BagBackend

    class Torch(BagBackend):
        name = "torch"

    with pytest.raises(CramkitError, match="cramkit's own"):
        backends.register(Torch)

    class Other(BagBackend):
        pass

    with pytest.raises(CramkitError, match="two backends are named 'bag'"):
        backends.register(Other)
    with pytest.raises(CramkitError, match="format must be one of hf, onnx, ct2, openvino, bag"):
        cramkit.export("nowhere", "out", format="nope")
    with pytest.raises(CramkitError, match="backend must be one of auto, torch, onnx, ct2, openvino, bag"):
        Engine("nowhere", backend="nope")


def _installed(tmp_path: Path) -> dict[str, str]:
    """The toy format installed as pip leaves a package: its module and a dist-info with the entry point."""
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(TOY, site / "toy_format.py")
    info = site / "cramkit_bag-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cramkit-bag\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[cramkit.backends]\nbag = toy_format:BagBackend\n")
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.integration  # an installed package: its entry point is read by a new process
def test_an_installed_format_exports_predicts_and_serves(ft_model, glue_dir, tmp_path, monkeypatch):
    from serve.test_server import start

    for key, value in _installed(tmp_path).items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "bag"
    proc = cli_process("export", str(ft_model), "--format", "bag", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "[bag] wrote a bag of" in proc.stderr and (out / "cramkit-bag.json").is_file()
    rows = tmp_path / "dev.tsv"
    rows.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in sst2(glue_dir, "dev")[:20]))
    proc = cli_process("predict", "--from", str(out), str(rows), "--out", str(tmp_path / "p.jsonl"))
    assert proc.returncode == 0, proc.stderr
    preds = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(preds) == 20 and {p["label"] for p in preds} <= {"0", "1"}
    server, url = start(f"bag={out}")
    try:
        texts = ["a gorgeous, witty film", "dull"]
        r = httpx.post(url + "/embed", json={"inputs": texts, "model": "bag"}, timeout=60)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.asarray(r.json()), _normalized(out, texts), rtol=1e-4, atol=1e-5)
        r = httpx.post(url + "/predict", json={"inputs": texts[0], "model": "bag"}, timeout=60)
        assert r.status_code == 200 and {d["label"] for d in r.json()} == {"0", "1"}
        info = httpx.get(url + "/info", timeout=60).json()
        assert "bag" in json.dumps(info)
    finally:
        server.terminate()
        server.wait(30)
    # without the package, the directory is not a model cramkit knows: one line
    monkeypatch.delenv("PYTHONPATH")
    proc = cli_process("predict", "--from", str(out), str(rows))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr


def _normalized(out: Path, texts: list[str]) -> np.ndarray:
    """/embed's answer: the model's pooling, L2-normalised as TEI's normalize=true default does."""
    from cramkit.text.tokenizer import load_tokenizer

    if json.loads((out / "cramkit-bag.json").read_text())["pooling"] == "mean":
        v = _bag_mean(out, texts)
    else:
        table = load_file(str(out / "bag.safetensors"))["word"]
        tok = load_tokenizer(out / "tokenizer")
        v = np.stack([table[tok.encode(t).ids[0]] for t in texts])
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_embed_and_index_take_an_export(ft_model, ft_onnx, builtin_docs, tmp_path):
    """`cramkit embed` and `cramkit index build` open an export through cramkit.load like any model; the
    index keeps a copy of the export and queries with it."""
    lines = [" ".join(d.split())[:160] for d in builtin_docs[:80]]
    src = tmp_path / "lines.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = cli("embed", str(src), "--from", str(ft_onnx), "--out", str(tmp_path / "emb"), "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    got = np.load(tmp_path / "emb" / "embeddings.npy", allow_pickle=False)
    ref = Engine(cramkit.load(ft_model), device="cpu").embed(lines)
    assert got.shape == ref.shape and np.abs(got - ref).max() < 1e-4
    idx = tmp_path / "idx"
    proc = cli("index", "build", str(src), "--encoder", str(ft_onnx), "--out", str(idx), "--kind", "flat")
    assert proc.returncode == 0, proc.stderr
    assert (idx / "encoder" / "cramkit-onnx.json").is_file()
    from cramkit import index as index_mod

    probe = index_mod.open(idx).chunks.text(3)
    proc = cli("index", "query", str(idx), probe, "-k", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[0])["hits"][0]["text"] == probe
