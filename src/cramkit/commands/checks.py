"""Flags several verbs share (the checks themselves live in the library: cramkit.api)."""

from __future__ import annotations

import argparse


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
