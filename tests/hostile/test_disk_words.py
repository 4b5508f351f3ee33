"""What a full disk looks like from each library, and that cramkit reads each as a full disk (the one line a
full disk gives names the disk, not a library's words): errno, safetensors' Rust message, numpy's short write."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from cramkit.errors import CramkitError
from cramkit.io import disk_errors, disk_problem


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.ENOSPC, "No space left on device", "/data/x.npy"),
        RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
        OSError("10731 requested and 2544 written"),  # numpy's np.save / tofile on a full disk
    ],
)
def test_every_librarys_full_disk_is_read_as_one(exc: BaseException) -> None:
    assert disk_problem(exc) and "no space left" in disk_problem(exc).lower()


def test_other_errors_are_not_a_full_disk() -> None:
    assert disk_problem(OSError("1 requested")) is None and disk_problem(ValueError("bad shape")) is None


def test_a_short_numpy_write_becomes_one_line(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    def short(*a, **k):
        raise OSError("10731 requested and 2544 written")

    monkeypatch.setattr(np, "save", short)
    with pytest.raises(CramkitError, match="no space left"), disk_errors(tmp_path / "out"):
        np.save(tmp_path / "out" / "x.npy", np.zeros(3))
