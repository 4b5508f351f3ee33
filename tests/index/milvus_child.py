"""Milvus Lite in a process of its own, for the tests: Milvus Lite 3.x serves a database from a thread of the process
that opens it and closes file descriptors it no longer owns when it shuts down (seen in CI: pytest's own capture file
closed under it, every later test of that worker failing). So no test opens Milvus Lite in the pytest process: the
export runs through `cli_process`, and what a test asks of the database runs here, in ``python -c``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from clirun import PROCESS_ENV

PRELUDE = """
import json, sys
import numpy as np
from pymilvus import MilvusClient
client = MilvusClient(sys.argv[1])
out = None
"""


def milvus(db: Path, code: str, *args: object) -> Any:
    """Run ``code`` against a MilvusClient on ``db`` in a fresh interpreter (``client``, ``sys.argv[2:]`` = args);
    what it assigns to ``out`` comes back as JSON."""
    import os

    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + code + "\nprint(json.dumps(out))", str(db), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **PROCESS_ENV},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
