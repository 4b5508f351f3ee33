"""How good are a model's sentence embeddings: STS (the correlation of cosine similarity with gold scores) and
retrieval over a folder in BEIR's layout (nDCG@10, recall, MRR, MAP), by exact search or through an index.

Every number is x100 (a correlation of 0.8 is 80.0; an nDCG of 0.5 is 50.0). The metrics follow BEIR's
(pytrec_eval / trec_eval): a judgement's gain is its score (graded, not 2^score - 1), a document is relevant
when its score is at least 1, discounts are log2(rank + 1), the ideal DCG is over every judgement of the query,
recall@k and MAP@k divide by the number of relevant documents, and a hit whose id equals the query's id is left
out (BEIR's ``ignore_identical_ids``). Queries without a relevant document are left out of the means (counted).

The pure metric functions take one query's ranked ids and its judgements; :func:`retrieval_metrics` averages
them over a run. :func:`evaluate_sts` and :func:`evaluate_retrieval` read the data, embed with the model's own
pooling (any model ``cramkit.load`` opens, through :class:`cramkit.infer.Engine`), score, and write
``results.json`` (last: its presence means the evaluation finished), ``results.md`` and ``scores.png``.
"""

from __future__ import annotations

import math
import os
import time
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cramkit.errors import CramkitError

if TYPE_CHECKING:
    from cramkit.infer.engine import Engine

SCALE = "x100"
EMBED_BLOCK = 2048  # texts per Engine.embed call (progress between them)
SHOW = 5  # bad rows / unknown ids named in an error


# ------------------------------------------------------------------------------------------------ metrics


def _relevant(relevance: Mapping[str, float]) -> int:
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
    n = _relevant(relevance)
    return sum(1 for d in ranked[:k] if relevance.get(d, 0) >= 1) / n if n else 0.0


def mrr_at_k(ranked: Sequence[str], relevance: Mapping[str, float], k: int) -> float:
    """1 / the rank of the first relevant id within the first ``k`` (0 when none is)."""
    return next((1.0 / (i + 1) for i, d in enumerate(ranked[:k]) if relevance.get(d, 0) >= 1), 0.0)


def average_precision_at_k(ranked: Sequence[str], relevance: Mapping[str, float], k: int) -> float:
    """trec_eval's map_cut: the precision at each relevant id's rank within the first ``k``, summed, over the
    number of relevant documents."""
    n = _relevant(relevance)
    hits, total = 0, 0.0
    for i, d in enumerate(ranked[:k]):
        if relevance.get(d, 0) >= 1:
            hits += 1
            total += hits / (i + 1)
    return total / n if n else 0.0


def metric_names(k: int = 10) -> list[str]:
    """The retrieval metrics reported, main (nDCG@k) first."""
    recalls = sorted({1, k, 100})
    return [f"ndcg@{k}", *(f"recall@{r}" for r in recalls), f"mrr@{k}", "map@100"]


def retrieval_metrics(
    run: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, float]], k: int = 10
) -> dict[str, float]:
    """The means (x100) of :func:`metric_names` over the queries of ``qrels`` that have a relevant document
    (a query missing from ``run`` retrieved nothing). Empty when no query has one."""
    funcs = {"ndcg": ndcg_at_k, "recall": recall_at_k, "mrr": mrr_at_k, "map": average_precision_at_k}
    names = metric_names(k)
    sums = dict.fromkeys(names, 0.0)
    n = 0
    for qid, rel in qrels.items():
        if not _relevant(rel):
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


# --------------------------------------------------------------------------------------------- reading


class _BadRows:
    """Malformed rows of one file: refused (one error naming the first few) unless ``skip`` (counted)."""

    def __init__(self, path: Path, skip: bool) -> None:
        self.path, self.skip = path, skip
        self.rows: list[tuple[int, str]] = []

    def add(self, lineno: int, problem: str) -> None:
        self.rows.append((lineno, problem))

    def check(self) -> int:
        if self.rows and not self.skip:
            lineno, problem = self.rows[0]
            more = f" (and {len(self.rows) - 1} more bad rows)" if len(self.rows) > 1 else ""
            raise CramkitError(
                f"{self.path} line {lineno}: {problem}{more}; fix the file, or pass --skip-bad-rows to skip "
                "(and count) such rows"
            )
        return len(self.rows)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        x = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


@dataclass
class StsData:
    """Sentence pairs with their gold similarity."""

    path: Path
    texts_a: list[str]
    texts_b: list[str]
    scores: list[float]
    columns: tuple[str, str, str]
    skipped: int = 0


STS_LABELS = ("score", "label", "similarity", "relatedness_score", "gold")


def read_sts(
    path: str | os.PathLike,
    *,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str | None = None,
    skip_bad_rows: bool = False,
) -> StsData:
    """The pairs of a TSV (GLUE's STS-B: sentence1, sentence2, score), CSV or JSON Lines file, by its columns
    (default sentence1, sentence2, score; else the usual names); a row with an empty text or a score that is
    not a number is refused, or skipped and counted with ``skip_bad_rows``."""
    from cramkit.text.tables import PAIR_COLUMNS, TEXT_COLUMNS, records, table_format

    path = Path(path)
    if not path.is_file():
        raise CramkitError(
            f"--data {path}: no such file; give a TSV, CSV or JSON Lines file of sentence pairs with a gold score "
            "(GLUE STS-B's dev.tsv: columns sentence1, sentence2, score)"
        )
    fmt = table_format(path, None)
    bad = _BadRows(path, skip_bad_rows)
    cols: tuple[str, str, str] | None = None
    a_texts: list[str] = []
    b_texts: list[str] = []
    scores: list[float] = []
    for lineno, rec, problem in records(path, fmt, None):
        if rec is None:
            bad.add(lineno, problem)
            continue
        if cols is None:
            names = list(rec.get("__header__", rec)) if "__header__" in rec else list(rec)
            cols = _sts_columns(path, names, text_a, text_b, label, TEXT_COLUMNS, PAIR_COLUMNS)
            if "__header__" in rec:
                continue
        ca, cb, cl = cols
        missing = [c for c in cols if c not in rec]
        if missing:
            bad.add(lineno, f"no field {missing[0]!r}")
            continue
        a, b, score = rec[ca], rec[cb], _number(rec[cl])
        if not isinstance(a, str) or not isinstance(b, str) or not a.strip() or not b.strip():
            bad.add(lineno, f"{ca!r} or {cb!r} is empty or not text")
            continue
        if score is None:
            bad.add(lineno, f"the score ({cl!r}) {str(rec[cl])[:40]!r} is not a number")
            continue
        a_texts.append(a)
        b_texts.append(b)
        scores.append(score)
    if cols is None:
        raise CramkitError(
            f"{path} is empty; it needs a header row naming the columns (sentence1, sentence2, score), then rows"
        )
    skipped = bad.check()
    if len(scores) < 2:
        raise CramkitError(f"{path}: {len(scores)} scored pair(s); a correlation needs at least 2")
    if len(set(scores)) < 2:
        raise CramkitError(
            f"{path}: every gold score is {scores[0]:g}, so no correlation can be measured; check the "
            f"--label column ({cols[2]})"
        )
    return StsData(path, a_texts, b_texts, scores, cols, skipped)


def _sts_columns(
    path: Path,
    names: list[str],
    text_a: str | None,
    text_b: str | None,
    label: str | None,
    text_cols: Sequence[str],
    pair_cols: Sequence[str],
) -> tuple[str, str, str]:
    a = text_a or ("sentence1" if "sentence1" in names else next((c for c in text_cols if c in names), None))
    b = text_b or ("sentence2" if "sentence2" in names else next((c for c in pair_cols if c in names), None))
    lab = label or next((c for c in STS_LABELS if c in names), None)
    for value, flag, what in ((a, "--text-a", "first text"), (b, "--text-b", "second text"), (lab, "--label", "score")):
        if value is None or value not in names:
            found = ", ".join(names[:12]) or "none"
            given = f"no column {value!r}" if value else f"no column for the {what}"
            raise CramkitError(f"{path}: {given} (columns: {found}); name it with {flag} COLUMN")
    assert a is not None and b is not None and lab is not None
    return a, b, lab


@dataclass
class BeirData:
    """A folder in BEIR's layout, read: the corpus, the queries that have judgements, the judgements."""

    root: Path
    split: str
    corpus_ids: list[str]
    corpus_texts: list[str]  # title + " " + text when the row has a title (stripped), as BEIR embeds them
    corpus_text_only: list[str]  # the "text" field alone (what `cramkit index build corpus.jsonl` indexes)
    query_ids: list[str]
    query_texts: list[str]
    qrels: dict[str, dict[str, float]]
    skipped: dict[str, int] = field(default_factory=dict)


def _jsonl(path: Path, what: str, skip: bool, fields: Sequence[str]) -> tuple[list[tuple[int, dict]], int]:
    from cramkit.text.tables import records

    if not path.is_file():
        raise CramkitError(
            f"{path} is missing; a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/SPLIT.tsv (e.g. "
            "python bench/make_beir.py --glue-dir GLUE --out DIR makes one from MRPC)"
        )
    bad = _BadRows(path, skip)
    rows: list[tuple[int, dict]] = []
    seen: set[str] = set()
    for lineno, rec, problem in records(path, "jsonl", None):
        if rec is None:
            bad.add(lineno, problem)
            continue
        missing = next((f for f in fields if f not in rec), None)
        if missing is not None:
            bad.add(lineno, f"no field {missing!r} (has: {', '.join(map(str, rec))[:80]})")
            continue
        rid = rec["_id"]
        if not isinstance(rid, (str, int)) or isinstance(rid, bool) or str(rid) == "":
            bad.add(lineno, f"'_id' {str(rid)[:40]!r} is not a string or integer")
            continue
        bad_text = next((f for f in ("text", "title") if f in rec and not isinstance(rec[f], (str, type(None)))), None)
        if bad_text is not None:
            bad.add(lineno, f"field {bad_text!r} is a {type(rec[bad_text]).__name__}, not text")
            continue
        rid = str(rid)
        if rid in seen:
            bad.add(lineno, f"'_id' {rid!r} again (ids must be unique)")
            continue
        seen.add(rid)
        rows.append((lineno, {**rec, "_id": rid}))
    skipped = bad.check()
    if not rows:
        raise CramkitError(
            f"{path} holds no {what} (an empty file, or every row skipped); each line is one JSON object "
            '{"_id": ..., "text": ...}'
        )
    return rows, skipped


def _read_qrels(path: Path, skip: bool) -> tuple[list[tuple[int, str, str, float]], int]:
    from cramkit.text.tables import read_tsv_lines

    bad = _BadRows(path, skip)
    rows: list[tuple[int, str, str, float]] = []
    try:
        lines = list(read_tsv_lines(path))
    except UnicodeDecodeError:
        raise CramkitError(f"{path} is not valid UTF-8; convert it (iconv -t utf-8)") from None
    for i, (lineno, parts) in enumerate(lines):
        if i == 0 and (len(parts) < 3 or _number(parts[2]) is None):
            continue  # the header (query-id, corpus-id, score)
        if len(parts) != 3:
            bad.add(lineno, f"expected 3 tab-separated fields (query-id, corpus-id, score), found {len(parts)}")
            continue
        score = _number(parts[2])
        if score is None:
            bad.add(lineno, f"the score {parts[2][:40]!r} is not a number")
            continue
        rows.append((lineno, parts[0].strip(), parts[1].strip(), score))
    skipped = bad.check()
    if not rows:
        raise CramkitError(
            f"{path} holds no judgements; after the header 'query-id<TAB>corpus-id<TAB>score', one row per "
            "relevant document"
        )
    return rows, skipped


def read_beir(folder: str | os.PathLike, split: str = "test", *, skip_bad_rows: bool = False) -> BeirData:
    """``folder/corpus.jsonl``, ``queries.jsonl`` and ``qrels/SPLIT.tsv``. Judgements naming an unknown query
    or document are refused (one error with their count and the first ids), or left out and counted with
    ``skip_bad_rows``, as are malformed rows."""
    root = Path(folder)
    if not root.is_dir():
        raise CramkitError(
            f"--data {root}: no such directory; give a folder in BEIR's layout (corpus.jsonl, queries.jsonl, "
            "qrels/SPLIT.tsv)"
        )
    qrels_file = root / "qrels" / f"{split}.tsv"
    if not qrels_file.is_file():
        have = sorted(p.stem for p in (root / "qrels").glob("*.tsv")) if (root / "qrels").is_dir() else []
        hint = f"; this folder has --split {', '.join(have)}" if have else " (qrels/ holds no .tsv file)"
        raise CramkitError(f"{qrels_file} is missing{hint}")
    corpus_rows, c_skip = _jsonl(root / "corpus.jsonl", "documents", skip_bad_rows, ("_id", "text"))
    query_rows, q_skip = _jsonl(root / "queries.jsonl", "queries", skip_bad_rows, ("_id", "text"))
    judged, r_skip = _read_qrels(qrels_file, skip_bad_rows)

    corpus_ids = [r["_id"] for _, r in corpus_rows]
    known_docs = set(corpus_ids)
    queries = {r["_id"]: r["text"] or "" for _, r in query_rows}
    unknown_q = [q for _, q, _, _ in judged if q not in queries]
    unknown_d = [d for _, _, d, _ in judged if d not in known_docs]
    for ids, what, file in ((unknown_q, "query", "queries.jsonl"), (unknown_d, "corpus", "corpus.jsonl")):
        if ids and not skip_bad_rows:
            first = ", ".join(list(dict.fromkeys(ids))[:SHOW])
            raise CramkitError(
                f"{qrels_file}: {len(ids)} row(s) name a {what} id that is not in {root / file} (first: {first}); "
                "fix the ids, or pass --skip-bad-rows to leave those judgements out (counted)"
            )
    qrels: dict[str, dict[str, float]] = {}
    dropped = 0
    for _, q, d, s in judged:
        if q not in queries or d not in known_docs:
            dropped += 1
            continue
        qrels.setdefault(q, {})[d] = s
    if not qrels:
        raise CramkitError(f"{qrels_file}: no judgement names a known query and document; check the ids")
    texts = []
    text_only = []
    for _, r in corpus_rows:
        body = r["text"] or ""
        text_only.append(body)
        texts.append((str(r["title"] or "") + " " + body).strip() if "title" in r else body.strip())
    query_ids = list(qrels)
    return BeirData(
        root=root,
        split=split,
        corpus_ids=corpus_ids,
        corpus_texts=texts,
        corpus_text_only=text_only,
        query_ids=query_ids,
        query_texts=[queries[q] for q in query_ids],
        qrels=qrels,
        skipped={
            k: v
            for k, v in (
                ("corpus.jsonl rows", c_skip),
                ("queries.jsonl rows", q_skip),
                (f"qrels/{split}.tsv rows", r_skip),
                (f"qrels/{split}.tsv judgements of unknown ids", dropped),
            )
            if v
        },
    )


# --------------------------------------------------------------------------------------------- embedding


def open_engine(model: Any, device: str = "auto", max_batch_tokens: int | None = None) -> Engine:
    """An :class:`~cramkit.infer.Engine` over ``model`` that can embed (else one error naming the model)."""
    from cramkit.infer import Engine

    engine = Engine(model, device=device, max_batch_tokens=max_batch_tokens)
    if not engine.can_embed:
        arch = getattr(engine.loaded, "architecture", None) or engine.kind
        raise CramkitError(
            f"{engine.source}: this model ({arch}) has no transformer encoder to take sentence embeddings from "
            "(a distilled BiLSTM student or a deep-prompt export gives labels only); evaluate an encoder: a "
            "pretraining run, a fine-tuned model or hf:DIR"
        )
    return engine


def embed_texts(
    engine: Engine,
    texts: Sequence[str],
    *,
    pooling: str | None = None,
    normalize: bool | None = True,
    progress: bool = True,
    desc: str = "embedding",
    dimensions: int | None = None,
    prompt: str | None = None,
) -> tuple[np.ndarray, int]:
    """(embeddings [n, dim] float32, how many texts were cut to the model's limit), ``EMBED_BLOCK`` texts per
    call, with the model's pooling unless ``pooling`` is given; ``prompt``: a text put before each (None: the
    model's default prompt, if any)."""
    from cramkit.embed.progress import ProgressBar

    n = len(texts)
    out: np.ndarray | None = None
    truncated = 0
    bar = ProgressBar("auto" if progress else False, desc, n, 0)
    t0 = time.perf_counter()
    try:
        for a in range(0, n, EMBED_BLOCK):
            vec = engine.embed(
                list(texts[a : a + EMBED_BLOCK]),
                pooling=pooling,
                normalize=normalize,
                dimensions=dimensions,
                prompt=prompt,
            )
            if out is None:
                out = np.zeros((n, vec.shape[1]), dtype=np.float32)
            out[a : a + len(vec)] = vec
            truncated += int(np.asarray(engine.truncated).sum())
            bar.update(min(a + EMBED_BLOCK, n), min(a + EMBED_BLOCK, n), time.perf_counter() - t0)
    finally:
        bar.close()
    if out is None:
        out = np.zeros((0, int(dimensions or engine.hidden_size or 0)), dtype=np.float32)
    return out, truncated


def _model_info(engine: Engine) -> dict[str, Any]:
    return {
        "source": engine.source,
        "kind": engine.kind,
        "backend": engine.backend,
        "pooling": engine.pooling,
        "normalize": engine.normalize,
        "max_length": engine.max_length,
        "hidden_size": engine.hidden_size,
    }


# ------------------------------------------------------------------------------------------------ output


def _check_out(out: Path, evaluation: str, inputs: Sequence[Any]) -> None:
    """``out`` may be written: the rule of every cramkit output; a results.json there must be this kind's."""
    from cramkit.io import check_out, read_json_object

    check_out(out, inputs=[i for i in inputs if i is not None], own=("results.json",))
    before = read_json_object(out / "results.json", "choose another --out") if (out / "results.json").is_file() else {}
    if before and before.get("evaluation") != evaluation:
        raise CramkitError(
            f"--out {out} holds the results of another evaluation ({out / 'results.json'}); choose another --out"
        )


def _write_outputs(out: Path, results: dict[str, Any], markdown: str, bars: dict[str, dict[str, float]], title: str):
    from cramkit.io import disk_errors, write_json_atomic, write_text_atomic

    with disk_errors(out):
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").unlink(missing_ok=True)  # written last: never an old one beside new files
        write_text_atomic(out / "results.md", markdown)
        _write_chart(out / "scores.png", bars, title)
        write_json_atomic(out / "results.json", results)


def _write_chart(path: Path, bars: dict[str, dict[str, float]], title: str) -> None:
    """A bar per metric (a group of bars per metric when ``bars`` has several series), x100."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(bars)
    names = list(next(iter(bars.values())))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.0 * len(names) * max(1, len(series) * 0.7) + 1.5), 3.6))
    colors = ["#4c72b0", "#dd8452", "#55a868"]
    for j, name in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(names))]
        values = [bars[name].get(m, float("nan")) for m in names]
        drawn = ax.bar(xs, values, width=width, color=colors[j % len(colors)], label=name)
        for bar, v in zip(drawn, values, strict=True):
            ax.annotate(
                f"{v:.1f}", (bar.get_x() + bar.get_width() / 2, max(v, 0)), ha="center", va="bottom", fontsize=8
            )
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_ylabel("score (x100)")
    low = min((v for b in bars.values() for v in b.values()), default=0.0)
    ax.set_ylim(min(0.0, low - 5), 108)
    if len(series) > 1:
        ax.legend(fontsize=8)
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


def _short(source: Any) -> str:
    s = str(source)
    return s if len(s) <= 48 else "..." + s[-45:]


# --------------------------------------------------------------------------------------------------- STS


def _check_model(model: Any) -> None:
    """A model given by its path or hub id that cannot be had: one line, before any data is read."""
    if isinstance(model, (str, os.PathLike)):
        from cramkit.load import check_source

        check_source(str(model))


def evaluate_sts(
    model: Any,
    data: str | os.PathLike,
    out: str | os.PathLike | None = "eval-sts",
    *,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str | None = None,
    skip_bad_rows: bool = False,
    device: str = "auto",
    max_batch_tokens: int | None = None,
    progress: bool = True,
    dimensions: int | None = None,
) -> dict[str, Any]:
    """Spearman (main) and Pearson correlation, x100, of the cosine similarity of each pair's embeddings with
    its gold score; results written to ``out`` (None: nothing written). ``dimensions``: the vectors cut to
    that many leading dimensions (a Matryoshka model's). Returns the results."""
    _check_model(model)
    t0 = time.perf_counter()
    out_dir = Path(out) if out is not None else None
    if out_dir is not None:
        _check_out(out_dir, "sts", [model, data])
    pairs = read_sts(data, text_a=text_a, text_b=text_b, label=label, skip_bad_rows=skip_bad_rows)
    engine = open_engine(model, device, max_batch_tokens)
    dimensions = engine.check_dimensions(dimensions)
    t1 = time.perf_counter()
    # each distinct text once (STS files repeat sentences)
    unique = list(dict.fromkeys([*pairs.texts_a, *pairs.texts_b]))
    where = {t: i for i, t in enumerate(unique)}
    vec, truncated = embed_texts(engine, unique, progress=progress, desc="embedding sentences", dimensions=dimensions)
    embed_seconds = time.perf_counter() - t1
    ia = np.fromiter((where[t] for t in pairs.texts_a), dtype=np.int64, count=len(pairs.texts_a))
    ib = np.fromiter((where[t] for t in pairs.texts_b), dtype=np.int64, count=len(pairs.texts_b))
    sims = cosine_rows(vec[ia], vec[ib])
    metrics = sts_metrics(sims, pairs.scores)
    results: dict[str, Any] = {
        "evaluation": "sts",
        "scale": f"{SCALE}: correlations times 100 (Spearman 85.0 = rho 0.85)",
        "main_metric": "spearman",
        "score": metrics["spearman"],
        "metrics": metrics,
        "similarity": "cosine of the two texts' embeddings (the model's own pooling)",
        "model": _model_info(engine),
        "dimensions": dimensions or engine.hidden_size,
        "data": str(pairs.path),
        "columns": dict(zip(("text_a", "text_b", "label"), pairs.columns, strict=True)),
        "counts": {"pairs": len(pairs.scores), "texts_embedded": len(unique), "truncated_texts": truncated},
        "skipped_rows": pairs.skipped,
        "seconds": {"embed": round(embed_seconds, 3), "total": round(time.perf_counter() - t0, 3)},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if out_dir is not None:
        md = [
            f"# STS: {engine.source}",
            "",
            f"data: {pairs.path} ({len(pairs.scores)} pairs; columns {', '.join(pairs.columns)})"
            + (f"; {pairs.skipped} bad rows skipped" if pairs.skipped else ""),
            "",
            "| metric (x100) | value |",
            "|---|---:|",
            *(f"| {m} | {v:.2f} |" for m, v in metrics.items()),
            "",
            "Correlation of the cosine similarity of the two texts' embeddings with the gold score, times 100; "
            "Spearman (rank correlation) is the main figure.",
            "",
        ]
        _write_outputs(out_dir, results, "\n".join(md), {"cosine": metrics}, f"STS (x100): {_short(engine.source)}")
        results["out"] = str(out_dir)
    return results


# --------------------------------------------------------------------------------------------- retrieval


def _ranked_docs(ids: np.ndarray, doc_of: Sequence[str] | np.ndarray, query_id: str, depth: int) -> list[str]:
    """Corpus ids of one query's hits (row ids ``ids``, -1 none), each document once (its best chunk), the
    query's own id left out, cut to ``depth``."""
    seen: dict[str, None] = {}
    for i in ids.tolist():
        if i < 0:
            continue
        d = doc_of[i]
        if d == query_id or d in seen:
            continue
        seen[d] = None
        if len(seen) == depth:
            break
    return list(seen)


def _index_documents(idx: Any, data: BeirData) -> tuple[np.ndarray, str]:
    """The corpus id of each chunk of ``idx`` (an index built from ``data``'s corpus.jsonl: its documents are the
    corpus rows with text, in order, each one's first chunk the start of its text), and which text was indexed
    ("text" or "title + text"); one error when the index holds other documents."""
    from cramkit.text.sources import MAX_DOC_CHARS

    table = np.asarray(idx.chunks.table[:, 0])
    docs, first = np.unique(table, return_index=True)
    forms = {
        "text": [unicodedata.normalize("NFC", t.strip()) for t in data.corpus_text_only],
        "title + text": [unicodedata.normalize("NFC", t) for t in data.corpus_texts],
    }
    fix = (
        f"evaluate it with the folder it was built from, or build one from this folder: cramkit index build "
        f"{data.root / 'corpus.jsonl'} --encoder MODEL --out IDX"
    )
    for form, texts in forms.items():
        row_of = np.full(int(docs.max()) + 1 if len(docs) else 0, -1, dtype=np.int64)
        j = -1
        ok = True
        for d, c in zip(docs.tolist(), first.tolist(), strict=True):
            start = idx.chunks.text(c)
            if j >= 0 and len(texts[j]) > MAX_DOC_CHARS and start in texts[j]:  # a long document's next piece
                row_of[d] = j
                continue
            j += 1
            while j < len(texts) and not texts[j]:
                j += 1  # a row without text is no document of the index
            if j >= len(texts) or not texts[j].startswith(start):
                ok = False
                break
            row_of[d] = j
        if ok and not any(texts[r] for r in range(j + 1, len(texts))):
            ids = np.asarray(data.corpus_ids, dtype=object)
            return ids[row_of[table]], form
    raise CramkitError(
        f"index {idx.path} does not hold the documents of {data.root / 'corpus.jsonl'} (built from "
        f"{', '.join(idx.manifest.get('sources') or ['?'])}: {idx.manifest.get('documents')} documents, the "
        f"corpus {len(data.corpus_ids)}); {fix}"
    )


def evaluate_retrieval(
    model: Any,
    data: str | os.PathLike,
    out: str | os.PathLike | None = "eval-retrieval",
    *,
    split: str = "test",
    index: str | os.PathLike | None = None,
    k: int = 10,
    skip_bad_rows: bool = False,
    device: str = "auto",
    max_batch_tokens: int | None = None,
    progress: bool = True,
    dimensions: int | None = None,
) -> dict[str, Any]:
    """nDCG@k (main), recall@1/k/100, MRR@k and MAP@100, x100, of ``model`` on a folder in BEIR's layout: exact
    cosine search over the embedded corpus, or through ``index`` (built by ``cramkit index build`` from the
    folder's corpus.jsonl with this model; its approximate search is then also compared with exact search over
    the index's own vectors). Results written to ``out`` (None: nothing written). Returns the results."""
    _check_model(model)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise CramkitError(f"--k must be a positive integer, got {k!r}")
    t0 = time.perf_counter()
    out_dir = Path(out) if out is not None else None
    if out_dir is not None:
        _check_out(out_dir, "retrieval", [model, data, index])
    beir = read_beir(data, split, skip_bad_rows=skip_bad_rows)
    idx = None
    if index is not None:
        from cramkit.index.core import Index

        idx = Index(index)
    engine = open_engine(model, device, max_batch_tokens)
    dimensions = engine.check_dimensions(dimensions)  # a Matryoshka model's vectors cut to their first N
    if idx is not None:  # the index's vectors are cut (or not) already: its queries are cut the same way
        if dimensions is not None and dimensions != idx.dimensions:
            raise CramkitError(
                f"--dimensions {dimensions}: index {index} holds vectors of {idx.manifest['dim']} dimensions; leave "
                "--dimensions out (its queries are cut as its vectors), or build an index with --dimensions "
                f"{dimensions}"
            )
        dimensions = idx.dimensions
    if idx is not None:
        from cramkit.embed.encoder import encoder_fingerprint

        want = idx.manifest["encoder"].get("fingerprint")
        if encoder_fingerprint(engine.loaded) != want:
            raise CramkitError(
                f"--index {index} was built with another model ({idx.encoder_source}), not {engine.source}; "
                f"evaluate that model, or build an index with this one: cramkit index build "
                f"{beir.root / 'corpus.jsonl'} --encoder MODEL --out IDX"
            )
        doc_of, indexed_as = _index_documents(idx, beir)
    depth = max(100, k)
    counts = {
        "corpus": len(beir.corpus_ids),
        "queries": len(beir.query_ids),
        "queries_scored": sum(1 for q in beir.qrels.values() if _relevant(q)),
        "judgements": sum(len(v) for v in beir.qrels.values()),
        "relevant": sum(_relevant(v) for v in beir.qrels.values()),
    }
    counts["queries_without_relevant"] = counts["queries"] - counts["queries_scored"]
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    pooling = idx.manifest["encoder"].get("pooling") if idx is not None else None
    from cramkit.embed.encoder import retrieval_prompts

    prompts = retrieval_prompts(engine)  # queries: the prompt named query; documents: document/passage/corpus
    if idx is not None:  # the index's own: what its chunks got, and what its queries get
        prompts = idx.manifest.get("prompts") or {s: {"name": None, "text": ""} for s in ("documents", "queries")}
    q_vec, q_trunc = embed_texts(
        engine,
        beir.query_texts,
        pooling=pooling,
        progress=progress,
        desc="embedding queries",
        dimensions=dimensions,
        prompt=prompts["queries"]["text"],
    )
    seconds["embed_queries"] = round(time.perf_counter() - t, 3)
    runs: dict[str, dict[str, list[str]]] = {}
    search: dict[str, Any]
    if idx is None:
        t = time.perf_counter()
        c_vec, c_trunc = embed_texts(
            engine,
            beir.corpus_texts,
            progress=progress,
            desc="embedding corpus",
            dimensions=dimensions,
            prompt=prompts["documents"]["text"],
        )
        seconds["embed_corpus"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        _, ids = exact_search(q_vec, c_vec, depth + 1)
        seconds["search"] = round(time.perf_counter() - t, 3)
        doc_ids = np.asarray(beir.corpus_ids, dtype=object)
        runs["exact"] = {q: _ranked_docs(r, doc_ids, q, depth) for q, r in zip(beir.query_ids, ids, strict=True)}
        search = {"kind": "exact", "how": "cosine similarity (inner product of L2-normalised embeddings), numpy"}
        counts["truncated_texts"] = q_trunc + c_trunc
    else:
        per_doc = int(np.bincount(np.unique(np.asarray(idx.chunks.table[:, 0]), return_inverse=True)[1]).max())
        want_chunks = min(len(idx), (depth + 1) * min(per_doc, 8))
        t = time.perf_counter()
        _, ids = idx.search_vectors(np.ascontiguousarray(q_vec, dtype=np.float32), want_chunks)
        seconds["search"] = round(time.perf_counter() - t, 3)
        runs["index"] = {q: _ranked_docs(r, doc_of, q, depth) for q, r in zip(beir.query_ids, ids, strict=True)}
        t = time.perf_counter()
        _, ids = exact_search(q_vec, idx.vectors, want_chunks)
        seconds["search_exact"] = round(time.perf_counter() - t, 3)
        runs["exact"] = {q: _ranked_docs(r, doc_of, q, depth) for q, r in zip(beir.query_ids, ids, strict=True)}
        info = idx.info()
        search = {
            "kind": "index",
            "index": str(index),
            "index_kind": info["kind"],
            "factory": info["factory"],
            "params": info["params"],
            "chunks": len(idx),
            "documents_indexed_as": indexed_as,
            "recall_at_10_vs_exact_measured_at_build": (info.get("recall") or {}).get("recall_at_10"),
            "how": "the index's search; 'exact' below: exact cosine search over the same index vectors "
            "(what the approximate search costs)",
        }
        counts["truncated_texts"] = q_trunc
    scored = {name: retrieval_metrics(run, beir.qrels, k) for name, run in runs.items()}
    main = "index" if idx is not None else "exact"
    metrics = scored[main]
    results: dict[str, Any] = {
        "evaluation": "retrieval",
        "scale": f"{SCALE}: every metric times 100 (nDCG@10 of 0.5 is 50.0)",
        "main_metric": f"ndcg@{k}",
        "score": metrics.get(f"ndcg@{k}"),
        "metrics": metrics,
        "search": search,
        "model": _model_info(engine),
        "dimensions": dimensions or engine.hidden_size,
        "prompts": prompts,
        "data": str(beir.root),
        "split": split,
        "counts": counts,
        "skipped_rows": beir.skipped,
        "ignore_identical_ids": True,
        "seconds": {**seconds, "total": round(time.perf_counter() - t0, 3)},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if idx is not None:
        results["exact_on_index_vectors"] = scored["exact"]
        results["index_cost"] = {m: scored["exact"][m] - metrics[m] for m in metrics}
    if out_dir is not None:
        _write_outputs(
            out_dir,
            results,
            _retrieval_markdown(results, scored),
            {("through the index" if n == "index" else "exact search"): v for n, v in scored.items()},
            f"retrieval {Path(beir.root).name}/{split} (x100): {_short(engine.source)}",
        )
        results["out"] = str(out_dir)
    return results


def _retrieval_markdown(results: dict[str, Any], scored: dict[str, dict[str, float]]) -> str:
    c = results["counts"]
    s = results["search"]
    names = list(next(iter(scored.values())))
    how = (
        f"through index {s['index']} ({s['index_kind']}, {s['factory']}), and exact search over the same vectors"
        if s["kind"] == "index"
        else "exact cosine search over the whole corpus"
    )
    cols = ["through the index", "exact search"] if s["kind"] == "index" else ["exact search"]
    lines = [
        f"# Retrieval: {results['model']['source']}",
        "",
        f"data: {results['data']} (split {results['split']}): {c['corpus']} documents, {c['queries_scored']} "
        f"queries scored"
        + (
            f" ({c['queries_without_relevant']} without a relevant document left out)"
            if c["queries_without_relevant"]
            else ""
        ),
        f"search: {how}",
        *_prompt_lines(results.get("prompts")),
        "",
        "| metric (x100) | " + " | ".join(cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    keys = ["index", "exact"] if s["kind"] == "index" else ["exact"]
    for m in names:
        lines.append(f"| {m} | " + " | ".join(f"{scored[key][m]:.2f}" for key in keys) + " |")
    lines += [
        "",
        "Every metric times 100. nDCG@k: graded gain (the judgement's score) discounted by log2(rank + 1), over "
        "the ideal ordering; recall@k: the share of a query's relevant documents in its first k hits; MRR@k: 1 / "
        "the rank of the first relevant hit; MAP@100: mean average precision of the first 100. Means over the "
        "queries with a relevant document (BEIR's definitions; a hit with the query's own id is left out).",
        "",
    ]
    if results.get("skipped_rows"):
        lines.append("skipped: " + "; ".join(f"{k}: {v}" for k, v in results["skipped_rows"].items()))
        lines.append("")
    return "\n".join(lines)


def _prompt_lines(prompts: dict[str, Any] | None) -> list[str]:
    """One line saying which prompt each side got (none when neither got one)."""
    sides = {s: (prompts or {}).get(s) or {} for s in ("queries", "documents")}
    if not any(v.get("name") for v in sides.values()):
        return []
    words = [f"{s} {v['name']!r} ({v['text']!r})" if v.get("name") else f"{s} none" for s, v in sides.items()]
    return ["prompts: " + ", ".join(words)]


def summary_line(results: dict[str, Any]) -> str:
    """The one line a command prints."""
    m = results["metrics"]
    where = f"; results in {results['out']}" if results.get("out") else ""
    if results["evaluation"] == "sts":
        c = results["counts"]
        return (
            f"STS {Path(results['data']).name}: Spearman {m['spearman']:.2f}, Pearson {m['pearson']:.2f} (x100, "
            f"{c['pairs']} pairs, {results['seconds']['total']:.1f}s){where}"
        )
    main = results["main_metric"]
    others = ", ".join(f"{k} {v:.2f}" for k, v in m.items() if k != main)
    how = "exact search"
    if results["search"]["kind"] == "index":
        exact = results["exact_on_index_vectors"][main]
        how = f"index {results['search']['index_kind']}; exact search on its vectors {main} {exact:.2f}"
    c = results["counts"]
    pr = results.get("prompts") or {}
    if any((pr.get(side) or {}).get("name") for side in ("queries", "documents")):
        named = {side: (pr.get(side) or {}).get("name") for side in ("queries", "documents")}
        how += f", prompts: queries {named['queries'] or 'none'}, documents {named['documents'] or 'none'}"
    return (
        f"retrieval {Path(results['data']).name}/{results['split']}: {main} {m[main]:.2f}, {others} (x100, "
        f"{c['queries_scored']} queries, {c['corpus']} documents, {how}, {results['seconds']['total']:.1f}s){where}"
    )
