"""Ctrl-C at any point of a verb stops it (issue 30): the command line's SIGINT handler, and the guard for a
KeyboardInterrupt that Python swallows (raised inside a ``__del__``, a weakref callback or an import lock's
cleanup, it is printed as "Exception ignored" and the program goes on)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

SWALLOWED = """
import os, signal, sys, time
from cramkit import cli, errors
errors.ABORT_AT_ONCE = True
signal.signal(signal.SIGINT, cli.Interrupt(grace=1.0))
class Swallows:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the KeyboardInterrupt is raised here, inside __del__: Python prints it and goes on
s = Swallows()
del s
print("swallowed; working on", flush=True)
time.sleep(30)
print("finished", flush=True)
"""


@pytest.mark.integration
def test_a_swallowed_ctrl_c_still_ends_the_command() -> None:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SWALLOWED], capture_output=True, text=True, timeout=60, env=ENV)
    took = time.monotonic() - t0
    assert "swallowed; working on" in proc.stdout  # Python did lose the KeyboardInterrupt...
    assert "finished" not in proc.stdout  # ...and the guard ended the process anyway
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.rstrip().endswith("cramkit: interrupted")
    assert took < 20


def test_an_error_after_a_ctrl_c_is_the_ctrl_c(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A KeyboardInterrupt raised inside a library's import can surface as another error (CI saw `cramkit export`
    answer "torch's ONNX exporter failed (AttributeError: module 'onnx_ir' has no attribute 'DEBUG')" to a Ctrl-C):
    once the handler has seen the signal, the command says it was interrupted and exits 130."""
    from cramkit import cli, errors

    missing = str(tmp_path / "no-such-run")
    assert cli.main(["export", missing, "--out", str(tmp_path / "e")]) == 2  # without a Ctrl-C: the error itself
    assert "no-such-run" in capsys.readouterr().err
    monkeypatch.setattr(errors, "INTERRUPTED", False)
    handler = cli.Interrupt()
    handler.since = 0.0  # as after a first signal: no second timer thread (it would end this test process)
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, None)
    assert errors.INTERRUPTED
    assert cli.main(["export", missing, "--out", str(tmp_path / "e")]) == 130
    assert capsys.readouterr().err.strip() == "cramkit: interrupted"


def _sigint_default() -> None:
    """In the child: Ctrl-C as at a terminal. A suite started in the background (``nohup ... &``) passes SIGINT
    on ignored, and cramkit rightly leaves an ignored SIGINT ignored (``cli.entry``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def started(log: Path, proc: subprocess.Popen, mark: str, timeout: float = 180) -> bool:
    """Whether ``proc`` printed ``mark`` (it is past Python's start-up, in cramkit's own code) in time."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and proc.poll() is None:
        if mark in log.read_text(errors="replace"):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.integration
def test_ctrl_c_while_exporting_stops_and_leaves_nothing(pretrained_run: Path, tmp_path: Path) -> None:
    """SIGINT at several points of `cramkit export --format onnx` (exporting the graph, optimising, checking):
    exit 130, one line, no output and no temporary directory left; the same command then exports. (A signal
    during the interpreter's own start-up, before cramkit's code runs, is Python's to handle.)"""
    out = tmp_path / "exports" / "model-onnx"
    out.parent.mkdir()
    cmd = [sys.executable, "-m", "cramkit", "export", str(pretrained_run), "--format", "onnx", "--out", str(out)]
    for delay in (0.0, 1.5, 5.0):
        log = tmp_path / f"log-{delay}"
        with log.open("w") as sink:
            proc = subprocess.Popen(
                cmd, stdout=sink, stderr=subprocess.STDOUT, text=True, env=ENV, preexec_fn=_sigint_default
            )
            if not started(log, proc, "[onnx] exporting"):
                proc.kill()
                raise AssertionError(f"the export did not start:\n{log.read_text()}")
            time.sleep(delay)
            if proc.poll() is not None:  # finished before the signal (a fast machine): nothing to check here
                break
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        text = log.read_text()
        if proc.returncode != 130 and text.rstrip().splitlines()[-1].startswith("exported "):
            # the signal came after the export was complete, as the interpreter exited (a fast machine): what
            # it wrote is whole
            assert (out / "model.onnx").is_file() and (out / "cramkit-onnx.json").is_file(), text
            break
        assert proc.returncode == 130, f"delay {delay}: exit {proc.returncode}\n{text}"
        assert text.rstrip().splitlines()[-1] == "cramkit: interrupted", text
        assert "Traceback" not in text, text
        assert list(out.parent.iterdir()) == [], f"delay {delay}: left {list(out.parent.iterdir())}"
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr
    assert (out / "model.onnx").is_file()


@pytest.mark.integration
def test_the_command_line_starts_without_torch() -> None:
    """`cramkit --help` and the parser import no torch (nor numpy): the facade and cramkit.model load them on
    first use, so the help is instant and a Ctrl-C during start-up lands in cramkit's handler."""
    code = (
        "import sys\nfrom cramkit.cli import build_parser\nbuild_parser()\n"
        "print(sorted(m for m in ('torch', 'numpy', 'tokenizers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc to find the workers")
def test_kill_9_of_data_build_takes_its_workers_with_it(tmp_path: Path, builtin_docs: list[str], tok_dir: Path):
    """`kill -9` of `cramkit data build` while it encodes left both encoding workers alive, waiting forever."""
    corpus = tmp_path / "docs.txt"
    text = "\n\n".join(builtin_docs)
    with open(corpus, "w", encoding="utf-8") as f:
        while f.tell() < 40_000_000:  # long enough to be encoding for a while on a slow machine
            f.write(text + "\n\n")
    cmd = [sys.executable, "-m", "cramkit", "data", "build", str(corpus), "--tokenizer", str(tok_dir)]
    proc = subprocess.Popen([*cmd, "--out", str(tmp_path / "store"), "--workers", "2"], env=ENV)
    try:
        deadline, workers = time.time() + 120, set()
        while time.time() < deadline and len(workers) < 2 and proc.poll() is None:
            time.sleep(0.2)
            workers = _children(proc.pid)
        assert len(workers) >= 2, f"no encoding workers seen (exit {proc.poll()})"
        time.sleep(1.0)  # encoding
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.time() + 20
        while time.time() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.2)
        left = [w for w in workers if _alive(w)]
        assert not left, f"workers {left} outlived their killed parent"
    finally:
        for w in _children(proc.pid) | workers if "workers" in locals() else set():
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGKILL)
        proc.kill()
