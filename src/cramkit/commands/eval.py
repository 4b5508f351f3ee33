"""`cramkit eval SUITE`: fine-tune and score on every task of a suite (GLUE, CLUE, ...), or score a model's
embeddings as they are (`eval sts`, `eval retrieval`). Its flags are
:class:`~cramkit.evaluation.request.EvalRequest`'s; ``-h`` (after SUITE: with its tasks) and ``--print-config`` are
the command's own."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from cramkit import request
from cramkit.errors import CramkitError
from cramkit.evaluation.request import EMBED_EVALS, EvalRequest
from cramkit.recipes.finetune_request import SETTINGS_HELP

EPILOG = """\
examples:
  cramkit eval glue --from runs/tiny --data-dir glue_data
  cramkit eval clue --from runs/tiny-zh --data-dir clue_data --tasks afqmc,tnews
  cramkit eval clue --from runs/tiny-zh --data-dir FewCLUE/datasets --fewshot-splits 0-4
embedding models (no fine-tuning: the model's own embeddings, cosine similarity, every number x100):
  cramkit eval sts --from hf:models/all-MiniLM-L6-v2 --data STS-B/dev.tsv
  cramkit eval sts --from runs/tiny --data MRPC/dev.tsv --text-a '#1 String' --text-b '#2 String' --label Quality
  cramkit eval retrieval --from hf:models/all-MiniLM-L6-v2 --data scifact/ --split test
  cramkit eval retrieval --from hf:models/all-MiniLM-L6-v2 --data scifact/ --index idx/
"""


def register(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser(
        "eval",
        help="fine-tune and score on every task of a suite (glue, clue, fewclue, ...) present in --data-dir; "
        "or score an embedding model as it is (sts, retrieval)",
        description="Fine-tune on every task of a suite found in --data-dir (one recipe for all), then write "
        "results.json, results.md (task by task + the suite's average), scores.png and submission/ (the test "
        "predictions in the leaderboard's file names). Tasks in FewCLUE's layout follow FewCLUE's protocol. "
        "`eval sts` and `eval retrieval` score a model's embeddings without fine-tuning (results.json, "
        "results.md, scores.png in --out).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    e.add_argument("-h", "--help", action=_SuiteHelp, help="show this help (after SUITE: with its tasks) and exit")
    request.add_arguments(
        e,
        EvalRequest,
        helps={"overrides": f"{SETTINGS_HELP}; for every task of the suite", "device": "auto, cpu, cuda, cuda:N"},
    )
    e.add_argument(
        "--print-config",
        action="store_true",
        help="print the settings this command would use (YAML) and exit; nothing is read or written",
    )
    e.set_defaults(func=run, suite=None)  # SUITE is required here (-h before it: the help of every suite)


class _SuiteHelp(argparse.Action):
    """``cramkit eval SUITE --help``: the help titled for the suite, with its tasks and where its data comes
    from (the suites are looked up only here, so that building the parser imports no task code)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        name = getattr(namespace, "suite", None)
        if name and name.lower() in EMBED_EVALS:
            parser.prog = f"{parser.prog} {name.lower()}"
            parser.usage = (
                "%(prog)s --from MODEL --data " + ("FILE" if name.lower() == "sts" else "DIR") + " [--out DIR]"
            )
        elif name:
            from cramkit.tasks.registry import get_suite

            try:
                suite = get_suite(name.lower())
            except CramkitError as e:
                parser.exit(2, f"cramkit: error: {e}\n")
            tasks = ", ".join(t.split("/")[-1] for t in suite.task_names)
            parser.prog = f"{parser.prog} {suite.name}"
            parser.usage = "%(prog)s --from MODEL [--data-dir DIR] [--tasks T1,T2] [options]"
            parser.epilog = (
                f"{suite.name}: tasks {tasks}\ndata: {suite.data_hint}\naverage: {suite.average_note}\n\n"
                + (parser.epilog or "")
            )
        parser.print_help()
        parser.exit()


def run(args: argparse.Namespace) -> int:
    import cramkit

    req = request.from_args(EvalRequest, args)
    cfg = req.resolve()
    req = dataclasses.replace(req, out=req.out_dir())
    if args.print_config:  # nothing is read or written
        return _print_config(req, cfg)
    res = cramkit.evaluate(req)
    if req.embeds():
        from cramkit.evaluation.results import summary_line

        print(summary_line(res))
        if res.get("skipped_rows"):
            print(f"cramkit: note: skipped bad rows: {json.dumps(res['skipped_rows'])}", file=sys.stderr)
        return 0
    print((Path(str(req.out)) / "results.md").read_text(encoding="utf-8"))
    if res["skipped"]:
        notes = "; ".join(f"{k} ({v})" for k, v in res["skipped"].items())
        print(f"note: skipped: {notes}", file=sys.stderr)
    return 0


def _print_config(req: EvalRequest, cfg: object) -> int:
    """A suite's fine-tuning settings (as ``finetune --print-config``), or an embedding evaluation's."""
    import yaml

    from cramkit.config import to_dict

    if cfg is not None:
        print(yaml.safe_dump({"finetune": to_dict(cfg)}, sort_keys=False), end="")
        return 0
    from cramkit.evaluation import CUTOFF

    what = req.suite_name()
    settings: dict[str, Any] = {"evaluation": what, "from": req.source, "data": req.data, "out": req.out}
    if what == "sts":
        settings.update(text_a=req.text_a or "sentence1", text_b=req.text_b or "sentence2", label=req.label or "score")
    else:
        settings.update(split=req.split or "test", index=req.index, k=CUTOFF if req.k is None else req.k)
    settings.update(skip_bad_rows=req.skip_bad_rows, device=req.device, max_batch_tokens=req.max_batch_tokens)
    settings.update(dimensions=req.dimensions)
    print(yaml.safe_dump({"eval": settings}, sort_keys=False), end="")
    return 0
