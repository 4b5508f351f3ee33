"""The scores of embedding evaluation: retrieval metrics over ranked ids, STS correlations, and the exact
search they are measured on.

The retrieval metrics follow BEIR's (pytrec_eval / trec_eval): a judgement's gain is its score (graded, not
2^score - 1), a document is relevant when its score is at least 1, discounts are log2(rank + 1), the ideal DCG is
over every judgement of the query, and recall@k and MAP@k divide by the number of relevant documents. The pure
metric functions take one query's ranked ids and its judgements; :func:`retrieval_metrics` averages them (x100)
over the queries that have a relevant document.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from cramkit.evaluation import CUTOFF


def relevant_count(relevance: Mapping[str, float]) -> int:
    """How many of the judged documents are relevant (score at least 1)."""
    return sum(1 for s in relevance.values() if s >= 1)


def dcg_at_k(ranked: Sequence[str], relevance: Mapping[str, float], k: int) -> float:
    """Discounted cumulative gain of the first ``k`` ids: sum of score / log2(rank + 1), unjudged ids 0."""
    return sum(max(float(relevance.get(d, 0.0)), 0.0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))


def ndcg_at_k(ranked: Sequence[str], relevance: Mapping[str, float], k: int) -> float:
    """nDCG@k in [0, 1] (trec_eval's ndcg_cut, as BEIR): DCG of ``ranked`` over the DCG of the judgements
    sorted best first; 0 when the query has no judgement above 0."""
    ideal = sorted((max(float(s), 0.0) for s in relevance.values()), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg_at_k(ranked, relevance, k) / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: Sequence[str], relevance: Mapping[str, float], k: int) -> float:
    """The share of the query's relevant documents (score >= 1) among the first ``k`` ids."""
    n = relevant_count(relevance)
    return sum(1 for d in ranked[:k] if relevance.get(d, 0) >= 1) / n if n else 0.0


def mrr_at_k(ranked: Sequence[str], relevance: Mapping[str, float], k: int) -> float:
    """1 / the rank of the first relevant id within the first ``k`` (0 when none is)."""
    return next((1.0 / (i + 1) for i, d in enumerate(ranked[:k]) if relevance.get(d, 0) >= 1), 0.0)


def average_precision_at_k(ranked: Sequence[str], relevance: Mapping[str, float], k: int) -> float:
    """trec_eval's map_cut: the precision at each relevant id's rank within the first ``k``, summed, over the
    number of relevant documents."""
    n = relevant_count(relevance)
    hits, total = 0, 0.0
    for i, d in enumerate(ranked[:k]):
        if relevance.get(d, 0) >= 1:
            hits += 1
            total += hits / (i + 1)
    return total / n if n else 0.0


def metric_names(k: int = CUTOFF) -> list[str]:
    """The retrieval metrics reported, main (nDCG@k) first."""
    recalls = sorted({1, k, 100})
    return [f"ndcg@{k}", *(f"recall@{r}" for r in recalls), f"mrr@{k}", "map@100"]


def retrieval_metrics(
    run: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, float]], k: int = CUTOFF
) -> dict[str, float]:
    """The means (x100) of :func:`metric_names` over the queries of ``qrels`` that have a relevant document
    (a query missing from ``run`` retrieved nothing). Empty when no query has one."""
    funcs = {"ndcg": ndcg_at_k, "recall": recall_at_k, "mrr": mrr_at_k, "map": average_precision_at_k}
    names = metric_names(k)
    sums = dict.fromkeys(names, 0.0)
    n = 0
    for qid, rel in qrels.items():
        if not relevant_count(rel):
            continue
        n += 1
        ranked = run.get(qid, ())
        for name in names:
            kind, cut = name.split("@")
            sums[name] += funcs[kind](ranked, rel, int(cut))
    return {name: 100.0 * s / n for name, s in sums.items()} if n else {}


def sts_metrics(similarity: Sequence[float] | np.ndarray, gold: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Spearman (ties ranked by their mean rank) and Pearson correlation, x100."""
    from cramkit.tasks.metrics import pearson, spearman

    return {"spearman": spearman(similarity, gold), "pearson": pearson(similarity, gold)}


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cosine similarity of each row of ``a`` with the same row of ``b``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    den = np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    return (a * b).sum(axis=1) / den


def exact_search(
    queries: np.ndarray, corpus: np.ndarray, depth: int, *, corpus_block: int = 65536, query_block: int = 256
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, row ids) [n_queries, depth]: the ``depth`` corpus rows of highest inner product per query,
    best first (equal scores: the earlier row first). Blocks of queries x corpus rows keep memory at
    query_block x corpus_block floats whatever the corpus size (``corpus`` may be a memory map)."""
    n = len(corpus)
    depth = min(int(depth), n)
    nq = len(queries)
    out_s = np.zeros((nq, depth), dtype=np.float32)
    out_i = np.zeros((nq, depth), dtype=np.int64)
    if depth == 0:
        return out_s, out_i
    for q0 in range(0, nq, query_block):
        q = np.ascontiguousarray(queries[q0 : q0 + query_block], dtype=np.float32)
        top_s = np.zeros((len(q), 0), dtype=np.float32)
        top_i = np.zeros((len(q), 0), dtype=np.int64)
        for c0 in range(0, n, corpus_block):
            c = np.ascontiguousarray(corpus[c0 : c0 + corpus_block], dtype=np.float32)
            s = q @ c.T
            kk = min(depth, s.shape[1])
            part = (
                np.argpartition(-s, kk - 1, axis=1)[:, :kk] if kk < s.shape[1] else np.tile(np.arange(kk), (len(q), 1))
            )
            cand_s = np.concatenate([top_s, np.take_along_axis(s, part, axis=1)], axis=1)
            cand_i = np.concatenate([top_i, part + c0], axis=1)
            if cand_s.shape[1] > depth:
                keep = np.argpartition(-cand_s, depth - 1, axis=1)[:, :depth]
                cand_s = np.take_along_axis(cand_s, keep, axis=1)
                cand_i = np.take_along_axis(cand_i, keep, axis=1)
            top_s, top_i = cand_s, cand_i
        order = np.lexsort((top_i, -top_s), axis=-1)
        out_s[q0 : q0 + len(q)] = np.take_along_axis(top_s, order, axis=1)
        out_i[q0 : q0 + len(q)] = np.take_along_axis(top_i, order, axis=1)
    return out_s, out_i
