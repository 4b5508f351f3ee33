"""Flags several verbs share (the checks themselves live in the library: cramkit.api)."""

from __future__ import annotations

import argparse


def add_training_args(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    settings: str,
    *,
    nproc: str | None = None,
    progress: str = "no progress bar",
) -> None:
    """What every training verb (pretrain, finetune, distill, eval of a suite) takes: ``--set KEY=VALUE`` (its
    ``settings`` help), ``--no-progress``, ``--report-to`` and, where the verb starts torchrun, ``--nproc``."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=settings)
    p.add_argument("--no-progress", action="store_true", help=progress)
    add_report_to(p)
    if nproc is not None:
        p.add_argument("--nproc", type=int, default=1, metavar="N", help=nproc)


def add_file_task_args(g: argparse.ArgumentParser | argparse._ArgumentGroup, *, dev: str, held_out: bool) -> None:
    """A task from the user's own files (finetune, distill): ``--train``, ``--dev`` (its ``dev`` help), the
    columns and the label kind; ``held_out`` (finetune): also ``--dev-fraction``, ``--test``, ``--choices`` and
    ``--name``."""
    from cramkit.recipes import DEV_FRACTION

    g.add_argument("--train", help="training file (.csv, .tsv or .jsonl with a header / named fields)")
    g.add_argument("--dev", help=dev)
    if held_out:
        g.add_argument(
            "--dev-fraction",
            type=float,
            default=DEV_FRACTION,
            help="without --dev: this fraction of the shuffled train rows is held out for scoring (default "
            "%(default)s)",
        )
        g.add_argument("--test", help="test file (labels optional); predictions are written")
    g.add_argument("--text-a", help="column with the (first) text")
    g.add_argument("--text-b", help="column with the second text of a pair")
    g.add_argument("--label", default="label", help="label column (default: %(default)s)")
    g.add_argument("--regression", action="store_true", help="the label is a number (MSE, Pearson/Spearman)")
    if held_out:
        g.add_argument(
            "--choices",
            metavar="COL[,COL...]",
            help="multiple choice: the choice columns (or one JSONL field holding a list); --text-a is the "
            "context, --label the right choice's index from 0",
        )
        g.add_argument("--name", help="name of the task (default: the train file's stem)")


def add_finetune_config_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--config FILE.yaml``, ``--print-config`` and ``--skip-bad-rows``: finetune's and eval's."""
    p.add_argument(
        "--config",
        metavar="FILE.yaml",
        help="a YAML file of fine-tuning settings (keys of --set, at the top level or under 'finetune:'); "
        "--set and the flags override it",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the fine-tuning settings this command would use (YAML) and exit; nothing is read or written",
    )
    p.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="skip (and count) malformed rows instead of stopping at the first one",
    )


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


def add_pass_args(
    p: argparse.ArgumentParser | argparse._ArgumentGroup, device: str = "auto, cpu, cuda, cuda:N"
) -> None:
    """``--device`` and ``--max-batch-tokens``: where the inference verbs' forward passes run, and how large
    they are (the defaults: cramkit.runtime.PASS_TOKENS)."""
    from cramkit.runtime import PASS_TOKENS_HELP

    p.add_argument("--device", default="auto", help=device)
    p.add_argument("--max-batch-tokens", type=int, default=None, metavar="N", help=PASS_TOKENS_HELP)


def add_offload_args(p: argparse.ArgumentParser) -> None:
    """--offload-experts and --expert-cache (predict, embed, serve): a mixture-of-experts model's experts read
    as the router picks them instead of all resident (``cramkit.infer.Engine``'s ``offload_experts``)."""
    p.add_argument(
        "--offload-experts",
        action="store_true",
        help="mixture-of-experts model: keep the experts out of memory and bring in only those each batch's router "
        "picks (CPU: read from the model's safetensors file, memory-mapped; CUDA: copied from host memory)",
    )
    p.add_argument(
        "--expert-cache",
        default=None,
        metavar="N",
        help="with --offload-experts: experts kept resident per MoE layer, least recently used leaving first "
        "(default 0)",
    )
