"""Task metrics (numpy only) and the GLUE average as the Cramming paper computes it.

Besides GLUE's: macro-F1 (SuperGLUE's CB), F1a and per-question exact match (MultiRC) and SQuAD-style
answer F1 / EM over answer strings (ReCoRD).

All metric values are on GLUE's 0..100 scale (accuracy 92.3, not 0.923), the way GLUE tables and the
Cramming and BERT papers report them. A correlation that is undefined (one side constant) counts as 0,
the convention scikit-learn uses for the Matthews correlation.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from cramkit.errors import CramkitError

METRICS = ("accuracy", "f1", "mcc", "pearson", "spearman", "macro_f1", "f1a", "em", "answer_f1", "answer_em")


def _as_class_ids(predictions) -> np.ndarray:
    """Label ids from ids (n,) or from logits / probabilities (n, num_labels) by argmax."""
    p = np.asarray(predictions)
    if p.ndim == 2:
        return p.argmax(axis=-1)
    return p.reshape(-1)


def _as_scores(predictions) -> np.ndarray:
    p = np.asarray(predictions, dtype=np.float64)
    if p.ndim == 2 and p.shape[1] == 1:
        p = p[:, 0]
    if p.ndim != 1:
        raise CramkitError(
            f"regression predictions must have shape (n,) or (n, 1), got {p.shape}; "
            "use a head with one output for a regression task"
        )
    return p


def accuracy(predictions, labels) -> float:
    p, y = _as_class_ids(predictions), np.asarray(labels).reshape(-1)
    return float((p == y).mean() * 100.0)


def f1_binary(predictions, labels) -> float:
    """F1 of the positive class (label id 1), as GLUE scores MRPC and QQP."""
    p, y = _as_class_ids(predictions), np.asarray(labels).reshape(-1)
    tp = np.sum((p == 1) & (y == 1))
    fp = np.sum((p == 1) & (y != 1))
    fn = np.sum((p != 1) & (y == 1))
    denom = 2 * tp + fp + fn
    return float(200.0 * tp / denom) if denom else 0.0


def matthews_corrcoef(predictions, labels) -> float:
    """Matthews correlation (multi-class form of Gorodkin 2004; the binary formula for two classes)."""
    p, y = _as_class_ids(predictions), np.asarray(labels).reshape(-1)
    classes, inv = np.unique(np.concatenate([y, p]), return_inverse=True)
    k = len(classes)
    yi, pi = inv[: len(y)], inv[len(y) :]
    cm = np.zeros((k, k), dtype=np.float64)
    np.add.at(cm, (yi, pi), 1.0)
    t, pk = cm.sum(axis=1), cm.sum(axis=0)  # true and predicted counts per class
    c, s = np.trace(cm), cm.sum()
    cov_yp = c * s - t @ pk
    cov_pp = s * s - pk @ pk
    cov_yy = s * s - t @ t
    denom = np.sqrt(cov_pp * cov_yy)
    return float(100.0 * cov_yp / denom) if denom else 0.0


def pearson(predictions, labels) -> float:
    x, y = _as_scores(predictions), np.asarray(labels, dtype=np.float64).reshape(-1)
    x, y = x - x.mean(), y - y.mean()
    denom = np.sqrt((x * x).sum() * (y * y).sum())
    return float(100.0 * (x * y).sum() / denom) if denom else 0.0


def rankdata(a) -> np.ndarray:
    """Ranks 1..n with ties given the mean of their ranks (scipy.stats.rankdata's 'average')."""
    a = np.asarray(a).reshape(-1)
    _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # rank of the last member of each tie group
    return (ends - (counts - 1) / 2.0)[inv.reshape(-1)]


def spearman(predictions, labels) -> float:
    return pearson(rankdata(_as_scores(predictions)), rankdata(labels))


def macro_f1(predictions, labels) -> float:
    """The unweighted mean of each class's F1 over the classes that occur in the labels or predictions
    (scikit-learn's ``f1_score(average="macro")``, as SuperGLUE scores CB)."""
    p, y = _as_class_ids(predictions), np.asarray(labels).reshape(-1)
    scores = []
    for k in np.unique(np.concatenate([y, p])):
        tp = np.sum((p == k) & (y == k))
        denom = 2 * tp + np.sum((p == k) & (y != k)) + np.sum((p != k) & (y == k))
        scores.append(2 * tp / denom)
    return float(100.0 * np.mean(scores))


def exact_match_groups(predictions, labels, groups) -> float:
    """Per-group exact match: the share of groups (MultiRC's questions) whose every row is right."""
    p, y = _as_class_ids(predictions), np.asarray(labels).reshape(-1)
    g = np.asarray(groups).reshape(-1)
    if len(g) != len(y):
        raise CramkitError(f"got {len(g)} groups for {len(y)} labels; they must be equal in number")
    ids, inv = np.unique(g, return_inverse=True)
    wrong = np.zeros(len(ids), dtype=bool)
    np.logical_or.at(wrong, inv.reshape(-1), p != y)
    return float(100.0 * np.mean(~wrong))


_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles (a/an/the), single spaces."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _token_f1(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def _answers(predictions, golds) -> list[tuple[str, list[str]]]:
    rows = list(zip(predictions, golds, strict=True))
    for pred, gold in rows:
        if not isinstance(pred, str) or not isinstance(gold, list | tuple) or not all(isinstance(a, str) for a in gold):
            raise CramkitError(
                "answer_f1 / answer_em score answer strings: predictions are strings and labels lists of "
                "gold answer strings"
            )
    return rows


def answer_f1(predictions, golds) -> float:
    """ReCoRD's (SQuAD's) F1: token overlap of the normalised answer with the best-matching gold, averaged."""
    return float(
        100.0 * np.mean([max((_token_f1(p, a) for a in g), default=0.0) for p, g in _answers(predictions, golds)])
    )


def answer_em(predictions, golds) -> float:
    """ReCoRD's (SQuAD's) exact match: the normalised answer equals one normalised gold, averaged."""
    rows = _answers(predictions, golds)
    return float(100.0 * np.mean([any(normalize_answer(p) == normalize_answer(a) for a in g) for p, g in rows]))


GROUPED: set[str] = {"em"}  # metrics called as f(predictions, labels, groups)

_FUNCS: dict[str, Callable[..., float]] = {
    "accuracy": accuracy,
    "f1": f1_binary,
    "mcc": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
    "macro_f1": macro_f1,
    "f1a": f1_binary,  # MultiRC's F1 over all answer options: F1 of the "true" class
    "em": exact_match_groups,
    "answer_f1": answer_f1,
    "answer_em": answer_em,
}


def compute_metrics(names: Sequence[str], predictions, labels, groups=None) -> dict[str, float]:
    """Compute the named metrics (each 0..100) of predictions against labels.

    predictions: label ids (n,) or logits (n, num_labels) for accuracy / f1 / mcc; scores (n,) or (n, 1)
    for pearson / spearman; answer strings for answer_f1 / answer_em, whose labels are lists of gold
    strings. labels: label ids or gold scores (n,). groups: a group id per row, for the metrics in
    ``GROUPED`` (scored per group, e.g. MultiRC's exact match over one question's answers).
    """
    n_pred, n_lab = len(predictions), len(labels)
    if n_pred != n_lab:
        raise CramkitError(f"got {n_pred} predictions for {n_lab} labels; they must be equal in number")
    if n_lab == 0:
        raise CramkitError("no examples to score: the prediction and label lists are empty")
    out = {}
    for name in names:
        if name not in _FUNCS:
            raise CramkitError(f"unknown metric '{name}'; known metrics: {', '.join(METRICS)}")
        if name in GROUPED:
            if groups is None:
                raise CramkitError(f"metric '{name}' is computed per group, and these rows have no groups")
            out[name] = _FUNCS[name](predictions, labels, groups)
        else:
            out[name] = _FUNCS[name](predictions, labels)
    return out


# ---------------------------------------------------------------------------------------------------
# The GLUE average (Cramming's convention)

#: The nine numbers averaged, with the metric taken from each; WNLI is left out.
GLUE_AVERAGE_ENTRIES: dict[str, str] = {
    "mnli-m": "accuracy",
    "mnli-mm": "accuracy",
    "sst2": "accuracy",
    "stsb": "spearman",
    "rte": "accuracy",
    "qnli": "accuracy",
    "qqp": "f1",
    "mrpc": "f1",
    "cola": "mcc",
}

_ALIASES = {
    "mnli:dev_matched": "mnli-m",
    "mnli-m": "mnli-m",
    "mnli_matched": "mnli-m",
    "mnli-matched": "mnli-m",
    "mnli:dev_mismatched": "mnli-mm",
    "mnli-mm": "mnli-mm",
    "mnli_mismatched": "mnli-mm",
    "mnli-mismatched": "mnli-mm",
    "sst-2": "sst2",
    "sts-b": "stsb",
}


def _glue_entry(key: str) -> str | None:
    """'glue/mnli:dev_matched', 'mnli-m', 'glue/cola', 'CoLA:dev', 'SST-2' -> the entry name, or None."""
    k = key.lower().removeprefix("glue/")
    if k in _ALIASES:
        return _ALIASES[k]
    base, _, split = k.partition(":")
    base = _ALIASES.get(base, base)
    if base == "mnli":
        return _ALIASES.get(f"mnli:{split}") if split else None
    if base == "wnli" or base in GLUE_AVERAGE_ENTRIES:
        return base
    return None


def glue_scores(task_scores: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The per-entry numbers that enter the GLUE average (see :func:`glue_average`), WNLI excluded."""
    out: dict[str, float] = {}
    for key, values in task_scores.items():
        entry = _glue_entry(key)
        if entry is None:
            if key.lower().removeprefix("glue/").split(":")[0] == "mnli":
                raise CramkitError(
                    f"GLUE average: '{key}' does not say which MNLI dev set; "
                    "give 'glue/mnli:dev_matched' and 'glue/mnli:dev_mismatched' separately"
                )
            continue  # not a GLUE task (a user task in the same results): not averaged
        if entry == "wnli":
            continue
        metric = GLUE_AVERAGE_ENTRIES[entry]
        if metric not in values:
            raise CramkitError(
                f"GLUE average: '{key}' has no '{metric}' value (it has {', '.join(values) or 'none'}); "
                f"the GLUE average takes {metric} for {entry}"
            )
        out[entry] = float(values[metric])
    return out


def glue_average(task_scores: Mapping[str, Mapping[str, float]], *, require_all: bool = False) -> float:
    """The GLUE score as the Cramming paper (Geiping & Goldstein 2023, Table 3) computes it.

    The plain mean of nine numbers, one per column of the paper's table: MNLI matched accuracy, MNLI
    mismatched accuracy (two separate entries), SST-2 accuracy, STS-B Spearman, RTE accuracy, QNLI
    accuracy, QQP F1, MRPC F1 and CoLA Matthews correlation. WNLI is left out, as in BERT (Devlin et al.
    2019, Table 1, whose note gives the same metric per task). This rule reproduces the published
    averages from the published columns: BERT-base 80.9 and crammed BERT 78.6.

    task_scores maps "TASK" or "TASK:SPLIT" (e.g. "glue/cola", "glue/mnli:dev_matched", "mnli-mm",
    "sst2") to that task's metric values (0..100, as :func:`compute_metrics` returns them). Keys that are
    not GLUE tasks are ignored. With some entries absent the mean is over those present, unless
    require_all, which makes an absent entry an error.
    """
    scores = glue_scores(task_scores)
    missing = [e for e in GLUE_AVERAGE_ENTRIES if e not in scores]
    if require_all and missing:
        raise CramkitError(f"GLUE average needs all nine entries; missing: {', '.join(missing)}")
    if not scores:
        raise CramkitError("GLUE average: none of the given results is a GLUE task (other than WNLI)")
    return float(np.mean(list(scores.values())))
