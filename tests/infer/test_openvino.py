"""OpenVINO export (`cramkit export --format openvino`), its runtime, and `cramkit export --target cpu`:
checked against torch, opened by predict, embed, index build and serve like any export."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import cramkit
from clirun import one_line
from cramkit import runtime
from cramkit.backends.openvino import MANIFEST
from cramkit.errors import CramkitError
from cramkit.infer import Engine
from cramkit.infer.export import cpu_target

from .models import cli, ok, sst2

pytest.importorskip("openvino")


@pytest.fixture(scope="module")
def ft_openvino(ft_model, tmp_path_factory) -> Path:
    """The fine-tuned classifier exported by `cramkit export --format openvino`, in this process."""
    out = tmp_path_factory.mktemp("ov") / "ft-ov"
    said = ok("export", str(ft_model), "--format", "openvino", "--out", str(out))
    assert "OpenVINO fp32" in said and "label_agreement 1.0000" in said, said
    return out


def test_classifier_export_matches_torch_on_unseen_text(ft_model, ft_openvino, glue_dir) -> None:
    man = json.loads((ft_openvino / MANIFEST).read_text())
    assert man["kind"] == "classifier" and man["labels"] == ["0", "1"] and man["quantize"] is None
    assert set(man["files"]) == {"model.xml", "model.bin"} and man["outputs"] == ["mean", "cls", "logits"]
    assert man["check"]["worst_relative_diff"] < 1e-3 and man["check"]["label_agreement"] == 1.0
    dev = [s for s, _ in sst2(glue_dir, "dev")[:200]]  # never seen by training nor by the export's check
    ref, got = Engine(ft_model, device="cpu"), Engine(ft_openvino, threads=1)
    assert got.backend == "openvino" and got.runner.precision == "f32" and got.max_batch_tokens == 512
    a, b = ref.logits(dev), got.logits(dev)
    assert np.abs(a - b).max() < 1e-4 * max(1.0, np.abs(a).max())
    assert ref.classify(dev).labels == got.classify(dev).labels
    assert np.abs(ref.embed(dev[:50]) - got.embed(dev[:50])).max() < 1e-4
    # two passes side by side (two streams of one thread): the same outputs
    two = Engine(ft_openvino, threads=2, max_batch_tokens=128)
    assert two.workers == 2 and np.abs(two.logits(dev) - b).max() < 1e-5


def test_labels_the_ir_does_not_give_are_refused_on_load(ft_openvino, tmp_path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(ft_openvino, bad)
    man = json.loads((bad / MANIFEST).read_text())
    (bad / MANIFEST).write_text(json.dumps(dict(man, labels=["a", "b", "c", "d"])))
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\nawful\n")
    proc = cli("predict", "--from", str(bad), str(rows), "--out", str(tmp_path / "p.jsonl"))
    one_line(proc, "model.xml gives logits of shape [1, 2] where the manifest says [1, 4]", "export the model again")
    assert not (tmp_path / "p.jsonl").exists()


def test_predict_embed_index_and_serve_open_it(ft_model, ft_openvino, glue_dir, builtin_docs, tmp_path) -> None:
    rows = tmp_path / "dev.tsv"
    dev = sst2(glue_dir, "dev")[:30]
    rows.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in dev))
    ok("predict", "--from", str(ft_openvino), str(rows), "--out", str(tmp_path / "p.jsonl"))
    got = [json.loads(line)["label"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert got == Engine(ft_model, device="cpu").classify([s for s, _ in dev]).labels
    lines = [" ".join(d.split())[:160] for d in builtin_docs[:60]]
    src = tmp_path / "lines.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ok("embed", str(src), "--from", str(ft_openvino), "--out", str(tmp_path / "emb"))
    vectors = np.load(tmp_path / "emb" / "embeddings.npy", allow_pickle=False)
    assert np.abs(vectors - Engine(ft_model, device="cpu").embed(lines)).max() < 1e-4
    idx = tmp_path / "idx"
    ok("index", "build", str(src), "--encoder", str(ft_openvino), "--out", str(idx), "--kind", "flat")
    assert (idx / "encoder" / MANIFEST).is_file()
    probe = cramkit.index.open(idx).chunks.text(3)
    said = ok("index", "query", str(idx), probe, "-k", "1", "--json")
    assert json.loads(said.splitlines()[0])["hits"][0]["text"] == probe
    # the server's own engines (cramkit serve MODEL: build_engines), its app in-process
    from starlette.testclient import TestClient

    from cramkit.serve import create_app
    from cramkit.serve.server import build_engines

    engines = build_engines([f"ov={ft_openvino}"], threads=1)
    with TestClient(create_app(engines)) as client:
        r = client.post("/predict", json={"inputs": dev[0][0], "model": "ov"})
        assert r.status_code == 200 and {d["label"] for d in r.json()} == {"0", "1"}
        r = client.post("/embed", json={"inputs": lines[:3], "model": "ov"})
        want = vectors[:3] / np.linalg.norm(vectors[:3], axis=1, keepdims=True)
        assert r.status_code == 200 and np.abs(np.asarray(r.json()) - want).max() < 1e-4


def test_an_encoder_exports_as_an_embedding_model_and_bf16_says_where_it_runs(tok, tmp_path) -> None:
    """A masked-LM model is exported as its encoder (fill-mask is ONNX's); --quantize bf16 keeps fp32 weights,
    and on a CPU without bf16 the manifest and the line say the check ran in f32."""
    import torch

    from cramkit.backends.openvino import native_bf16
    from cramkit.loading import LoadedModel
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import MaskedLM

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), hidden=64, layers=2, heads=2, intermediate=128)
    loaded = LoadedModel(model=MaskedLM(cfg).eval(), kind="mlm", config=cfg, tokenizer=tok, source="tiny")
    f32 = cramkit.export(loaded, tmp_path / "f32", format="openvino", progress=False)
    b16 = cramkit.export(loaded, tmp_path / "b16", format="openvino", quantize="bf16", progress=False)
    texts = ["the value of the key is returned", "a list", "raise an error when the file is missing " * 8]
    ref = Engine(loaded, device="cpu", precision="fp32").embed(texts)
    e32, e16 = Engine(f32, threads=1), Engine(b16, threads=1)
    assert e32.kind == "encoder" and np.abs(e32.embed(texts) - ref).max() < 1e-4
    man = json.loads((b16 / MANIFEST).read_text())
    assert man["quantize"] == "bf16" and man["computed_in"] == ("bf16" if native_bf16() else "f32")
    assert e16.runner.precision == man["computed_in"]
    cos = (e16.embed(texts) * ref).sum(1)
    assert cos.min() > 0.995
    assert (b16 / "model.bin").stat().st_size == (f32 / "model.bin").stat().st_size  # fp32 weights kept
    with pytest.raises(CramkitError, match="has no masked-LM head"):
        e32.fill_mask(["the [MASK] of it"])


def _no_override(monkeypatch: pytest.MonkeyPatch, flags: set[str]) -> None:
    """This CPU's flags faked (the suite's CRAMKIT_CPU_BF16=0 dropped so that they decide)."""
    monkeypatch.delenv(runtime.CPU_BF16_ENV, raising=False)
    monkeypatch.setattr(runtime, "cpu_flags", lambda: frozenset(flags))


@pytest.mark.parametrize(
    ("flags", "missing", "want"),
    [
        ({"avx2", "amx_bf16", "amx_int8", "avx512_vnni"}, (), ("openvino", "bf16")),
        ({"avx2", "avx512f", "avx512_bf16"}, (), ("openvino", "bf16")),
        ({"avx2", "avx512_bf16"}, ("openvino",), ("ct2", "int8")),
        ({"avx2", "fma"}, (), ("ct2", "int8")),  # a plain AVX2 CPU: today's fastest path, never slower
        ({"avx2", "avx512f", "avx512_vnni"}, (), ("ct2", "int8")),
        ({"avx2"}, ("ctranslate2",), ("onnx", "int8")),
    ],
)
def test_target_cpu_picks_by_the_cpus_flags(monkeypatch, flags, missing, want) -> None:
    _no_override(monkeypatch, flags)
    for module in missing:
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    fmt, quantize, why = cpu_target()
    assert (fmt, quantize) == want
    if "amx_bf16" in flags or "avx512_bf16" in flags:
        assert "natively" in why or "computes bf16" in why
    else:
        assert "no native bf16" in why
    for module in missing:
        assert module in why or f"cramkit[{'ct2' if module == 'ctranslate2' else module}]" in why
    # for a server: CTranslate2 int8 on every CPU, bf16 or not (ONNX Runtime int8 without it)
    fmt, quantize, why = cpu_target(serving=True)
    assert (fmt, quantize) == (("onnx", "int8") if "ctranslate2" in missing else ("ct2", "int8"))
    assert why.startswith("for serving many small requests")


def test_target_cpu_through_the_command(ft_model, tmp_path, monkeypatch) -> None:
    """`cramkit export --target cpu --no-race`: the CPU flags' rule (the fallback when a race cannot run; the race
    itself: tests/infer/test_target_race.py), one line saying what it picked and why, then that export, checked."""
    # as the suite runs (CRAMKIT_CPU_BF16=0, a CPU without bf16 to cramkit): CTranslate2 int8
    pytest.importorskip("ctranslate2")
    said = ok("export", str(ft_model), "--target", "cpu", "--no-race", "--out", str(tmp_path / "plain"))
    picked = [line for line in said.splitlines() if line.startswith("cramkit: --target cpu")]
    assert picked == [f"cramkit: --target cpu: --format ct2 --quantize int8: {cpu_target()[2]}"], said
    assert (tmp_path / "plain" / "cramkit-ct2.json").is_file() and "CTranslate2 int8" in said
    # an AMX Xeon: OpenVINO bf16
    _no_override(monkeypatch, {"avx2", "avx512f", "amx_bf16", "avx512_bf16"})
    said = ok("export", str(ft_model), "--target", "cpu", "--no-race", "--out", str(tmp_path / "amx"))
    assert "--format openvino --quantize bf16: this CPU computes bf16 natively (amx_bf16)" in said
    man = json.loads((tmp_path / "amx" / MANIFEST).read_text())
    assert man["quantize"] == "bf16" and man["check"]["label_agreement"] >= 0.98
    # the same CPU, for a server: CTranslate2 int8, whose passes of a few requests each are the faster there
    said = ok("export", str(ft_model), "--target", "cpu-serve", "--no-race", "--out", str(tmp_path / "serve"))
    assert "cramkit: --target cpu-serve: --format ct2 --quantize int8: for serving many small requests" in said
    assert (tmp_path / "serve" / "cramkit-ct2.json").is_file()
    # --target decides the format: asking for one too is one line
    proc = cli("export", str(ft_model), "--target", "cpu", "--format", "onnx", "--out", str(tmp_path / "both"))
    one_line(proc, "--target cpu picks the format and quantization itself; drop --format and --quantize")
    assert not (tmp_path / "both").exists()
    # a target cramkit does not have: one line naming them, and the nearest
    proc = cli("export", str(ft_model), "--target", "cpu-serv", "--out", str(tmp_path / "typo"))
    one_line(proc, "target must be one of cpu, cpu-serve, got 'cpu-serv'; did you mean cpu-serve?")
    assert not (tmp_path / "typo").exists()


def test_prompt_models_and_missing_openvino_are_one_line(ft_model, tmp_path, monkeypatch) -> None:
    from cramkit import backends

    b = backends.get("openvino")
    with pytest.raises(CramkitError, match="the OpenVINO format cannot hold this model .*--format onnx"):
        backends.check_architecture(b, "prompt", "runs/prompt")
    monkeypatch.setitem(sys.modules, "openvino", None)
    proc = cli("export", str(ft_model), "--format", "openvino", "--out", str(tmp_path / "x"))
    one_line(proc, "the OpenVINO format needs openvino", "pip install 'cramkit[openvino]'")


@pytest.mark.integration
def test_minilm_vectors_match_torch_at_f32_and_bf16(minilm_dir, glue_dir, tmp_path) -> None:
    """The real embedding model (all-MiniLM-L6-v2: token types, mean pooling, normalised) through
    `cramkit export --format openvino` in its own process: its vectors on unseen text are torch's."""
    from clirun import cli_process

    dev = [s for s, _ in sst2(glue_dir, "dev")[:200]]
    ref = Engine(cramkit.load(f"hf:{minilm_dir}"), device="cpu", precision="fp32").embed(dev)
    for q in ("none", "bf16"):
        out = tmp_path / q
        args = ["--quantize", q] if q != "none" else []
        proc = cli_process("export", f"hf:{minilm_dir}", "--format", "openvino", *args, "--out", str(out))
        assert proc.returncode == 0 and "cosine_mean_mean" in proc.stderr, proc.stderr
        got = Engine(out, threads=2).embed(dev)
        cos = (got * ref).sum(1)
        assert cos.min() > (0.9999 if q == "none" else 0.995), cos.min()
