"""Milvus Lite and pymilvus in processes of their own, for the tests. In an xdist worker of the default tier
(not in a single pytest process), a test that ran them in-process had pytest's own capture file closed under it,
and every later test of that worker failed (three CI runs on a fresh clone; not isolated further). So no test
runs them in the pytest process: the exports go through `cli_process`, and what a test asks of the database runs
here, in ``python -c``."""

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
