"""Retrieval: nDCG@10 (main), recall, MRR and MAP, x100, of a model's embeddings over a folder in BEIR's
layout (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv), by exact cosine search or through an index built from
the folder's corpus (then also compared with exact search over the index's own vectors).

A hit whose id equals the query's id is left out (BEIR's ``ignore_identical_ids``); queries without a
relevant document are left out of the means (counted). The metrics: :mod:`cramkit.evaluation.metrics`.
"""

from __future__ import annotations

import os
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.errors import CramkitError
from cramkit.evaluation import CUTOFF, results_dir
from cramkit.evaluation.embedding import check_model, embed_texts, model_info, open_engine
from cramkit.evaluation.metrics import exact_search, relevant_count, retrieval_metrics
from cramkit.evaluation.results import SCALE, check_results_out, short_source, write_outputs
from cramkit.evaluation.rows import BadRows, parse_number

SHOW = 5  # unknown ids named in an error


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
    bad = BadRows(path, skip)
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

    bad = BadRows(path, skip)
    rows: list[tuple[int, str, str, float]] = []
    try:
        lines = list(read_tsv_lines(path))
    except UnicodeDecodeError:
        raise CramkitError(f"{path} is not valid UTF-8; convert it (iconv -t utf-8)") from None
    for i, (lineno, parts) in enumerate(lines):
        if i == 0 and (len(parts) < 3 or parse_number(parts[2]) is None):
            continue  # the header (query-id, corpus-id, score)
        if len(parts) != 3:
            bad.add(lineno, f"expected 3 tab-separated fields (query-id, corpus-id, score), found {len(parts)}")
            continue
        score = parse_number(parts[2])
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
    out: str | os.PathLike | None = results_dir("retrieval"),
    *,
    split: str = "test",
    index: str | os.PathLike | None = None,
    k: int = CUTOFF,
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
    check_model(model)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise CramkitError(f"--k must be a positive integer, got {k!r}")
    t0 = time.perf_counter()
    out_dir = Path(out) if out is not None else None
    if out_dir is not None:
        check_results_out(out_dir, "retrieval", [model, data, index])
    beir = read_beir(data, split, skip_bad_rows=skip_bad_rows)
    idx = _open_index(index)
    engine = open_engine(model, device, max_batch_tokens)
    dimensions = engine.check_dimensions(dimensions)  # a Matryoshka model's vectors cut to their first N
    doc_of, indexed_as = None, None
    if idx is not None:
        dimensions = _index_dimensions(idx, index, dimensions)
        _check_index_model(idx, index, engine, beir)
        doc_of, indexed_as = _index_documents(idx, beir)
    depth = max(100, k)
    counts = _counts(beir)
    t = time.perf_counter()
    prompts = _prompts(engine, idx)
    q_vec, q_trunc = embed_texts(
        engine,
        beir.query_texts,
        pooling=idx.manifest["encoder"].get("pooling") if idx is not None else None,
        progress=progress,
        desc="embedding queries",
        dimensions=dimensions,
        prompt=prompts["queries"]["text"],
    )
    seconds = {"embed_queries": round(time.perf_counter() - t, 3)}
    if idx is None:
        runs, search, more_seconds, c_trunc = _search_exact(
            engine, beir, q_vec, depth, prompt=prompts["documents"]["text"], dimensions=dimensions, progress=progress
        )
        counts["truncated_texts"] = q_trunc + c_trunc
    else:
        runs, search, more_seconds = _search_index(idx, index, beir, q_vec, depth, doc_of, indexed_as)
        counts["truncated_texts"] = q_trunc
    seconds |= more_seconds
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
        "model": model_info(engine),
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
        write_outputs(
            out_dir,
            results,
            _retrieval_markdown(results, scored),
            {("through the index" if n == "index" else "exact search"): v for n, v in scored.items()},
            f"retrieval {Path(beir.root).name}/{split} (x100): {short_source(engine.source)}",
        )
        results["out"] = str(out_dir)
    return results


def _open_index(index: str | os.PathLike | None) -> Any:
    """The index to search through (None: exact search)."""
    if index is None:
        return None
    from cramkit.index import Index

    return Index(index)


def _index_dimensions(idx: Any, index: str | os.PathLike | None, dimensions: int | None) -> int | None:
    """The dimensions the queries are cut to: the index's vectors are cut (or not) already, and its queries are
    cut the same way; a different --dimensions is one line."""
    if dimensions is not None and dimensions != idx.dimensions:
        raise CramkitError(
            f"--dimensions {dimensions}: index {index} holds vectors of {idx.manifest['dim']} dimensions; leave "
            "--dimensions out (its queries are cut as its vectors), or build an index with --dimensions "
            f"{dimensions}"
        )
    return idx.dimensions


def _check_index_model(idx: Any, index: str | os.PathLike | None, engine: Any, beir: BeirData) -> None:
    """The index was built with the model evaluated (else one line)."""
    from cramkit.embeddings.encoder import encoder_fingerprint

    want = idx.manifest["encoder"].get("fingerprint")
    if encoder_fingerprint(engine.loaded) != want:
        raise CramkitError(
            f"--index {index} was built with another model ({idx.encoder_source}), not {engine.source}; "
            f"evaluate that model, or build an index with this one: cramkit index build "
            f"{beir.root / 'corpus.jsonl'} --encoder MODEL --out IDX"
        )


def _counts(beir: BeirData) -> dict[str, int]:
    """How many documents, queries and judgements the folder holds, and how many queries are scored."""
    counts = {
        "corpus": len(beir.corpus_ids),
        "queries": len(beir.query_ids),
        "queries_scored": sum(1 for q in beir.qrels.values() if relevant_count(q)),
        "judgements": sum(len(v) for v in beir.qrels.values()),
        "relevant": sum(relevant_count(v) for v in beir.qrels.values()),
    }
    counts["queries_without_relevant"] = counts["queries"] - counts["queries_scored"]
    return counts


def _prompts(engine: Any, idx: Any) -> dict[str, Any]:
    """The prompt each side gets: the model's (queries: its prompt named query; documents: document, passage or
    corpus), or through an index the index's own (what its chunks got, and what its queries get)."""
    from cramkit.embeddings.encoder import retrieval_prompts

    prompts: dict[str, Any] = retrieval_prompts(engine)
    if idx is not None:
        prompts = idx.manifest.get("prompts") or {s: {"name": None, "text": ""} for s in ("documents", "queries")}
    return prompts


def _search_exact(
    engine: Any,
    beir: BeirData,
    q_vec: np.ndarray,
    depth: int,
    *,
    prompt: str,
    dimensions: int | None,
    progress: bool,
) -> tuple[dict[str, dict[str, list[str]]], dict[str, Any], dict[str, float], int]:
    """Exact cosine search over the embedded corpus: (the run, how it searched, seconds, corpus texts cut)."""
    t = time.perf_counter()
    c_vec, c_trunc = embed_texts(
        engine, beir.corpus_texts, progress=progress, desc="embedding corpus", dimensions=dimensions, prompt=prompt
    )
    seconds = {"embed_corpus": round(time.perf_counter() - t, 3)}
    t = time.perf_counter()
    _, ids = exact_search(q_vec, c_vec, depth + 1)
    seconds["search"] = round(time.perf_counter() - t, 3)
    doc_ids = np.asarray(beir.corpus_ids, dtype=object)
    runs = {"exact": {q: _ranked_docs(r, doc_ids, q, depth) for q, r in zip(beir.query_ids, ids, strict=True)}}
    search = {"kind": "exact", "how": "cosine similarity (inner product of L2-normalised embeddings), numpy"}
    return runs, search, seconds, c_trunc


def _search_index(
    idx: Any,
    index: str | os.PathLike | None,
    beir: BeirData,
    q_vec: np.ndarray,
    depth: int,
    doc_of: Any,
    indexed_as: str | None,
) -> tuple[dict[str, dict[str, list[str]]], dict[str, Any], dict[str, float]]:
    """The index's search, and exact search over the same index vectors (what the approximate search costs):
    (the two runs, how it searched, seconds). ``doc_of``: the corpus id of each chunk (:func:`_index_documents`)."""
    per_doc = int(np.bincount(np.unique(np.asarray(idx.chunks.table[:, 0]), return_inverse=True)[1]).max())
    want_chunks = min(len(idx), (depth + 1) * min(per_doc, 8))
    runs: dict[str, dict[str, list[str]]] = {}
    t = time.perf_counter()
    _, ids = idx.search_vectors(np.ascontiguousarray(q_vec, dtype=np.float32), want_chunks)
    seconds = {"search": round(time.perf_counter() - t, 3)}
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
    return runs, search, seconds


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
