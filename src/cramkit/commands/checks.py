"""Checks the verbs make before reading any data (shared by commands/tasks.py, distill.py and embed_eval.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cramkit.errors import CramkitError


def add_report_to(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--report-to``: the training verbs' experiment trackers (train/report.py)."""
    p.add_argument(
        "--report-to",
        metavar="TRACKERS",
        help="also send the training metrics (metrics.jsonl's records) and the configuration to: none (the "
        "default), tensorboard, wandb, mlflow, trackio; several comma-separated. Their files go into the run "
        "directory (RUN/tb, RUN/wandb, RUN/mlruns, RUN/trackio) unless WANDB_DIR, MLFLOW_TRACKING_URI or "
        "TRACKIO_DIR say otherwise",
    )


def check_model_source(source: str, flag: str = "--from") -> None:
    """Fail before any data is read when the model cannot be had: a path that does not exist, or an
    ``hf:`` hub id that cannot be downloaded (resolved, and cached, as ``cramkit.load`` resolves it)."""
    if source.startswith("hf:"):
        from cramkit.model.hf import _resolve

        _resolve(source)
    elif not Path(source).expanduser().exists():
        raise CramkitError(
            f"{flag} {source}: no such directory; give a cramkit run directory (with config.yaml and "
            "checkpoints/), a model directory, a Hugging Face directory or hf:ORG/NAME (a hub id)"
        )
