"""Where the benchmarks find ../shared's data: ``$CRAMKIT_SHARED_DATA``, else ``shared/data`` beside the
repository (the layout of CI and of the development machines; tests/conftest.py reads the same variable)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("CRAMKIT_SHARED_DATA") or REPO.parent / "shared" / "data")
GLUE = SHARED / "glue"
