"""cramkit eval sts / retrieval: the metrics against hand-computed values and plain re-implementations, the
readers' refusals, and real models (all-MiniLM-L6-v2 against a 10-step `cramkit pretrain` run) on GLUE MRPC."""

from __future__ import annotations

import importlib.util
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

import cramkit
from cramkit.cli import main
from cramkit.errors import CramkitError
from cramkit.evaluation import metrics, retrieval, sts

REPO = Path(__file__).resolve().parents[2]


def _load_make_beir():
    spec = importlib.util.spec_from_file_location("make_beir", REPO / "bench" / "make_beir.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mrpc_beir(real_glue_dir, tmp_path_factory) -> Path:
    """GLUE MRPC dev (408 pairs) as a BEIR folder, by bench/make_beir.py: 279 queries, 531 documents."""
    out = tmp_path_factory.mktemp("beir") / "mrpc"
    counts = _load_make_beir().make_beir(real_glue_dir / "MRPC" / "dev.tsv", out, "dev")
    assert counts == {"pairs": 408, "corpus": 531, "queries": 279, "qrels": 279}
    return out


def fails(capsys, *args: str) -> str:
    """Run the CLI in-process; it must fail with one `cramkit: error:` line, exit 2, no traceback."""
    capsys.readouterr()
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("cramkit: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ---------------------------------------------------------------------------------------------- metrics

RANKED = ["a", "b", "c"]
REL = {"b": 2, "c": 1, "x": 1, "z": 0}  # graded; x relevant but not retrieved; z judged not relevant


def test_metrics_by_hand():
    dcg = 2 / math.log2(3) + 1 / math.log2(4)  # a (unjudged) 0 at rank 1
    idcg = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)  # ideal: 2, 1, 1 (z's 0 adds nothing)
    assert metrics.ndcg_at_k(RANKED, REL, 3) == pytest.approx(dcg / idcg) == pytest.approx(0.562727, abs=1e-6)
    assert metrics.ndcg_at_k(RANKED, REL, 1) == 0.0
    assert metrics.ndcg_at_k(["b"], REL, 1) == 1.0
    assert metrics.recall_at_k(RANKED, REL, 1) == 0.0
    assert metrics.recall_at_k(RANKED, REL, 3) == pytest.approx(2 / 3)
    assert metrics.mrr_at_k(RANKED, REL, 3) == 0.5 and metrics.mrr_at_k(RANKED, REL, 1) == 0.0
    assert metrics.average_precision_at_k(RANKED, REL, 3) == pytest.approx((1 / 2 + 2 / 3) / 3)
    # no relevant document: every metric 0, and the query is left out of the means
    assert metrics.ndcg_at_k(RANKED, {"a": 0}, 10) == metrics.recall_at_k(RANKED, {"a": 0}, 10) == 0.0
    run = {"q1": RANKED, "q2": ["x"]}
    qrels = {"q1": REL, "q2": {"x": 1}, "q3": {"a": 0}, "q4": {"b": 1}}  # q4 retrieved nothing
    m = metrics.retrieval_metrics(run, qrels, k=3)
    assert list(m) == ["ndcg@3", "recall@1", "recall@3", "recall@100", "mrr@3", "map@100"]
    assert m["ndcg@3"] == pytest.approx(100 * (dcg / idcg + 1 + 0) / 3)
    assert m["recall@1"] == pytest.approx(100 / 3) and m["mrr@3"] == pytest.approx(100 * 1.5 / 3)
    assert metrics.retrieval_metrics(run, {"q3": {"a": 0}}) == {}


def _ndcg_reference(ranked, rel, k):
    """trec_eval's ndcg_cut written out the long way: gains by rank, ideal from the sorted judgements."""
    gains = [rel.get(d, 0) for d in ranked][:k]
    dcg = 0.0
    for rank, g in enumerate(gains, start=1):
        dcg += g / math.log(rank + 1, 2)
    ideal = sorted([g for g in rel.values() if g > 0], reverse=True)[:k]
    idcg = 0.0
    for rank, g in enumerate(ideal, start=1):
        idcg += g / math.log(rank + 1, 2)
    return dcg / idcg if idcg else 0.0


def test_ndcg_matches_a_reference_on_graded_judgements_with_ties():
    rng = random.Random(0)
    docs = [f"d{i}" for i in range(30)]
    for _ in range(200):
        rel = {d: rng.choice([0, 1, 1, 2, 2, 3]) for d in rng.sample(docs, rng.randint(1, 12))}  # many equal grades
        ranked = rng.sample(docs, rng.randint(0, 25))
        for k in (1, 3, 10, 100):
            assert metrics.ndcg_at_k(ranked, rel, k) == pytest.approx(_ndcg_reference(ranked, rel, k), abs=1e-12)
    # equal grades: any order of the two grade-2 documents is ideal
    rel = {"a": 2, "b": 2, "c": 1}
    assert metrics.ndcg_at_k(["b", "a", "c"], rel, 10) == metrics.ndcg_at_k(["a", "b", "c"], rel, 10) == 1.0


def test_sts_metrics_match_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 6, 200).astype(float)  # STS-style scores 0..5: many ties
    sim = np.round(gold / 5 + rng.normal(0, 0.3, 200), 1)  # ties in the similarities too
    m = metrics.sts_metrics(sim, gold)
    assert m["spearman"] == pytest.approx(100 * stats.spearmanr(sim, gold).statistic, abs=1e-9)
    assert m["pearson"] == pytest.approx(100 * stats.pearsonr(sim, gold).statistic, abs=1e-9)


def test_exact_search_in_blocks_equals_a_full_sort():
    rng = np.random.default_rng(1)
    corpus = rng.normal(size=(53, 8)).astype(np.float32)
    corpus[20] = corpus[3]  # a tie: the earlier row first
    queries = np.concatenate([rng.normal(size=(10, 8)), corpus[3:4]]).astype(np.float32)
    scores, ids = metrics.exact_search(queries, corpus, 12, corpus_block=7, query_block=4)
    full = queries @ corpus.T
    for q in range(len(queries)):
        want = sorted(range(len(corpus)), key=lambda i: (-full[q, i], i))[:12]
        assert ids[q].tolist() == want
        np.testing.assert_allclose(scores[q], full[q, want], rtol=1e-6)
    assert ids[-1][:2].tolist() == [3, 20]
    assert metrics.exact_search(queries, corpus, 100)[1].shape == (11, 53)  # depth capped at the corpus


# -------------------------------------------------------------------------------------- crafted files


def write_beir(root: Path, corpus=None, queries=None, qrels=None, split: str = "test") -> Path:
    corpus = (
        corpus
        if corpus is not None
        else [
            {"_id": "d1", "title": "Cats", "text": "Cats purr when they are content."},
            {"_id": "d2", "text": "The stock market fell sharply on Monday."},
            {"_id": "d3", "title": None, "text": "Rain is expected tomorrow afternoon."},
        ]
    )
    queries = (
        queries
        if queries is not None
        else [
            {"_id": "q1", "text": "why do cats purr"},
            {"_id": "q2", "text": "weather forecast"},
            {"_id": "q3", "text": "a query without judgements"},
        ]
    )
    qrels = qrels if qrels is not None else "query-id\tcorpus-id\tscore\nq1\td1\t2\nq2\td3\t1\nq2\td2\t0\n"
    root.mkdir(parents=True, exist_ok=True)
    (root / "qrels").mkdir(exist_ok=True)
    for name, rows in (("corpus.jsonl", corpus), ("queries.jsonl", queries)):
        text = rows if isinstance(rows, str) else "".join(json.dumps(r) + "\n" for r in rows)
        (root / name).write_text(text, encoding="utf-8")
    (root / "qrels" / f"{split}.tsv").write_text(qrels, encoding="utf-8")
    return root


def test_read_beir(tmp_path):
    data = retrieval.read_beir(write_beir(tmp_path / "b"), "test")
    assert data.corpus_ids == ["d1", "d2", "d3"]
    assert data.corpus_texts[0] == "Cats Cats purr when they are content."  # BEIR: title + " " + text
    assert data.corpus_texts[1] == "The stock market fell sharply on Monday."
    assert data.query_ids == ["q1", "q2"]  # only the judged queries are embedded
    assert data.qrels == {"q1": {"d1": 2.0}, "q2": {"d3": 1.0, "d2": 0.0}}


def test_beir_refusals(tmp_path, capsys, pretrained_run):
    src = str(pretrained_run)

    def refused(root: Path, *extra: str) -> str:
        out = tmp_path / "out"
        err = fails(capsys, "eval", "retrieval", "--from", src, "--data", str(root), "--out", str(out), *extra)
        assert not out.exists()  # nothing written
        return err

    ok = write_beir(tmp_path / "ok")
    assert "qrels/dev.tsv is missing; this folder has --split test" in refused(ok, "--split", "dev")
    for name in ("corpus.jsonl", "queries.jsonl"):
        root = write_beir(tmp_path / f"no-{name}")
        (root / name).unlink()
        err = refused(root)
        assert f"{root / name} is missing" in err and "qrels/SPLIT.tsv" in err
    root = write_beir(tmp_path / "empty", corpus="")
    assert f"{root / 'corpus.jsonl'} holds no documents" in refused(root)
    root = write_beir(tmp_path / "badjson", queries='{"_id": "q1", "text": "x"}\n{"_id": "q2", "text": \n')
    err = refused(root)
    assert f"{root / 'queries.jsonl'} line 2: not valid JSON" in err and "--skip-bad-rows" in err
    root = write_beir(tmp_path / "noid", corpus=[{"text": "no id"}])
    assert "corpus.jsonl line 1: no field '_id'" in refused(root)
    root = write_beir(tmp_path / "score", qrels="query-id\tcorpus-id\tscore\nq1\td1\thigh\n")
    assert "test.tsv line 2: the score 'high' is not a number" in refused(root)
    root = write_beir(
        tmp_path / "ids", qrels="query-id\tcorpus-id\tscore\nq1\td1\t1\nq9\td1\t1\nq8\td1\t1\nq1\td7\t1\n"
    )
    err = refused(root)
    assert "2 row(s) name a query id that is not in" in err and "(first: q9, q8)" in err and "--skip-bad-rows" in err
    # --skip-bad-rows: the judgements of unknown ids are left out and counted
    res = retrieval.evaluate_retrieval(pretrained_run, root, None, skip_bad_rows=True, device="cpu", progress=False)
    assert res["skipped_rows"] == {"qrels/test.tsv judgements of unknown ids": 3}
    assert res["counts"]["queries"] == 1 and res["counts"]["judgements"] == 1


def test_sts_reading_and_refusals(tmp_path, capsys, pretrained_run):
    f = tmp_path / "sts.tsv"
    # GLUE STS-B's dev.tsv header; quotes are plain text in a TSV
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    rows = [
        ("A man is playing a guitar.", "A man plays the guitar.", "4.8"),
        ('A "woman" is slicing onions.', "Someone is cutting onions.", "4.2"),
        ("A dog runs in the park.", "The stock market fell.", "0.0"),
    ]
    f.write_text(
        head + "".join(f"{i}\tx\tf\t2012\t{i}\tnone\tnone\t{a}\t{b}\t{s}\n" for i, (a, b, s) in enumerate(rows))
    )
    data = sts.read_sts(f)
    assert data.columns == ("sentence1", "sentence2", "score") and data.scores == [4.8, 4.2, 0.0]
    assert data.texts_a[1] == 'A "woman" is slicing onions.'
    out = tmp_path / "o"
    err = fails(
        capsys, "eval", "sts", "--from", str(pretrained_run), "--data", str(f), "--label", "gold", "--out", str(out)
    )
    assert "no column 'gold'" in err and "--label" in err and not out.exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"sentence1": "a b", "sentence2": "a c", "score": 1}\n{"sentence1": "a", "sentence2": "b", "score": "n/a"}\n'
    )
    err = fails(capsys, "eval", "sts", "--from", str(pretrained_run), "--data", str(bad), "--out", str(out))
    assert f"{bad} line 2: the score ('score') 'n/a' is not a number" in err and not out.exists()
    same = tmp_path / "same.csv"
    same.write_text("sentence1,sentence2,score\na,b,1\nc,d,1\n")
    assert "every gold score is 1" in fails(capsys, "eval", "sts", "--from", str(pretrained_run), "--data", str(same))
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    assert f"{empty} is empty" in fails(capsys, "eval", "sts", "--from", str(pretrained_run), "--data", str(empty))
    # the suites' options are not the embedding evaluations', and the other way round
    assert "--seeds applies to the fine-tuning suites" in fails(
        capsys, "eval", "sts", "--from", str(pretrained_run), "--data", str(f), "--seeds", "1"
    )
    assert "--index applies to cramkit eval retrieval" in fails(
        capsys, "eval", "sts", "--from", str(pretrained_run), "--data", str(f), "--index", "x"
    )
    assert "--data applies to cramkit eval sts / retrieval" in fails(
        capsys, "eval", "glue", "--from", str(pretrained_run), "--data", str(f)
    )


def test_a_model_without_an_encoder_is_refused(tmp_path, capsys, tok):
    """A BiLSTM student (what `cramkit distill --student bilstm` saves) has no encoder to embed with."""
    from cramkit.loading import LoadedModel
    from cramkit.model.students import BiLSTMConfig, BiLSTMStudent, bilstm_meta

    cfg = BiLSTMConfig(vocab_size=tok.get_vocab_size(), embedding_dim=16, lstm_hidden=8, fc_hidden=8)
    student = LoadedModel(
        model=BiLSTMStudent(cfg, 2),
        kind="classifier",
        config=bilstm_meta(cfg),
        tokenizer=tok,
        labels=["0", "1"],
        architecture="bilstm",
        with_types=False,
    )
    where = student.save(tmp_path / "bilstm")
    data = write_beir(tmp_path / "b")
    err = fails(capsys, "eval", "retrieval", "--from", str(where), "--data", str(data), "--out", str(tmp_path / "o"))
    assert "(bilstm) has no transformer encoder" in err and not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------ real models


@pytest.mark.integration
def test_minilm_far_above_a_barely_trained_run_on_mrpc(
    mrpc_beir, real_glue_dir, minilm_dir, pretrained_run, tmp_path, capsys
):
    minilm = f"hf:{minilm_dir}"
    out = tmp_path / "eval-minilm"
    assert main(["eval", "retrieval", "--from", minilm, "--data", str(mrpc_beir), "--split", "dev", "--out", str(out),
                 "--device", "cpu", "--no-progress"]) == 0  # fmt: skip
    line = capsys.readouterr().out.strip()
    assert line.startswith("retrieval mrpc/dev: ndcg@10 ") and "x100, 279 queries, 531 documents" in line
    res = json.loads((out / "results.json").read_text())
    assert {p.name for p in out.iterdir()} == {"results.json", "results.md", "scores.png"}
    assert res["scale"].startswith("x100") and res["model"]["pooling"] == "mean" and res["search"]["kind"] == "exact"
    tiny = cramkit.evaluate_retrieval(pretrained_run, mrpc_beir, None, split="dev", device="cpu", progress=False)
    assert res["metrics"]["ndcg@10"] > 90 > tiny["metrics"]["ndcg@10"] + 40, (res["metrics"], tiny["metrics"])
    assert res["metrics"]["recall@100"] >= res["metrics"]["recall@10"] >= res["metrics"]["recall@1"]
    # STS on MRPC's pairs straight from GLUE's file, the 0/1 Quality as the gold score: paraphrases are closer
    mrpc = str(real_glue_dir / "MRPC" / "dev.tsv")
    cols = {"text_a": "#1 String", "text_b": "#2 String", "label": "Quality"}
    sts_minilm = cramkit.evaluate_sts(minilm, mrpc, tmp_path / "sts", device="cpu", progress=False, **cols)
    sts_tiny = cramkit.evaluate_sts(pretrained_run, mrpc, None, device="cpu", progress=False, **cols)
    assert sts_minilm["counts"]["pairs"] == 408
    assert sts_minilm["score"] > sts_tiny["score"] + 5 and sts_minilm["score"] > 20, (sts_minilm, sts_tiny)
    assert "| spearman |" in (tmp_path / "sts" / "results.md").read_text()


def test_through_an_index(mrpc_beir, pretrained_run, minilm_dir, tmp_path, capsys):
    """An index built from the folder's corpus.jsonl: a flat one gives exact search's numbers, and it must have
    been built by the model evaluated."""
    idx = tmp_path / "idx"
    assert main(["index", "build", str(mrpc_beir / "corpus.jsonl"), "--encoder", str(pretrained_run), "--out", str(idx),
                 "--kind", "flat", "--device", "cpu"]) == 0  # fmt: skip
    via = cramkit.evaluate_retrieval(
        pretrained_run, mrpc_beir, tmp_path / "r", split="dev", index=idx, device="cpu", progress=False
    )
    exact = cramkit.evaluate_retrieval(pretrained_run, mrpc_beir, None, split="dev", device="cpu", progress=False)
    assert via["search"]["kind"] == "index" and via["search"]["index_kind"] == "flat"
    assert via["search"]["documents_indexed_as"] == "text"
    for m, v in exact["metrics"].items():
        # Faiss's inner products and numpy's differ in the last bits: a near-tie of a barely trained model's
        # scores may rank the other way (a few 1e-4 points); a wrong document would move a metric by points
        assert via["metrics"][m] == pytest.approx(v, abs=1e-2)
        assert via["exact_on_index_vectors"][m] == pytest.approx(v, abs=1e-6)
    assert "| ndcg@10 |" in (tmp_path / "r" / "results.md").read_text()
    capsys.readouterr()
    err = fails(capsys, "eval", "retrieval", "--from", f"hf:{minilm_dir}", "--data", str(mrpc_beir), "--split", "dev",
                "--index", str(idx), "--out", str(tmp_path / "o"))  # fmt: skip
    assert "was built with another model" in err and "cramkit index build" in err and not (tmp_path / "o").exists()
    # an index of other documents
    other = write_beir(tmp_path / "other")
    with pytest.raises(CramkitError, match="does not hold the documents of"):
        retrieval.evaluate_retrieval(pretrained_run, other, None, index=idx, device="cpu", progress=False)
