"""A writer never renames over what is not a regular file (issue 66, case 2): a FIFO given as ``--out`` or
``--json`` is written through (its reader gets the bytes, the FIFO stays a FIFO), /dev/full is one line ("no
space left on the device") and stays a character device."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from clirun import cli, one_line

DOCTOR = ("doctor", "--hidden", "16", "--intermediate", "32", "--tokens", "16", "--seconds", "0.01", "--no-save")


class Reader:
    """Reads a FIFO to its end in a thread (the writer's open waits for it)."""

    def __init__(self, fifo: Path) -> None:
        self.data = b""
        self.thread = threading.Thread(target=self._read, args=(fifo,), daemon=True)
        self.thread.start()

    def _read(self, fifo: Path) -> None:
        with open(fifo, "rb") as f:
            self.data = f.read()

    def text(self) -> str:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the FIFO was never written and closed"
        return self.data.decode("utf-8")


def _fifo(tmp_path: Path, name: str) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / name
    os.mkfifo(path)
    return path


def test_doctor_json_to_a_fifo(tmp_path) -> None:
    fifo = _fifo(tmp_path, "figures.json")
    reader = Reader(fifo)
    proc = cli(*DOCTOR, "--json", fifo)
    assert proc.returncode == 0, proc.stderr
    assert isinstance(json.loads(reader.text()), dict)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures.json"]  # no temporary file left beside it


def test_predict_out_to_a_fifo(ft_model, tmp_path) -> None:
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\nawful, just awful\n", encoding="utf-8")
    fifo = _fifo(tmp_path, "predictions.jsonl")
    reader = Reader(fifo)
    proc = cli("predict", "--from", ft_model, rows, "--out", fifo)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in reader.text().splitlines()]
    assert len(lines) == 2 and all("label" in r for r in lines)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def _full() -> Path:
    full = Path("/dev/full")
    if not full.exists() or not os.access(full, os.W_OK) or os.geteuid() != 0:
        pytest.skip("needs a writable /dev/full (run as root)")
    return full


def test_doctor_json_to_dev_full_is_one_line_and_keeps_the_device() -> None:
    full = _full()
    one_line(cli(*DOCTOR, "--json", full), "/dev/full", "no space left on the device")
    assert stat.S_ISCHR(os.stat(full).st_mode)


def test_predict_out_to_dev_full_is_one_line_and_keeps_the_device(ft_model, tmp_path) -> None:
    full = _full()
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\n", encoding="utf-8")
    one_line(cli("predict", "--from", ft_model, rows, "--out", full), "/dev/full", "no space left on the device")
    assert stat.S_ISCHR(os.stat(full).st_mode)


def test_dev_null_takes_the_write(tmp_path) -> None:
    """A character device that takes bytes (/dev/null) is written, never replaced."""
    from cramkit.io import atomic_path, write_json_atomic

    null = Path("/dev/null")
    write_json_atomic(null, {"a": 1})
    with atomic_path(null) as tmp:
        tmp.write_text("x\n")
    assert stat.S_ISCHR(os.stat(null).st_mode)
