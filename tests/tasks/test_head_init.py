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

    from cramkit.load import load_torch
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
