"""The one way tests run the `cramkit` command.

``cli(...)`` calls ``cramkit.cli.main`` in this process, with stdout and stderr captured, the working
directory and environment set for the call and restored after it, and returns what a subprocess would (a
``CompletedProcess`` with returncode, stdout, stderr); with ``--nproc N`` what torchrun's workers print goes
to the file descriptors, not to this capture (use ``cli_process`` to read it). An exception
that escapes ``main`` becomes a traceback on stderr and exit status 1, as ``python -m cramkit`` would print
it, so "no traceback" assertions hold. A refusal costs milliseconds this way instead of the 10 s of a fresh
interpreter importing torch.

``cli_process(...)`` starts ``python -m cramkit`` for real: only for what crosses the process boundary
(signals, torchrun, a server, what reaches the terminal); a test that calls it is in the integration tier
(``pytestmark = pytest.mark.integration``), which ``conftest`` enforces.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping

PROCESS_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


class _Capture(io.StringIO):
    """A text stream that also answers what code asks of a terminal stream (``isatty``, ``fileno`` fails)."""

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def _environment(cwd: str | os.PathLike | None, env: Mapping[str, str] | None) -> Iterator[None]:
    before_env = dict(os.environ)
    before_cwd = os.getcwd()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if env is not None:
            os.environ.update({k: str(v) for k, v in env.items()})
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(before_cwd)
        os.environ.clear()
        os.environ.update(before_env)
        for sig, handler in handlers.items():
            if signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)


@contextlib.contextmanager
def _log_to(stream: io.StringIO) -> Iterator[None]:
    """cramkit's log records (warnings and up) on ``stream`` as bare messages, as a process prints them through
    logging's last-resort handler (under pytest the root logger has handlers of its own that would take them)."""
    logger = logging.getLogger("cramkit")
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.WARNING)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def cli(
    *args: object,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,  # accepted for the same call as cli_process; nothing to time out in-process
    stdin: object = None,
) -> subprocess.CompletedProcess:
    """`cramkit ARGS` in this process: exit status and what it printed."""
    from cramkit import cli as cramkit_cli

    argv = [str(a) for a in args]
    out, err = _Capture(), _Capture()
    with _environment(cwd, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _log_to(err):
        try:
            code = cramkit_cli.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception:
            traceback.print_exc(file=sys.stderr)
            code = 1
    return subprocess.CompletedProcess(["cramkit", *argv], code, out.getvalue(), err.getvalue())


def cli_process(
    *args: object,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    stdin: int | None = subprocess.DEVNULL,
) -> subprocess.CompletedProcess:
    """`python -m cramkit ARGS` as a process of its own (the integration tier only)."""
    full_env = {**os.environ, **PROCESS_ENV, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "cramkit", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
        stdin=stdin,
    )


def ok(*args: object, cwd: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> str:
    """`cramkit ARGS` in this process, which must succeed; what it printed."""
    proc = cli(*args, cwd=cwd, env=env)
    command = " ".join(map(str, args))
    assert proc.returncode == 0, f"cramkit {command} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def one_line(proc: subprocess.CompletedProcess, *needles: str, code: int = 2) -> str:
    """The single error line of a refused command (exit ``code``, no traceback); it must hold every needle."""
    err = proc.stderr.strip()
    assert proc.returncode == code, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("cramkit: error:"), err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in: {lines[0]}"
    return lines[0]
