"""The whole flow through the real commands: pretrain (1 and 2 processes) -> load -> fine-tune -> predict ->
export, and a real pretrained BERT fine-tuned, exported and checked against transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import cramkit
from clirun import cli
from conftest import run_pretrain
from cramkit.errors import CramkitError
from cramkit.infer import Engine
from cramkit.train.metrics import read_metrics


def ok(*args: str) -> str:
    proc = cli(*args)
    assert proc.returncode == 0, f"cramkit {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _task_files(root: Path, docs: list[str]) -> tuple[Path, Path]:
    """A two-label task from the built-in corpus: does the docstring mention 'return'?"""
    rows = [(d.split("\n")[0][:200].replace("\t", " "), "yes" if "return" in d.lower() else "no") for d in docs]
    rows = [r for r in rows if r[0].strip()][:240]
    train, test = root / "train.tsv", root / "test.tsv"
    train.write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows[:200]), encoding="utf-8")
    test.write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows[200:]), encoding="utf-8")
    return train, test


def _losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run) if "loss" in r}


@pytest.mark.integration
def test_two_process_run_loads_finetunes_predicts_and_exports(tmp_path, tok_dir, builtin_docs) -> None:
    every = ("--set", "train.log_every=1")
    run = run_pretrain(tmp_path / "run2", "--tokenizer", str(tok_dir), *every, nproc=2, steps=6)
    one = run_pretrain(tmp_path / "run1", "--tokenizer", str(tok_dir), *every, nproc=1, steps=6)
    # the global batch (8) is exact on 2 processes although micro_batch * world = 16: the same curve
    a, b = _losses(one), _losses(run2 := run)
    assert sorted(a) == sorted(b) == list(range(1, 7))
    assert all(abs(a[s] - b[s]) <= 2e-5 * max(1.0, abs(a[s])) for s in a), (a, b)
    # a sharded checkpoint loads without torch.distributed, and its weights equal the 1-process run's
    m2, m1 = cramkit.load(run2), cramkit.load(one)
    assert m2.kind == "mlm" and m2.tokenizer.get_vocab_size() == m1.tokenizer.get_vocab_size()
    diff = max(
        float((p - q).detach().abs().max()) for p, q in zip(m1.model.parameters(), m2.model.parameters(), strict=True)
    )
    assert diff < 1e-4
    # fine-tune from it (no --dev: 10% of train held out), keep the model, predict with it, export it
    train, test = _task_files(tmp_path, builtin_docs)
    out = tmp_path / "ft"
    settings = (
        "--from",
        str(run2),
        "--train",
        str(train),
        "--text-a",
        "text",
        "--set",
        "epochs=2",
        "--set",
        "min_steps=0",
        "--set",
        "batch_size=16",
        "--set",
        "dropout=0",
        "--set",
        "attention_dropout=0",
        "--no-progress",
    )
    said = ok("finetune", *settings, "--out", str(out))
    assert "saved in" in said
    res = json.loads((out / "results.json").read_text())
    # fine-tuning on 2 processes (torchrun, DDP) follows the 1-process run: same global batch, same curve
    ok("finetune", *settings, "--out", str(tmp_path / "ft2"), "--nproc", "2")
    res2 = json.loads((tmp_path / "ft2" / "results.json").read_text())
    c1, c2 = res["seeds"][0]["loss_curve"], res2["seeds"][0]["loss_curve"]
    assert len(c1) == len(c2) == res["seeds"][0]["steps"]
    assert all(abs(x - y) <= 1e-4 * max(1.0, abs(x)) for x, y in zip(c1, c2, strict=True)), (c1, c2)
    assert abs(res["score"] - res2["score"]) <= 5.01  # at most one of the 20 held-out examples flips
    model = cramkit.load(out)
    assert model.kind == "classifier" and model.labels == ["no", "yes"] and model.task == "user/train"
    said = ok("predict", "--from", str(out), str(test), "--out", str(tmp_path / "pred.jsonl"))
    assert "examples/s" in said and "accuracy" in said
    preds = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert len(preds) == 40 and {p["label"] for p in preds} <= {"no", "yes"}
    assert all(abs(sum(p["probabilities"].values()) - 1) < 1e-4 for p in preds)
    # the engine gives the same answer in-process
    eng = Engine(model, device="cpu")
    texts = [line.split("\t")[0] for line in test.read_text().splitlines()[1:]]
    assert eng.classify(texts).labels == [p["label"] for p in preds]
    ok("export", str(out), "--out", str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "config.json").is_file()
    assert res["kept_seed"] == 0


@pytest.mark.integration
def test_pretrained_bert_finetuned_exports_to_transformers_with_equal_logits(minilm_dir, glue_dir, tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    lines = (glue_dir / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(lines[:161]) + "\n", encoding="utf-8")
    out = tmp_path / "ft"
    ok(
        "finetune",
        "--from",
        f"hf:{minilm_dir}",
        "--train",
        str(tmp_path / "train.tsv"),
        "--text-a",
        "sentence",
        "--out",
        str(out),
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--set",
        "pooling=first",
        "--no-progress",
    )
    ok("export", str(out), "--out", str(tmp_path / "hf"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "0", "1": "1"}
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    texts = [line.split("\t")[0] for line in lines[200:232]]
    with torch.no_grad():
        theirs = hf(**tok(texts, padding=True, return_tensors="pt")).logits.numpy()
    ours = Engine(cramkit.load(out), device="cpu").logits(texts)
    assert np.abs(ours - theirs).max() < 1e-4


def test_engine_embeddings_match_sentence_transformers_and_do_not_depend_on_batching(minilm_dir) -> None:
    st = pytest.importorskip("sentence_transformers")
    texts = ["a short one", "a much longer sentence about the weather in the mountains " * 3, "x", "y z"] * 5
    m = cramkit.load(f"hf:{minilm_dir}")
    assert m.kind == "encoder" and m.pooling == "mean" and m.normalize and m.max_length == 256
    small = Engine(m, device="cpu", max_batch_tokens=64).embed(texts)
    big = Engine(m, device="cpu").embed(texts)
    assert np.abs(small - big).max() < 1e-5
    ref = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(texts)
    cos = (big * ref).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(big, axis=1)
    assert cos.min() > 0.9999


def test_fill_mask_and_predict_from_a_pretraining_run(pretrained_run, tmp_path) -> None:
    m = cramkit.load(pretrained_run)
    out = Engine(m, device="cpu").fill_mask(["the [MASK] of the [MASK]", "no mask here"], top_k=3)
    assert [len(x) for x in out] == [2, 0] and all(len(c) == 3 for c in out[0])
    assert out[0][0][0]["score"] >= out[0][0][1]["score"] >= out[0][0][2]["score"]
    (tmp_path / "in.txt").write_text("return the [MASK] value\n", encoding="utf-8")
    ok("predict", "--from", str(pretrained_run), str(tmp_path / "in.txt"), "--out", str(tmp_path / "o.csv"))
    assert (tmp_path / "o.csv").read_text().splitlines()[0] == "row,mask0"


def test_bad_inputs_get_one_line(pretrained_run, tmp_path) -> None:
    (tmp_path / "bin.csv").write_bytes(b"text,label\n\xff\xfe\x00bad,1\n")
    proc = cli("predict", "--from", str(pretrained_run), str(tmp_path / "bin.csv"))
    assert proc.returncode == 2 and "binary file" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("finetune", "--from", str(pretrained_run), "--train", str(tmp_path / "bin.csv"), "--text-a", "text")
    assert proc.returncode == 2 and "binary file" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "latin.csv").write_bytes(b"text,label\ncaf\xe9,1\nthe,0\n")
    proc = cli("finetune", "--from", str(pretrained_run), "--train", str(tmp_path / "latin.csv"), "--text-a", "text")
    assert proc.returncode == 2 and "not valid UTF-8" in proc.stderr and "iconv" in proc.stderr
    proc = cli("predict", "--from", str(tmp_path / "nope"), str(tmp_path / "bin.csv"))
    assert proc.returncode == 2 and "no such file or directory" in proc.stderr
    proc = cli("finetune", "--list-tasks")
    assert proc.returncode == 0 and "glue/sst2" in proc.stdout
    # a model directory naming an architecture outside cramkit's own table is refused, never imported
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "cramkit-model.json").write_text(
        json.dumps({"format": "cramkit-model-1", "kind": "classifier", "architecture": "os:system"})
    )
    (bad / "model.safetensors").write_bytes(b"")
    with pytest.raises(CramkitError, match="unknown architecture"):
        cramkit.load(bad)


def test_export_refuses_to_destroy_its_source(pretrained_run, tmp_path) -> None:
    for out in (pretrained_run, pretrained_run / "checkpoints", pretrained_run.parent):
        proc = cli("export", str(pretrained_run), "--out", str(out), "--force")
        assert proc.returncode == 2 and "destroy the source" in proc.stderr
    assert cramkit.load(pretrained_run).kind == "mlm"  # still there
