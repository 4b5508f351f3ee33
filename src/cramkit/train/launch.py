"""``cramkit pretrain --nproc N`` (and finetune's, distill's): torchrun (PyTorch's elastic launcher) starts the
verb on N processes, each reading the request the command decided once (``cramkit VERB --request FILE``)::

    cramkit pretrain --nproc 2 ...      ==  torchrun --standalone --nproc_per_node 2 -m cramkit pretrain --request F

Several machines (run once per node, same endpoint, node ranks 0..nnodes-1)::

    cramkit pretrain --nproc 8 --nnodes 2 --node-rank 0 --rdzv-endpoint host0:29400 ...

torchrun's agent watches the workers: when one dies it stops the others and exits with a summary
naming the rank and its exit code, so a job never hangs on a dead peer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from cramkit import runtime
from cramkit.errors import CramkitError


def torchrun_command(
    nproc: int,
    cramkit_args: Sequence[str],
    *,
    nnodes: int = 1,
    node_rank: int | None = None,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    max_restarts: int = 0,
) -> list[str]:
    """The ``python -m torch.distributed.run ... -m cramkit <cramkit_args>`` command line."""
    if nproc < 1:
        raise CramkitError(f"--nproc must be at least 1, got {nproc}")
    if nnodes < 1:
        raise CramkitError(f"--nnodes must be at least 1, got {nnodes}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd += ["--standalone"]  # a free local port, no coordination with other jobs on the machine
    else:
        if not rdzv_endpoint:
            raise CramkitError(
                f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node, e.g. the "
                "first node's address and a free port such as 29400)"
            )
        cmd += ["--nnodes", str(nnodes), "--rdzv_backend", "c10d", "--rdzv_endpoint", rdzv_endpoint]
        cmd += ["--rdzv_id", rdzv_id or "cramkit"]
        # c10d assigns ranks at the rendezvous (node 0 need not start first); a node rank is only checked
        if node_rank is not None and not 0 <= node_rank < nnodes:
            raise CramkitError(f"--node-rank must be in 0..{nnodes - 1}, got {node_rank}")
    cmd += ["--max_restarts", str(max_restarts), "-m", "cramkit", *cramkit_args]
    return cmd


def launch(nproc: int, cramkit_args: Sequence[str], **kwargs: object) -> int:
    """Run ``cramkit <cramkit_args>`` on ``nproc`` processes through torchrun; returns its exit code.

    SIGINT/SIGTERM are passed on to torchrun, whose agent sends SIGTERM to every worker (each finishes
    its step, saves a checkpoint and stops; after 30 s torchrun kills what is left)."""
    cmd = torchrun_command(nproc, cramkit_args, **kwargs)  # type: ignore[arg-type]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, runtime.cpu_cores() // max(1, nproc))))
    # its own session: a Ctrl-C reaches torchrun once, through us, not twice (terminal + forward)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        proc.send_signal(signum)

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if code < 0:  # killed by a signal
        return 128 - code
    if received and code != 0:  # stopped on request (each worker saved a checkpoint): say so by the code
        return 128 + received[0]
    return code


def launch_request(nproc: int, verb: str, request: Any, args: Sequence[str] = (), **kwargs: object) -> int:
    """``cramkit VERB --nproc N``: ``request`` (decided once) written to a temporary file that each of the N
    torchrun processes reads (``cramkit VERB [args] --request FILE``), removed when torchrun returns."""
    import tempfile

    from cramkit.request import write_request

    if runtime.torchrun().world > 1:
        raise CramkitError("--nproc given inside a torchrun job; use one or the other")
    fd, where = tempfile.mkstemp(prefix=f"cramkit-{verb}-", suffix=".yaml")
    os.close(fd)
    try:
        write_request(request, verb, where)
        return launch(nproc, [verb, *args, "--request", where], **kwargs)
    finally:
        os.unlink(where)
