"""ONNX export (`cramkit export --format onnx`) and the ONNX Runtime backend, checked against torch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

import cramkit
from cramkit.backends import open_export as load_onnx
from cramkit.backends.onnx import MANIFEST
from cramkit.errors import CramkitError
from cramkit.infer import Engine

from .models import cli, sst2


def test_fp32_export_matches_torch_on_unseen_text(ft_model, ft_onnx, glue_dir) -> None:
    man = json.loads((ft_onnx / MANIFEST).read_text())
    assert man["kind"] == "classifier" and man["labels"] == ["0", "1"] and man["quantize"] is None
    assert man["check"]["worst_relative_diff"] < 1e-3 and man["check"]["label_agreement"] == 1.0
    assert man["check"]["texts"] >= 64 and set(man["files"]) == {"model.onnx"}
    dev = [s for s, _ in sst2(glue_dir, "dev")[:200]]  # never seen by training nor by the export's check
    ref = Engine(ft_model, device="cpu")
    got = Engine(ft_onnx, threads=1)
    assert got.backend == "onnx" and got.kind == "classifier" and got.labels == ["0", "1"]
    a, b = ref.logits(dev), got.logits(dev)
    assert np.abs(a - b).max() < 1e-4 * max(1.0, np.abs(a).max())
    ea, eb = ref.embed(dev[:50]), got.embed(dev[:50])
    assert np.abs(ea - eb).max() < 1e-4
    assert ref.classify(dev).labels == got.classify(dev).labels


@pytest.mark.integration
def test_python_export_to_onnx_is_the_commands(ft_model, ft_onnx, glue_dir, tmp_path) -> None:
    """`cramkit.export(MODEL, OUT, format="onnx")` writes what `cramkit export --format onnx` writes."""
    out = cramkit.export(ft_model, tmp_path / "py-onnx", format="onnx")
    assert out == tmp_path / "py-onnx"
    ours, theirs = (json.loads((d / MANIFEST).read_text()) for d in (out, ft_onnx))
    for key in ("kind", "labels", "max_length", "pooling", "inputs", "outputs", "quantize"):
        assert ours[key] == theirs[key], key
    dev = [s for s, _ in sst2(glue_dir, "dev")[:64]]
    a, b = Engine(out, threads=1).logits(dev), Engine(ft_onnx, threads=1).logits(dev)
    assert np.abs(a - b).max() < 1e-5
    with pytest.raises(CramkitError, match="the hf format takes no quantize"):
        cramkit.export(ft_model, tmp_path / "hf", quantize="int8")


def test_int8_export_records_what_it_cost(ft_model, ft_onnx, ft_onnx_int8, glue_dir) -> None:
    man = json.loads((ft_onnx_int8 / MANIFEST).read_text())
    check = man["check"]
    assert man["quantize"] == "int8" and man["quantization"]["weights"].startswith("int8")
    assert 0.8 <= check["label_agreement"] <= 1.0 and check["cosine_mean_mean"] > 0.95
    assert check["max_abs_diff_logits"] > 0  # it really is quantized
    ops = {n.op_type for n in onnx.load(str(ft_onnx_int8 / "model.onnx")).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops, ops
    rows = sst2(glue_dir, "dev")
    dev, gold = [s for s, _ in rows], np.asarray([int(y) for _, y in rows])
    acc32 = (Engine(ft_onnx, threads=1).logits(dev).argmax(1) == gold).mean()
    acc8 = (Engine(ft_onnx_int8, threads=1).logits(dev).argmax(1) == gold).mean()
    assert abs(acc32 - acc8) < 0.05, (acc32, acc8)


@pytest.mark.slow
def test_mlm_export_fills_masks_like_torch(pretrained_run) -> None:
    # backend="onnx" on a torch model exports it to a temporary directory first
    got = Engine(pretrained_run, backend="onnx", threads=1)
    ref = Engine(cramkit.load(pretrained_run), device="cpu")
    assert got.backend == "onnx" and got.can_fill_mask
    man = got.loaded.manifest
    assert set(man["files"]) == {"model.onnx", "head.onnx"} and man["check"]["fill_mask_top1_agreement"] == 1.0
    texts = ["return the [MASK] of the list", "an [MASK] is raised when the [MASK] is empty"]
    a, b = ref.fill_mask(texts, top_k=3), got.fill_mask(texts, top_k=3)
    assert [[c["id"] for c in m] for r in a for m in r] == [[c["id"] for c in m] for r in b for m in r]
    pa = np.asarray([c["score"] for r in a for m in r for c in m])
    pb = np.asarray([c["score"] for r in b for m in r for c in m])
    assert np.abs(pa - pb).max() < 1e-4


def test_crafted_or_damaged_exports_are_refused(ft_onnx, tmp_path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(ft_onnx, bad)
    man = json.loads((bad / MANIFEST).read_text())
    # a path outside the directory
    (bad / MANIFEST).write_text(json.dumps(dict(man, tokenizer="../../etc")))
    with pytest.raises(CramkitError, match="outside the directory"):
        load_onnx(bad)
    # a model file that is not the one exported
    (bad / MANIFEST).write_text(json.dumps(man))
    with open(bad / "model.onnx", "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    with pytest.raises(CramkitError, match="corrupt"):
        load_onnx(bad)
    # not JSON, wrong format, wrong kind
    (bad / MANIFEST).write_text("{not json")
    with pytest.raises(CramkitError, match="not valid JSON"):
        load_onnx(bad)
    (bad / MANIFEST).write_text(json.dumps(dict(man, kind="rce")))
    with pytest.raises(CramkitError, match="unknown kind"):
        load_onnx(bad)
    # through the command line: one line, exit 2
    proc = cli("serve", str(bad), "--port", "0")
    assert proc.returncode == 2 and "unknown kind" in proc.stderr and "Traceback" not in proc.stderr


def test_export_refuses_to_overwrite_what_is_not_an_export(ft_model, tmp_path) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = cli("export", str(ft_model), "--format", "onnx", "--out", str(out))
    assert (
        proc.returncode == 2
        and "holds other files (notes.txt)" in proc.stderr
        and "--force" in proc.stderr
        and "Traceback" not in proc.stderr
    )
    assert (out / "notes.txt").read_text() == "mine"


def test_predict_command_runs_an_onnx_export(ft_model, ft_onnx, glue_dir, tmp_path) -> None:
    rows = sst2(glue_dir, "dev")[:40]
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows), encoding="utf-8")
    said = cli("predict", "--from", str(ft_onnx), str(tmp_path / "dev.tsv"), "--out", str(tmp_path / "p.jsonl"))
    assert said.returncode == 0 and "accuracy" in said.stdout, said.stderr
    got = [json.loads(line)["label"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert got == Engine(ft_model, device="cpu").classify([s for s, _ in rows]).labels


def _tiny(tmp_path_factory, tok_dir, name: str, *sets: str) -> Path:
    from conftest import run_pretrain

    args = [x for s in sets for x in ("--set", s)]
    return run_pretrain(tmp_path_factory.mktemp(name) / "run", "--tokenizer", str(tok_dir), *args, steps=2)


def _export_and_compare(run: Path, out: Path, **kwargs) -> dict:
    """`export_onnx` of ``run`` (a masked-LM encoder), its manifest, and its embeddings against torch's."""
    from cramkit.backends import write_export
    from cramkit.infer.engine import compare_outputs

    loaded = cramkit.load(run)
    write_export("onnx", loaded, out, compare=compare_outputs, progress=False, **kwargs)
    man = json.loads((out / MANIFEST).read_text())
    texts = [
        "the function returns a list of the keys",
        "a short one",
        "raise an error when the file is missing " * 2,
    ]
    a, b = Engine(loaded, device="cpu").embed(texts), Engine(out, threads=1).embed(texts)
    man["embed_diff"] = float(np.abs(a - b).max())
    return man


BERT_SHAPE = (
    "model.norm_position=post",
    "model.bias=true",
    "model.position=learned",
    "model.activation=gelu",
    "model.type_vocab_size=2",
    "model.final_norm=false",
)


@pytest.mark.integration
def test_bert_shaped_export_runs_fused_attention(tmp_path_factory, tok_dir, tmp_path) -> None:
    """A BERT-shaped encoder's attention is one ONNX Runtime MultiHeadAttention per layer (no softmax left),
    with the same outputs as torch; int8 quantizes its projections for the instruction set it is asked
    for, and the manifest says which."""
    run = _tiny(tmp_path_factory, tok_dir, "bert", *BERT_SHAPE)
    man = _export_and_compare(run, tmp_path / "fp32")
    assert man["attention"] == {"fused": True}
    ops = [n.op_type for n in onnx.load(str(tmp_path / "fp32" / "model.onnx")).graph.node]
    assert ops.count("MultiHeadAttention") == 2 and "Softmax" not in ops, ops
    assert man["graph_ops"]["MultiHeadAttention"] == 2 and "MultiHeadAttention" not in man["fusions"]["applied"]
    assert man["check"]["worst_relative_diff"] < 1e-4 and man["embed_diff"] < 1e-4
    # int8, quantized for another CPU than this one: what was chosen is what the manifest says
    man8 = _export_and_compare(run, tmp_path / "int8", quantize="int8", isa="avx2")
    quant = man8["quantization"]
    assert quant["isa"] == "avx2" and quant["reduce_range"] is True and quant["format"] == "U8S8"
    assert man8["graph_ops"]["MultiHeadAttention"] == 2 and man8["graph_ops"]["MatMulInteger"] >= 6, man8
    assert man8["check"]["cosine_mean_mean"] > 0.98 and man8["embed_diff"] > 0


@pytest.mark.integration
def test_every_encoder_shape_fuses_its_attention(tmp_path_factory, tok_dir, tmp_path) -> None:
    """Pre-LN with RMSNorm, rotary positions and a SwiGLU MLP: the rotary embedding stays in the graph,
    the attention core is fused, the outputs are torch's."""
    run = _tiny(
        tmp_path_factory,
        tok_dir,
        "rope",
        "model.position=rope",
        "model.max_position=512",
        "model.norm=rmsnorm",
        "model.activation=swiglu",
    )
    man = _export_and_compare(run, tmp_path / "rope")
    assert man["attention"] == {"fused": True} and man["graph_ops"]["MultiHeadAttention"] == 2
    assert man["check"]["worst_relative_diff"] < 1e-4 and man["embed_diff"] < 1e-4


@pytest.mark.integration
def test_export_falls_back_to_the_plain_attention_graph(tmp_path_factory, tok_dir, tmp_path, monkeypatch) -> None:
    """When the fused attention cannot be exported, the plain graph is, and the manifest says why."""
    from cramkit.backends import onnx_graph as onnx_mod

    real, _ = onnx_mod._attention_op()

    def broken(*args, **kwargs):
        raise ValueError("no MultiHeadAttention here")

    monkeypatch.setattr(onnx_mod, "_attention_op", lambda: (real, broken))
    run = _tiny(tmp_path_factory, tok_dir, "plain", *BERT_SHAPE)
    man = _export_and_compare(run, tmp_path / "plain")
    assert man["attention"]["fused"] is False and "no MultiHeadAttention here" in man["attention"]["why_not"]
    assert "MultiHeadAttention" not in man["graph_ops"] and man["graph_ops"]["MatMul"] >= 12
    assert man["check"]["worst_relative_diff"] < 1e-4 and man["embed_diff"] < 1e-4


@pytest.mark.slow
def test_deepnet_glu_shape_runs_fused_attention(tmp_path_factory, tok_dir, tmp_path) -> None:
    run = _tiny(tmp_path_factory, tok_dir, "deepnet", "model.norm_position=deepnorm", "model.norm=rmsnorm")
    man = _export_and_compare(run, tmp_path / "deepnet")
    assert man["attention"] == {"fused": True} and man["graph_ops"]["MultiHeadAttention"] == 2
    assert man["check"]["worst_relative_diff"] < 1e-4 and man["embed_diff"] < 1e-4


def test_int8_quantizes_for_the_cpu_it_runs_on(ft_onnx, ft_onnx_int8) -> None:
    from cramkit.backends.onnx import ISA_FORMATS, cpu_isa

    fp32, int8 = (json.loads((d / MANIFEST).read_text()) for d in (ft_onnx, ft_onnx_int8))
    assert fp32["attention"] == {"fused": True} and fp32["graph_ops"]["MultiHeadAttention"] == 2
    quant = int8["quantization"]
    assert quant["isa"] == cpu_isa() and quant["reduce_range"] is ISA_FORMATS[cpu_isa()][0]
    assert int8["graph_ops"]["MultiHeadAttention"] == 2 and int8["graph_ops"]["MatMulInteger"] >= 4
    assert cpu_isa({"avx2", "avx512f", "avx512bw", "avx512_vnni"}, "x86_64") == "avx512_vnni"
    assert cpu_isa({"avx2", "avx512f", "avx512bw"}, "x86_64") == "avx512"
    assert cpu_isa({"avx2", "avx_vnni"}, "x86_64") == "avx_vnni"
    assert cpu_isa({"avx2"}, "x86_64") == "avx2" and cpu_isa(set(), "aarch64") == "arm64"
    assert ISA_FORMATS["avx2"][0] and not ISA_FORMATS["avx512_vnni"][0] and not ISA_FORMATS["arm64"][0]


@pytest.mark.integration
def test_int8_ships_only_what_passes_its_bar(ft_model, tmp_path, monkeypatch) -> None:
    """When int8 everywhere and its fallback (MLP down-projections in fp32) both miss the bar, nothing is shipped:
    one line with both checks' figures, and no --out."""
    from cramkit.backends import onnx_int8

    monkeypatch.setattr(onnx_int8, "INT8_MIN_COSINE", 1.01)  # a bar no quantized model meets
    out = tmp_path / "int8"
    with pytest.raises(
        CramkitError,
        match=r"int8 is too far from torch on this model: everywhere .*; with the MLP "
        r"down-projections in fp32 .*export it without --quantize",
    ):
        cramkit.export(ft_model, out, format="onnx", quantize="int8")
    assert not out.exists() and list(tmp_path.iterdir()) == []
