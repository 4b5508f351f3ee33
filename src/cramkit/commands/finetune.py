"""`cramkit finetune`: one task (registered, or from files), a mixture of tasks, few labels, or an encoder trained
to embed (the contrastive stage). Its flags are :class:`~cramkit.recipes.finetune_request.FinetuneRequest`'s;
``--list-tasks``, ``--print-config`` and the launcher's ``--nproc`` are the command's own."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from cramkit import request, runtime
from cramkit.commands.finetune_report import report_contrastive, report_fewshot, report_finetune, report_mixture
from cramkit.recipes.finetune_request import SETTINGS_HELP, FinetuneRequest

EPILOG = """\
examples:
  cramkit finetune --task glue/sst2 --from runs/tiny --data-dir glue_data
  cramkit finetune --task glue/rte --from hf:models/bert-base-uncased --seeds 0,1,2 --set lr=2e-5
  cramkit finetune --train train.csv --dev dev.csv --text-a review --label stars --from runs/tiny

defaults (Cramming's GLUE-sane recipe, one for all tasks): lr auto (4e-5; 1e-3 for models narrower than
384, e.g. the tiny presets), batch 16, 5 epochs and at least
500 steps (small data trains too; only when neither epochs nor min_steps is set: --set epochs=1 trains one
epoch), AdamW (0.9, 0.98, eps 1e-6, weight decay 0.01), 10% linear warmup then cosine decay, max_length
128, dropout 0.1, the model's own pooling (a sentence-transformers model's mean; else the first token
through BERT's pooler). Override any with --set KEY=VALUE.

few labels: --few-shot 16 --splits 5 (LM-BFF's protocol, any task); --method prompt (the MLM head through a
template: --prompt TEMPLATE --label-words LABEL=WORD,...); --method ptuning (deep prompts, encoder frozen);
--method setfit (SetFit: the encoder learns from pairs of rows, then a logistic regression; any encoder,
e.g. all-MiniLM-L6-v2, which has no MLM head).

FewCLUE (a task folder in FewCLUE's layout): --fewshot-splits 0-4 trains on train_K for each K, scores
on test_public, and reports each split with the mean and standard deviation (FewCLUE's protocol).
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "finetune",
        help="fine-tune an encoder on one task (GLUE or your own file) and score it",
        description="Fine-tune a cramkit run or a Hugging Face BERT directory on one task; report the dev "
        "score (median over seeds) and write test predictions in the GLUE leaderboard format.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    request.add_arguments(p, FinetuneRequest, helps={"overrides": SETTINGS_HELP})
    p.add_argument("--list-tasks", action="store_true", help="list the registered tasks and mixtures and exit")
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the fine-tuning settings this command would use (YAML) and exit; nothing is read or written",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        metavar="N",
        help="processes on this machine (starts torchrun; DDP, one per GPU); needs --out",
    )
    p.add_argument("--request", metavar="FILE.yaml", help=argparse.SUPPRESS)  # torchrun's workers: the request
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import cramkit

    if args.list_tasks:
        return _list_tasks()
    if args.request is not None:  # a torchrun worker: the request the launcher checked, as it is
        req = request.read_request(FinetuneRequest, args.request, "finetune")
    else:
        req = request.from_args(FinetuneRequest, args)
    embeds = req.embeds()
    if args.print_config:  # the settings, checked; nothing is read or written
        cfg = req.contrastive().embedding_config() if embeds else req.finetune_config()
        return _print_config(cfg)
    if args.nproc != 1:
        return _launch(req, args.nproc)
    if embeds:
        creq = req.contrastive()
        cfg = creq.resolve()
        creq = dataclasses.replace(creq, out=creq.out_dir(cfg))
        res = cramkit.train_embeddings(creq)
        if runtime.torchrun().is_main:  # rank 0 reports
            report_contrastive(creq, cfg, res)
        return 0
    settings, mixture = req.resolve()
    req = dataclasses.replace(req, out=req.out_dir(mixture, keep=True))  # the command keeps its model
    res = cramkit.finetune(req)
    if not res:  # under torchrun, a rank other than 0: rank 0 reports
        return 0
    if req.few_shot is not None or req.fewshot_splits:
        report_fewshot(req, res)
    elif mixture is not None:
        report_mixture(req, res)
    else:
        report_finetune(req, settings, res)
    if res.get("skipped_rows"):
        print(f"skipped bad rows: {json.dumps(res['skipped_rows'])}", file=sys.stderr)
    return 0


def _print_config(cfg: object) -> int:
    import yaml

    from cramkit.config import to_dict

    print(yaml.safe_dump({"finetune": to_dict(cfg)}, sort_keys=False), end="")
    return 0


def _list_tasks() -> int:
    from cramkit.tasks.mixtures import get_mixture, list_mixtures
    from cramkit.tasks.registry import list_tasks

    print("\n".join(list_tasks()))
    print(
        "(or your own files: --train FILE [--dev FILE] --text-a COLUMN [--text-b COLUMN | --choices COLS] "
        "--label COLUMN)"
    )
    print("\nmixtures (--mixture NAME, or task names separated by commas):")
    for name in list_mixtures():
        mix = get_mixture(name)
        print(f"{name}: {', '.join(mix.tasks)} (rates {mix.rates}){f'; {mix.description}' if mix.description else ''}")
    return 0


def _launch(req: FinetuneRequest, nproc: int) -> int:
    """``--nproc N``: the request checked once here, then written to a file that every one of N torchrun
    processes reads (``cramkit finetune --request FILE``)."""
    from cramkit.train.launch import launch_request

    if req.embeds():
        req.contrastive().resolve(nproc)  # negatives gathered across the processes
    else:
        req.resolve(nproc)
    return launch_request(nproc, "finetune", req)
