"""The head started from the classes' descriptions (recipes/label_prior.py, issue 49): with the public sentence
encoder on SST-2 it answers before any step what the descriptions answer; through the command the choice and its
reason land in results.json, ``head_init=random`` turns it off, and a pair task has none."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cramkit.recipes.finetune_config import FinetuneConfig
from infer.models import cli


@pytest.mark.integration  # 15 s: the public model's embeddings of 32 training and 300 dev sentences
def test_the_untrained_head_answers_through_the_descriptions(minilm_dir: Path, real_glue_dir: Path) -> None:
    import torch

    from cramkit.loading import load_torch
    from cramkit.recipes.finetune_model import build_model, encode_task_examples, predict
    from cramkit.recipes.label_prior import head_init
    from cramkit.tasks.fewshot import few_shot_task
    from cramkit.tasks.registry import get_task

    view = few_shot_task(get_task("glue/sst2", data_dir=real_glue_dir), k=16, split=0)
    loaded = load_torch(f"hf:{minilm_dir}", purpose="fine-tuning")
    cfg = FinetuneConfig(max_length=64)
    weight, info = head_init(view, loaded, cfg, view.examples("train"), 64)
    assert weight is not None and info["used"], info
    assert info["descriptions"] == {"0": "It was terrible .", "1": "It was great ."}
    assert weight.shape == (2, loaded.config.hidden) and info["labelled_rows"] == 32
    model = build_model(loaded, 2, cfg)
    with torch.no_grad():
        model.classifier.weight.copy_(torch.from_numpy(weight))
        model.classifier.bias.zero_()
    dev = view.examples("dev")[:300]
    logits = predict(model, encode_task_examples(view, loaded.tokenizer, dev, 64), cfg, "cpu", loaded.pad_id, False)
    right = (logits.argmax(1) == np.array([e.label for e in dev])).mean()
    assert right >= 0.65, right  # the descriptions alone: 71% of SST-2's dev sentences (bench/RESULTS.md)
    # calibrated, not saturated: the logits differ by a few units, as the temperature fitted on the rows says
    assert 0.1 < float(np.abs(logits[:, 1] - logits[:, 0]).mean()) < 10
    random, why = head_init(view, loaded, FinetuneConfig(head_init="random"), view.examples("train"), 64)
    assert random is None and why == {"used": False, "why": "head_init random"}


def test_label_names_that_name_something_become_descriptions() -> None:
    from cramkit.recipes.label_prior import label_names

    assert label_names(["negative", "positive"]) == {"negative": "negative", "positive": "positive"}
    assert label_names(["not_spam", "spam"]) == {"not_spam": "not spam", "spam": "spam"}
    assert label_names(["体育", "财经"]) == {"体育": "体育", "财经": "财经"}
    for numbered in (["0", "1"], ["LABEL_0", "LABEL_1"], ["class 1", "class 2"], ["c1", "c2"], ["A", "B"], ["yes"]):
        assert label_names(numbered) is None, numbered


@pytest.mark.integration  # 15 s: the public model's embeddings of 32 training and 300 dev sentences
def test_a_file_task_s_word_labels_start_the_head(minilm_dir: Path, real_glue_dir: Path, tmp_path: Path) -> None:
    """A user's own file with no built-in prompt: its label names are the descriptions; numbered labels give none."""
    import csv

    from cramkit.loading import load_torch
    from cramkit.recipes.label_prior import head_init
    from cramkit.tasks.resolve import resolve_task

    with (real_glue_dir / "SST-2" / "train.tsv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))[:2000]
    ours = [r for r in rows if len(r["sentence"].split()) >= 8]
    train = [r for r in ours if r["label"] == "0"][:16] + [r for r in ours if r["label"] == "1"][:16]
    loaded = load_torch(f"hf:{minilm_dir}", purpose="fine-tuning")
    for words, used in ((("negative", "positive"), True), (("0", "1"), False)):
        path = tmp_path / f"{words[0]}.tsv"
        path.write_text("text\tlabel\n" + "".join(f"{r['sentence']}\t{words[int(r['label'])]}\n" for r in train))
        task = resolve_task(train=path, dev=path, text_a="text")
        weight, info = head_init(task, loaded, FinetuneConfig(max_length=64), task.examples("train"), 64)
        assert (weight is not None) == used == info["used"], info
        if used:
            assert info["source"] == "the label names" and info["descriptions"] == {w: w for w in words}, info
            assert info["labelled_accuracy"] > 0.5, info
        else:
            assert "no built-in label words" in info["why"], info


def test_the_command_records_the_head_s_start(tiny_run: Path, real_glue_dir: Path, tmp_path: Path) -> None:
    fast = ["--few-shot", "4", "--splits", "1", "--set", "min_steps=4", "--set", "max_length=32", "--no-progress"]
    common = ["finetune", "--from", tiny_run, "--data-dir", real_glue_dir, *fast]
    # the pretrained model's first token goes through a pooler fine-tuning starts at random: no start from it
    proc = cli(*common, "--task", "glue/sst2", "--out", tmp_path / "first")
    assert proc.returncode == 0, proc.stderr
    init = json.loads((tmp_path / "first" / "split-0" / "results.json").read_text())["head_init"]
    assert not init["used"] and "has no trained pooler" in init["why"], init
    # its mean-pooled vectors: the descriptions are read, and used only where they beat the largest class
    proc = cli(*common, "--task", "glue/sst2", "--out", tmp_path / "mean", "--set", "pooling=mean")
    assert proc.returncode == 0, proc.stderr
    init = json.loads((tmp_path / "mean" / "split-0" / "results.json").read_text())["head_init"]
    assert init["descriptions"] == {"0": "It was terrible .", "1": "It was great ."}
    assert init["labelled_rows"] == 8 and init["source"] == "the built-in prompt"
    assert init["used"] == (init["labelled_accuracy"] > 0.5), init
    proc = cli(
        *common,
        "--task",
        "glue/sst2",
        "--out",
        tmp_path / "random",
        "--set",
        "head_init=random",
        "--set",
        "pooling=mean",
    )
    assert proc.returncode == 0, proc.stderr
    init = json.loads((tmp_path / "random" / "split-0" / "results.json").read_text())["head_init"]
    assert init == {"used": False, "why": "head_init random"}
    proc = cli(*common, "--task", "glue/mrpc", "--out", tmp_path / "pair")
    assert proc.returncode == 0, proc.stderr
    init = json.loads((tmp_path / "pair" / "split-0" / "results.json").read_text())["head_init"]
    assert not init["used"] and "pair" in init["why"]
    proc = cli(*common, "--task", "glue/sst2", "--out", tmp_path / "bad", "--set", "head_init=labels")
    err = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(err) == 1 and "head_init" in err[0], proc.stderr
