"""The verbs on imported families, through ``cramkit``'s own command line (in process): a tiny random MPNet and
RoBERTa (transformers' config classes) fine-tuned, predicted, exported back and read by transformers; continued
pretraining of a checkpoint with no masked-LM head; a small pretrained model (all-MiniLM-L6-v2) as the student of
a teacher of another family and vocabulary."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from cramkit.cli import main as cli_main

from .test_architectures import _tiny

transformers = pytest.importorskip("transformers")


def _task(root: Path, rows: int = 200, seed: int = 0) -> tuple[Path, Path, Path]:
    """A two-class task over the tiny vocabulary (class 1 draws its words from the upper half): train.csv,
    dev.csv and a text file of documents separated by blank lines."""
    rng = random.Random(seed)
    lines = []
    for i in range(rows):
        label = i % 2
        words = [f"w{rng.randrange(5, 55) + (55 if label else 0)}" for _ in range(rng.randrange(3, 12))]
        lines.append((" ".join(words), label))
    root.mkdir(parents=True, exist_ok=True)
    cut = rows * 4 // 5
    for name, part in (("train.csv", lines[:cut]), ("dev.csv", lines[cut:])):
        (root / name).write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in part))
    (root / "docs.txt").write_text("".join(f"{t}\n\n" for t, _ in lines * 6))
    return root / "train.csv", root / "dev.csv", root / "docs.txt"


@pytest.mark.parametrize("model_type", ["mpnet", "roberta", "deberta-v2"])
def test_finetune_predict_and_export_back(model_type: str, tmp_path: Path) -> None:
    """finetune from hf:DIR -> predict -> export: transformers' own class of the family reads the export and
    gives the probabilities cramkit predicted."""
    _tiny(tmp_path / "base", model_type, "encoder")
    train, dev, _ = _task(tmp_path / "data")
    ft, ex = tmp_path / "ft", tmp_path / "ex"
    common = ["--train", str(train), "--dev", str(dev), "--text-a", "text", "--label", "label"]
    args = ["finetune", "--from", f"hf:{tmp_path / 'base'}", *common, "--out", str(ft), "--set", "epochs=4"]
    assert cli_main([*args, "--set", "min_steps=0", "--set", "precision=fp32", "--no-progress"]) == 0
    result = json.loads((ft / "results.json").read_text())
    assert result["score"] > 60  # the classes are separable by their words
    assert cli_main(["predict", "--from", str(ft), str(dev), "--out", str(tmp_path / "p.jsonl")]) == 0
    predicted = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]

    assert cli_main(["export", str(ft), "--out", str(ex)]) == 0
    config = json.loads((ex / "config.json").read_text())
    assert config["model_type"] == model_type and config["architectures"][0].endswith("ForSequenceClassification")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(ex).eval()
    tok = transformers.AutoTokenizer.from_pretrained(ex)
    texts = [line.split(",")[0] for line in dev.read_text().splitlines()[1:]]
    with torch.no_grad():
        probs = model(**tok(texts, padding=True, return_tensors="pt")).logits.softmax(-1)
    for row, p in zip(predicted, probs, strict=True):
        assert [row["probabilities"][label] for label in ("0", "1")] == pytest.approx(p.tolist(), abs=1e-4)


def test_pretrain_from_a_checkpoint_without_mlm_head(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """pretrain --from an MPNetModel (no masked-LM head, like all-mpnet-base-v2): a fresh head, said in one line;
    the run exports as MPNetForMaskedLM, whose fill-mask at <mask> is the run's at [MASK]."""
    from cramkit.infer import Engine
    from cramkit.loading import load

    _tiny(tmp_path / "base", "mpnet", "encoder")
    _, _, docs = _task(tmp_path / "data")
    run = tmp_path / "run"
    args = ["pretrain", str(docs), "--from", f"hf:{tmp_path / 'base'}", "--budget", "12steps", "--out", str(run)]
    settings = ["--set", "train.batch_size=8", "--set", "train.micro_batch=8", "--set", "train.precision=fp32"]
    assert cli_main([*args, *settings]) == 0
    said = capsys.readouterr()
    assert "a fresh MLM head (the model has none)" in said.out
    assert "data.seq_len" not in said.err  # the preset's 128 tokens capped at the model's 32 positions, no error

    assert cli_main(["export", str(run), "--out", str(tmp_path / "ex")]) == 0
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "ex").eval()
    assert type(hf).__name__ == "MPNetForMaskedLM"
    engine = Engine(load(str(run)), precision="fp32")
    (ours,) = engine.fill_mask(["w3 w4 [MASK] w6"], top_k=3)
    ids = torch.tensor([engine.tokenizer.encode("w3 w4 <mask> w6").ids])
    with torch.no_grad():
        top = hf(input_ids=ids).logits[0, 3].softmax(-1).topk(3)
    assert [m["id"] for m in ours[0]] == top.indices.tolist()


def test_distil_into_a_pretrained_small_model_of_another_family(
    tmp_path: Path, minilm_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--student hf:DIR: the student is all-MiniLM-L6-v2 (BERT, its own vocabulary), all six of its layers,
    taught by a RoBERTa teacher; the student reads the texts with its own tokenizer."""
    from cramkit.loading import load

    _tiny(tmp_path / "base", "roberta", "encoder")
    train, dev, _ = _task(tmp_path / "data", rows=100)
    common = ["--train", str(train), "--dev", str(dev), "--text-a", "text", "--label", "label"]
    ft = tmp_path / "teacher"
    args = ["finetune", "--from", f"hf:{tmp_path / 'base'}", *common, "--out", str(ft), "--set", "epochs=2"]
    assert cli_main([*args, "--set", "min_steps=0", "--no-progress"]) == 0
    out = tmp_path / "student"
    settings = ["--set", "p_pos=0", "--set", "n_iter=1", "--set", "epochs=0.2", "--set", "baseline_epochs=0.2"]
    args = ["distill", "--teacher", str(ft), "--student", f"hf:{minilm_dir}", *common, "--out", str(out)]
    assert cli_main([*args, *settings, "--no-progress"]) == 0
    student = load(str(out))
    assert student.config.layers == 6 and student.config.hf_model_type == "bert"
    assert student.tokenizer.token_to_id("[CLS]") == 101  # MiniLM's own vocabulary, not the teacher's
    report = json.loads((out / "report.json").read_text())
    assert report["student"] == "encoder" and report["parameters"]["student"]["total"] > 20_000_000


def test_few_shot_prints_the_frozen_embeddings_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--few-shot K: each split's logistic regression on the backbone's frozen embeddings of its K rows per class,
    scored on the dev rows, printed beside the recipe's score; the figure is what transformers' own hidden states
    (mean-pooled, as the model's sentence-transformers pooling) give through the same regression."""
    from cramkit.loading import load
    from cramkit.recipes.setfit import logistic_regression
    from cramkit.tasks.fewshot import few_shot_task
    from cramkit.tasks.resolve import resolve_task

    theirs = _tiny(tmp_path / "base", "roberta", "encoder")
    train, dev, _ = _task(tmp_path / "data", rows=120)
    common = ["--train", str(train), "--dev", str(dev), "--text-a", "text", "--label", "label"]
    out = tmp_path / "fs"
    args = ["finetune", "--from", f"hf:{tmp_path / 'base'}", *common, "--few-shot", "4", "--splits", "2"]
    assert cli_main([*args, "--out", str(out), "--set", "min_steps=5", "--set", "precision=fp32", "--no-progress"]) == 0
    said = capsys.readouterr().out
    base = json.loads((out / "results.json").read_text())["fewshot"]["frozen_baseline"]
    assert set(base["per_split"]) == {"0", "1"}
    assert f"frozen embeddings of the same labelled rows: accuracy {base['mean']:.2f} ± {base['std']:.2f}" in said

    task = resolve_task(None, train=train, dev=dev, text_a="text", label="label", dev_fraction=None)
    tok = load(f"hf:{tmp_path / 'base'}").tokenizer  # (its ids equal transformers': test_architectures)

    def vectors(rows: list) -> np.ndarray:
        out = []
        for e in rows:
            with torch.no_grad():
                out.append(theirs(input_ids=torch.tensor([tok.encode(e.text_a).ids])).last_hidden_state.mean(1)[0])
        return torch.stack(out).double().numpy()

    scored = task.examples("dev")
    x = vectors(scored)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for key, score in base["per_split"].items():
        view = few_shot_task(task, 4, int(key))
        rows = view.examples(view.train_split)
        weight = logistic_regression(vectors(rows), np.asarray([e.label for e in rows]), 2)
        right = ((x @ weight.T).argmax(1) == np.asarray([e.label for e in scored])).mean()
        assert score == pytest.approx(100 * right, abs=1e-6)
