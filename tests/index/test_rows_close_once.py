"""An index's vectors are read through one file descriptor (index/checks.py ``Rows``), closed exactly once. A
``vectors.npy`` refused for its size once closed its descriptor twice (in the refusal and again when the object
was collected), closing whatever had reused that number meanwhile: in CI, pytest's own capture file, which failed
every later test of that worker."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np

from cramkit.errors import CramkitError
from cramkit.index.checks import MappedFiles, Rows


def _short_vectors(tmp_path: Path) -> Path:
    path = tmp_path / "vectors.npy"
    np.save(path, np.ones((10, 4), dtype=np.float32))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8)  # two floats short
    return path


def test_a_refused_file_closes_its_descriptor_once(tmp_path: Path) -> None:
    bad = _short_vectors(tmp_path)
    try:
        Rows(bad)
    except CramkitError as exc:
        held = exc.__traceback__  # keeps the refused Rows alive (as a traceback shown later would)
        assert "not the size of its" in str(exc)
    other = os.open(tmp_path / "other.txt", os.O_CREAT | os.O_RDWR)  # reuses the number the refusal freed
    del held
    gc.collect()  # the refused Rows goes here: it must not close `other`
    os.fstat(other)  # OSError (EBADF) if it was closed
    os.close(other)


def test_rows_and_mapped_files_close_once(tmp_path: Path) -> None:
    path = tmp_path / "vectors.npy"
    np.save(path, np.arange(40, dtype=np.float32).reshape(10, 4))
    rows = Rows(path)
    assert rows[3].tolist() == [12.0, 13.0, 14.0, 15.0] and len(rows) == 10
    rows.close()
    rows.close()  # a second close is nothing
    kept = os.open(tmp_path / "kept.txt", os.O_CREAT | os.O_RDWR)
    del rows
    mapped = MappedFiles({path: os.path.getsize(path)})
    mapped.check()
    mapped.close()
    mapped.close()  # once
    del mapped
    gc.collect()
    os.fstat(kept)
    os.close(kept)
