"""Metrics against independent references (scipy, plain-Python formulas) and the GLUE average rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from cramkit.errors import CramkitError
from cramkit.tasks.metrics import compute_metrics, glue_average, glue_scores, rankdata


def ref_mcc(pred, gold):
    """Multi-class MCC as the correlation of one-hot indicator matrices, written with loops."""
    classes = sorted(set(pred) | set(gold))
    n = len(pred)

    def cov(a, b):
        total = 0.0
        for k in classes:
            xa = [1.0 if v == k else 0.0 for v in a]
            xb = [1.0 if v == k else 0.0 for v in b]
            ma, mb = sum(xa) / n, sum(xb) / n
            total += sum((u - ma) * (w - mb) for u, w in zip(xa, xb, strict=True))
        return total

    d = math.sqrt(cov(pred, pred) * cov(gold, gold))
    return 0.0 if d == 0 else 100 * cov(pred, gold) / d


def ref_f1(pred, gold):
    tp = sum(p == 1 and g == 1 for p, g in zip(pred, gold, strict=True))
    precision = tp / max(1, sum(p == 1 for p in pred))
    recall = tp / max(1, sum(g == 1 for g in gold))
    return 0.0 if tp == 0 else 100 * 2 * precision * recall / (precision + recall)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classification_metrics_match_references(seed):
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 2, 300)
    pred = np.where(rng.random(300) < 0.7, gold, 1 - gold)
    m = compute_metrics(["accuracy", "f1", "mcc"], pred, gold)
    assert m["accuracy"] == pytest.approx(100 * np.mean(pred == gold))
    assert m["f1"] == pytest.approx(ref_f1(pred.tolist(), gold.tolist()))
    # binary MCC is the phi coefficient: the Pearson correlation of the 0/1 vectors
    assert m["mcc"] == pytest.approx(100 * stats.pearsonr(pred, gold)[0])
    assert m["mcc"] == pytest.approx(ref_mcc(pred.tolist(), gold.tolist()))


def test_multiclass_mcc_and_logits():
    rng = np.random.default_rng(3)
    gold = rng.integers(0, 3, 200)
    logits = rng.normal(size=(200, 3))
    logits[np.arange(200), gold] += 1.0  # better than chance
    pred = logits.argmax(-1)
    m = compute_metrics(["accuracy", "mcc"], logits, gold)
    assert m["mcc"] == pytest.approx(ref_mcc(pred.tolist(), gold.tolist()))
    assert m["accuracy"] == pytest.approx(100 * np.mean(pred == gold))
    assert 0 < m["mcc"] < 100


def test_correlations_match_scipy_with_ties():
    rng = np.random.default_rng(4)
    gold = rng.integers(0, 6, 500).astype(float)  # many ties, like STS-B's 0..5 scores
    pred = gold + rng.normal(scale=1.5, size=500)
    pred[:50] = np.round(pred[:50])  # ties on the prediction side too
    m = compute_metrics(["pearson", "spearman"], pred.reshape(-1, 1), gold)
    assert m["pearson"] == pytest.approx(100 * stats.pearsonr(pred, gold)[0], rel=1e-9)
    assert m["spearman"] == pytest.approx(100 * stats.spearmanr(pred, gold)[0], rel=1e-9)
    a = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    assert rankdata(a).tolist() == stats.rankdata(a).tolist()


def test_degenerate_inputs_count_as_zero():
    gold = np.array([0, 1, 0, 1])
    const = np.zeros(4, dtype=int)
    m = compute_metrics(["mcc", "f1", "accuracy"], const, gold)
    assert m == {"mcc": 0.0, "f1": 0.0, "accuracy": 50.0}
    assert compute_metrics(["pearson", "spearman"], np.ones(4), [1.0, 2.0, 3.0, 4.0]) == {
        "pearson": 0.0,
        "spearman": 0.0,
    }
    assert compute_metrics(["mcc", "f1"], gold, gold) == {"mcc": 100.0, "f1": 100.0}


def test_macro_f1_and_f1a_match_sklearn():
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(5)
    for n, k in ((60, 3), (25, 3), (40, 2)):
        gold = rng.integers(0, k, n)
        pred = np.where(rng.random(n) < 0.6, gold, rng.integers(0, k, n))
        m = compute_metrics(["macro_f1", "f1a"], pred, gold)
        assert m["macro_f1"] == pytest.approx(100 * sk.f1_score(gold, pred, average="macro"))
        if k == 2:
            assert m["f1a"] == pytest.approx(100 * sk.f1_score(gold, pred))
    # a class never predicted nor gold is not averaged (scikit-learn's labels = those present)
    gold, pred = [0, 0, 1, 1], [0, 1, 1, 1]  # class 0: F1 2/3, class 1: F1 4/5; class 2 absent
    assert compute_metrics(["macro_f1"], pred, gold)["macro_f1"] == pytest.approx(100 * (2 / 3 + 4 / 5) / 2)
    # a class present only in the predictions counts with F1 0 (CB's "neutral" never gold here)
    assert compute_metrics(["macro_f1"], [0, 2], [0, 1])["macro_f1"] == pytest.approx(100 / 3)


def test_exact_match_per_group_by_hand():
    pred = [1, 0, 1, 1, 0, 0]
    gold = [1, 0, 0, 1, 0, 1]
    groups = [7, 7, 7, 9, 4, 4]  # group 7 has a wrong row, 9 is right, 4 has a wrong row
    assert compute_metrics(["em"], pred, gold, groups=groups) == {"em": pytest.approx(100 / 3)}
    assert compute_metrics(["em"], gold, gold, groups=groups) == {"em": 100.0}
    with pytest.raises(CramkitError, match="computed per group"):
        compute_metrics(["em"], pred, gold)


def test_answer_f1_and_em_as_squad_scores_them():
    preds = ["The Eiffel Tower!", "Barack Obama", "New York", "London"]
    golds = [["Eiffel Tower"], ["Obama", "President Barack Obama"], ["York"], ["Paris", "Rome"]]
    m = compute_metrics(["answer_f1", "answer_em"], preds, golds)
    # 1: equal once normalised (article, case, punctuation); 2: best gold "President Barack Obama",
    # 2 common tokens, P 1, R 2/3 -> F1 0.8; 3: "new york" vs "york": P 1/2, R 1 -> 2/3; 4: 0
    assert m["answer_em"] == pytest.approx(25.0)
    assert m["answer_f1"] == pytest.approx(100 * (1 + 0.8 + 2 / 3 + 0) / 4)
    with pytest.raises(CramkitError, match="answer strings"):
        compute_metrics(["answer_f1"], [1, 0], [0, 1])


def test_bad_metric_calls():
    with pytest.raises(CramkitError, match="3 predictions for 2 labels"):
        compute_metrics(["accuracy"], [0, 1, 1], [0, 1])
    with pytest.raises(CramkitError, match="unknown metric 'auc'.*accuracy"):
        compute_metrics(["auc"], [0, 1], [0, 1])
    with pytest.raises(CramkitError, match="empty"):
        compute_metrics(["accuracy"], [], [])
    with pytest.raises(CramkitError, match=r"shape \(n,\) or \(n, 1\)"):
        compute_metrics(["pearson"], np.zeros((3, 2)), [0.0, 1.0, 2.0])


def _paper_results(mnli_m, mnli_mm, sst2, stsb, rte, qnli, qqp, mrpc, cola):
    """A results dict as the eval command produces it, with the extra metrics a real run has."""
    return {
        "glue/mnli:dev_matched": {"accuracy": mnli_m},
        "glue/mnli:dev_mismatched": {"accuracy": mnli_mm},
        "glue/sst2": {"accuracy": sst2},
        "glue/stsb": {"pearson": 0.0, "spearman": stsb},  # pearson must not enter the average
        "glue/rte": {"accuracy": rte},
        "glue/qnli": {"accuracy": qnli},
        "glue/qqp": {"f1": qqp, "accuracy": 0.0},
        "glue/mrpc": {"f1": mrpc, "accuracy": 0.0},
        "glue/cola": {"mcc": cola, "accuracy": 0.0},
        "glue/wnli": {"accuracy": 0.0},  # left out
        "user/reviews": {"accuracy": 0.0},  # not GLUE
    }


def test_glue_average_reproduces_the_cramming_table():
    # Cramming (Geiping & Goldstein), Table 3 columns: MNLI m/mm, SST-2, STSB, RTE, QNLI, QQP, MRPC, CoLA
    bert = _paper_results(83.2, 83.4, 91.9, 86.7, 59.2, 90.6, 87.7, 89.3, 56.5)
    crammed = _paper_results(83.9, 84.1, 92.2, 84.6, 53.8, 89.5, 87.3, 87.5, 44.5)
    assert round(glue_average(bert, require_all=True), 1) == 80.9
    assert round(glue_average(crammed, require_all=True), 1) == 78.6
    assert set(glue_scores(bert)) == {
        "mnli-m",
        "mnli-mm",
        "sst2",
        "stsb",
        "rte",
        "qnli",
        "qqp",
        "mrpc",
        "cola",
    }


def test_glue_average_key_forms_and_errors():
    short = {"mnli-m": {"accuracy": 80.0}, "mnli_mismatched": {"accuracy": 82.0}, "SST-2": {"accuracy": 90.0}}
    assert glue_average(short) == pytest.approx(84.0)
    with pytest.raises(CramkitError, match="missing: .*cola"):
        glue_average(short, require_all=True)
    with pytest.raises(CramkitError, match="dev_matched"):
        glue_average({"glue/mnli": {"accuracy": 80.0}})
    with pytest.raises(CramkitError, match="no 'mcc' value"):
        glue_average({"glue/cola": {"accuracy": 70.0}})
    with pytest.raises(CramkitError, match="none of the given results"):
        glue_average({"glue/wnli": {"accuracy": 56.3}})
