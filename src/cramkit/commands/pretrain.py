"""`cramkit pretrain`: budgeted masked-LM pretraining (the README's main command)."""

from __future__ import annotations

import argparse
from typing import Any

from cramkit import runtime
from cramkit.commands.checks import add_training_args
from cramkit.commands.reading import add_reading_args, reading_kwargs
from cramkit.errors import CramkitError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pretrain",
        help="pretrain an encoder on raw text or a token store within a budget",
        description="Pretrain a BERT-style encoder with the Cramming recipe. With no arguments: the tiny-cpu "
        "preset on the built-in corpus for about 3 minutes.",
    )
    p.add_argument(
        "inputs",
        nargs="*",
        metavar="SOURCE_OR_STORE",
        help="text files, directories, globs or hf:dataset sources; or one token store directory "
        "(default: the built-in corpus)",
    )
    p.add_argument(
        "--preset",
        default=None,
        help="tiny-cpu (the default), tiny-zh (the default when the text is Chinese), crammed-bert, "
        "bert-base, bert-lamb, continue (the default with --from) or a YAML file",
    )
    p.add_argument(
        "--from",
        dest="init",
        metavar="MODEL",
        help="continue this model on the text (domain/task adaptation): a run, checkpoint, model "
        "directory or hf:DIR; its tokenizer, architecture and masking are kept",
    )
    p.add_argument(
        "--inherit",
        metavar="MODEL",
        help="train a new model (the preset's shape) on MODEL's tokenizer that learns from MODEL's "
        "predictions early in the run (knowledge inheritance; --set inherit.alpha/until/init)",
    )
    p.add_argument(
        "--extend-vocab",
        type=int,
        default=0,
        metavar="N",
        help="with --from: add the N most frequent words of the text that the tokenizer splits "
        "into pieces (new embeddings start as the mean of their pieces')",
    )
    p.add_argument(
        "--upcycle",
        action="store_true",
        help="with --from a dense model and --set model.moe_experts=E: start a mixture of experts whose every "
        "expert is a copy of the model's feed-forward weights (the routers fresh)",
    )
    p.add_argument(
        "--config",
        metavar="FILE.yaml",
        help="a YAML file of settings (the same as --preset FILE.yaml; --set still overrides it)",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the full configuration this command would train with (YAML) and exit; nothing is written",
    )
    p.add_argument("--budget", help="training budget: 30s, 5m, 24h (time), 2e9tok (tokens), 1000steps")
    p.add_argument("--out", help="run directory (default: runs/<preset>-<timestamp>)")
    p.add_argument("--resume", metavar="RUN", help="continue the run in RUN from its latest checkpoint")
    p.add_argument("--tokenizer", metavar="DIR", help="use this tokenizer instead of training one")
    add_reading_args(p)
    add_training_args(
        p,
        "override a setting, e.g. --set train.lr=1e-3 (repeatable)",
        nproc="processes on this machine (starts torchrun; one per GPU)",
        progress="no progress bar (same as --set train.progress=false)",
    )
    p.add_argument("--nnodes", type=int, default=1, help="machines taking part (with --nproc; torchrun c10d)")
    p.add_argument("--node-rank", type=int, default=None, help="this machine's index, 0..nnodes-1")
    p.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="rendezvous address shared by all nodes (e.g. the first node's host and port 29400)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.no_progress:
        args.overrides = [*args.overrides, "train.progress=false"]
    if args.config is not None:
        if args.preset is not None:
            raise CramkitError("give --preset NAME or --config FILE.yaml, not both (--config is a preset file)")
        args.preset = args.config
    given = {  # what the command passes on, to cramkit.pretrain or (--print-config) to the resolved settings
        "preset": args.preset,
        "budget": args.budget,
        "overrides": args.overrides,
        "resume": args.resume,
        "tokenizer": args.tokenizer,
        "init": args.init,
        "inherit": args.inherit,
        "extend_vocab": args.extend_vocab,
        "upcycle": args.upcycle,
        "report_to": args.report_to,
        **reading_kwargs(args),
    }
    if args.print_config:
        import yaml

        from cramkit.config import to_dict
        from cramkit.recipes.pretrain import resolved_config

        cfg = resolved_config(args.inputs or None, **given)
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        return 0
    if args.nproc != 1 or args.nnodes != 1:
        return _launch(args, given)
    import cramkit

    run_dir = cramkit.pretrain(args.inputs or None, out=args.out, **given)
    if runtime.torchrun().is_main:  # under torchrun: once, not once per process
        print(f"cramkit: run directory {run_dir} (metrics.jsonl, loss.png, checkpoints/)")
    return 0


def _launch(args: argparse.Namespace, given: dict[str, Any]) -> int:
    """``--nproc N``: the same command, without --nproc, on N processes started by torchrun."""
    from cramkit.errors import CramkitError
    from cramkit.train.launch import launch, without_flags

    if runtime.torchrun().world > 1:
        raise CramkitError("--nproc given inside a torchrun job; use one or the other")
    preset = "continue" if args.init is not None else None
    if args.init is None:  # a mistyped setting or degree: one message here, not one per process
        preset = _check_degrees(args, given, args.nproc * args.nnodes)
    out = args.out
    if out is None and args.resume is None and args.nnodes > 1:
        raise CramkitError(
            "with --nnodes above 1 give --out RUN on a filesystem every node shares (each rank writes its "
            "own shards of every checkpoint into it)"
        )
    if out is None and args.resume is None:
        from cramkit.recipes.pretrain import default_out

        # chosen once, so every process writes into the same run, named by the preset the run trains (text-aware)
        out = str(default_out(preset or args.preset or "tiny-cpu"))
    # the command as typed, without the launcher's flags: a flag added to pretrain reaches the processes as it is
    argv = without_flags(args.argv, ("--nproc", "--nnodes", "--node-rank", "--rdzv-endpoint"))
    if out is not None and args.out is None:
        argv += ["--out", out]
    return launch(args.nproc, argv, nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint)


def _check_degrees(args: argparse.Namespace, given: dict[str, Any], world: int) -> str:
    """The pipeline and expert-parallel degrees ``world`` processes allow, checked before torchrun starts them
    against the configuration the run will train (the text-aware preset: ``tiny-zh`` for Chinese text); for
    ``--resume``, with the degrees its checkpoint was written with named (a resume may change them: the checkpoint
    holds the whole model, resharded on load). Returns the preset the run starts from ("" for a resume)."""
    from cramkit.errors import CramkitError
    from cramkit.recipes.pretrain import resolved_start
    from cramkit.train.parallel import check_ep
    from cramkit.train.pipeline import check_pp, stages_per_rank

    try:
        cfg, preset = resolved_start(args.inputs or None, **given)
        check_pp(cfg.model, cfg.parallel.pp, world, virtual=stages_per_rank(cfg.parallel), tp=cfg.parallel.tp)
        check_ep(cfg.model, cfg.parallel.ep, world)
    except CramkitError as exc:
        if args.resume is None:
            raise
        raise CramkitError(f"{exc}. {_written_with(args.resume)}") from None
    return preset


def _written_with(run: str) -> str:
    """What the latest checkpoint of ``run`` was written with, and what a resume may change."""
    from cramkit import rundir

    latest = rundir.find_latest(rundir.require_run_dir(run))
    trainer = rundir.verify(latest).get("trainer") if latest is not None else None
    trainer = trainer if isinstance(trainer, dict) else {}
    saved, world = trainer.get("parallel"), trainer.get("world")
    saved = saved if isinstance(saved, dict) else {}
    degrees = ", ".join(f"parallel.{k}={saved[k]}" for k in ("pp", "tp", "ep", "strategy") if k in saved)
    where = f"{latest.name if latest else run} was written with {degrees or 'other degrees'}"
    where += f" on {world} processes" if isinstance(world, int) else ""
    return (
        f"{where}; a resume may change parallel.pp, parallel.tp, parallel.strategy and --nproc (the checkpoint "
        "is resharded), as long as the new degrees fit the model and the processes"
    )
