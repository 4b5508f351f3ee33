"""Fine-tuning: tokenisation, length bucketing, determinism, loss going down, a real checkpoint learning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cramkit.data.batching import bucketed_batches, collate, encode_examples
from cramkit.errors import CramkitError
from cramkit.loading import load
from cramkit.recipes.finetune import finetune
from cramkit.recipes.finetune_config import FinetuneConfig, auto_lr, config_from
from cramkit.tasks.registry import Example, Task, get_task


def make_tiny_run(root: Path, sentences: list[str], *, vocab_size: int = 1500) -> Path:
    """A run directory made by the real `cramkit pretrain` on ``sentences`` (tiny model, 10 steps)."""
    from conftest import run_pretrain

    root.mkdir(parents=True, exist_ok=True)
    text = root.parent / f"{root.name}-corpus.txt"
    text.write_text("\n\n".join(sentences) + "\n", encoding="utf-8")
    return run_pretrain(root, str(text), "--set", f"tokenizer.vocab_size={vocab_size}")


def sst2_sentences(glue_dir: Path, n: int = 3000) -> list[str]:
    lines = (glue_dir / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1 : n + 1]
    return [line.split("\t")[0] for line in lines]


def subset_task(task: Task, n_train: int, n_dev: int) -> Task:
    """The task with only the first n_train / n_dev examples of train / dev (and no test split)."""
    train, dev = task.examples("train")[:n_train], task.examples("dev")[:n_dev]
    return Task(
        name=task.name,
        splits={"train": lambda: train, "dev": lambda: dev},
        labels=task.labels,
        metrics=task.metrics,
        main_metric=task.main_metric,
        test_splits=[],
    )


@pytest.fixture(scope="module")
def sst2(glue_dir: Path) -> Task:
    return get_task("glue/sst2", data_dir=glue_dir)


def test_load_run_and_checkpoint_dir(tiny_run: Path) -> None:
    m = load(tiny_run)
    cfg, tok = m.config, m.tokenizer
    assert m.kind == "mlm" and cfg.hidden == 64 and cfg.vocab_size == tok.get_vocab_size()
    state = m.encoder.state_dict()
    assert state["embeddings.word.weight"].shape == (cfg.vocab_size, 64)
    m2 = load(tiny_run / "checkpoints" / "step-000010")
    state2 = m2.encoder.state_dict()
    assert m2.config == cfg and torch.equal(state2["layers.0.attn.qkv.weight"], state["layers.0.attn.qkv.weight"])


def test_vocab_mismatch_is_a_clear_error(tiny_run: Path, glue_dir: Path, tmp_path: Path) -> None:
    from cramkit.text.tokenizer import save_tokenizer, train_tokenizer

    other = tmp_path / "run"
    other.mkdir()
    for name in ("config.yaml",):
        (other / name).write_text((tiny_run / name).read_text())
    (other / "checkpoints").mkdir()
    (other / "checkpoints" / "latest").write_text("step-000010")
    (other / "checkpoints" / "step-000010").symlink_to(tiny_run / "checkpoints" / "step-000010")
    save_tokenizer(train_tokenizer(sst2_sentences(glue_dir, 500), vocab_size=400), other / "tokenizer")
    with pytest.raises(CramkitError, match="different vocabularies"):
        load(other)


def test_pair_encoding_truncation_and_padding(tiny_run: Path) -> None:
    tok = load(tiny_run).tokenizer
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    long = " ".join(["the film is good"] * 20)
    rows = [Example("a good film", "it is bad", 1, 0), Example(long, long, 0, 1), Example("fine", None, 1, 2)]
    enc = encode_examples(tok, rows, max_length=32)
    a = tok.encode("a good film", add_special_tokens=False).ids
    b = tok.encode("it is bad", add_special_tokens=False).ids
    assert enc.ids[0].tolist() == [cls, *a, sep, *b, sep]
    assert enc.b_start[0] == len(a) + 2
    assert enc.lengths[1] == 32 and enc.ids[1][-1] == sep  # truncated longest-first, ends with [SEP]
    assert abs(int(enc.b_start[1]) - (32 - int(enc.b_start[1]))) <= 2  # both segments cut about evenly
    assert enc.ids[2].tolist()[0] == cls and enc.b_start[2] == enc.lengths[2]
    batch = collate(enc, np.array([0, 2]), pad_id=0, with_types=True)
    assert batch["input_ids"].shape == (2, enc.lengths[0])  # padded to the longest member only
    assert batch["attention_mask"][1].sum() == enc.lengths[2]
    types = batch["token_type_ids"][0].tolist()
    assert types == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    same = collate(enc, np.array([0, 0]), pad_id=0, with_types=False)
    assert same["attention_mask"] is None and same["token_type_ids"] is None  # nothing padded: no mask


def test_bucketing_covers_every_example_once_and_cuts_padding() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 60, size=1000)
    batches = bucketed_batches(lengths, 16, 50, np.random.default_rng(1))
    again = bucketed_batches(lengths, 16, 50, np.random.default_rng(1))
    assert all(np.array_equal(x, y) for x, y in zip(batches, again, strict=True))
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    plain = bucketed_batches(lengths, 16, 0, np.random.default_rng(1))

    def padded(bs):
        return sum(len(b) * lengths[b].max() for b in bs)

    assert padded(batches) < 0.7 * padded(plain)
    assert not np.array_equal(np.concatenate(batches)[:16], np.sort(np.concatenate(batches))[:16])


def test_config_is_strict_and_has_the_glue_sane_defaults() -> None:
    cfg = FinetuneConfig()
    assert (cfg.lr, cfg.batch_size, cfg.epoch_count, cfg.max_length, cfg.warmup) == ("auto", 16, 5.0, 128, 0.1)
    # auto: Cramming's 4e-5 from MiniLM's width up, 1e-3 for narrower models; a number is taken as given
    assert [auto_lr(cfg, h) for h in (64, 256, 384, 768, None)] == [1e-3, 1e-3, 4e-5, 4e-5, 4e-5]
    assert auto_lr(config_from({"lr": "2e-5"}), 256) == 2e-5
    assert config_from({"lr": "2e-5", "seeds": "0,1,2"}).seeds == [0, 1, 2]
    with pytest.raises(CramkitError, match="did you mean 'epochs'"):
        config_from({"epoch": 3})


def test_the_steps_are_the_epochs_or_the_floor(tiny_run: Path, sst2: Task, tmp_path: Path) -> None:
    """max(epochs x steps per epoch, min_steps): few rows train min_steps steps (the warmup and cosine over
    them, 'epoch' evaluations spread as the epochs would be); enough rows train their epochs."""
    from cramkit.train.metrics import read_metrics

    assert FinetuneConfig().step_floor == 500 and FinetuneConfig(epochs=1).step_floor == 0  # a default floor
    few = subset_task(sst2, 40, 50)  # 3 batches an epoch: 5 epochs = 15 steps < 40
    cfg = FinetuneConfig(min_steps=40, seeds=[0], max_length=32)
    res = finetune(few, tiny_run, cfg, tmp_path / "few", progress=False)
    assert res["seeds"][0]["steps"] == 40 and len(res["seeds"][0]["loss_curve"]) == 40
    saved = json.loads((tmp_path / "few" / "results.json").read_text())
    assert saved["seeds"][0]["steps"] == 40 and saved["config"]["min_steps"] == 40
    rows = read_metrics(tmp_path / "few" / "seeds" / "seed-0")
    lr = [r["lr"] for r in rows if "lr" in r]
    peak = 1e-3  # lr auto on this 64-wide model
    assert res["seeds"][0]["lr"] == peak and saved["config"]["lr"] == "auto"
    assert len(lr) == 40 and lr[0] == 0.0 and max(lr) == pytest.approx(peak)
    assert lr.index(max(lr)) == 4 and lr[-1] < 0.01 * peak  # 10% warmup of 40 steps, cosine to ~0
    assert [r["step"] for r in rows if "val_loss" in r] == [8, 16, 24, 32, 40]  # 5 'epochs' of 8 steps

    more = subset_task(sst2, 160, 50)  # 10 batches an epoch: 5 epochs = 50 steps > 40
    res = finetune(more, tiny_run, cfg, None, progress=False)
    assert res["seeds"][0]["steps"] == 50
    res = finetune(few, tiny_run, config_from({"min_steps": 0}, cfg), None, progress=False)
    assert res["seeds"][0]["steps"] == 15  # 0: epochs only
    with pytest.raises(CramkitError, match="min_steps"):
        config_from({"min_steps": -1})


def test_tiny_model_learns_and_is_deterministic(tiny_run: Path, sst2: Task, tmp_path: Path) -> None:
    task = subset_task(sst2, 256, 200)
    cfg = FinetuneConfig(lr=3e-3, epochs=5, seeds=[0], warmup=0.0, max_length=64, pooling="mean", min_steps=0)
    r1 = finetune(task, tiny_run, cfg, tmp_path / "a", progress=False)
    r2 = finetune(task, tiny_run, cfg, tmp_path / "b", progress=False)
    curve = r1["seeds"][0]["loss_curve"]
    assert len(curve) == 80
    assert np.mean(curve[-10:]) < 0.6 * np.mean(curve[:10])  # the training loss goes down
    assert curve == r2["seeds"][0]["loss_curve"]  # same seed, same losses
    assert r1["median"] == r2["median"]
    r3 = finetune(task, tiny_run, config_from({"seeds": [1]}, cfg), None, progress=False)
    assert r3["seeds"][0]["loss_curve"] != curve  # another seed, another order and init
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    assert saved["median"]["dev"]["metrics"]["accuracy"] == r1["median"]["dev"]["metrics"]["accuracy"]


def test_seeds_median_and_test_predictions(tiny_run: Path, glue_dir: Path, tmp_path: Path) -> None:
    # MRPC: pairs, F1 + accuracy, a test split written in the leaderboard format
    task = get_task("glue/mrpc", data_dir=glue_dir)
    cfg = FinetuneConfig(epochs=0.05, seeds=[0, 1, 2], max_length=64, eval_batch_size=256, min_steps=0)
    res = finetune(task, tiny_run, cfg, tmp_path, progress=False)
    scores = sorted(r["dev"]["dev"]["score"] for r in res["seeds"])
    assert res["median"]["dev"]["score"] == scores[1]
    assert set(res["median"]["dev"]["metrics"]) == {"f1", "accuracy"}
    rows = (tmp_path / "predictions" / "MRPC.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 1 + len(task.examples("test"))
    assert {r.split("\t")[1] for r in rows[1:]} <= {"0", "1"}


@pytest.mark.integration
def test_minilm_learns_sst2(minilm_dir: Path, sst2: Task) -> None:
    """The real all-MiniLM-L6-v2 checkpoint, 400 SST-2 examples, one epoch: clearly above chance."""
    task = subset_task(sst2, 400, 300)
    cfg = FinetuneConfig(lr=1e-4, batch_size=8, epochs=1, seeds=[0], min_steps=0)
    res = finetune(task, f"hf:{minilm_dir}", cfg, None, progress=False)
    assert res["median"]["dev"]["metrics"]["accuracy"] > 65.0
