"""RETRO neighbours (`cramkit index neighbours`) resume from any point a kill or a full disk stops them: after a
block's commit, after the last block's commit and before the final rename, after ``chunks.npy`` and before the
rename, after the rename and before ``neighbours.json``; and a crafted progress file is one line.

A kill is reproduced in this process: the run is stopped (a BaseException no handler of cramkit takes, as
SIGKILL leaves no handler a chance either) right after the named write, leaving the files a kill -9 there
leaves; the rerun is the real command. The full disk is a small tmpfs (integration tier)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clirun import cli, ok, one_line


class Killed(BaseException):
    """The process dies here: nothing after this point runs, no cleanup of cramkit's does."""


def write_docs(path: Path, docs: list[str]) -> Path:
    path.write_text("\n\n".join(d.replace("\n\n", "\n") for d in docs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def retro(tmp_path_factory, builtin_docs, tok_dir, pretrained_run) -> dict[str, Path]:
    """A token store, a RETRO index built from it, and its neighbours computed in one go (the reference)."""
    d = tmp_path_factory.mktemp("retro")
    src = write_docs(d / "docs.txt", builtin_docs[500:560])
    ok("data", "build", src, "--tokenizer", tok_dir, "--out", d / "store", "--quiet")
    idx = d / "idx"
    ok("index", "build", d / "store", "--encoder", pretrained_run, "--mode", "retro", "--out", idx, "--device", "cpu")
    whole = d / "whole"
    ok("index", "neighbours", idx, "--store", d / "store", "--out", whole, "-k", "2")
    return {"store": d / "store", "index": idx, "whole": whole}


def _args(retro: dict[str, Path], out: Path) -> list[object]:
    return ["index", "neighbours", retro["index"], "--store", retro["store"], "--out", out, "-k", "2", "--block", "16"]


def _same_as_whole(retro: dict[str, Path], out: Path) -> dict:
    for name in ("neighbours.npy", "chunks.npy"):
        a = np.load(out / name, allow_pickle=False)
        b = np.load(retro["whole"] / name, allow_pickle=False)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert not (out / ".neighbours.progress.json").exists() and not (out / ".neighbours.npy").exists()
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]
    return json.loads((out / "neighbours.json").read_text())


def _kill_after_commit(monkeypatch, done_at_least: int | None) -> None:
    """Stop the run right after the progress file records ``done_at_least`` rows (None: every row)."""
    import cramkit.index.neighbours as nb

    real = nb.write_json_atomic

    def commit(path, data):
        real(path, data)
        if Path(path).name == ".neighbours.progress.json":
            n = data["job"]["chunks"]
            if data["done"] >= (n if done_at_least is None else done_at_least):
                raise Killed

    monkeypatch.setattr(nb, "write_json_atomic", commit)


def _kill_after_chunks(monkeypatch) -> None:
    """Stop the run right after ``chunks.npy`` is in place, before ``.neighbours.npy`` is renamed."""
    import cramkit.index.neighbours as nb

    real = nb.save_npy

    def then_die(path, array):
        real(path, array)
        raise Killed

    monkeypatch.setattr(nb, "save_npy", then_die)


def _kill_before_record(monkeypatch) -> None:
    """Stop the run after the rename of ``neighbours.npy``, before ``neighbours.json`` is written."""
    import cramkit.index.neighbours as nb

    real = nb.write_json_atomic

    def record(path, data):
        if Path(path).name == "neighbours.json":
            raise Killed
        real(path, data)

    monkeypatch.setattr(nb, "write_json_atomic", record)


@pytest.mark.parametrize("point", ["mid-way", "last-commit", "last-commit-truncated-chunks", "chunks", "rename"])
def test_neighbours_resume_from_every_kill_point(retro, tmp_path, monkeypatch, point) -> None:
    out = tmp_path / "nb"
    n = json.loads((retro["whole"] / "neighbours.json").read_text())["chunks"]
    with monkeypatch.context() as m:
        if point == "mid-way":
            _kill_after_commit(m, 16)
        elif point.startswith("last-commit"):
            _kill_after_commit(m, None)
        elif point == "chunks":
            _kill_after_chunks(m)
        else:
            _kill_before_record(m)
        with pytest.raises(Killed):
            cli(*_args(retro, out))
    assert not (out / "neighbours.json").exists()
    if point == "last-commit-truncated-chunks":  # what a full disk left under the final name before this fix
        whole = (retro["whole"] / "chunks.npy").read_bytes()
        (out / "chunks.npy").write_bytes(whole[: len(whole) // 3])
    progress = json.loads((out / ".neighbours.progress.json").read_text())
    assert progress["done"] == (16 if point == "mid-way" else n)
    proc = cli(*_args(retro, out))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    info = _same_as_whole(retro, out)
    assert info["resumed_after"] == progress["done"] and info["chunks"] == n
    # and once more: a finished output is computed again from the start, never stuck
    proc = cli(*_args(retro, out))
    assert proc.returncode == 0, proc.stderr
    assert _same_as_whole(retro, out)["resumed_after"] == 0


@pytest.mark.parametrize(
    "done, says",
    [
        (999999, "field 'done' must be an integer from 0 to"),
        (None, "field 'done' must be an integer from 0 to"),
        ([1, 2], "field 'done' must be an integer from 0 to"),
        ("12", "field 'done' must be an integer from 0 to"),
        (-1, "field 'done' must be an integer from 0 to"),
        (True, "field 'done' must be an integer from 0 to"),
    ],
)
def test_crafted_progress_file_is_one_line(retro, tmp_path, monkeypatch, done, says) -> None:
    out = tmp_path / "nb"
    with monkeypatch.context() as m:
        _kill_after_commit(m, 16)
        with pytest.raises(Killed):
            cli(*_args(retro, out))
    progress = out / ".neighbours.progress.json"
    rec = json.loads(progress.read_text())
    progress.write_text(json.dumps(rec | {"done": done}))
    before = (out / ".neighbours.npy").read_bytes()
    line = one_line(cli(*_args(retro, out)), str(progress), says, f"remove {progress}")
    assert "Traceback" not in line
    assert (out / ".neighbours.npy").read_bytes() == before  # nothing of the work is lost
    # the fix the line gives works
    progress.unlink()
    ok(*_args(retro, out))
    _same_as_whole(retro, out)


def test_damaged_progress_json_is_one_line(retro, tmp_path, monkeypatch) -> None:
    out = tmp_path / "nb"
    with monkeypatch.context() as m:
        _kill_after_commit(m, 16)
        with pytest.raises(Killed):
            cli(*_args(retro, out))
    progress = out / ".neighbours.progress.json"
    for text in ("[1, 2]", '{"job": ', '{"job": {}, "done": 1e10}'):
        progress.write_text(text)
        proc = cli(*_args(retro, out))
        if text.startswith('{"job": {}'):  # another job's record: started over, not trusted
            assert proc.returncode == 0, proc.stderr
            _same_as_whole(retro, out)
            break
        one_line(proc, str(progress))


# ----------------------------------------------------------------------------------------------- full disk


def _in_small_tmpfs(tmp_path: Path, script: str, size_kb: int) -> subprocess.CompletedProcess:
    """``script`` (sh) with a ``size_kb`` KiB tmpfs mounted at tmp_path/disk in a private mount namespace."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir(exist_ok=True)
    probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "tmpfs", str(disk)], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here ({probe.stderr.decode().strip()})")
    full = f"mount -t tmpfs -o size={size_kb}k tmpfs {shlex.quote(str(disk))} && {script}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(["unshare", "-rm", "sh", "-c", full], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.integration
def test_disk_full_while_chunks_npy_is_written_then_freed(retro, tmp_path) -> None:
    """The disk fills while ``chunks.npy`` is written: one line, no truncated ``chunks.npy``; the rerun after
    space is freed finishes, equal to a run in one go."""
    n = json.loads((retro["whole"] / "neighbours.json").read_text())["chunks"]
    page = 4096
    pages = lambda size: -(-size // page)  # noqa: E731
    work_pages = pages(n * 2 * 4 + 128)  # .neighbours.npy, allocated up front
    chunk_pages = pages(n * 3 * 8 + 128)
    slack = 3  # the progress record (old and new while it is replaced) and the lock
    assert chunk_pages > slack + 1, "too few chunks for the test to place the full disk"
    free_kb = (work_pages + slack) * 4
    size_kb = 1024
    disk = tmp_path / "disk"
    saved = tmp_path / "saved"
    cmd = " ".join(shlex.quote(str(a)) for a in [sys.executable, "-m", "cramkit", *_args(retro, disk / "nb")])
    script = (
        f"head -c {1024 * (size_kb - free_kb)} /dev/zero > {disk}/filler; "
        f"{cmd} > {tmp_path}/first.out 2> {tmp_path}/first.err; echo $? > {tmp_path}/first.rc; "
        f"ls -a {disk}/nb > {tmp_path}/first.ls; cp {disk}/nb/.neighbours.progress.json {tmp_path}/first.progress; "
        f"rm {disk}/filler; {cmd} > {tmp_path}/second.out 2> {tmp_path}/second.err; echo $? > {tmp_path}/second.rc; "
        f"cp -r {disk}/nb {saved}"
    )
    proc = _in_small_tmpfs(tmp_path, script, size_kb)
    assert proc.returncode == 0, proc.stderr
    first_err = (tmp_path / "first.err").read_text()
    assert (tmp_path / "first.rc").read_text().strip() == "2", first_err
    errors = [line for line in first_err.splitlines() if line.startswith("cramkit: error:")]
    assert len(errors) == 1 and "Traceback" not in first_err, first_err
    assert "no space left" in errors[0] and str(disk / "nb") in errors[0], errors[0]
    left = (tmp_path / "first.ls").read_text().split()
    assert "chunks.npy" not in left and "neighbours.json" not in left, left  # never a truncated chunks.npy
    assert not [name for name in left if ".tmp-" in name], left
    # the disk filled after the search (every row committed): the rerun does not search again
    assert json.loads((tmp_path / "first.progress").read_text())["done"] == n
    second_err = (tmp_path / "second.err").read_text()
    assert (tmp_path / "second.rc").read_text().strip() == "0", second_err
    info = _same_as_whole(retro, saved)
    assert info["resumed_after"] == n
