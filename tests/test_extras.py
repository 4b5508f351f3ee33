"""A missing optional dependency is one line naming the extra that installs it, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # `cramkit serve` in a process without its extra


@pytest.mark.parametrize("missing", ["fastapi", "starlette"])
def test_serve_without_its_extra_says_which_to_install(tmp_path: Path, pretrained_run: Path, missing: str) -> None:
    # a module of that name that cannot be imported stands in for one that is not installed
    (tmp_path / f"{missing}.py").write_text(
        f"raise ModuleNotFoundError('No module named {missing}', name={missing!r})\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "cramkit", "serve", str(pretrained_run)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"cramkit: error: {missing} is not installed; install cramkit's [serve] extra: pip install 'cramkit[serve]'"
    )
