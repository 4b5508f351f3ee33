"""The label words' prior (issue 49): a zero-shot teacher for self-training, from the backbone's sentence embeddings.

Each class gets a description (``recipes/label_prior.py``: the task's prompt with its text left out and the mask
filled by the class's label word, SST-2's "It was terrible ." / "It was great .", or the user's own, ``prior``
``LABEL=TEXT,...``). A row's logits are its embedding's cosines with the descriptions, calibrated by one
temperature fitted on every labelled row (the training rows and the selection dev rows: the prior never trained on
them, so they are honest evidence); the temperature never changes its answer.

This is PET's use of label words (their knowledge before any fine-tuning) for a sentence encoder, which has no MLM
head to score a word at a mask: on SST-2 at K=16 from all-MiniLM-L6-v2 the descriptions alone score 71.2% on the
test split, ahead of every method trained on the 32 labels (67.5 ± 4.1 for the head), and averaged with the head
73.5 ± 1.6 over 5 splits (bench/RESULTS.md, 2026-11-29). Averaged with the trained teachers (half the weight), it
labels the unlabelled rows; a prior no better than chance on the labelled rows is left out, and said so.

A task that pairs two texts (MRPC's paraphrases) has no description of a class, but a sentence encoder's own
question is its answer: how alike are the two texts? Its prior is the cosine of their embeddings, Platt-scaled on
the labelled rows (a slope and an offset: which class the alike pairs are, and from where), for a task of two
classes. On MRPC at K=16 it scores 78.1 ± 2.6 F1 on the dev pairs over 5 splits, ahead of the head trained on the
same 32 rows (67.8 ± 8.1) and of the student self-trained with it (75.6 ± 3.8; bench/RESULTS.md, 2026-11-29).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cramkit.loading import LoadedModel
from cramkit.recipes.finetune_config import FinetuneConfig
from cramkit.recipes.label_prior import CALIBRATION_ROWS, prior_spec
from cramkit.tasks.registry import Task

STEP_ROWS = 512  # rows embedded per call: the progress line's step


def embed_rows(engine: Any, texts: list[str], root: Path, which: str = "a", progress: bool = True) -> np.ndarray:
    """The backbone's unit-length sentence embeddings of ``texts`` [n, width], float32, computed once into
    ``root``/embeddings-KEY-``which``.npy (KEY the engine's model and input length; renamed into place when
    complete; read back only when its size, shape, dtype and values check out, else computed again): the label
    words' prior and the neighbours' labels (``distill/neighbours.py``) read the same vectors."""
    from cramkit.distillation.teacher import teacher_key
    from cramkit.io import atomic_path
    from cramkit.progress import Progress

    cache = root / f"embeddings-{teacher_key(engine.loaded, engine.max_length)}-{which}.npy"
    if cache.is_file():
        vectors = _cached(cache, engine, texts)
        if vectors is not None:
            return vectors
    parts = []
    bar = Progress("embeddings", len(texts), unit="rows", enabled="auto" if progress else False, leave=False)
    for i in range(0, len(texts), STEP_ROWS):
        parts.append(np.asarray(engine.embed(texts[i : i + STEP_ROWS], normalize=True), np.float32))
        bar.update(len(texts[i : i + STEP_ROWS]))
    bar.close()
    vectors = np.concatenate(parts) if parts else np.zeros((0, 1), np.float32)
    cache.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(cache) as tmp, open(tmp, "wb") as fh:
        np.save(fh, vectors, allow_pickle=False)
    return vectors


def _cached(cache: Path, engine: Any, texts: list[str]) -> np.ndarray | None:
    """The vectors of ``cache`` when it holds one unit-length, finite float32 row per text, as wide as the
    engine's (one text embedded to know it; :func:`cramkit.readback.read_array` checks the header against the
    size first); else None, the bad file removed and said in one line, to be computed again."""
    from cramkit.readback import BadCache, read_array, rebuilding

    width = int(np.asarray(engine.embed(texts[:1], normalize=True)).shape[-1]) if texts else None
    try:
        vectors = read_array(cache, rows=len(texts), width=width, mmap=False)
        norms = np.linalg.norm(vectors, axis=1) if len(vectors) else np.zeros(0)
        if len(norms) and float(norms.max()) > 1.001:
            raise BadCache(f"{cache} holds vectors longer than 1, and it keeps unit-length ones")
    except BadCache as exc:
        rebuilding(cache, str(exc), "embedding cache")
        cache.unlink(missing_ok=True)
        return None
    return vectors


def backbone_engine(loaded: LoadedModel, cfg: FinetuneConfig) -> tuple[Any, str]:
    """The inference engine over the backbone's sentence embeddings, or None and why (a model without them)."""
    from cramkit.infer.engine import Engine

    engine = Engine(loaded, device=cfg.device, max_length=min(cfg.max_length, loaded.max_length))
    if not engine.can_embed:
        return None, f"{loaded.source} gives no sentence embeddings"
    return engine, ""


def _raw(engine: Any, anchors: np.ndarray | None, pairs: list[tuple[str, str | None]]) -> np.ndarray:
    """Each row's cosines with the descriptions [n, classes], or of its two texts [n, 1] (anchors None)."""
    a = engine.embed([x for x, _ in pairs], normalize=True)
    if anchors is not None:
        return np.asarray(a @ anchors.T, np.float32)
    b = engine.embed([y or "" for _, y in pairs], normalize=True)
    return np.asarray((a * b).sum(1, keepdims=True), np.float32)


def _fit(raw: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """The calibration of the raw cosines on the labelled rows: a temperature (descriptions: it never changes the
    answer), or Platt's slope and offset (a pair's cosine: they choose the class and the boundary)."""
    from cramkit.recipes.calibrate import fit_platt, fit_temperature

    if raw.shape[1] == 1:
        slope, offset = fit_platt(raw[:, 0], y)
        return {"slope": round(slope, 6), "offset": round(offset, 6)}
    return {"temperature": round(fit_temperature(raw, y), 6)}


def _logits(raw: np.ndarray, fit: dict[str, float]) -> np.ndarray:
    if "temperature" in fit:
        return raw.astype(np.float64) / fit["temperature"]
    z = fit["slope"] * raw.astype(np.float64) + fit["offset"]
    return np.concatenate([np.zeros_like(z), z], 1)


def prior_probs(
    loaded: LoadedModel,
    task: Task,
    rows: list[tuple[str, str | None]],
    cfg: FinetuneConfig,
    root: Path,
    pair: bool,
    progress: bool = True,
) -> tuple[np.ndarray | None, dict[str, Any]]:
    """The prior's calibrated probabilities over ``rows`` (None when there is none or it is no better than chance
    on the labelled rows) and what it was: its kind, descriptions, calibration, its accuracy on the labelled rows."""
    from cramkit.recipes.calibrate import softmax

    spec, why = prior_spec(task, cfg, pair)
    if spec is None:
        return None, {"used": False, "why": why}
    engine, why = backbone_engine(loaded, cfg)
    if engine is None:
        return None, {"used": False, "why": why}
    desc = spec.descriptions
    anchors = None if desc is None else engine.embed(list(desc.values()), normalize=True)
    labelled = [e for s in [task.train_split, *task.selection_splits[:1]] if s for e in task.examples(s)]
    labelled = labelled[:CALIBRATION_ROWS]
    y = np.asarray([int(e.label) for e in labelled])  # type: ignore[arg-type]
    raw = _raw(engine, anchors, [(e.text_a, e.text_b) for e in labelled])
    fit = _fit(raw, y)
    right = float((_logits(raw, fit).argmax(1) == y).mean())
    classes = len(desc) if desc is not None else 2
    chance = max(1.0 / classes, float(np.bincount(y, minlength=classes).max() / max(len(y), 1)))
    info: dict[str, Any] = {
        "kind": spec.kind,
        **({"descriptions": desc} if desc is not None else {}),
        "source": spec.source,
        **fit,
        "labelled_rows": len(y),
        "labelled_accuracy": round(right, 4),
    }
    if right <= chance:  # above it, the calibration weighs the prior by what the labelled rows say of it
        why = f"it answers {right:.0%} of the {len(y)} labelled rows right, no better than chance ({chance:.0%})"
        return None, {**info, "used": False, "why": why}
    a = embed_rows(engine, [x for x, _ in rows], root, "a", progress)
    if anchors is not None:
        raw_rows = np.asarray(a @ anchors.T, np.float32)
    else:
        b = embed_rows(engine, [y or "" for _, y in rows], root, "b", progress)
        raw_rows = np.asarray((a * b).sum(1, keepdims=True), np.float32)
    return softmax(_logits(raw_rows, fit)).astype(np.float32), {**info, "used": True}
