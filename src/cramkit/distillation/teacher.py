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
from cramkit.io import open_memmap, write_json_atomic
from cramkit.loading import LoadedModel


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


LOGIT_BOUND = 1e6  # a logit over this in magnitude is no model's answer: the cache is damaged or crafted


def load_cached(root: Path, key: str, rows: int | None = None, outputs: int | None = None) -> np.ndarray | None:
    """The complete cache ``teacher-KEY.npy`` of ``root`` (read-only, memory-mapped), checked before use
    (:func:`cramkit.readback.read_array`: its header against its size, ``rows`` x ``outputs`` float32, every
    logit finite); None when there is none, or when it is bad: then it is removed, said in one line, and the
    caller computes it again."""
    from cramkit.readback import BadCache, read_array, rebuilding

    path = Path(root) / f"teacher-{key}.npy"
    if not path.is_file():
        return None
    try:
        return read_array(path, rows=rows, width=outputs, bound=LOGIT_BOUND)
    except BadCache as exc:
        rebuilding(path, str(exc), "teacher's label cache")
        path.unlink(missing_ok=True)
        return None


def _resume_from(part: Path, state_path: Path, n: int, outputs: int) -> int:
    """The rows of an interrupted labelling that are done and may be kept: its progress record and its partial
    array checked (:mod:`cramkit.readback`: sizes, shape, dtype, ``0 <= done <= n``, the rows said done finite
    and written); 0 (start over, said in one line when they were bad) otherwise."""
    from cramkit.readback import BadCache, check_values, npy_header, read_progress, rebuilding

    if not (part.is_file() and state_path.is_file()):
        return 0
    try:
        done = read_progress(state_path, n)
        shape, dtype, _ = npy_header(part)
        if shape != (n, outputs) or dtype != np.float32:
            raise BadCache(f"{part} holds {dtype} {shape!r:.80}, not float32 ({n}, {outputs})")
        arr = np.load(part, mmap_mode="r", allow_pickle=False)
        check_values(arr, part, LOGIT_BOUND, upto=done)
        for s in range(0, done, 1 << 16):  # a row said done but never written (all zeros) is not done
            if not np.asarray(arr[s : min(done, s + (1 << 16))]).any(axis=1).all():
                raise BadCache(f"{state_path} says {done:,} rows are done, but {part.name} holds unwritten rows")
        del arr
    except BadCache as exc:
        rebuilding(part, str(exc), "teacher's unfinished labels")
        return 0
    return done


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
    from cramkit.readback import BadCache, read_array

    root = Path(root)
    key = teacher_key(teacher, max_length)
    done_path = root / f"teacher-{key}.npy"
    n, outputs = len(inputs_a), teacher.num_labels or 1
    cached = load_cached(root, key, n, outputs)
    if cached is not None:
        return cached, {"cached": True, "rows_computed": 0, "seconds": 0.0}
    part = root / f"teacher-{key}.partial.npy"
    state_path = root / f"teacher-{key}.progress.json"
    start = _resume_from(part, state_path, n, outputs)
    if start:
        arr = np.lib.format.open_memmap(part, mode="r+")
    else:
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
    try:
        got = read_array(done_path, rows=n, width=outputs, bound=LOGIT_BOUND)
    except BadCache as exc:  # what the teacher answered itself: its weights, not the cache, are at fault
        done_path.unlink(missing_ok=True)
        raise CramkitError(
            f"{teacher.source} labelled the rows with unusable logits ({exc}); check its weights"
        ) from None
    return got, {
        "cached": False,
        "resumed_from": start,
        "rows_computed": n - start,
        "seconds": round(seconds, 3),
        "examples_per_s": round((n - start) / max(1e-9, seconds), 1),
    }
