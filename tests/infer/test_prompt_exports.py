"""Exports of prompt models (finetune --prompt) and deep-prompt models (finetune --method ptuning), through the
real commands: a BERT-shaped run `cramkit pretrain` made, fine-tuned both ways, exported to ONNX (fp32, int8)
and Hugging Face; predict, serve and cramkit.load on the exports give the torch models' labels."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import cramkit
from cramkit.cli import main as cli_main
from cramkit.errors import CramkitError
from cramkit.infer import Engine
from infer.models import ok
from infer.test_onnx import BERT_SHAPE

TEMPLATE = "{sentence} it was [MASK] ."
RECORDED = "{text_a} it was [MASK] ."  # what a model directory and its exports record: the generic field names
MANIFEST = "cramkit-onnx.json"


@pytest.fixture(scope="module")
def run(tmp_path_factory, tok_dir: Path) -> Path:
    """A BERT-shaped tiny run (its HF export is a plain BertForMaskedLM)."""
    from conftest import run_pretrain

    args = [x for s in BERT_SHAPE for x in ("--set", s)]
    return run_pretrain(tmp_path_factory.mktemp("prompt-run") / "run", "--tokenizer", str(tok_dir), *args, steps=3)


@pytest.fixture(scope="module")
def words(tok) -> str:
    """Two label words of one token each in the tests' tokenizer (trained on the stdlib's docstrings)."""
    pair = next(p for p in (("negative", "positive"), ("false", "true")) if all(tok.token_to_id(w) for w in p))
    return f"0={pair[0]},1={pair[1]}"


@pytest.fixture(scope="module")
def files(glue_dir: Path, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("prompt-sst2")
    lines = (glue_dir / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    (root / "train.tsv").write_text("\n".join([lines[0], *lines[1:41]]) + "\n", encoding="utf-8")
    (root / "dev.tsv").write_text("\n".join([lines[0], *lines[1001:1049]]) + "\n", encoding="utf-8")
    return root / "train.tsv", root / "dev.tsv"


def _finetune(run: Path, files: tuple[Path, Path], out: Path, *args: str) -> Path:
    ok(
        "finetune",
        "--from",
        str(run),
        "--train",
        str(files[0]),
        "--text-a",
        "sentence",
        "--out",
        str(out),
        "--set",
        "epochs=1",
        "--set",
        "batch_size=8",
        "--set",
        "min_steps=0",
        "--set",
        "lr=1e-3",
        "--no-progress",
        *args,
    )
    return out


@pytest.fixture(scope="module")
def prompt_model(run: Path, files, words: str, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prompt-model") / "prompt"
    return _finetune(run, files, out, "--prompt", TEMPLATE, "--label-words", words)


@pytest.fixture(scope="module")
def prefix_model(run: Path, files, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prefix-model") / "pt"
    return _finetune(run, files, out, "--method", "ptuning", "--prefix-len", "3")


@pytest.fixture(scope="module")
def prompt_onnx(prompt_model: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prompt-onnx") / "onnx"
    from cramkit.infer.export import export

    done = export(prompt_model, out, format="onnx", progress=False)
    assert "inputs are read through its template" in done.summary
    return out


def cramkit_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`cramkit ARGS` in this process (the CLI's own main: its exit status, stdout and stderr)."""
    capsys.readouterr()
    rc = cli_main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def run_ok(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc, out, err = cramkit_cli(capsys, *args)
    assert rc == 0, f"cramkit {' '.join(args)} failed:\n{out}\n{err}"
    return out


def one_line_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc, _, err = cramkit_cli(capsys, *args)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith("cramkit: error: "), err
    return err


def _predict(capsys, model: Path, rows: Path, out: Path, *args: str) -> list[dict]:
    run_ok(capsys, "predict", "--from", str(model), *args, str(rows), "--out", str(out), "--label", "none")
    return [json.loads(line) for line in out.read_text().splitlines()]


def _same_predictions(want: list[dict], got: list[dict], tol: float) -> None:
    """The same labels wherever torch's margin exceeds the tolerance, probabilities within it."""
    assert len(want) == len(got) > 0
    for a, b in zip(want, got, strict=True):
        pa, pb = a["probabilities"], b["probabilities"]
        assert pa.keys() == pb.keys() and max(abs(pa[k] - pb[k]) for k in pa) <= tol, (a, b)
        top = sorted(pa.values())
        if top[-1] - top[-2] > 2 * tol:
            assert a["label"] == b["label"], (a, b)


@pytest.mark.integration
def test_a_prompt_model_exports_to_onnx_and_predicts_as_the_torch_model(
    prompt_model: Path, prompt_onnx: Path, files, tmp_path: Path, capsys
) -> None:
    man = json.loads((prompt_onnx / MANIFEST).read_text())
    assert man["prompt"]["template"] == RECORDED and set(man["prompt"]["label_words"]) == {"0", "1"}
    assert man["kind"] == "classifier" and man["architecture"] == "prompt" and "logits" in man["outputs"]
    assert man["check"]["worst_relative_diff"] < 1e-4 and man["check"]["label_agreement"] == 1.0
    int8 = tmp_path / "int8"
    run_ok(capsys, "export", str(prompt_model), "--format", "onnx", "--quantize", "int8", "--out", str(int8))
    assert json.loads((int8 / MANIFEST).read_text())["graph_ops"].get("MatMulInteger", 0) >= 4
    want = _predict(capsys, prompt_model, files[1], tmp_path / "torch.jsonl")
    _same_predictions(want, _predict(capsys, prompt_onnx, files[1], tmp_path / "fp32.jsonl"), 1e-4)
    _same_predictions(want, _predict(capsys, int8, files[1], tmp_path / "int8.jsonl"), 0.05)
    # cramkit.load / Engine on the export read the inputs through the template, as the torch model does
    exported, torch_model = cramkit.load(prompt_onnx), cramkit.load(prompt_model)
    assert exported.prompt is not None and exported.prompt.meta() == torch_model.prompt.meta()
    texts = ["a gorgeous , witty film", "the worst movie of the year", "it has a [MASK] in it"]
    engine = Engine(exported, threads=1)
    enc = engine.tokenize(texts)
    assert all(int((ids == exported.prompt.mask_id).sum()) == 1 for ids in enc.ids)
    a, b = Engine(torch_model, device="cpu").classify(texts), engine.classify(texts)
    assert np.abs(a.probs - b.probs).max() < 1e-4 and a.labels == b.labels


@pytest.mark.integration
def test_a_deep_prompt_model_exports_to_one_standalone_graph(
    prefix_model: Path, run: Path, files, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "onnx"
    # without its base: the line predict gives, naming it
    assert f"--base {run}" in one_line_error(capsys, "export", str(prefix_model), "--format", "onnx", "--out", str(out))
    assert not out.exists()
    said = run_ok(capsys, "export", str(prefix_model), "--base", str(run), "--format", "onnx", "--out", str(out))
    assert "runs without --base" in said
    man = json.loads((out / MANIFEST).read_text())
    assert man["architecture"] == "prefix" and man["outputs"] == ["logits"] and man["prompt"] is None
    assert man["base"]["prefix_len"] == 3 and len(man["base"]["sha256"]) == 64
    assert man["check"]["worst_relative_diff"] < 1e-4 and man["attention"] == {"fused": True}
    # the export runs alone: no --base, the same labels and probabilities as the torch model on its base
    want = _predict(capsys, prefix_model, files[1], tmp_path / "torch.jsonl", "--base", str(run))
    _same_predictions(want, _predict(capsys, out, files[1], tmp_path / "onnx.jsonl"), 1e-4)
    engine = Engine(out, threads=1)
    assert engine.can_classify and not engine.can_embed  # its labels; embeddings come from the base
    with pytest.raises(CramkitError, match="gives labels only.*embed with the base model"):
        engine.embed(["a film"])
    # the prefixes are in the graph: made large, the export still follows torch, far from the base alone
    import torch

    loaded = cramkit.load(prefix_model, base=run)
    torch.manual_seed(0)
    with torch.no_grad():
        loaded.model.prefix.normal_(0, 2)
        loaded.model.classifier.weight.mul_(100)  # the tiny head barely tells inputs apart: amplify it
    big = cramkit.export(loaded, tmp_path / "big", format="onnx", progress=False)
    texts = ["a gorgeous , witty film", "the worst movie of the year", "fine"]
    want, got = Engine(loaded, device="cpu").logits(texts), Engine(big, threads=1).logits(texts)
    with torch.no_grad():
        loaded.model.prefix.zero_()
    alone = Engine(loaded, device="cpu").logits(texts)
    off = np.abs(want - got).max()
    assert off < 1e-4 * max(1.0, np.abs(want).max()) and np.abs(want - alone).max() > 1000 * max(off, 1e-7)


@pytest.mark.integration
def test_a_served_prompt_export_answers_predict(prompt_model: Path, prompt_onnx: Path) -> None:
    import httpx

    from serve.test_server import start

    server, url = start(f"p={prompt_onnx}")
    try:
        texts = ["a gorgeous , witty film", "the worst movie of the year"]
        r = httpx.post(f"{url}/predict", json={"inputs": [[t] for t in texts], "model": "p"}, timeout=60)
        assert r.status_code == 200, r.text
        got = np.asarray([[d["score"] for d in sorted(row, key=lambda d: d["label"])] for row in r.json()])
        want = Engine(cramkit.load(prompt_model), device="cpu").classify(texts)
        assert np.abs(got - want.probs).max() < 1e-4
        assert [row[0]["label"] for row in r.json()] == want.labels
    finally:
        server.terminate()
        server.wait(timeout=30)


def _words(prompt: dict) -> dict:
    return prompt["label_words"]


@pytest.mark.parametrize(
    ("craft", "needle"),
    [
        (lambda p: {**p, "template": "{text_a} it was fine ."}, "0 [MASK]s"),
        (lambda p: {**p, "label_words": {**_words(p), "7": _words(p)["1"]}}, "'7', which the task does not have"),
        (lambda p: {**p, "template": ["{text_a}", "[MASK]"]}, "a string template"),
        (lambda p: {**p, "template": None}, "a string template"),
        (lambda p: {**p, "label_words": {"0": _words(p)["0"], "1": "qqqzzzxxv"}}, "'qqqzzzxxv'"),
        (lambda p: p["template"], "field 'prompt' must be a JSON object"),
    ],
)
def test_a_crafted_prompt_in_a_manifest_is_one_line(prompt_onnx: Path, tmp_path: Path, craft, needle) -> None:
    crafted = tmp_path / "crafted"
    shutil.copytree(prompt_onnx, crafted)
    man = json.loads((crafted / MANIFEST).read_text())
    man["prompt"] = craft(man["prompt"])
    (crafted / MANIFEST).write_text(json.dumps(man))
    with pytest.raises(CramkitError) as err:
        cramkit.load(crafted)
    msg = str(err.value)
    assert needle in msg and str(crafted / MANIFEST) in msg and "\n" not in msg


def test_a_crafted_prompt_fails_predict_in_one_line(prompt_onnx: Path, files, tmp_path: Path, capsys) -> None:
    crafted = tmp_path / "crafted"
    shutil.copytree(prompt_onnx, crafted)
    man = json.loads((crafted / MANIFEST).read_text())
    man["prompt"]["template"] = "{text_a} it was fine ."
    (crafted / MANIFEST).write_text(json.dumps(man))
    err = one_line_error(capsys, "predict", "--from", str(crafted), str(files[1]), "--out", str(tmp_path / "p.jsonl"))
    assert "its prompt does not fit" in err and "export the model again" in err and str(crafted) in err


def test_a_prompt_model_exports_to_hf_as_a_bert_masked_lm_with_its_prompt(
    prompt_model: Path, tmp_path: Path, capsys
) -> None:
    import torch
    from transformers import BertForMaskedLM, BertTokenizerFast

    out = tmp_path / "hf"
    said = run_ok(capsys, "export", str(prompt_model), "--out", str(out))
    assert "BertForMaskedLM" in said and "must apply the template themselves" in said
    marker = json.loads((out / "cramkit_export.json").read_text())
    assert marker["architecture"] == "BertForMaskedLM" and marker["prompt"]["template"] == RECORDED
    # what a transformers user does with the recorded prompt gives the prompt model's scores
    words = marker["prompt"]["label_words"]
    hf, tok = BertForMaskedLM.from_pretrained(out).eval(), BertTokenizerFast.from_pretrained(out)
    texts = ["a gorgeous , witty film", "the worst movie of the year"]
    batch = tok([TEMPLATE.replace("{sentence}", t) for t in texts], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = hf(**batch).logits
    at = logits[batch["input_ids"] == tok.mask_token_id].log_softmax(-1)
    ids = [tok.convert_tokens_to_ids(words[label]) for label in ("0", "1")]
    want = Engine(cramkit.load(prompt_model), device="cpu").logits(texts)
    assert np.abs(at[:, ids].numpy() - want).max() < 1e-3
    back = cramkit.load(out)  # read back by cramkit: a masked-LM model, as transformers sees it
    assert back.kind == "mlm" and Engine(back, device="cpu").fill_mask(["it was [MASK] ."], top_k=1)[0][0]


def test_what_a_format_cannot_hold_is_one_line_naming_onnx(
    prompt_model: Path, prefix_model: Path, tmp_path: Path, capsys
) -> None:
    err = one_line_error(capsys, "export", str(prefix_model), "--format", "hf", "--out", str(tmp_path / "hf"))
    assert "Hugging Face BERT has no per-layer prefix" in err and "--format onnx" in err
    for model, needle in ((prompt_model, "masked-LM head"), (prefix_model, "prefix keys and values")):
        with pytest.raises(CramkitError) as err:
            cramkit.export(model, tmp_path / "ct2", format="ct2")  # refused before the base is asked for
        assert needle in str(err.value) and "--format onnx" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(CramkitError, match="drop --no-mlm-head"):
        cramkit.export(prompt_model, tmp_path / "enc", mlm_head=False)
    assert not any(tmp_path.iterdir())
