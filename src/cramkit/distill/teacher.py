"""The teacher's logits over the transfer set, computed once and cached on disk (memory-mapped).

``teacher-KEY.partial.npy`` (a float32 ``[rows, outputs]`` array made with ``np.lib.format.open_memmap``)
fills in chunks; after each chunk is flushed, ``teacher-KEY.progress.json`` records how many rows are
done, so an interrupted run resumes from there. When every row is done the array is renamed
``teacher-KEY.npy``: only a complete cache carries the final name. It is read back memory-mapped with
``np.load(mmap_mode="r")`` (no pickle).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.errors import CramkitError
from cramkit.io import json_loads, open_memmap, write_json_atomic
from cramkit.load import LoadedModel


def teacher_key(teacher: LoadedModel, max_length: int) -> str:
    """A short fingerprint of the teacher's weights and the input length it reads."""
    digest = teacher.weights_digest()
    if digest is None:  # weights elsewhere: fingerprint the tensors themselves
        h = hashlib.sha256()
        for name, t in sorted(teacher.model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().float().cpu().numpy().tobytes())
        digest = h.hexdigest()
    return hashlib.sha256(f"{digest}:{max_length}".encode()).hexdigest()[:16]


def load_cached(root: Path, key: str) -> np.ndarray | None:
    path = Path(root) / f"teacher-{key}.npy"
    if not path.is_file():
        return None
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:  # a damaged or crafted file (object arrays would need pickle)
        raise CramkitError(f"{path} is not a float32 .npy array ({exc}); delete it to recompute") from None
    if arr.dtype != np.float32 or arr.ndim != 2:
        raise CramkitError(f"{path} holds {arr.dtype} {arr.shape}, not float32 [rows, outputs]; delete it")
    return arr


def teacher_logits(
    teacher: LoadedModel,
    inputs_a: list[str],
    inputs_b: list[str | None],
    root: Path,
    *,
    max_length: int,
    chunk: int = 4096,
    device: str = "auto",
    progress: bool = True,
) -> tuple[np.ndarray, dict[str, Any]]:
    """The teacher's logits ``[n, outputs]`` for the inputs, from ``root``'s cache or computed (and
    resumed) there. Returns the read-only memmap and what was done (rows computed, seconds)."""
    import time

    from cramkit.infer.engine import Engine
    from cramkit.progress import Progress

    root = Path(root)
    key = teacher_key(teacher, max_length)
    done_path = root / f"teacher-{key}.npy"
    cached = load_cached(root, key)
    n = len(inputs_a)
    if cached is not None:
        if cached.shape[0] != n:
            raise CramkitError(f"{done_path} holds {cached.shape[0]} rows, the transfer set {n}; delete it")
        return cached, {"cached": True, "rows_computed": 0, "seconds": 0.0}
    outputs = teacher.num_labels or 1
    part = root / f"teacher-{key}.partial.npy"
    state_path = root / f"teacher-{key}.progress.json"
    start = 0
    if part.is_file() and state_path.is_file():
        try:
            state = json_loads(state_path.read_text(encoding="utf-8"))
            arr = np.lib.format.open_memmap(part, mode="r+")
            if arr.shape == (n, outputs) and arr.dtype == np.float32:
                start = int(state.get("done", 0))
            else:
                del arr
                start = 0
        except (OSError, ValueError):
            start = 0
    if start == 0:
        arr = open_memmap(part, np.float32, (n, outputs))
        write_json_atomic(state_path, {"done": 0, "rows": n})
    engine = Engine(teacher, device=device, max_length=max_length)
    t0 = time.perf_counter()
    with Progress("teacher logits", n, unit="rows", initial=start, enabled="auto" if progress else False) as bar:
        for s in range(start, n, chunk):
            e = min(n, s + chunk)
            batch = [a if b is None else (a, b) for a, b in zip(inputs_a[s:e], inputs_b[s:e], strict=True)]
            arr[s:e] = engine.logits(batch)
            arr.flush()
            write_json_atomic(state_path, {"done": e, "rows": n})
            bar.update(e - s)
    seconds = time.perf_counter() - t0
    del arr
    os.replace(part, done_path)
    state_path.unlink(missing_ok=True)
    got = load_cached(root, key)
    assert got is not None
    return got, {
        "cached": False,
        "resumed_from": start,
        "rows_computed": n - start,
        "seconds": round(seconds, 3),
        "examples_per_s": round((n - start) / max(1e-9, seconds), 1),
    }
