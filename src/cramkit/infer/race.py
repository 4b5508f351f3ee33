"""``cramkit export --target cpu|cpu-serve`` by measurement: the installed export formats raced on this machine.

Each candidate (ONNX fp32/int8, OpenVINO fp32 and, where the CPU computes bf16, bf16, CTranslate2 int8/float32:
those whose package is installed and which can hold the model) is exported to a temporary directory and run
through :class:`~cramkit.infer.Engine` beside the fp32 torch model (the baseline, never chosen) for a few
seconds, in interleaved rounds, at one thread and at every core: for ``cpu`` (batch work) on short (8-12 tokens)
and long (100-128 tokens) texts, for ``cpu-serve`` (a server) on calls of one and of four short texts. The
fastest candidate whose outputs agree with the fp32 torch model (embeddings: mean cosine >= ``AGREE_COSINE``;
a classifier: probabilities within ``AGREE_PROB``) is chosen; the race is recorded in the export's manifest
(``race``) and in ``races.json`` in cramkit's cache directory, keyed by the model's shape and kind, the
formats' versions and the CPU (model name, flags, cores), so that a later export of the same kind of model on
the same CPU reuses it. The rules from the CPU's flags (:func:`cramkit.infer.export.cpu_target`) stay the
fallback where a race cannot run (fewer than two formats installed, ``--no-race``, a failure).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError

if TYPE_CHECKING:
    from cramkit.loading import LoadedModel

RACES_FILE = "races.json"  # beside the doctor's ceilings.json
RACES_BYTES = 1 << 20
RACES_KEPT = 64  # races kept in the cache, the newest
RACE_ENV = "CRAMKIT_RACE"  # 1: always race (the cache ignored), 0: never (the flags' rule)
SECONDS_ENV = "CRAMKIT_RACE_SECONDS"  # the measuring budget, all cells together
RACE_SECONDS = 4.0
MIN_ROUNDS, MAX_ROUNDS = 3, 50  # per cell, for the contenders
CONTEND = 1.5  # after two rounds, an entrant whose fastest round is over this times the best's drops out
AGREE_COSINE = 0.995  # an embedding candidate's mean cosine to the fp32 torch model's vectors, at least
AGREE_PROB = 0.03  # a classifier candidate's largest probability difference from the fp32 torch model, at most
# (format, quantize) in the order a tie is broken: the formats cramkit builds in
CANDIDATES: tuple[tuple[str, str | None], ...] = (
    ("ct2", "int8"),
    ("ct2", "float32"),
    ("onnx", "int8"),
    ("onnx", None),
    ("openvino", "bf16"),
    ("openvino", None),
)
BASELINE = "torch fp32"
HEAD_KINDS = ("classifier", "multilabel", "regression")
_SAID: set[Path] = set()


def label(fmt: str, quantize: str | None) -> str:
    return f"{fmt} {quantize or 'fp32'}"


@dataclass
class Cell:
    """One measured condition: ``calls`` (texts per call, one list each) at ``threads``."""

    name: str
    threads: int
    calls: list[list[str]]
    concurrent: int = 1  # calls made at once (a server's workers)


@dataclass
class Entrant:
    name: str
    fmt: str | None  # None: the torch baseline
    quantize: str | None
    path: Path | None = None
    rates: dict[str, float] = field(default_factory=dict)  # cell -> texts/s
    rounds: dict[str, int] = field(default_factory=dict)  # cell -> rounds run (2 for one that dropped out)
    agreement: dict[str, float] = field(default_factory=dict)
    agrees: bool = True
    error: str | None = None
    score: float = 0.0


# ------------------------------------------------------------------------------------------ candidates


def candidates(loaded: LoadedModel) -> tuple[list[tuple[str, str | None]], dict[str, str]]:
    """The (format, quantize) pairs raced for ``loaded`` here, and why each other built-in one is not."""
    from cramkit import backends
    from cramkit.runtime import cpu_bf16

    found: list[tuple[str, str | None]] = []
    skipped: dict[str, str] = {}
    experts = getattr(loaded.config, "moe_experts", 0)
    registered = backends.backends()
    for fmt, quantize in CANDIDATES:
        name, b = label(fmt, quantize), registered.get(fmt)
        try:
            if b is None:
                raise CramkitError("not registered")
            b.available()
            backends.check_architecture(b, loaded.architecture, loaded.source)
        except CramkitError as exc:
            skipped[name] = str(exc)[:160]
            continue
        why = b.incompatibilities(loaded)
        if experts and fmt != "onnx":
            why = [*why, "a mixture of experts exports to ONNX only"]
        if b.exported_kind(loaded) not in b.exported_kinds:
            why = [*why, f"the format holds no {loaded.kind} model"]
        if fmt == "openvino" and quantize == "bf16" and cpu_bf16() is None:
            why = [*why, "this CPU has no native bf16"]
        if why:
            skipped[name] = "; ".join(why)[:160]
        else:
            found.append((fmt, quantize))
    return found, skipped


def race_key(loaded: LoadedModel, target: str, found: Sequence[tuple[str, str | None]]) -> dict[str, Any]:
    """What a cached race must match: the model's shape and kind, the raced formats and their versions, the CPU."""
    import torch

    from cramkit import backends
    from cramkit.doctor import FLAGS, cpu_name
    from cramkit.runtime import cpu_bf16, cpu_cores, cpu_flags

    cfg = loaded.config
    shape = {k: getattr(cfg, k, None) for k in ("layers", "hidden", "heads", "intermediate", "vocab_size")}
    versions: dict[str, str] = {"torch": torch.__version__}
    for fmt in sorted({f for f, _ in found}):
        versions.update(backends.get(fmt).versions())
    flags = sorted(set(FLAGS) & cpu_flags())
    return {
        "target": target,
        "kind": loaded.kind,
        "architecture": loaded.architecture,
        "shape": shape,
        "formats": [label(f, q) for f, q in found],
        "versions": versions,
        "cpu": cpu_name(),
        "flags": flags,
        "bf16": cpu_bf16(),
        "cores": cpu_cores(),
    }


def key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


# ------------------------------------------------------------------------------------------ the cache


def races_path() -> Path:
    from cramkit.doctor import cache_dir

    return cache_dir() / RACES_FILE


def read_races(path: Path | None = None) -> dict[str, Any]:
    """The cached races ({} when there are none); a damaged file (over RACES_BYTES, not JSON, not an object) is
    ignored with one stderr line, and the race runs again."""
    from cramkit.io import BadJson, json_loads, json_text

    path = path or races_path()
    if not path.is_file():
        return {}
    try:
        data = json_loads(json_text(path, RACES_BYTES), max_depth=12)
        if not isinstance(data, dict):
            raise BadJson("not a JSON object")
    except (OSError, UnicodeDecodeError, BadJson) as exc:
        _say_once(path, f"the cached races {path} are damaged ({str(exc)[:120]}); ignored, racing again")
        return {}
    return data


def _say_once(path: Path, msg: str) -> None:
    if path not in _SAID:
        _SAID.add(path)
        print(f"cramkit: {msg}", file=sys.stderr)


def cached(key: dict[str, Any], found: Sequence[tuple[str, str | None]]) -> dict[str, Any] | None:
    """The cached race of ``key``, when one is there and well formed (a crafted entry: one line, None)."""
    path = races_path()
    entry = read_races(path).get(key_digest(key))
    if entry is None:
        return None
    if not _well_formed(entry, key, {label(f, q) for f, q in found}):
        _say_once(path, f"the cached race for this model and CPU in {path} is malformed; ignored, racing again")
        return None
    return entry


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _well_formed(entry: Any, key: dict[str, Any], names: set[str]) -> bool:
    """A cached race as :func:`run` writes it: its key this one, its chosen candidate one raced here, every
    candidate a name, a format and either a ratio or an error."""
    if not (isinstance(entry, dict) and entry.get("key") == key and isinstance(entry.get("date"), str)):
        return False
    if not (isinstance(entry.get("threads"), list) and all(type(t) is int for t in entry["threads"])):
        return False
    rows = entry.get("candidates")
    if not isinstance(rows, list) or not all(isinstance(c, dict) for c in rows):
        return False
    for c in rows:
        if not (isinstance(c.get("name"), str) and isinstance(c.get("format"), str)):
            return False
        if not (c.get("quantize") is None or isinstance(c["quantize"], str)):
            return False
        if not (_number(c.get("ratio")) or isinstance(c.get("error"), str)):
            return False
        if c.get("agreement") is not None and not isinstance(c["agreement"], dict):
            return False
    chosen = next((c for c in rows if c["name"] == entry.get("chosen")), None)
    if chosen is None or chosen.get("error") is not None:
        return False
    return chosen["name"] in names and label(chosen["format"], chosen.get("quantize")) == chosen["name"]


def save_race(record: dict[str, Any]) -> Path:
    """Keep ``record`` in the cache (atomically), the newest RACES_KEPT races."""
    from cramkit.io import write_json_atomic

    path = races_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    known = {k: v for k, v in read_races(path).items() if isinstance(v, dict)}
    known.pop(record["digest"], None)
    known[record["digest"]] = record
    kept = dict(list(known.items())[-RACES_KEPT:])
    write_json_atomic(path, kept)
    return path


# ------------------------------------------------------------------------------------------ the texts


def race_texts(tokenize: Callable[[list[str]], Any], source: Sequence[str]) -> tuple[list[str], list[str]]:
    """Short (8-12 tokens) and long (100-128 tokens) texts cut from ``source`` (the built-in sample of real
    text an export is checked on: ``cramkit.backends.check_texts``)."""
    words = [w for text in source for w in text.split()]
    short: list[str] = []
    i = 0
    while len(short) < 32 and i + 12 <= len(words):
        for n in (7, 6, 5, 8, 9, 4):
            text = " ".join(words[i : i + n])
            if 8 <= int(tokenize([text]).lengths[0]) <= 12:
                short.append(text)
                break
        i += 9
    long: list[str] = []
    i = len(words) // 2  # other words than the short texts', where there are enough
    while len(long) < 8 and i + 60 <= len(words):
        n = 60
        while i + n <= len(words) and int(tokenize([" ".join(words[i : i + n])]).lengths[0]) < 100:
            n += 8
        text = " ".join(words[i : i + n])
        if 100 <= int(tokenize([text]).lengths[0]) <= 128:
            long.append(text)
        i += n
    if len(short) < 8 or len(long) < 2:
        raise CramkitError("the built-in sample gave too few race texts for this tokenizer")
    return short, long


def cells(target: str, short: list[str], long: list[str], cores: int) -> list[Cell]:
    threads = sorted({1, cores})
    out: list[Cell] = []
    for t in threads:
        if target == "cpu-serve":  # a server's passes: one request, or a few short ones
            out.append(Cell(f"1 short text/call @{t}", t, [short[i : i + 1] for i in range(len(short))], t))
            out.append(Cell(f"4 short texts/call @{t}", t, [short[i : i + 4] for i in range(0, len(short), 4)], t))
        else:
            out.append(Cell(f"short @{t}", t, [short]))
            out.append(Cell(f"long @{t}", t, [long]))
    return out


# ------------------------------------------------------------------------------------------ running


def _work(engine: Any) -> Callable[[list[str]], Any]:
    """What the export is used for: a classifier's logits, else embeddings."""
    if engine.kind in HEAD_KINDS and engine.can_classify:
        return engine.logits
    return engine.embed


def _open(entrants: list[Entrant], loaded: LoadedModel, threads: int) -> dict[str, Callable[[list[str]], Any]]:
    from cramkit import backends
    from cramkit.infer.engine import Engine

    runs: dict[str, Callable[[list[str]], Any]] = {}
    for e in entrants:
        if e.error is not None:
            continue
        if e.fmt is None:
            work = _work(Engine(loaded, backend="torch", device="cpu", precision="fp32"))

            def torch_run(texts: list[str], work: Callable[[list[str]], Any] = work, t: int = threads) -> Any:
                import torch

                torch.set_num_threads(t)  # (measure restores the process's own setting)
                return work(texts)

            runs[e.name] = torch_run
        else:
            runs[e.name] = _work(Engine(backends.open_export(e.path or Path(), threads=threads)))
    return runs


def _call(run: Callable[[list[str]], Any], cell: Cell, pool: Any) -> float:
    """Seconds for every call of ``cell`` (``concurrent`` at a time)."""
    start = time.perf_counter()
    if cell.concurrent > 1:
        list(pool.map(run, cell.calls))
    else:
        for texts in cell.calls:
            run(texts)
    return time.perf_counter() - start


def measure(entrants: list[Entrant], loaded: LoadedModel, plan: list[Cell], seconds: float, texts: list[str]) -> None:
    """The candidates' :func:`agreement` on ``texts`` (at one thread), then :func:`rounds` per cell, about
    ``seconds`` in all; each entrant's texts/s per cell from its fastest round (a loaded machine only slows
    rounds down)."""
    import torch

    before = torch.get_num_threads()
    try:
        _measure(entrants, loaded, plan, seconds, texts)
    finally:
        torch.set_num_threads(before)


def _measure(entrants: list[Entrant], loaded: LoadedModel, plan: list[Cell], seconds: float, texts: list[str]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    per_cell = seconds / max(1, len(plan))
    for threads in sorted({1, *(c.threads for c in plan)}):
        runs = _open(entrants, loaded, threads)
        if threads == 1:
            agreement(entrants, loaded, texts, runs)
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for cell in (c for c in plan if c.threads == threads):
                timed = {n: (lambda run=run, cell=cell: _call(run, cell, pool)) for n, run in runs.items()}
                times = rounds(timed, per_cell)
                n_texts = sum(len(c) for c in cell.calls)
                for e in entrants:
                    if e.name in times:
                        # the fastest round: another process's load only ever slows a round down
                        e.rates[cell.name] = round(n_texts / min(times[e.name]), 2)
                        e.rounds[cell.name] = len(times[e.name])


def rounds(
    timed: Mapping[str, Callable[[], float]],
    seconds: float,
    clock: Callable[[], float] = time.perf_counter,
    contend: float | None = CONTEND,
) -> dict[str, list[float]]:
    """Interleaved rounds of ``timed`` (each call returns its own seconds), the order rotated each round, about
    ``seconds`` in all: every entrant runs twice (the first is its warm-up, kept: only the fastest round counts),
    then only the contenders go on, those whose fastest round is within ``CONTEND`` of the best's (the baseline,
    never chosen, stops there), to at least ``MIN_ROUNDS`` each while more than one is left. A loaded machine only
    slows a round down, so an entrant half again slower than the best in its fastest of two rounds is not going to
    be the fastest: the race's time goes to the ones that can. ``contend=None``: no one drops out (a comparison of
    speeds, not a choice), every entrant runs at least ``MIN_ROUNDS``."""
    names = list(timed)
    times: dict[str, list[float]] = {n: [] for n in names}
    alive, start, n = names, clock(), 0
    while True:
        for name in alive[n % len(alive) :] + alive[: n % len(alive)]:
            times[name].append(timed[name]())
        n += 1
        if n < 2:
            continue
        if contend is not None:
            best = min((min(times[x]) for x in alive if x != BASELINE), default=0.0)
            alive = [x for x in alive if x != BASELINE and min(times[x]) <= best * contend]
        if len(alive) <= 1 or n >= MAX_ROUNDS or (n >= MIN_ROUNDS and clock() - start >= seconds):
            return times


def agreement(
    entrants: list[Entrant], loaded: LoadedModel, texts: list[str], runs: dict[str, Callable[[list[str]], Any]]
) -> None:
    """Each candidate's outputs against the fp32 torch model's on ``texts``: embeddings by cosine, a classifier's
    probabilities by their largest difference (a regression's outputs relative to their scale)."""
    import numpy as np

    from cramkit.infer.engine import probabilities

    ref = np.asarray(runs[BASELINE](texts), dtype=np.float64)
    for e in entrants:
        if e.fmt is None or e.name not in runs:
            continue
        got = np.asarray(runs[e.name](texts), dtype=np.float64)
        if loaded.kind in HEAD_KINDS and got.shape == ref.shape and loaded.kind != "regression":
            pa, pb = probabilities(loaded.kind, ref), probabilities(loaded.kind, got)
            assert pa is not None and pb is not None
            worst = float(np.abs(pa - pb).max())
            e.agreement = {
                "prob_max_diff": round(worst, 5),
                "label_agreement": float((pa.argmax(1) == pb.argmax(1)).mean()),
            }
            e.agrees = worst <= AGREE_PROB
        elif loaded.kind == "regression" and got.shape == ref.shape:
            worst = float(np.abs(ref - got).max() / max(1.0, float(np.abs(ref).max())))
            e.agreement = {"relative_max_diff": round(worst, 5)}
            e.agrees = worst <= AGREE_PROB
        else:
            norms = np.maximum(np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1), 1e-12)
            cos = (ref * got).sum(1) / norms
            e.agreement = {"cosine_mean": round(float(cos.mean()), 5), "cosine_min": round(float(cos.min()), 5)}
            e.agrees = bool(cos.mean() >= AGREE_COSINE)


# ------------------------------------------------------------------------------------------ the race


class NoRace(Exception):
    """The race cannot run here (the reason in words): the rules from the CPU's flags decide."""


def wanted(race: bool | None) -> tuple[bool | None, str]:
    """Whether to race: True (always, the cache ignored), False (never), None (a matching cached race is
    reused); from ``race`` (--race/--no-race), else the environment (CRAMKIT_RACE=1/0). And where it came from."""
    if race is not None:
        return race, "--race" if race else "--no-race"
    env = os.environ.get(RACE_ENV, "").strip()
    if env in ("0", "1"):
        return env == "1", f"{RACE_ENV}={env}"
    if env:
        raise CramkitError(f"{RACE_ENV} must be 1 (always race) or 0 (never: the CPU flags' rule), got {env[:40]!r}")
    return None, ""


def _budget() -> float:
    raw = os.environ.get(SECONDS_ENV, "").strip()
    try:
        seconds = float(raw) if raw else RACE_SECONDS
    except ValueError:
        raise CramkitError(f"{SECONDS_ENV} must be a number of seconds, got {raw[:40]!r}") from None
    if not 0 < seconds <= 600:
        raise CramkitError(f"{SECONDS_ENV} must be from 0 to 600 seconds, got {raw[:40]!r}")
    return seconds


def pick(loaded: LoadedModel, target: str, race: bool | None = None) -> tuple[str, str | None, dict[str, Any]]:
    """(format, quantize, the race's record) for ``target``, by a race on this machine or a matching cached
    one; :class:`NoRace` where the race cannot run (the caller falls back to the CPU flags' rule)."""
    mode, why = wanted(race)
    if mode is False:
        raise NoRace(why)
    found, skipped = candidates(loaded)
    if len(found) < 2:
        only = label(*found[0]) if found else "no export format"
        raise NoRace(f"only {only} is installed and can hold this model, nothing to race")
    key = race_key(loaded, target, found)
    if mode is None:
        entry = cached(key, found)
        if entry is not None:
            print(f"cramkit: --target {target}: {ratios(entry)}; {reused(entry)}", file=sys.stderr)
            return _chosen(entry) + ({**entry, "reused": True},)
    try:
        record = run(loaded, target, found, skipped, key)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # a race that fails must not fail the export: the rules decide, said in one line
        raise NoRace(f"the race failed ({type(exc).__name__}: {str(exc)[:160]})") from None
    try:
        save_race(record)
    except (OSError, CramkitError) as exc:
        print(f"cramkit: the race was not cached ({str(exc)[:160]})", file=sys.stderr)
    print(f"cramkit: --target {target}: {ratios(record)}; {raced(record)}", file=sys.stderr)
    return _chosen(record) + ({**record, "reused": False},)


def _chosen(record: dict[str, Any]) -> tuple[str, str | None]:
    entry = next(c for c in record["candidates"] if c["name"] == record["chosen"])
    return str(entry["format"]), entry.get("quantize")


def run(
    loaded: LoadedModel,
    target: str,
    found: Sequence[tuple[str, str | None]],
    skipped: dict[str, str],
    key: dict[str, Any],
) -> dict[str, Any]:
    """Export every candidate to a temporary directory, check it against the fp32 torch model, race it; the
    record (raises when no candidate agrees)."""
    from cramkit import backends
    from cramkit.infer.engine import Engine, compare_outputs
    from cramkit.runtime import cpu_cores

    start = time.perf_counter()
    seconds = _budget()
    loaded.model.to("cpu").eval()
    print(
        f"cramkit: --target {target}: racing {', '.join(label(f, q) for f, q in found)} and {BASELINE} on this CPU "
        f"(each exported, then about {seconds:g} s of forward passes)",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="cramkit-race-") as tmp:
        entrants = [Entrant(BASELINE, None, None)]
        sample = backends.check_texts()  # the texts every export is checked on (read once here)
        reference: dict[str, Any] = {}  # the fp32 torch model's outputs on them, computed for the first check only
        for fmt, quantize in found:
            where = Path(tmp) / label(fmt, quantize).replace(" ", "-")
            e = Entrant(label(fmt, quantize), fmt, quantize, where)
            try:
                backends.write_export(
                    fmt,
                    loaded,
                    where,
                    quantize,
                    compare=partial(compare_outputs, reference=reference),
                    texts=sample,
                    progress=False,
                )
            except CramkitError as exc:  # e.g. bf16 not faithful enough: out of the race, said in the record
                e.error = str(exc)[:300]
            entrants.append(e)
        exported = time.perf_counter()
        probe = Engine(loaded, backend="torch", device="cpu", precision="fp32")
        short, long = race_texts(probe.tokenize, sample)
        plan = cells(target, short, long, cpu_cores())
        measure(entrants, loaded, plan, seconds, short + long)
    score(entrants, plan)
    fit = [e for e in entrants if e.fmt is not None and e.error is None and e.agrees]
    if not fit:
        raise CramkitError("no candidate's outputs agreed with the fp32 torch model")
    best = max(fit, key=lambda e: e.score)
    return {
        "target": target,
        "digest": key_digest(key),
        "key": key,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "seconds": round(time.perf_counter() - exported, 1),
        "export_seconds": round(exported - start, 1),
        "threads": sorted({c.threads for c in plan}),
        "cells": {
            c.name: {"threads": c.threads, "texts": sum(len(x) for x in c.calls), "per_call": len(c.calls[0])}
            for c in plan
        },
        "agree_when": {"cosine_mean_at_least": AGREE_COSINE, "prob_max_diff_at_most": AGREE_PROB},
        "candidates": [
            {
                "name": e.name,
                "format": e.fmt or "torch",
                "quantize": e.quantize,
                "texts_per_s": e.rates,
                "rounds": e.rounds,
                "ratio": round(e.score / best.score, 3) if e.error is None else None,
                "agreement": e.agreement,
                "agrees": e.agrees if e.error is None else None,
                "error": e.error,
            }
            for e in entrants
        ],
        "skipped": skipped,
        "chosen": best.name,
    }


def score(entrants: list[Entrant], plan: list[Cell]) -> None:
    """Each entrant's geometric mean over the cells of its texts/s as a share of the cell's fastest."""
    import math

    for e in entrants:
        if e.error is not None or not e.rates:
            continue
        shares = [e.rates[c.name] / max(x.rates.get(c.name, 0.0) for x in entrants) for c in plan]
        e.score = math.exp(sum(math.log(max(s, 1e-9)) for s in shares) / len(shares))


def ratios(record: dict[str, Any]) -> str:
    """The chosen one first (1.00x), then every other by its ratio, fastest first: one line's words."""
    chosen = record["chosen"]
    rest = sorted(
        (c for c in record["candidates"] if c["name"] != chosen),
        key=lambda c: -(c.get("ratio") or 0.0),
    )
    parts = [f"{chosen} (1.00x)"]
    for c in rest:
        if c.get("error"):
            parts.append(f"{c['name']} failed to export")
            continue
        word = f"{c['name']} {c['ratio']:.2f}x"
        if c.get("agrees") is False:
            agree = c.get("agreement") or {}
            shown = ", ".join(f"{k} {v}" for k, v in agree.items() if k != "label_agreement")
            word += f" (disagrees with fp32: {shown})"
        parts.append(word)
    return ", ".join(parts)


def _where(record: dict[str, Any]) -> str:
    key = record["key"]
    threads = " and ".join(str(t) for t in record["threads"])
    return f"on {key['cpu']} ({' '.join(key['flags']) or 'no AVX2'}), {threads} thread{'s' if threads != '1' else ''}"


def raced(record: dict[str, Any]) -> str:
    return f"raced {record['seconds']:.1f} s (exports {record['export_seconds']:.1f} s) {_where(record)}"


def reused(record: dict[str, Any]) -> str:
    return f"the cached race of {record.get('date', '?')} {_where(record)} (in {races_path()}; --race runs it again)"
