"""The contrastive stage (issue 29): `cramkit finetune --objective contrastive|simcse` on a run that `cramkit
pretrain` made, on MRPC's real paraphrase pairs; the loss against a hand computation; cached negatives give
the same gradients; bad input is one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import cramkit
from cramkit.errors import CramkitError
from cramkit.recipes import contrastive as con
from cramkit.recipes import contrastive_config, contrastive_data, contrastive_loss
from infer.models import cli

from .conftest import write_mrpc_pairs


@pytest.fixture(scope="module")
def mrpc_pairs(real_glue_dir: Path, tmp_path_factory) -> Path:  # real paraphrases
    """MRPC's paraphrases (Quality 1) of its training file as a TSV of pairs."""
    return write_mrpc_pairs(real_glue_dir, tmp_path_factory.mktemp("pairs") / "pairs.tsv", 600)


def _train(tiny_run: Path, pairs: Path, out: Path, *more: str):
    return cli(
        "finetune",
        *("--from", str(tiny_run), "--objective", "contrastive", "--train", str(pairs)),
        *("--text-a", "s1", "--text-b", "s2", "--out", str(out), "--no-progress"),
        *("--set", "batch_size=16", "--set", "lr=2e-3", "--set", "dev_fraction=0.2"),
        *more,
    )


@pytest.mark.integration
def test_the_stage_teaches_a_pretrained_run_to_find_paraphrases(tiny_run: Path, mrpc_pairs: Path, tmp_path) -> None:
    out = tmp_path / "emb"
    proc = _train(tiny_run, mrpc_pairs, out, "--budget", "40steps")
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["steps"] == 40 and res["pairs"] == 480 and res["dev_pairs"] == 120
    before, after = res["before"], res["after"]
    # each held-out anchor finds its own paraphrase among 120 more often than before the stage
    assert after["dev_mrr"] > before["dev_mrr"] + 3, (before, after)
    assert f"dev recall@1 {after['dev_recall_at_1']:.1f}" in proc.stdout
    model = cramkit.load(out)
    assert model.kind == "encoder" and model.normalize and model.pooling in ("mean", "cls")
    from cramkit.infer import Engine

    vecs = Engine(model).embed(["the cat sat on the mat", "a cat was sitting on the mat"])
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-4)
    assert not (out / "run" / "checkpoints").exists() and (out / "run" / "metrics.jsonl").is_file()
    again = _train(tiny_run, mrpc_pairs, out, "--budget", "40steps")  # the same command: the finished run
    assert again.returncode == 0 and "finished run" in again.stderr
    other = _train(tiny_run, mrpc_pairs, out, "--budget", "20steps")  # other settings: never over it
    assert other.returncode == 2 and "other settings" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_simcse_and_matryoshka_on_single_texts(tiny_run: Path, mrpc_pairs: Path, tmp_path) -> None:
    text = tmp_path / "lines.txt"
    lines = [line.split("\t")[0] for line in mrpc_pairs.read_text(encoding="utf-8").splitlines()[1:200]]
    text.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    out = tmp_path / "simcse"
    proc = cli(
        "finetune",
        *("--from", str(tiny_run), "--objective", "simcse", "--train", str(text), "--out", str(out)),
        *("--budget", "3steps", "--set", "batch_size=8", "--set", "matryoshka=32,16", "--no-progress"),
    )
    assert proc.returncode == 0, proc.stderr
    model = cramkit.load(out)
    hidden = model.config.hidden
    assert hidden == 64 and model.extra["matryoshka"] == [hidden, 32, 16]
    base = cramkit.load(tiny_run).encoder.state_dict()
    moved = [k for k, v in model.encoder.state_dict().items() if not torch.equal(v, base[k])]
    assert moved  # dropout made the two passes differ: the encoder learnt

    # the Matryoshka dimensions: the leading ones of the pooled vector, renormalised; others refused
    from cramkit.infer import Engine

    eng = Engine(model)
    texts = ["a fine film", "the market fell", "he went home"]
    full = eng.embed(texts, normalize=False)
    cut = eng.embed(texts, dimensions=16)
    assert cut.shape == (3, 16)
    assert np.allclose(cut, full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True), atol=1e-5)
    with pytest.raises(CramkitError, match="answers 64, 32, 16"):
        eng.embed(texts, dimensions=20)
    with pytest.raises(CramkitError, match="not trained to be cut"):
        Engine(cramkit.load(tiny_run)).embed(texts, dimensions=16)
    sts = tmp_path / "sts.tsv"  # scored at a cut: the cosine of the cut vectors against the gold score
    pairs = [line.split("\t") for line in mrpc_pairs.read_text(encoding="utf-8").splitlines()[1:41]]
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{i % 5}\n" for i, (a, b) in enumerate(pairs)))
    res = cramkit.evaluate_sts(out, sts, None, dimensions=16, progress=False, device="cpu")
    va, vb = eng.embed([p[0] for p in pairs], dimensions=16), eng.embed([p[1] for p in pairs], dimensions=16)
    from cramkit.tasks.metrics import spearman

    assert res["dimensions"] == 16
    assert res["metrics"]["spearman"] == pytest.approx(spearman((va * vb).sum(1), [i % 5 for i in range(40)]), abs=1e-3)
    with pytest.raises(CramkitError, match="answers 64, 32, 16"):
        cramkit.evaluate_sts(out, sts, None, dimensions=8, progress=False)
    exported = cramkit.export(out, tmp_path / "onnx", format="onnx", progress=False)  # the export keeps them
    onnx = Engine(cramkit.load(exported))
    assert onnx.dimensions == [64, 32, 16]
    assert np.allclose(onnx.embed(texts, dimensions=16), cut, atol=1e-4)
    from serve.test_server import start

    server, url = start(str(out))
    try:
        import httpx

        r = httpx.post(f"{url}/embed", json={"inputs": texts, "dimensions": 32}, timeout=60)
        assert r.status_code == 200, r.text
        assert np.allclose(np.asarray(r.json()), eng.embed(texts, dimensions=32), atol=1e-5)
        r = httpx.post(f"{url}/v1/embeddings", json={"input": texts[:1], "dimensions": 16}, timeout=60)
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 16
        bad = httpx.post(f"{url}/embed", json={"inputs": texts, "dimensions": 7}, timeout=60)
        assert bad.status_code == 422 and "answers 64, 32, 16" in bad.text
        assert httpx.get(f"{url}/info", timeout=10).json()  # still up
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_info_nce_is_cross_entropy_over_the_batch_with_duplicates_masked() -> None:
    gen = torch.Generator().manual_seed(0)
    a, p, n = (torch.randn(4, 8, generator=gen) for _ in range(3))
    scale = torch.tensor(20.0)
    cand = torch.cat([p, n])
    norm = torch.nn.functional.normalize

    def by_hand(a, c, same=None):
        s = (norm(a, dim=-1) @ norm(c, dim=-1).T) * scale
        total = 0.0
        for i in range(a.shape[0]):
            row = [s[i, j] for j in range(c.shape[0]) if same is None or not same[i, j]]
            total += -(s[i, i] - torch.logsumexp(torch.stack(row), 0))
        return total / a.shape[0]

    assert torch.allclose(contrastive_loss.info_nce(a, cand, scale), by_hand(a, cand), atol=1e-5)
    same = torch.zeros(4, 8, dtype=torch.bool)
    same[0, 2] = same[2, 0] = True  # rows 0 and 2 share a positive text: not each other's negatives
    assert torch.allclose(contrastive_loss.info_nce(a, cand, scale, same=same), by_hand(a, cand, same), atol=1e-5)
    sym = contrastive_loss.info_nce(a, p, scale, symmetric=True)
    assert torch.allclose(sym, (by_hand(a, p) + by_hand(p, a)) / 2, atol=1e-5)
    mat = contrastive_loss.info_nce(a, cand, scale, dims=[4])
    assert torch.allclose(mat, (by_hand(a, cand) + by_hand(a[:, :4], cand[:, :4])) / 2, atol=1e-5)


def test_collate_masks_the_same_text_and_keeps_each_rows_own_positive() -> None:
    pairs = contrastive_data.make_pairs([("a", "x", None), ("b", "x", None), ("c", "y", None), ("y", "z", None)])
    enc = [np.array([1, 5 + i, 2]) for i in range(len(pairs.texts))]
    batch = contrastive_data.collate_pairs(pairs, np.arange(4), enc, pad_id=0)
    same = batch["same"].numpy()
    assert not same.diagonal().any()
    assert same[0, 1] and same[1, 0]  # "x" is both rows' positive
    assert same[3, 2]  # row 3's anchor "y" is row 2's positive: not a negative of row 3
    assert same.sum() == 3


def test_cached_negatives_give_the_gradients_of_the_whole_batch(tiny_run: Path, mrpc_pairs: Path) -> None:
    loaded = cramkit.load(tiny_run)
    rows, _ = contrastive_data.read_pairs(mrpc_pairs, "s1", "s2", None, objective="contrastive")
    pairs = contrastive_data.make_pairs(rows[:12])
    from cramkit.data.batching import encode_texts

    enc = encode_texts(loaded.tokenizer, pairs.texts, None, 64).ids
    grads = []
    for micro in (0, 4):
        cfg = contrastive_config.ContrastiveConfig(dropout=0.0, micro_batch=micro, batch_size=12)
        objective = con.ContrastiveObjective(loaded, cfg, pairs, None, enc, "mean")
        model = objective.build_model()
        batch = contrastive_data.collate_pairs(pairs, np.arange(12), enc, loaded.pad_id)
        loss = objective.loss(model, batch, torch.device("cpu"))
        loss.backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
        assert math.isfinite(float(loss.detach()))
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], atol=1e-5, rtol=1e-4), k


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--text-a", "nope", "--text-b", "s2"), "no column 'nope'"),
        ((), "which column holds the texts? name it with --text-a"),
        (("--text-a", "s1"), "needs pairs: name the second text's column with --text-b"),
        (("--text-a", "s1", "--text-b", "s2", "--set", "batch_size=1"), "at least 2"),
        (("--text-a", "s1", "--text-b", "s2", "--set", "matryoshka=big"), "matryoshka 'big'"),
        (("--text-a", "s1", "--text-b", "s2", "--set", "temprature=0.1"), "temprature"),
    ],
)
def test_bad_input_is_one_line(tiny_run: Path, mrpc_pairs: Path, tmp_path, args, needle) -> None:
    proc = cli(
        "finetune",
        *("--from", str(tiny_run), "--objective", "contrastive", "--train", str(mrpc_pairs)),
        *("--out", str(tmp_path / "x"), *args),
    )
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x" / "cramkit-model.json").exists()


def test_a_pair_task_gives_its_positives_and_a_single_text_task_is_refused(glue_dir: Path) -> None:
    from cramkit.tasks.registry import get_task

    mrpc = get_task("glue/mrpc", data_dir=glue_dir)
    pairs = contrastive_data.task_pairs(mrpc, "train")
    labelled = [r for r in mrpc.examples("train") if r.label == 1]
    assert len(pairs) == len(labelled) and pairs[0][:2] == (labelled[0].text_a, labelled[0].text_b)
    with pytest.raises(CramkitError, match="no pairs"):
        contrastive_data.task_pairs(get_task("glue/sst2", data_dir=glue_dir), "train")


def test_from_python_on_a_pair_task(tiny_run: Path, glue_dir: Path, tmp_path) -> None:
    res = cramkit.train_embeddings(
        tiny_run,
        task="glue/mrpc",
        data_dir=glue_dir,
        out=tmp_path / "py",
        progress=False,
        budget="3steps",
        batch_size=8,
        max_train_examples=64,
        symmetric=True,
        learn_temperature=True,
    )
    assert res["steps"] == 3 and res["pairs"] == 64
    assert res["dev_pairs"] == sum(r.label == 1 for r in cramkit_task(glue_dir).examples("dev"))
    assert res["temperature"] != 0.05  # learnt
    assert cramkit.load(tmp_path / "py").kind == "encoder"


def cramkit_task(glue_dir: Path):
    from cramkit.tasks.registry import get_task

    return get_task("glue/mrpc", data_dir=glue_dir)


@pytest.mark.integration
def test_the_hf_export_of_an_embedding_model_is_a_sentence_transformers_folder(
    minilm_dir: Path, tiny_run: Path, mrpc_pairs: Path, tmp_path
) -> None:
    from sentence_transformers import SentenceTransformer

    from cramkit.infer import Engine

    texts = ["a fine film", "The capital of France is Paris. " * 60]  # the second is cut at the length limit
    exported = cramkit.export(f"hf:{minilm_dir}", tmp_path / "minilm", progress=False)
    ours = SentenceTransformer(str(exported), device="cpu").encode(texts)
    assert np.abs(ours - SentenceTransformer(str(minilm_dir), device="cpu").encode(texts)).max() < 1e-5
    out = tmp_path / "emb"  # a cramkit-shaped model: through its remote code
    proc = _train(tiny_run, mrpc_pairs, out, "--budget", "2steps", "--set", "matryoshka=32")
    assert proc.returncode == 0, proc.stderr
    exported = cramkit.export(out, tmp_path / "emb-hf", progress=False)
    st = SentenceTransformer(str(exported), device="cpu", trust_remote_code=True)
    assert np.abs(st.encode(texts) - Engine(cramkit.load(out)).embed(texts)).max() < 1e-5
    marker = json.loads((exported / "cramkit_export.json").read_text())
    assert marker["sentence_transformers"]["matryoshka"] == [64, 32]
