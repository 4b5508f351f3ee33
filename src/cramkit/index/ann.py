"""The Faiss side: choose an index from the vector count and a memory budget, train it, tune it to a target
recall@10 measured against exact search, search it (inner product on normalised vectors).

Kinds:

``flat``   exact search (``faiss.knn``) straight over the memory-mapped vectors: no index file at all.
``hnsw``   ``IDMap2,HNSW32,Flat``; ``efSearch`` tuned.
``ivfsq8`` ``IVF{nlist},SQ8`` (8-bit scalar codes, d bytes a vector) when those fit the budget, else
``ivfpq``  ``IVF{nlist},PQ{m}x4fs`` (4-bit fast-scan codes, m <= d/2 sized to the budget); both trained on a
           sample, and the candidates they return (``k * refine``) re-scored exactly against the
           memory-mapped float vectors, so the raw vectors never need to be in RAM; ``nprobe`` and
           ``refine`` tuned.

Any IVF kind can keep its inverted lists on disk (``plan["on_disk"]``: Faiss's ``OnDiskInvertedLists``, one
``lists.ivfdata`` file, memory-mapped), filled shard by shard in parallel processes and merged
(:mod:`cramkit.index.ondisk`). ``auto`` chooses it when not even full-quality 4-bit codes fit ``memory``
(the codes, ids and all, then live on disk: RAM holds the centroids); on disk the codes are 8-bit (SQ8),
or ``PQ{d/4}`` 8-bit codes with ``ivfpq`` (Faiss's fast-scan lists cannot be kept on disk).

Recall is measured on held-out queries: up to 1000 corpus vectors kept out of the index while the search
parameters are tuned against exact search over the rest, added afterwards.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.errors import CramkitError
from cramkit.index.checks import Rows, check_ids, validate_faiss_index

FLAT_MAX = 50_000  # below this many vectors exact search is fast enough
HNSW_MAX = 300_000  # above this HNSW takes too long to build on a few cores
HNSW_M = 32
KINDS = ("auto", "flat", "hnsw", "ivfsq8", "ivfpq")
IVF_KINDS = ("ivfsq8", "ivfpq")


def parse_memory(text: str | int | float) -> int:
    """'4GB', '512MB', '1.5G', 1000000 -> bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    s = str(text).strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        if s and s[-1] in mult:
            return int(float(s[:-1]) * mult[s[-1]])
        return int(float(s))
    except ValueError:
        raise CramkitError(f"--memory {text!r} is not a size; use e.g. 4GB, 512MB") from None


def plan_index(n: int, d: int, memory: int, kind: str = "auto", on_disk: bool | None = None) -> dict[str, Any]:
    """The index for ``n`` vectors of dimension ``d`` within ``memory`` bytes of RAM, with the reason;
    ``on_disk``: True keeps the inverted lists on disk, None lets the budget decide."""
    if kind not in KINDS:
        raise CramkitError(f"unknown index kind {kind!r}; use one of {', '.join(KINDS)}")
    raw = n * d * 4
    hnsw_bytes = raw + n * HNSW_M * 2 * 4
    sq8_bytes = n * (d + 8)
    pq_bytes = n * (max(1, d // 4) + 8)  # 4-bit codes of d/2 sub-quantisers and the 8-byte ids
    if on_disk:
        if kind in ("flat", "hnsw"):
            raise CramkitError(f"--on-disk keeps IVF lists on disk; --kind {kind} has none: use ivfsq8 or ivfpq")
        kind = "ivfsq8" if kind == "auto" else kind
        why = f"chosen with --on-disk: {n} vectors' IVF lists ({_disk_bytes(n, d, kind) / 2**20:.0f} MiB) on disk"
        return _ivf_plan(n, d, memory, kind, why, on_disk=True)
    if kind == "auto" and not (n <= FLAT_MAX and raw <= memory) and sq8_bytes > memory and pq_bytes > memory:
        why = (
            f"{n} vectors: not even 4-bit codes ({pq_bytes / 2**20:.0f} MiB) fit the budget; 8-bit IVF codes in "
            f"on-disk inverted lists ({_disk_bytes(n, d, 'ivfsq8') / 2**20:.0f} MiB, memory-mapped), candidates "
            f"re-scored from the memory-mapped vectors ({raw / 2**20:.0f} MiB on disk)"
        )
        return _ivf_plan(n, d, memory, "ivfsq8", why, on_disk=True)
    if kind == "auto":
        if n <= FLAT_MAX and raw <= memory:
            kind, why = "flat", f"{n} vectors <= {FLAT_MAX}: exact search"
        elif n <= HNSW_MAX and hnsw_bytes <= memory:
            kind, why = (
                "hnsw",
                f"{n} vectors: HNSW graph + vectors ({hnsw_bytes / 2**20:.0f} MiB) fit the budget",
            )
        elif sq8_bytes <= memory:
            kind, why = (
                "ivfsq8",
                (
                    f"{n} vectors: 8-bit IVF codes ({sq8_bytes / 2**20:.0f} MiB) fit the budget; candidates re-scored "
                    f"from the memory-mapped vectors ({raw / 2**20:.0f} MiB on disk)"
                ),
            )
        else:
            kind, why = (
                "ivfpq",
                (
                    f"{n} vectors: 8-bit codes ({sq8_bytes / 2**20:.0f} MiB) exceed the budget; 4-bit IVF-PQ codes, "
                    f"candidates re-scored from the memory-mapped vectors ({raw / 2**20:.0f} MiB on disk)"
                ),
            )
    else:
        why = "chosen with --kind"
    if kind in IVF_KINDS:
        return _ivf_plan(n, d, memory, kind, why, on_disk=False)
    plan: dict[str, Any] = {"kind": kind, "why": why, "dim": d}
    if kind == "hnsw":
        plan.update(M=HNSW_M, efConstruction=80, factory=f"IDMap2,HNSW{HNSW_M},Flat")
    return plan


def _ivf_plan(n: int, d: int, memory: int, kind: str, why: str, *, on_disk: bool) -> dict[str, Any]:
    nlist = int(2 ** round(math.log2(max(16.0, 2 * math.sqrt(n)))))
    nlist = max(1, min(nlist, n // 39 or 1))
    plan: dict[str, Any] = {"kind": kind, "why": why, "dim": d, "nlist": nlist}
    if kind == "ivfsq8":
        plan["factory"] = f"IVF{nlist},SQ8"
    elif on_disk:  # 8-bit PQ: fast-scan's blocked lists cannot live in OnDiskInvertedLists
        m = _divisor_near(d, max(1, d // 4))
        plan.update(m=m, factory=f"IVF{nlist},PQ{m}")
    else:
        m = _pq_m(d, n, memory)
        plan.update(m=m, factory=f"IVF{nlist},PQ{m}x4fs")
    if on_disk:
        plan.update(on_disk=True, ivfdata=IVFDATA)
    return plan


IVFDATA = "lists.ivfdata"  # an on-disk index's inverted lists, beside its faiss.index


def _disk_bytes(n: int, d: int, kind: str) -> int:
    return n * ((d if kind == "ivfsq8" else _divisor_near(d, max(1, d // 4))) + 8)


def _divisor_near(d: int, most: int) -> int:
    """The largest divisor of ``d`` not above ``most`` (PQ needs m | d)."""
    for m in range(max(1, most), 0, -1):
        if d % m == 0:
            return m
    return 1


def _pq_m(d: int, n: int, memory: int) -> int:
    """Sub-quantisers of 4 bits: about d/2 (two dimensions each), fewer when the codes would not fit
    ``memory``; even and dividing d when possible."""
    most = max(2, min(d // 2, int(2 * memory / max(n, 1))))
    for m in range(most, 1, -1):
        if d % m == 0 and m % 2 == 0:
            return m
    return 2 if d >= 2 else 1


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise CramkitError("the index needs faiss: pip install 'cramkit[index]' (faiss-cpu)") from None
    return faiss


def build_and_tune(
    vectors: np.ndarray,
    plan: dict[str, Any],
    *,
    target: float = 0.95,
    index: Any = None,
    start: int = 0,
    k: int = 10,
    queries: int = 1000,
    seed: int = 0,
    log: Any = None,
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(index, search params, recall measurement) for ``vectors`` (rows ``start:`` are new; ``index``, when
    given, already holds the rows before ``start``). None for ``flat``.

    A random sample of the new rows is held out: the others are added, the search parameters are tuned until
    the held-out queries reach recall@k >= ``target`` against exact search over what the index holds, and
    then the held-out rows are added too (row number = id)."""
    faiss = _faiss()
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    n, d = vectors.shape
    kind = plan["kind"]
    if kind == "flat":
        return None, {}, {"recall_at_10": 1.0, "queries": 0, "target": target, "exact": True, "reached": True}
    rng = np.random.default_rng(seed)
    new = n - start
    qids = held_out(rng, new, queries) + start
    if index is None:
        if kind == "hnsw":
            index = faiss.index_factory(d, plan["factory"], faiss.METRIC_INNER_PRODUCT)
            _hnsw(index).efConstruction = plan["efConstruction"]
        else:
            index = train_ivf(vectors, plan, rng, log)
    keep = np.ones(new, dtype=bool)
    keep[qids - start] = False
    t0 = time.perf_counter()
    add(index, vectors, np.flatnonzero(keep) + start, log=log)
    log(f"added {int(keep.sum())} vectors in {time.perf_counter() - t0:.1f}s")
    params, meas = tune(index, vectors, plan, qids, target=target, k=k, log=log)
    add(index, vectors, qids)
    return index, params, meas


def held_out(rng: np.random.Generator, n: int, queries: int = 1000) -> np.ndarray:
    """The sorted rows kept out of the index while its search parameters are tuned (the first draw of ``rng``)."""
    return np.sort(rng.choice(n, min(queries, max(1, n // 10)), replace=False))


def train_ivf(vectors: np.ndarray, plan: dict[str, Any], rng: np.random.Generator, log: Any) -> Any:
    """An empty IVF index of ``plan`` trained on a random sample of ``vectors`` (``rng``'s next draw)."""
    faiss = _faiss()
    n, d = vectors.shape
    index = faiss.index_factory(d, plan["factory"], faiss.METRIC_INNER_PRODUCT)
    n_train = min(n, max(40 * plan["nlist"], 20_000), 200_000)
    faiss.extract_index_ivf(index).cp.niter = 12  # k-means: 12 iterations are enough for coarse cells
    sample = np.sort(rng.choice(n, n_train, replace=False))
    t0 = time.perf_counter()
    index.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
    log(f"trained {plan['factory']} on {n_train} vectors in {time.perf_counter() - t0:.1f}s")
    return index


def _hnsw(index: Any) -> Any:
    faiss = _faiss()
    inner = faiss.downcast_index(index)
    if hasattr(inner, "index"):  # IndexIDMap2 around the HNSW index
        inner = faiss.downcast_index(inner.index)
    return inner.hnsw


def add(index: Any, vectors: np.ndarray, rows: np.ndarray, *, log: Any = None, block: int = 65536) -> None:
    """Add ``vectors[rows]`` with their row numbers as ids."""
    rows = np.asarray(rows, dtype=np.int64)
    for i in range(0, len(rows), block):
        r = rows[i : i + block]
        index.add_with_ids(np.ascontiguousarray(vectors[r], dtype=np.float32), r)
        if log is not None and len(rows) > block and (i // block) % 8 == 7:
            log(f"  {min(i + block, len(rows))}/{len(rows)} vectors added")


def exact_search(
    vectors: np.ndarray | Rows, queries: np.ndarray, k: int, block: int = 262_144, exclude: np.ndarray | None = None
) -> tuple:
    """Exact top-k by inner product over (memory-mapped) ``vectors``, streamed in row blocks; rows in the
    sorted array ``exclude`` are left out."""
    faiss = _faiss()
    q = np.ascontiguousarray(queries, dtype=np.float32)
    n = len(vectors)
    best_d = np.full((len(q), k), -np.inf, dtype=np.float32)
    best_i = np.full((len(q), k), -1, dtype=np.int64)
    extra = 0 if exclude is None else min(len(exclude), 32)
    for a in range(0, n, block):
        part = np.ascontiguousarray(vectors[a : a + block], dtype=np.float32)
        kk = min(k + extra, len(part))
        dd, ii = faiss.knn(q, part, kk, metric=faiss.METRIC_INNER_PRODUCT)
        ii = ii + a
        if extra:
            assert exclude is not None  # extra > 0 only with rows to exclude
            masked = np.isin(ii, exclude)
            short = np.flatnonzero(masked.sum(1) > extra)  # rare: more excluded rows than the margin
            if len(short) and kk < len(part):
                kf = min(k + len(exclude), len(part))
                d2, i2 = faiss.knn(q[short], part, kf, metric=faiss.METRIC_INNER_PRODUCT)
                i2 = i2 + a
                d2 = np.where(np.isin(i2, exclude), -np.inf, d2)
                order = np.argsort(-d2, axis=1, kind="stable")[:, :kk]
                dd[short] = np.take_along_axis(d2, order, axis=1)
                ii[short] = np.take_along_axis(i2, order, axis=1)
                masked[short] = ~np.isfinite(dd[short])
            dd = np.where(masked, -np.inf, dd)
        dd = np.concatenate([best_d, dd], axis=1)
        ii = np.concatenate([best_i, ii], axis=1)
        order = np.argsort(-dd, axis=1, kind="stable")[:, :k]
        best_d = np.take_along_axis(dd, order, axis=1)
        best_i = np.take_along_axis(ii, order, axis=1)
    best_i = np.where(np.isfinite(best_d), best_i, -1)
    return best_d, best_i


def set_params(index: Any, plan: dict[str, Any], params: dict[str, Any], k: int) -> None:
    faiss = _faiss()
    if plan["kind"] == "hnsw":
        _hnsw(index).efSearch = max(int(params["efSearch"]), k)
    elif plan["kind"] in IVF_KINDS:
        faiss.extract_index_ivf(index).nprobe = int(params["nprobe"])


def check_params(plan: dict[str, Any], params: Any, where: Any) -> dict[str, Any]:
    """The manifest's search parameters, each an integer in its range (a crafted efSearch of 10^12 would size
    Faiss's candidate heap)."""
    bounds = {"hnsw": {"efSearch": 1 << 16}, "ivfsq8": {"nprobe": 1 << 20, "refine": 1024}}
    want = bounds.get(plan["kind"], bounds["ivfsq8"] if plan["kind"] in IVF_KINDS else {})
    if not isinstance(params, dict):
        raise CramkitError(f"{where}: field 'params' is not an object; rebuild the index")
    for name, most in want.items():
        v = params.get(name, 1 if name == "refine" else None)
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= most:
            raise CramkitError(f"{where}: params.{name} {v!r} is not an integer in 1..{most}; rebuild the index")
    return params


def search(
    index: Any,
    vectors: np.ndarray | Rows,
    plan: dict[str, Any],
    params: dict[str, Any],
    queries: np.ndarray,
    k: int,
    exclude: np.ndarray | None = None,
    where: Any = "faiss.index",
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) [nq, k], best first; ids -1 where fewer than k were found. ``exclude``: ids an IVF index
    holds that are left out of the results (Faiss's search-time ID selector). An id beyond the vectors (a
    damaged or crafted list) is :class:`~cramkit.index.checks.DamagedIndex`, naming ``where``."""
    q = np.ascontiguousarray(queries, dtype=np.float32)
    if plan["kind"] == "flat" or index is None:
        return exact_search(vectors, q, min(k, len(vectors)))
    set_params(index, plan, params, k)
    faiss = _faiss()
    threads = faiss.omp_get_max_threads()
    if len(q) < 4:  # a handful of queries: OpenMP's fork/join costs more than it saves (worse on busy cores)
        faiss.omp_set_num_threads(1)
    try:
        if plan["kind"] == "hnsw":
            found_d, found_i = index.search(q, k)
            return found_d, check_ids(found_i, len(vectors), where)
        kk = min(int(index.ntotal), k * int(params.get("refine", 1)))
        if exclude is not None and len(exclude):
            keep = faiss.IDSelectorNot(faiss.IDSelectorBatch(np.ascontiguousarray(exclude, dtype=np.int64)))
            _, cand = index.search(q, kk, params=faiss.SearchParametersIVF(sel=keep, nprobe=int(params["nprobe"])))
        else:
            _, cand = index.search(q, kk)
    finally:
        faiss.omp_set_num_threads(threads)
        settle_prefetch(index)
    return rerank(vectors, q, check_ids(cand, len(vectors), where), k)


def settle_prefetch(index: Any) -> None:
    """Join the threads an on-disk index's search started to page its lists in (Faiss's ``prefetch_lists``:
    up to 32, left running when the search returns). Joined here, no thread reads the mapped lists between
    searches, so the size check before the next one (:class:`~cramkit.index.checks.MappedFiles`) is enough
    to refuse a list file cut short (a prefetch thread still running when it was cut died of SIGBUS)."""
    faiss = _faiss()
    ivf = faiss.try_extract_index_ivf(index)
    lists = faiss.downcast_InvertedLists(ivf.invlists) if ivf is not None else None
    if isinstance(lists, faiss.OnDiskInvertedLists):
        lists.prefetch_lists(faiss.swig_ptr(_NO_LISTS), 0)  # clears the queue, joins the threads, starts none


_NO_LISTS = np.zeros(0, dtype=np.int64)


def rerank(vectors: np.ndarray | Rows, q: np.ndarray, cand: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact scores of the candidate ids against the (memory-mapped) vectors; the best k of them."""
    nq, kk = cand.shape
    out_d = np.full((nq, k), -np.inf, dtype=np.float32)
    out_i = np.full((nq, k), -1, dtype=np.int64)
    step = max(1, 65536 // max(kk, 1))
    for a in range(0, nq, step):
        c = cand[a : a + step]
        valid = c >= 0
        flat = np.where(valid, c, 0).reshape(-1)
        uniq, inv = np.unique(flat, return_inverse=True)
        vecs = np.asarray(vectors[uniq], dtype=np.float32)
        sc = np.einsum("qkd,qd->qk", vecs[inv.reshape(c.shape)], q[a : a + step])
        sc = np.where(valid, sc, -np.inf)
        m = min(k, kk)
        top = np.argsort(-sc, axis=1, kind="stable")[:, :m]
        out_d[a : a + step, :m] = np.take_along_axis(sc, top, axis=1)
        out_i[a : a + step, :m] = np.where(np.isfinite(out_d[a : a + step, :m]), np.take_along_axis(c, top, axis=1), -1)
    return out_d, out_i


def recall_at(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean over queries of |found[:k] & truth[:k]| / |truth[:k]| (ids -1 ignored)."""
    vals = []
    for f, t in zip(found, truth, strict=True):
        want = set(t[:k].tolist()) - {-1}
        if want:
            vals.append(len(set(f[:k].tolist()) & want) / len(want))
    return float(np.mean(vals)) if vals else 1.0


def tune(
    index: Any,
    vectors: np.ndarray,
    plan: dict[str, Any],
    qids: np.ndarray,
    *,
    target: float = 0.95,
    k: int = 10,
    log: Any = None,
    holds_queries: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fastest search parameters whose recall@k on the held-out rows ``qids`` (not in ``index``, or left
    out of its results with ``holds_queries``) reaches ``target`` against exact search over the other rows;
    and ``{"recall_at_10", "queries", "target", "qps", "reached"}``."""
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    exclude = qids if holds_queries else None
    kk = max(1, min(k, int(index.ntotal) - (len(qids) if holds_queries else 0)))
    q = np.ascontiguousarray(vectors[qids], dtype=np.float32)
    _, truth = exact_search(vectors, q, kk, exclude=qids)
    if plan["kind"] == "hnsw":
        grid = [{"efSearch": e} for e in (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)]
    else:
        probes = [p for p in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512) if p <= plan["nlist"]]
        if plan["nlist"] not in probes:
            probes.append(plan["nlist"])
        refines = (1, 2, 4, 8) if plan["kind"] == "ivfsq8" else (2, 4, 8, 16, 32, 64)
        grid = [{"nprobe": p, "refine": r} for r in refines for p in probes]
    best: tuple[float, dict, dict] | None = None
    fallback: tuple[float, dict, dict] | None = None
    skip_refine: set[int] = set()
    last: dict[int, float] = {}
    for params in grid:
        r = params.get("refine")
        if r in skip_refine:
            continue
        t0 = time.perf_counter()
        _, ids = search(index, vectors, plan, params, q, kk, exclude=exclude)
        dt = time.perf_counter() - t0
        rec = recall_at(ids, truth, kk)
        qps = len(q) / dt if dt > 0 else float("inf")
        meas = {"recall_at_10": round(rec, 4), "queries": len(q), "target": target, "qps": round(qps, 1)}
        if fallback is None or rec > fallback[0]:
            fallback = (rec, params, meas)
        if rec >= target:
            if best is None or qps > best[0]:
                best = (qps, params, meas)
            if r is None:
                break
            skip_refine.add(r)  # more probes only cost time
        elif r is not None:
            if params["nprobe"] >= 16 and rec - last.get(r, -1.0) < 0.002:
                skip_refine.add(r)  # a plateau: more probes will not help this refine factor
            last[r] = rec
    if best is None:
        rec, params, meas = fallback  # type: ignore[misc]
        log(f"warning: recall@10 {rec:.3f} is below the target {target} at the most thorough setting tried")
        return params, meas | {"reached": False}
    _, params, meas = best
    return params, meas | {"reached": True}


def write(index: Any, path: Path) -> None:
    """``index`` written to ``path`` through Python's file object: a full disk is an OSError even when only the
    last buffered bytes fail (Faiss's own writer only prints a failed close)."""
    faiss = _faiss()
    with open(path, "wb") as fh:
        faiss.write_index(index, faiss.PyCallbackIOWriter(fh.write))


def read(path: Path, *, rows: int, dim: int, mmap: bool = True) -> tuple[Any, bool]:
    """(index, memory-mapped?) - memory-mapped where Faiss allows it for the index type; checked
    (:func:`~cramkit.index.checks.validate_faiss_index`) to hold ``rows`` vectors of ``dim`` dimensions."""
    faiss = _faiss()
    index, mapped = None, False
    if mmap:
        with contextlib.suppress(RuntimeError, MemoryError):
            index, mapped = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY), True
    if index is None:
        try:
            index = faiss.read_index(str(path))
        except (RuntimeError, MemoryError) as exc:
            raise CramkitError(f"{path} is not a readable Faiss index ({_last_line(exc)}); rebuild the index") from None
    validate_faiss_index(index, path, rows=rows, dim=dim)
    return index, mapped


def _last_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__


def open_rows(path: Path) -> Rows:
    """``path`` (a ``.npy`` of vectors) for random row reads (:class:`~cramkit.index.checks.Rows`: ``pread``,
    no read-ahead, never memory-mapped: a file cut short under a server is an error, not SIGBUS). Measured at
    20M x 64 in a 4 GiB cgroup, reading candidates with the default read-ahead evicted the inverted lists
    (80 ms a query against a few ms; bench/RESULTS.md)."""
    return Rows(path)


def read_on_disk(path: Path, ivfdata: Path, *, rows: int, dim: int) -> Any:
    """An index whose inverted lists are on disk (``plan["on_disk"]``), its lists memory-mapped read-only from
    ``ivfdata``. The list file named inside ``path`` is never opened: it must be ``ivfdata``'s name (a crafted
    faiss.index naming another file, ../ or absolute, is refused), and ``ivfdata`` itself is the checked path."""
    faiss = _faiss()
    try:
        index = faiss.read_index(str(path), faiss.IO_FLAG_SKIP_IVF_DATA | faiss.IO_FLAG_READ_ONLY)
        lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(index).invlists)
    except (RuntimeError, MemoryError) as exc:
        raise CramkitError(f"{path} is not a readable Faiss index ({_last_line(exc)}); rebuild the index") from None
    if not isinstance(lists, faiss.OnDiskInvertedLists):
        raise CramkitError(f"{path} does not keep its lists on disk, yet the manifest says so; rebuild the index")
    if lists.filename != ivfdata.name:
        raise CramkitError(
            f"{path} names its list file {lists.filename!r}, not {ivfdata.name!r} beside it; refusing to open it "
            "(damaged or crafted): rebuild the index"
        )
    if not ivfdata.is_file() or os.path.getsize(ivfdata) < int(lists.totsize):  # a short map would SIGBUS
        raise CramkitError(f"{ivfdata} is missing or shorter than its index says; the index is damaged, rebuild it")
    validate_faiss_index(index, path, rows=rows, dim=dim)  # before any list is read: offsets inside the file
    lists.filename = str(ivfdata)
    lists.read_only = True
    try:
        lists.do_mmap()
    except RuntimeError as exc:
        why = str(exc).strip()[-200:]
        raise CramkitError(f"{ivfdata} cannot be memory-mapped ({why}); rebuild the index") from None
    return index
