"""`cramkit pretrain`: budgeted masked-LM pretraining (the README's main command). Its flags are
:class:`~cramkit.recipes.pretrain_request.PretrainRequest`'s; the launcher's (``--nproc``, ``--nnodes``, ...) and
``--config``/``--print-config`` are the command's own."""

from __future__ import annotations

import argparse

from cramkit import request, runtime
from cramkit.errors import CramkitError
from cramkit.recipes.pretrain_request import SETTINGS_HELP, PretrainRequest


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pretrain",
        help="pretrain an encoder on raw text or a token store within a budget",
        description="Pretrain a BERT-style encoder with the Cramming recipe. With no arguments: the tiny-cpu "
        "preset on the built-in corpus for about 3 minutes.",
    )
    request.add_arguments(
        p,
        PretrainRequest,
        helps={"overrides": SETTINGS_HELP, "progress": "no progress bar (same as --set train.progress=false)"},
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
    p.add_argument(
        "--request",
        metavar="FILE.yaml",
        help=argparse.SUPPRESS,  # torchrun's workers: the launcher's decided request
    )
    p.add_argument(
        "--nproc", type=int, default=1, metavar="N", help="processes on this machine (starts torchrun; one per GPU)"
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
    import cramkit

    if args.request is not None:  # a torchrun worker: the request the launcher decided, as it is
        req = request.read_request(PretrainRequest, args.request, "pretrain")
    else:
        req = request.from_args(PretrainRequest, args)
        if args.config is not None:
            if req.preset is not None:
                raise CramkitError("give --preset NAME or --config FILE.yaml, not both (--config is a preset file)")
            req.preset = args.config
    if args.print_config:
        import yaml

        from cramkit.config import to_dict
        from cramkit.recipes.pretrain import resolved_config

        print(yaml.safe_dump(to_dict(resolved_config(req)), sort_keys=False), end="")
        return 0
    if args.nproc != 1 or args.nnodes != 1:
        return _launch(args, req)
    run_dir = cramkit.pretrain(req)
    if runtime.torchrun().is_main:  # under torchrun: once, not once per process
        print(f"cramkit: run directory {run_dir} (metrics.jsonl, loss.png, checkpoints/)")
    return 0


def _launch(args: argparse.Namespace, req: PretrainRequest) -> int:
    """``--nproc N``: the request decided once (its run directory and preset), written to a file that every one of
    N torchrun processes reads."""
    from cramkit.train.launch import launch_request

    if req.out is None and req.resume is None and args.nnodes > 1:
        raise CramkitError(
            "with --nnodes above 1 give --out RUN on a filesystem every node shares (each rank writes its "
            "own shards of every checkpoint into it)"
        )
    from cramkit.recipes.pretrain import decided as decide

    decided = decide(req)
    if req.init is None:  # a mistyped setting or degree: one message here, not one per process
        _check_degrees(decided, args.nproc * args.nnodes)
    return launch_request(
        args.nproc,
        "pretrain",
        decided,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
    )


def _check_degrees(req: PretrainRequest, world: int) -> None:
    """The pipeline and expert-parallel degrees ``world`` processes allow, checked before torchrun starts them
    against the configuration the run will train (the text-aware preset: ``tiny-zh`` for Chinese text); for
    ``--resume``, with the degrees its checkpoint was written with named (a resume may change them: the checkpoint
    holds the whole model, resharded on load)."""
    from cramkit.recipes.pretrain import resolved_start
    from cramkit.train.parallel import check_ep
    from cramkit.train.pipeline import check_pp, stages_per_rank

    try:
        cfg, _ = resolved_start(req)
        check_pp(cfg.model, cfg.parallel.pp, world, virtual=stages_per_rank(cfg.parallel), tp=cfg.parallel.tp)
        check_ep(cfg.model, cfg.parallel.ep, world)
    except CramkitError as exc:
        if req.resume is None:
            raise
        raise CramkitError(f"{exc}. {_written_with(str(req.resume))}") from None


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
