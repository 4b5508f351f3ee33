"""The transfer set of Tang et al. 2019 ("Distilling Task-Specific Knowledge from BERT into Simple Neural
Networks", arXiv 1903.12136, section 3.3): the training sentences plus ``n_iter`` edited copies of each.

Per word, X ~ U[0, 1]: X < p_mask -> the word is masked (``MASK``: the teacher reads ``[MASK]``, a student
``[UNK]``); p_mask <= X < p_mask + p_pos -> the word is replaced by a word with the same part-of-speech
tag, drawn from the training set's unigram distribution within that tag. Then, with probability p_ng, the
example is cut to a random n-gram, n uniform in 1..max_ngram. For a sentence pair each copy edits the
first text, the second or both (uniformly). Copies equal to an example already in the set are dropped.

POS tags come from NLTK's averaged perceptron tagger. Every example draws from its own random stream
(seed, example index), so the set is the same for a seed whatever the number of worker processes; the
workers' results are written in example order, streamed to a JSON-lines file that is renamed into place
when complete (with a manifest written last).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.errors import CramkitError
from cramkit.io import json_loads, read_json
from cramkit.runtime import cpu_cores, die_with_parent

MASK = "[MASK]"  # what a masked word is stored as; students read STUDENT_MASK instead
STUDENT_MASK = "[UNK]"
TAGGER = "averaged_perceptron_tagger_eng"
WORD_RE = re.compile(r"\w+(?:['\-]\w+)*|[^\w\s]")


@dataclass
class AugmentConfig:
    """Tang et al.'s defaults; ``n_iter`` 0 means 20 for single sentences, 10 for pairs."""

    p_mask: float = 0.1
    p_pos: float = 0.1
    p_ng: float = 0.25
    n_iter: int = 0
    max_ngram: int = 5
    seed: int = 0
    workers: int = 0  # 0 = every core this process may use

    def validate(self) -> None:
        for name in ("p_mask", "p_pos", "p_ng"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise CramkitError(f"{name} is a probability in [0, 1], got {v}")
        if self.p_mask + self.p_pos > 1.0:
            raise CramkitError(f"p_mask + p_pos must be at most 1, got {self.p_mask + self.p_pos}")
        if self.n_iter < 0 or self.max_ngram < 1 or self.workers < 0:
            raise CramkitError("n_iter and workers must be >= 0 and max_ngram >= 1")

    def copies(self, pairs: bool) -> int:
        return self.n_iter or (10 if pairs else 20)


def words(text: str) -> list[str]:
    """Words and punctuation marks of ``text`` (what is tagged and edited)."""
    return WORD_RE.findall(text or "")


# ------------------------------------------------------------------------------------------ the tagger


_TAGGERS: dict[str, Any] = {}


def find_tagger() -> str:
    """Where NLTK's tagger is (cheap: nothing is loaded); CramkitError saying how to install it when absent."""
    try:
        import nltk
    except ImportError:
        raise CramkitError("distillation's POS-guided replacement needs NLTK: pip install 'cramkit[distill]'") from None
    try:
        return str(nltk.data.find(f"taggers/{TAGGER}/"))
    except (LookupError, OSError, ValueError):
        raise CramkitError(
            f"NLTK's POS tagger ({TAGGER}) is not installed: run python -c \"import nltk; "
            f"nltk.download('{TAGGER}')\" (or point NLTK_DATA at a folder that holds taggers/{TAGGER}/); "
            "or turn POS replacement off with --set p_pos=0"
        ) from None


def load_tagger() -> Any:
    """NLTK's averaged perceptron tagger (loaded once per process); CramkitError when absent."""
    key = find_tagger()
    if key not in _TAGGERS:  # loading its weights takes seconds
        from nltk.tag import PerceptronTagger

        try:
            _TAGGERS[key] = PerceptronTagger(lang="eng")
        except (LookupError, OSError, ValueError) as exc:
            raise CramkitError(f"NLTK's POS tagger in {key} cannot be read ({exc}); install it again") from None
    return _TAGGERS[key]


# ------------------------------------------------------------------------------ the POS distribution


class PosTable:
    """Per POS tag: the words seen with it in the training set and their cumulative frequencies."""

    def __init__(self, tagged: Sequence[Sequence[tuple[str, str]]]) -> None:
        counts: dict[str, Counter] = {}
        for sentence in tagged:
            for word, tag in sentence:
                counts.setdefault(tag, Counter())[word] += 1
        self.words: dict[str, list[str]] = {}
        self.cum: dict[str, np.ndarray] = {}
        for tag, c in counts.items():
            items = sorted(c.items())  # sorted: the table is the same whatever order it was built in
            self.words[tag] = [w for w, _ in items]
            freq = np.asarray([n for _, n in items], dtype=np.float64)
            self.cum[tag] = np.cumsum(freq) / freq.sum()

    def sample(self, tag: str, u: float) -> str | None:
        cum = self.cum.get(tag)
        if cum is None:
            return None
        return self.words[tag][min(int(np.searchsorted(cum, u, side="right")), len(cum) - 1)]


# ------------------------------------------------------------------------------------------ editing


def edit(
    tokens: Sequence[str],
    tags: Sequence[str],
    table: PosTable | None,
    cfg: AugmentConfig,
    rng: np.random.Generator,
) -> list[str]:
    """One edited copy of a tagged sentence (mask, POS replacement, then n-gram sampling)."""
    n = len(tokens)
    x = rng.random(n)
    u = rng.random(n)
    out = list(tokens)
    for i in range(n):
        if x[i] < cfg.p_mask:
            out[i] = MASK
        elif x[i] < cfg.p_mask + cfg.p_pos and table is not None:
            out[i] = table.sample(tags[i], u[i]) or out[i]
    if n > 1 and rng.random() < cfg.p_ng:
        k = int(rng.integers(1, cfg.max_ngram + 1))
        if k < n:
            start = int(rng.integers(0, n - k + 1))
            out = out[start : start + k]
    return out


# the workers' shared state (set once per process by _init; forked workers inherit it)
_STATE: dict[str, Any] = {}


def _init(table: PosTable | None, cfg: AugmentConfig, pairs: bool, parent: int | None = None) -> None:
    if parent is not None:  # in a worker
        die_with_parent(parent)
    _STATE.update(table=table, cfg=cfg, pairs=pairs)


def _tag_chunk(chunk: list[list[str]]) -> list[list[str]]:
    tagger = _STATE.get("tagger")
    if tagger is None:
        tagger = _STATE["tagger"] = load_tagger()
    return [[t for _, t in tagged] for tagged in tagger.tag_sents(chunk)]


def _augment_chunk(job: tuple[int, list[tuple]]) -> list[list[tuple[str, str | None]]]:
    """For each example (i, words_a, tags_a, words_b, tags_b): its distinct edited copies."""
    _, rows = job
    table, cfg, pairs = _STATE["table"], _STATE["cfg"], _STATE["pairs"]
    copies = cfg.copies(pairs)
    out = []
    for i, wa, ta, wb, tb in rows:
        rng = np.random.default_rng([cfg.seed, i])
        seen = {(" ".join(wa), " ".join(wb) if wb is not None else None)}
        mine = []
        for _ in range(copies):
            which = int(rng.integers(0, 3)) if wb is not None else 0  # 0: first, 1: second, 2: both
            a = edit(wa, ta, table, cfg, rng) if which in (0, 2) else list(wa)
            b = (edit(wb, tb, table, cfg, rng) if which in (1, 2) else list(wb)) if wb is not None else None
            key = (" ".join(a), " ".join(b) if b is not None else None)
            if key in seen or not key[0]:
                continue
            seen.add(key)
            mine.append(key)
        out.append(mine)
    return out


def _chunks(items: Sequence[Any], size: int) -> Iterator[tuple[int, list[Any]]]:
    for s in range(0, len(items), size):
        yield s, list(items[s : s + size])


@contextlib.contextmanager
def _workers(workers: int, table: PosTable | None, cfg: AugmentConfig, pairs: bool) -> Iterator[Any]:
    """A pool of ``workers`` processes sharing ``table`` and ``cfg`` (0: None, the work runs in this process),
    terminated on leaving."""
    if not workers:
        yield None
        return
    import multiprocessing as mp

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    pool = ctx.Pool(workers, initializer=_init, initargs=(table, cfg, pairs, os.getpid()))
    try:
        yield pool
    finally:
        pool.terminate()


# ------------------------------------------------------------------------------------------ the set


@dataclass
class TransferSet:
    """The transfer set on disk: ``transfer.jsonl`` rows ``[a, b, label, orig]`` and its manifest."""

    root: Path
    texts_a: list[str]
    texts_b: list[str | None]
    labels: list[Any]  # the original's label for originals, None for copies and unlabelled text
    orig: np.ndarray  # bool: an original training example
    manifest: dict[str, Any]

    def __len__(self) -> int:
        return len(self.texts_a)

    def rendered(self, mask_token: str) -> tuple[list[str], list[str | None]]:
        """Texts with masked words written as ``mask_token`` ([MASK] for the teacher, [UNK] for a
        word-level student)."""
        if mask_token == MASK:
            return self.texts_a, self.texts_b

        def r(t: str | None) -> str | None:
            return t.replace(MASK, mask_token) if t is not None else None

        return [t.replace(MASK, mask_token) for t in self.texts_a], [r(t) for t in self.texts_b]


MANIFEST = "manifest.json"
ROWS = "transfer.jsonl"


def read_transfer(root: Path) -> TransferSet:
    """A complete transfer set written by :func:`build_transfer` (CramkitError when incomplete)."""
    root = Path(root)
    if not (root / MANIFEST).is_file() or not (root / ROWS).is_file():
        raise CramkitError(f"{root}: no complete transfer set (manifest.json written last is missing)")
    manifest = read_json(root / MANIFEST, f"delete {root} (a cache) and run again")
    a, b, labels, orig = [], [], [], []
    with open(root / ROWS, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            try:
                ta, tb, label, o = json_loads(line)
            except (ValueError, TypeError) as exc:
                raise CramkitError(f"{root / ROWS} line {lineno} is damaged ({exc}); delete {root} (a cache)") from None
            a.append(ta)
            b.append(tb)
            labels.append(label)
            orig.append(bool(o))
    if len(a) != manifest.get("rows"):
        raise CramkitError(f"{root / ROWS} has {len(a)} rows, its manifest says {manifest.get('rows')}; delete {root}")
    return TransferSet(root, a, b, labels, np.asarray(orig, dtype=bool), manifest)


def build_transfer(
    out: Path,
    texts_a: Sequence[str],
    texts_b: Sequence[str | None] | None,
    labels: Sequence[Any],
    cfg: AugmentConfig,
    *,
    unlabelled: Sequence[str] = (),
    progress: bool = True,
) -> TransferSet:
    """Write the transfer set for these training examples to ``out`` (reused when already complete).

    Originals come first (with their labels), then each example's copies in example order; then the
    unlabelled texts (as they are, no label). Returns the set read back.
    """
    from cramkit.io import write_json_atomic

    out = Path(out)
    if (out / MANIFEST).is_file():
        return read_transfer(out)
    cfg.validate()
    n = len(texts_a)
    b = list(texts_b) if texts_b is not None else [None] * n
    pairs = any(t is not None for t in b)
    workers = cfg.workers or cpu_cores()
    wa = [words(t) for t in texts_a]
    wb = [words(t) if t is not None else None for t in b]
    t0 = time.perf_counter()
    if cfg.p_pos > 0:  # loaded once here (the forked workers share it); fails early with how to install it
        _STATE["tagger"] = load_tagger()
    small = n < 500 or workers == 1  # not worth starting processes for
    # 1. POS tags of every training sentence (in parallel), then the per-tag unigram table
    with _workers(0 if small else workers, None, cfg, pairs) as pool:
        ta, tb, table = _pos_tags(wa, wb, cfg, pool, progress)
        t_tag = time.perf_counter() - t0
    # 2. the copies, in parallel, written in example order as they come
    t1 = time.perf_counter()
    _init(table, cfg, pairs)
    with _workers(0 if small else workers, table, cfg, pairs) as pool:
        originals = [(texts_a[i], b[i], labels[i]) for i in range(n)]
        rows = [(i, wa[i], ta[i], wb[i], tb[i]) for i in range(n)]
        counts = _write_rows(out, originals, rows, unlabelled, cfg.copies(pairs), pool, progress)
        t_aug = time.perf_counter() - t1
    manifest = {
        "rows": counts["rows"],
        "originals": counts["originals"],
        "repeated_originals": n - counts["originals"],
        "copies": counts["copies"],
        "duplicates_dropped": counts["duplicates"],
        "unlabelled": counts["unlabelled"],
        "pairs": pairs,
        "config": {**cfg.__dict__, "n_iter": cfg.copies(pairs)},
        "workers": 1 if small else workers,
        "seconds_tagging": round(t_tag, 3),
        "seconds_augmenting": round(t_aug, 3),
        "examples_per_s": round((n * cfg.copies(pairs)) / max(1e-9, t_aug), 1),
    }
    write_json_atomic(out / MANIFEST, manifest)
    return read_transfer(out)


def _pos_tags(
    wa: list[list[str]], wb: list[list[str] | None], cfg: AugmentConfig, pool: Any, progress: bool
) -> tuple[list[list[str]], list[list[str] | None], PosTable | None]:
    """The POS tags of the words of every text a and b (tagged by ``pool``'s processes, or in this one without
    a pool) and the per-tag unigram table drawn from; without ``p_pos`` empty tags and no table."""
    from cramkit.progress import Progress

    n = len(wa)
    ta: list[list[str]] = [[""] * len(w) for w in wa]
    tb: list[list[str] | None] = [[""] * len(w) if w is not None else None for w in wb]
    if cfg.p_pos <= 0:
        return ta, tb, None
    sents = wa + [w for w in wb if w is not None]
    tags: list[list[str]] = []
    size = 512
    with Progress("POS tagging", len(sents), unit="sentences", enabled="auto" if progress else False) as bar:
        parts = [c for _, c in _chunks(sents, size)]
        for got in pool.imap(_tag_chunk, parts) if pool else map(_tag_chunk, parts):
            tags.extend(got)
            bar.update(len(got))
    ta = tags[:n]
    it = iter(tags[n:])
    tb = [next(it) if w is not None else None for w in wb]
    tagged = [list(zip(w, t, strict=True)) for w, t in zip(wa, ta, strict=True)]
    tagged += [
        list(zip(w, t, strict=True)) for w, t in zip(wb, tb, strict=True) if w is not None and t is not None
    ]  # (t is None where w is)
    return ta, tb, PosTable(tagged)


def _write_rows(
    out: Path,
    originals: list[tuple[str, str | None, Any]],
    rows: list[tuple],
    unlabelled: Sequence[str],
    per: int,
    pool: Any,
    progress: bool,
) -> dict[str, int]:
    """``out/transfer.jsonl``, renamed into place when complete: the ``originals`` (text a, text b, label),
    the ``per`` edited copies of each of the ``rows`` (made by ``pool``'s processes, or in this one without a
    pool) as they come, in example order, then the unlabelled texts; a row already written is not written
    again. Returns the counts of what was written and dropped."""
    from cramkit.io import clean_stale
    from cramkit.progress import Progress

    out.mkdir(parents=True, exist_ok=True)
    clean_stale(out / ROWS)
    tmp = out / f".{ROWS}.tmp-{os.getpid()}"
    seen: set[int] = set()
    count = copies = dup = n_orig = extra = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:

            def put(a: str, bb: str | None, label: Any, orig: bool) -> bool:
                nonlocal count
                key = hash((a, bb))
                if key in seen:
                    return False
                seen.add(key)
                f.write(json.dumps([a, bb, label, orig], ensure_ascii=False) + "\n")
                count += 1
                return True

            for a, bb, label in originals:  # an original repeated in the training set is kept once
                n_orig += put(a, bb, label, True)
            with Progress("augmenting", len(rows) * per, unit="rows", enabled="auto" if progress else False) as bar:
                jobs = _chunks(rows, 64)
                for got in pool.imap(_augment_chunk, jobs) if pool else map(_augment_chunk, jobs):
                    for mine in got:
                        dup += per - len(mine)  # copies equal to the original or to an earlier copy
                        for a, bb in mine:
                            if put(a, bb, None, False):
                                copies += 1
                            else:
                                dup += 1
                        bar.update(per)
            for t in unlabelled:
                if t and t.strip():
                    extra += put(t, None, None, False)
        os.replace(tmp, out / ROWS)
    finally:
        tmp.unlink(missing_ok=True)
    return {"rows": count, "originals": n_orig, "copies": copies, "duplicates": dup, "unlabelled": extra}
