"""The label words' prior (issue 49): a zero-shot teacher for self-training, from the backbone's sentence embeddings.

Each class gets a description, the task's prompt with its text left out and the mask filled by the class's label
word (SST-2's built-in ``{text_a} It was [MASK] .`` with terrible/great: "It was terrible ." / "It was great ."),
or the user's own (``self_train_prior`` ``LABEL=TEXT,...``). A row's logits are its embedding's cosines with the
descriptions, calibrated by one temperature fitted on every labelled row (the training rows and the selection dev
rows: the prior never trained on them, so they are honest evidence); the temperature never changes its answer.

This is PET's use of label words (their knowledge before any fine-tuning) for a sentence encoder, which has no MLM
head to score a word at a mask: on SST-2 at K=16 from all-MiniLM-L6-v2 the descriptions alone score 71.2% on the
test split, ahead of every method trained on the 32 labels (67.5 ± 4.1 for the head), and averaged with the head
73.5 ± 1.6 over 5 splits (bench/RESULTS.md, 2026-11-29). Averaged with the trained teachers (half the weight), it
labels the unlabelled rows; a prior no better than chance on the labelled rows is left out, and said so.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.data.prompts import MASK
from cramkit.errors import CramkitError
from cramkit.load import LoadedModel
from cramkit.recipes.finetune_config import FinetuneConfig
from cramkit.tasks.registry import Task

CALIBRATION_ROWS = 2000  # labelled rows the temperature is fitted on, at most


def descriptions(task: Task, cfg: FinetuneConfig, pair: bool) -> tuple[dict[str, str] | None, str]:
    """{label: description} for the task's classes and where they come from; (None, why) without a prior."""
    from cramkit.data.prompts import parse_label_words
    from cramkit.tasks.prompts import builtin_prompt

    setting = str(cfg.self_train_prior).strip()
    names = [str(x) for x in (task.labels or [])]
    if setting == "none":
        return None, "self_train_prior none"
    if setting == "auto":
        builtin = builtin_prompt(task.name)
        if builtin is None:
            return None, f"task {task.name} has no built-in label words (give self_train_prior LABEL=TEXT,...)"
        template, words = builtin
        if pair or "{text_b}" in template:
            return None, f"task {task.name} pairs two texts; the label words' prior describes one"
        out = {label: _fill(template, word) for label, word in words.items()}
        source = "the built-in prompt"
    else:
        if pair:
            raise CramkitError(
                f"self_train_prior: task {task.name} pairs two texts; descriptions of its classes score one text "
                "(use self_train_prior none)"
            )
        out = parse_label_words(setting, "self_train_prior")
        source = "self_train_prior"
    if names and set(out) != set(names):
        raise CramkitError(
            f"self_train_prior: the descriptions name labels {sorted(out)}, task {task.name} has {names}; give one "
            "LABEL=TEXT per label"
        )
    return {label: out[label] for label in (names or sorted(out))}, source


def _fill(template: str, word: str) -> str:
    text = re.sub(r"\{[a-z_]+\}", " ", template).replace(MASK, word)
    return " ".join(text.split())


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
    on the labelled rows) and what it was: descriptions, temperature, its accuracy on the labelled rows."""
    from cramkit.distill.calibrate import fit_temperature, softmax
    from cramkit.distill.teacher import teacher_key
    from cramkit.infer.engine import Engine
    from cramkit.io import atomic_path

    desc, source = descriptions(task, cfg, pair)
    if desc is None:
        return None, {"used": False, "why": source}
    engine = Engine(loaded, device=cfg.device, max_length=min(cfg.max_length, loaded.max_length))
    if not engine.can_embed:
        return None, {"used": False, "why": f"{loaded.source} gives no sentence embeddings"}
    names = list(desc)
    anchors = engine.embed(list(desc.values()), normalize=True)
    labelled = [e for s in [task.train_split, *task.selection_splits[:1]] if s for e in task.examples(s)]
    labelled = labelled[:CALIBRATION_ROWS]
    y = np.asarray([int(e.label) for e in labelled])  # type: ignore[arg-type]
    cos = engine.embed([e.text_a for e in labelled], normalize=True) @ anchors.T
    scale = fit_temperature(cos, y)
    right = float((cos.argmax(1) == y).mean())
    chance = 1.0 / len(names)
    info: dict[str, Any] = {
        "descriptions": desc,
        "source": source,
        "temperature": round(scale, 6),
        "labelled_rows": len(y),
        "labelled_accuracy": round(right, 4),
    }
    if right <= chance:  # above it, the temperature weighs the prior by what the labelled rows say of it
        why = f"it answers {right:.0%} of the {len(y)} labelled rows right, no better than chance ({chance:.0%})"
        return None, {**info, "used": False, "why": why}
    key = hashlib.sha256(
        f"{teacher_key(loaded, engine.max_length)}:{sorted(desc.items())}:{len(rows)}".encode()
    ).hexdigest()[:16]
    cache = root / f"prior-{key}.npy"
    if cache.is_file():
        try:
            cos_rows = np.load(cache, allow_pickle=False)
        except (ValueError, OSError) as exc:  # a damaged or crafted file (an object array would need pickle)
            raise CramkitError(f"{cache} is not a float32 .npy array ({exc}); delete it to recompute") from None
    else:
        from tqdm import tqdm

        parts = []
        bar = tqdm(total=len(rows), desc="label words' prior", unit="row", disable=not progress, leave=False)
        for i in range(0, len(rows), 512):
            parts.append(engine.embed([a for a, _ in rows[i : i + 512]], normalize=True) @ anchors.T)
            bar.update(len(rows[i : i + 512]))
        bar.close()
        cos_rows = np.concatenate(parts) if parts else np.zeros((0, len(names)), np.float32)
        root.mkdir(parents=True, exist_ok=True)
        with atomic_path(cache) as tmp, open(tmp, "wb") as fh:
            np.save(fh, cos_rows.astype(np.float32), allow_pickle=False)
    if cos_rows.dtype != np.float32 or cos_rows.shape != (len(rows), len(names)):
        raise CramkitError(
            f"{cache} holds {cos_rows.dtype} {cos_rows.shape}, not float32 [{len(rows)}, {len(names)}]; delete it"
        )
    return softmax(cos_rows, scale).astype(np.float32), {**info, "used": True}
