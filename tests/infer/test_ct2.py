"""CTranslate2 export (`cramkit export --format ct2`) and the engine's ct2 backend, checked against torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

import cramkit
from clirun import cli_process
from cramkit.backends import open_export as load_ct2
from cramkit.backends.ct2 import MANIFEST
from cramkit.errors import CramkitError
from cramkit.infer import Engine

from .models import cli, ok, sst2

pytest.importorskip("ctranslate2")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def minilm_ct2(minilm_dir, tmp_path_factory) -> dict[str, Path]:
    """all-MiniLM-L6-v2 exported by `cramkit export` processes, float32 and int8 (the integration tier)."""
    base = tmp_path_factory.mktemp("ct2")
    out = {}
    for q in ("float32", "int8"):
        out[q] = base / f"minilm-{q}"
        proc = cli_process("export", f"hf:{minilm_dir}", "--format", "ct2", "--quantize", q, "--out", str(out[q]))
        said = proc.stdout + proc.stderr
        assert proc.returncode == 0, said
        assert f"CTranslate2 {q}" in said and "cosine_mean_mean" in said, said
    return out


@pytest.fixture(scope="module")
def dev200(glue_dir) -> list[str]:
    return [s for s, _ in sst2(glue_dir, "dev")[:200]]  # never seen by the export's check


@pytest.mark.integration
def test_minilm_export_matches_torch_on_unseen_text(minilm_dir, minilm_ct2, dev200) -> None:
    ref = Engine(cramkit.load(f"hf:{minilm_dir}"), device="cpu").embed(dev200)
    f32 = Engine(minilm_ct2["float32"], threads=1)  # a CTranslate2 export is run by CTranslate2 by itself
    assert f32.backend == "ct2" and f32.kind == "encoder" and f32.pooling == "mean" and f32.normalize
    got = f32.embed(dev200)
    assert cosines(ref, got).min() > 0.9999 and np.abs(ref - got).max() < 1e-4
    i8 = Engine(minilm_ct2["int8"], threads=1)
    assert i8.runner.precision.startswith("int8")  # int8 weights (int8_float32 on a CPU)
    c8 = cosines(ref, i8.embed(dev200))
    assert c8.mean() > 0.99 and c8.min() < 0.99999  # faithful, and really quantized
    for q, d in minilm_ct2.items():
        man = json.loads((d / MANIFEST).read_text())
        assert man["quantize"] == q and man["kind"] == "encoder" and man["max_length"] == f32.max_length
        assert set(man["files"]) == {"model.bin", "config.json", "vocabulary.json"} and man["check"]["texts"] >= 64
    assert json.loads((minilm_ct2["float32"] / MANIFEST).read_text())["check"]["cosine_mean_min"] > 0.9999
    # the engine's token budget cuts the same inputs into other passes: the same embeddings
    small = Engine(minilm_ct2["float32"], threads=1, max_batch_tokens=256).embed(dev200)
    assert np.abs(small - got).max() < 1e-5


@pytest.mark.integration
def test_fast_path_passes_and_vectors_match_a_plain_ctranslate2_loop(minilm_dir, minilm_ct2, dev200) -> None:
    """The CPU fast path's own pass size (CTranslate2's budget, not the torch default), the same vectors as
    the loop a user would write on the export's files, and pairs still read with their token types."""
    import ctranslate2
    from tokenizers import Tokenizer

    from cramkit.backends.ct2 import CPU_BATCH_TOKENS
    from cramkit.infer.engine import default_batch_tokens

    i8 = Engine(minilm_ct2["int8"], threads=1)
    assert i8.max_batch_tokens == CPU_BATCH_TOKENS < default_batch_tokens("cpu")
    assert i8.info()["max_batch_tokens"] == CPU_BATCH_TOKENS
    assert Engine(minilm_ct2["int8"], threads=1, max_batch_tokens=2048).max_batch_tokens == 2048  # asked: kept
    got = i8.embed(dev200)
    # the plain loop: the export's tokenizer, 32 length-sorted texts a pass, forward_batch, mean in numpy
    tok = Tokenizer.from_file(str(minilm_ct2["int8"] / "tokenizer" / "tokenizer.json"))
    tok.enable_truncation(i8.max_length)
    tok.no_padding()
    enc = ctranslate2.Encoder(str(minilm_ct2["int8"]), device="cpu", intra_threads=1)
    ids = [e.ids for e in tok.encode_batch(dev200)]
    order = np.argsort([len(x) for x in ids], kind="stable")
    plain = np.zeros_like(got)
    for i in range(0, len(ids), 32):
        rows = [ids[j] for j in order[i : i + 32]]
        h = np.asarray(enc.forward_batch(rows).last_hidden_state)
        n = np.asarray([len(r) for r in rows])
        mean = (h * (np.arange(h.shape[1])[None, :] < n[:, None])[..., None]).sum(1) / n[:, None]
        plain[order[i : i + 32]] = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    # int8 answers depend on how inputs are grouped into passes on some CPUs (an AVX2 EPYC without VNNI: one
    # sentence of 200 at 0.9985, every other at 1.0000), so the loop's vectors are the same up to that
    same = cosines(plain, got)
    assert same.min() > 0.995 and np.median(same) > 0.99999 and (same > 0.9999).mean() >= 0.98
    # pairs: the second text's token types reach CTranslate2 (float32: torch's vectors to 1e-4)
    pairs = [(a, b) for a, b in zip(dev200[:24], dev200[24:48], strict=True)]
    ref = Engine(cramkit.load(f"hf:{minilm_dir}"), device="cpu").embed(pairs)
    f32 = Engine(minilm_ct2["float32"], threads=1).embed(pairs)
    assert np.abs(ref - f32).max() < 1e-4


@pytest.mark.integration
def test_passes_run_side_by_side_one_thread_each_with_the_same_vectors(minilm_ct2, dev200) -> None:
    """On a CPU a CTranslate2 export runs one thread per pass and as many passes at once as threads; the
    vectors and their order are those of one pass at a time."""
    from cramkit.model.forward import run_passes

    one, two = Engine(minilm_ct2["int8"], threads=1), Engine(minilm_ct2["int8"], threads=2)
    assert (one.workers, two.workers) == (1, 2)
    enc = two.tokenize(dev200)
    assert len(two.batches(enc)) > 4  # several passes, so two run at once
    assert np.abs(one.embed(dev200) - two.embed(dev200)).max() < 1e-5
    # the helper keeps the passes' order whatever finishes first
    assert run_passes(lambda b: int(b[0]), [np.array([i]) for i in range(9)], workers=3) == list(range(9))


@pytest.mark.integration
def test_serve_runs_a_ct2_export(minilm_dir, minilm_ct2, dev200) -> None:
    from serve.test_server import start

    proc, url = start(f"mini={minilm_ct2['int8']}", "--backend", "ct2")
    try:
        info = httpx.get(url + "/info", timeout=30).json()
        assert "ct2" in json.dumps(info) and "int8" in json.dumps(info)
        r = httpx.post(url + "/embed", json={"inputs": dev200[:16]}, timeout=60)
        assert r.status_code == 200, r.text
        ref = Engine(cramkit.load(f"hf:{minilm_dir}"), device="cpu").embed(dev200[:16])
        assert cosines(ref, np.asarray(r.json())).mean() > 0.99
        r = httpx.post(url + "/fill-mask", json={"inputs": "a [MASK] film"}, timeout=30)
        assert 400 <= r.status_code < 500  # an encoder: no fill-mask, and the server stays up
        assert httpx.post(url + "/embed", json={"inputs": "still up"}, timeout=30).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.integration
def test_crafted_or_incomplete_exports_are_one_line(minilm_ct2, tmp_path) -> None:
    good = minilm_ct2["float32"]
    man = json.loads((good / MANIFEST).read_text())

    def crafted(name: str) -> Path:
        d = tmp_path / name
        shutil.copytree(good, d, symlinks=True)
        return d

    # a file named in the manifest outside the directory
    bad = crafted("outside")
    files = dict(man["files"], **{"../../etc/passwd": man["files"]["model.bin"]})
    (bad / MANIFEST).write_text(json.dumps(dict(man, files=files)))
    with pytest.raises(CramkitError, match="points outside the directory"):
        load_ct2(bad)
    # the tokenizer outside
    (bad / MANIFEST).write_text(json.dumps(dict(man, tokenizer="../../etc")))
    with pytest.raises(CramkitError, match="tokenizer path points outside"):
        load_ct2(bad)
    # model.bin missing
    bad = crafted("missing")
    (bad / "model.bin").unlink()
    with pytest.raises(CramkitError, match="model.bin is missing; the CTranslate2 export is incomplete"):
        load_ct2(bad)
    # model.bin a link to a file outside, with the very bytes the manifest names: refused as a link
    bad = crafted("link")
    outside = tmp_path / "elsewhere.bin"
    shutil.copy(good / "model.bin", outside)
    (bad / "model.bin").unlink()
    os.symlink(outside, bad / "model.bin")
    with pytest.raises(CramkitError, match="is a symbolic link"):
        load_ct2(bad)
    # damaged weights
    bad = crafted("corrupt")
    with open(bad / "model.bin", "r+b") as f:
        f.seek(1000)
        f.write(b"\x00\x01\x02")
    with pytest.raises(CramkitError, match="corrupt"):
        load_ct2(bad)
    # not a manifest
    (bad / MANIFEST).write_text(json.dumps(dict(man, kind="rce")))
    with pytest.raises(CramkitError, match="unknown kind"):
        load_ct2(bad)
    # through the command line: one line, exit 2; cramkit.load opens an export, what needs torch names its source
    proc = cli("serve", str(tmp_path / "link"), "--port", "0")
    assert proc.returncode == 2 and "symbolic link" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    opened = cramkit.load(good)
    assert opened.backend_name == "ct2" and opened.kind == "encoder" and opened.max_length == man["max_length"]
    from cramkit.loading import load_torch

    with pytest.raises(CramkitError, match="is an export .* fine-tuning needs the torch model it was exported"):
        load_torch(good, purpose="fine-tuning")
    with pytest.raises(CramkitError, match="run it with backend ct2"):
        Engine(good, backend="onnx")
    with pytest.raises(CramkitError, match="threads must be 1..[0-9]+ .the cores this process may use., got 4096"):
        Engine(good, threads=4096)


def test_cramkit_pre_ln_classifier_runs_on_ct2(ft_model, glue_dir, tmp_path) -> None:
    """cramkit's own shape (pre-LN, final norm, no biases, scaled sinusoidal positions, GELU-GLU) is an
    encoder CTranslate2's spec expresses: exported and checked like BERT, the head run in numpy."""
    out = tmp_path / "ft-ct2"
    said = ok("export", str(ft_model), "--format", "ct2", "--out", str(out))
    assert "label_agreement 1.0000" in said, said
    man = json.loads((out / MANIFEST).read_text())
    assert man["shape"]["norm_position"] == "pre" and man["head"]["pooler"] and "head.safetensors" in man["files"]
    rows = sst2(glue_dir, "dev")[:100]
    dev = [s for s, _ in rows]
    ref = Engine(ft_model, device="cpu").classify(dev)
    got = Engine(out, threads=1).classify(dev)
    assert got.labels == ref.labels and np.abs(got.logits - ref.logits).max() < 1e-4
    # predict --from a CT2 export
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows), encoding="utf-8")
    said = cli("predict", "--from", str(out), str(tmp_path / "dev.tsv"), "--out", str(tmp_path / "p.jsonl"))
    assert said.returncode == 0 and "accuracy" in said.stdout, said.stderr
    labels = [json.loads(line)["label"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert labels == ref.labels


def test_what_ct2_cannot_run_is_one_line(tok, tmp_path) -> None:
    from cramkit.loading import LoadedModel
    from cramkit.model.students import BiLSTMConfig, BiLSTMStudent

    cfg = BiLSTMConfig(vocab_size=tok.get_vocab_size(), embedding_dim=8, lstm_hidden=4, fc_hidden=4)
    student = LoadedModel(
        model=BiLSTMStudent(cfg, 2),
        kind="classifier",
        config=cfg,
        tokenizer=tok,
        labels=["0", "1"],
        architecture="bilstm",
        source="student",
    )
    with pytest.raises(CramkitError, match="the CTranslate2 format cannot hold this model .*--format onnx"):
        cramkit.export(student, tmp_path / "s-ct2", format="ct2")
    assert not (tmp_path / "s-ct2").exists()
    proc = cli("export", "hf:nowhere", "--format", "hf", "--quantize", "int8_float32", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "the hf format takes no quantize" in proc.stderr, proc.stderr


@pytest.mark.integration
def test_without_ctranslate2_the_export_names_the_extra(minilm_dir, tmp_path) -> None:
    # a module of that name that cannot be imported stands in for one that is not installed
    (tmp_path / "ctranslate2.py").write_text(
        "raise ModuleNotFoundError('No module named ctranslate2', name='ctranslate2')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cramkit",
            "export",
            f"hf:{minilm_dir}",
            "--format",
            "ct2",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2 and not (tmp_path / "o").exists()
    assert proc.stderr.strip() == (
        "cramkit: error: ctranslate2 is not installed; install cramkit's [ct2] extra: pip install 'cramkit[ct2]'"
    )


SHAPES = {
    "rope, rmsnorm, swiglu": dict(position="rope", norm="rmsnorm", activation="swiglu"),
    "deepnorm, biases, learned positions": dict(norm_position="deepnorm", bias=True, position="learned"),
    "pre-LN without final norm, relu, token types": dict(
        final_norm=False, activation="relu", type_vocab_size=2, embedding_norm=False
    ),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_cramkit_shape_runs_on_ct2(tok, tmp_path, shape) -> None:
    import torch

    from cramkit.loading import LoadedModel
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import SequenceClassifier

    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=tok.get_vocab_size(),
        hidden=64,
        layers=2,
        heads=2,
        intermediate=128,
        max_position=128,
        **SHAPES[shape],
    )
    model = SequenceClassifier(cfg, 3).eval()
    with torch.no_grad():  # away from the init's ones and zeros, so that every norm and bias matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    loaded = LoadedModel(
        model=model,
        kind="classifier",
        config=cfg,
        tokenizer=tok,
        labels=["a", "b", "c"],
        max_length=128,
        with_types=cfg.type_vocab_size > 0,
        source=shape,
    )
    out = cramkit.export(loaded, tmp_path / "ct2", format="ct2")
    texts = ["return the value of the key", ("a list of items", "is sorted in place"), "x " * 200]
    ref, got = Engine(loaded, device="cpu"), Engine(out, threads=1)
    inputs = texts if cfg.type_vocab_size else [t for t in texts if isinstance(t, str)]
    assert np.abs(ref.logits(inputs) - got.logits(inputs)).max() < 1e-4
    assert np.abs(ref.embed(inputs) - got.embed(inputs)).max() < 1e-4


def test_a_masked_lm_exports_as_its_encoder(tok, tmp_path) -> None:
    from cramkit.loading import LoadedModel
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import MaskedLM

    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), hidden=64, layers=2, heads=2, intermediate=128)
    loaded = LoadedModel(model=MaskedLM(cfg).eval(), kind="mlm", config=cfg, tokenizer=tok, source="mlm")
    out = cramkit.export(loaded, tmp_path / "ct2", format="ct2")
    got = Engine(out, threads=1)
    assert got.kind == "encoder" and not got.can_fill_mask
    texts = ["return the value of the key", "a list"]
    assert np.abs(Engine(loaded, device="cpu").embed(texts) - got.embed(texts)).max() < 1e-4
    with pytest.raises(CramkitError, match="no masked-LM head"):
        got.fill_mask(["the [MASK] value"])
