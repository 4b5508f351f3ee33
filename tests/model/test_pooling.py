"""One pooling vocabulary (cls, mean) and one "auto" rule (cramkit.model.pooling).

The first token's older name ``first`` is written nowhere in src/ but that module; a model directory the real
``cramkit finetune`` wrote whose head still says ``first``, and a Hugging Face export whose config does, read
as ``cls``; the auto rule gives a sentence-transformers folder its own pooling, a classifier its head's, and
a model that declares none the caller's (fine-tuning's first token through BERT's pooler, mean for sentence
vectors).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import cramkit
from cramkit.errors import CramkitError
from cramkit.model.loaded import MODEL_FILE
from cramkit.model.pooling import (
    POOLINGS,
    declared_pooling,
    pooling_for,
    read_head,
    read_pooling,
    read_st_pooling,
    st_pooling_config,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "cramkit"
MODULE = SRC / "model" / "pooling.py"
OLD_NAME = re.compile(r"""["']first["']""")
# a translation between the spellings, or sentence-transformers' own flags, wherever it is written
TRANSLATION = re.compile(r"""["']cls["']\s+if\b|\belse\s+["']first["']|["']first["']\s+if\b|["']pooling_mode""")
TEXTS = ["a good , funny film", "the worst movie of the year", "it is neither"]


def test_the_other_spelling_is_written_only_in_the_pooling_module() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == MODULE:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if TRANSLATION.search(line) or (OLD_NAME.search(line) and "pool" in line.lower()):
                found.append(f"{path.relative_to(SRC.parent)}:{n}: {line.strip()}")
    assert not found, "translate pooling names through cramkit.model.pooling:\n" + "\n".join(found)


def test_names_read_and_sentence_transformers_files_round_trip(tmp_path: Path) -> None:
    assert POOLINGS == ("cls", "mean")
    assert [read_pooling(v) for v in ("cls", "mean", "first")] == ["cls", "mean", "cls"]
    assert read_head({"pooling": "first", "dropout": 0.1}) == {"pooling": "cls", "dropout": 0.1}
    for bad in ("max", "", None, ["cls"]):
        with pytest.raises(CramkitError, match="not a pooling cramkit computes"):
            read_pooling(bad, "head.pooling")
    conf = tmp_path / "config.json"
    for pooling in POOLINGS:
        assert read_st_pooling(st_pooling_config(pooling, 8), conf) == pooling  # the flags (before v5)
        assert read_st_pooling({"pooling_mode": pooling}, conf) == pooling  # the name (v5)
    assert read_st_pooling({"pooling_mode_cls_token": False}, conf) is None
    with pytest.raises(CramkitError, match="is not one cramkit computes"):
        read_st_pooling({"pooling_mode_max_tokens": True}, conf)


def test_settings_say_first_or_cls(tiny_run: Path) -> None:
    """``--set pooling=first`` (a settings file written before) and ``pooling=cls`` are one setting."""
    from cramkit.config import from_dict
    from cramkit.recipes.contrastive_config import ContrastiveConfig
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.finetune_model import resolve_pooling

    run = cramkit.load(tiny_run)
    for name in ("first", "cls"):
        cfg = resolve_pooling(from_dict(FinetuneConfig, {"pooling": name}), run)
        assert (cfg.pooling, cfg.pooler_dense) == ("cls", True)
        assert pooling_for(run, from_dict(ContrastiveConfig, {"pooling": name}).pooling) == "cls"
    with pytest.raises(CramkitError, match="pooling"):
        from_dict(FinetuneConfig, {"pooling": "max"})


def test_an_old_classifier_whose_head_says_first_reads_as_cls(ft_model: Path, tmp_path: Path) -> None:
    meta = json.loads((ft_model / MODEL_FILE).read_text(encoding="utf-8"))
    assert (meta["pooling"], meta["head"]["pooling"]) == ("cls", "cls")  # what finetune writes now
    old = tmp_path / "old"
    shutil.copytree(ft_model, old)
    (old / MODEL_FILE).write_text(json.dumps(meta | {"head": meta["head"] | {"pooling": "first"}}), encoding="utf-8")
    new_model, old_model = cramkit.load(ft_model), cramkit.load(old)
    assert old_model.model.head_cfg.pooling == new_model.model.head_cfg.pooling == "cls"
    assert declared_pooling(old_model) == declared_pooling(new_model) == "cls"
    from cramkit.infer import Engine

    want = Engine(new_model, device="cpu").classify(TEXTS).probs
    assert np.allclose(Engine(old_model, device="cpu").classify(TEXTS).probs, want, atol=1e-6)


def test_an_export_whose_config_says_first_reads_as_cls(ft_model: Path, tmp_path: Path) -> None:
    """`cramkit export` of a non-BERT classifier writes ``classifier_pooling: cls``; one written before says
    ``first``, and reads the same."""
    from cramkit.cli import main

    out = tmp_path / "hf"
    assert main(["export", str(ft_model), "--format", "hf", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert (config["model_type"], config["classifier_pooling"]) == ("cramkit", "cls")
    (out / "config.json").write_text(json.dumps(config | {"classifier_pooling": "first"}), encoding="utf-8")
    back = cramkit.load(f"hf:{out}")
    assert (back.pooling, back.model.head_cfg.pooling, back.head and back.head["pooling"]) == ("cls",) * 3


def test_auto_is_the_models_own_pooling(minilm_dir: Path, ft_model: Path, pretrained_run: Path, tmp_path: Path):
    """The one rule, as fine-tuning (undeclared: the first token) and sentence vectors (undeclared: the mean)
    call it: a sentence-transformers folder's pooling, mean or cls; a classifier's head, cls or mean; a bare
    pretraining run declares none."""
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.finetune_model import resolve_pooling

    def rules(model: cramkit.LoadedModel) -> tuple[str | None, str, str, bool]:
        cfg = resolve_pooling(FinetuneConfig(), model)
        return declared_pooling(model), pooling_for(model), cfg.pooling, cfg.pooler_dense

    st = cramkit.load(f"hf:{minilm_dir}")
    assert rules(st) == ("mean", "mean", "mean", False)
    cls_st = tmp_path / "cls-st"
    shutil.copytree(minilm_dir, cls_st)
    (cls_st / "1_Pooling" / "config.json").write_text(json.dumps(st_pooling_config("cls", 384)), encoding="utf-8")
    assert rules(cramkit.load(f"hf:{cls_st}")) == ("cls", "cls", "cls", True)

    assert rules(cramkit.load(ft_model)) == ("cls", "cls", "cls", True)
    mean_head = tmp_path / "mean-head"  # a classifier fine-tuned with pooling=mean: its head says so
    shutil.copytree(ft_model, mean_head)
    meta = json.loads((ft_model / MODEL_FILE).read_text(encoding="utf-8"))
    meta |= {"pooling": "mean", "head": meta["head"] | {"pooling": "mean"}}
    (mean_head / MODEL_FILE).write_text(json.dumps(meta), encoding="utf-8")
    assert rules(cramkit.load(mean_head)) == ("mean", "mean", "mean", False)

    run = cramkit.load(pretrained_run)
    assert rules(run) == (None, "mean", "cls", True)
    setfit = resolve_pooling(FinetuneConfig(method="setfit"), run)
    assert (setfit.pooling, setfit.pooler_dense) == ("mean", False)
