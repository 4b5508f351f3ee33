"""`cramkit eval sts` and `cramkit eval retrieval`: score an embedding model (no fine-tuning). The arguments
live on the `eval` parser (commands/tasks.py) in their own group; heavy imports stay inside functions."""

from __future__ import annotations

import argparse
import json
import sys

from cramkit.commands.checks import add_pass_args
from cramkit.errors import CramkitError
from cramkit.evaluation import CUTOFF

EMBED_EVALS = ("sts", "retrieval")

EPILOG = """\
embedding models (no fine-tuning: the model's own embeddings, cosine similarity, every number x100):
  cramkit eval sts --from hf:models/all-MiniLM-L6-v2 --data STS-B/dev.tsv
  cramkit eval sts --from runs/tiny --data MRPC/dev.tsv --text-a '#1 String' --text-b '#2 String' --label Quality
  cramkit eval retrieval --from hf:models/all-MiniLM-L6-v2 --data scifact/ --split test
  cramkit eval retrieval --from hf:models/all-MiniLM-L6-v2 --data scifact/ --index idx/
"""

# the suites' own options, and the embedding evaluations': each refused on the other side
_SUITE_ONLY = {
    "data_dir": "--data-dir",
    "seeds": "--seeds",
    "tasks": "--tasks",
    "fewshot_splits": "--fewshot-splits",
    "config": "--config",
    "few_shot": "--few-shot",
    "method": "--method",
    "prefix_len": "--prefix-len",
    "report_to": "--report-to",
}
_EMBED_ONLY = {
    "data": "--data",
    "text_a": "--text-a",
    "text_b": "--text-b",
    "label": "--label",
    "split": "--split",
    "index": "--index",
    "k": "--k",
    "max_batch_tokens": "--max-batch-tokens",
    "dimensions": "--dimensions",
}


def add_arguments(e: argparse.ArgumentParser) -> None:
    g = e.add_argument_group("embedding models: cramkit eval sts | retrieval")
    g.add_argument(
        "--data",
        metavar="FILE_OR_DIR",
        help="sts: a TSV/CSV/JSONL file of pairs with a gold score (GLUE STS-B's dev.tsv: sentence1, sentence2, "
        "score); retrieval: a folder in BEIR's layout (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv)",
    )
    g.add_argument("--text-a", help="sts: the first text's column (default sentence1)")
    g.add_argument("--text-b", help="sts: the second text's column (default sentence2)")
    g.add_argument("--label", help="sts: the gold score's column (default score)")
    g.add_argument("--split", help="retrieval: the judgements to score, qrels/SPLIT.tsv (default test)")
    g.add_argument(
        "--index",
        metavar="IDX",
        help="retrieval: search through this index (cramkit index build DATA/corpus.jsonl --encoder MODEL) "
        "instead of exact search; exact search over its vectors is reported beside it",
    )
    g.add_argument(
        "-k", "--k", type=int, metavar="K", help=f"retrieval: the cut-off of nDCG and MRR (default {CUTOFF})"
    )
    add_pass_args(g, device="auto (default), cpu, cuda, cuda:N")
    g.add_argument(
        "--dimensions",
        type=int,
        metavar="N",
        help="score the vectors cut to their first N dimensions (a Matryoshka model's: its recorded list)",
    )


def check_suite_args(args: argparse.Namespace) -> None:
    """A suite (glue, clue, ...) given an embedding evaluation's option: one line naming it."""
    given = [flag for name, flag in _EMBED_ONLY.items() if getattr(args, name, None) is not None]
    if given:
        raise CramkitError(
            f"{given[0]} applies to cramkit eval sts / retrieval (embedding models), not to the suite "
            f"{args.suite}; leave it out"
        )


def run_embed_eval(args: argparse.Namespace) -> int:
    import cramkit

    what = args.suite.lower()
    given = [flag for name, flag in _SUITE_ONLY.items() if getattr(args, name, None)]
    given += ["--set"] if args.overrides else []
    if given:
        raise CramkitError(
            f"{given[0]} applies to the fine-tuning suites (glue, clue, ...); cramkit eval {what} scores the "
            "model's embeddings as they are: leave it out"
        )
    if not args.data:
        example = "STS-B/dev.tsv" if what == "sts" else "DIR (corpus.jsonl, queries.jsonl, qrels/test.tsv)"
        raise CramkitError(f"cramkit eval {what} needs --data {example}")
    wrong = (
        [f for n, f in _EMBED_ONLY.items() if n in ("split", "index", "k") and getattr(args, n) is not None]
        if what == "sts"
        else [f for n, f in _EMBED_ONLY.items() if n in ("text_a", "text_b", "label") and getattr(args, n)]
    )
    if wrong:
        other = "retrieval" if what == "sts" else "sts"
        raise CramkitError(f"{wrong[0]} applies to cramkit eval {other}, not {what}; leave it out")
    if args.print_config:  # the settings, as the suites print theirs; nothing is read or written
        return _print_settings(args, what)
    if what == "sts":
        res = cramkit.evaluate_sts(
            args.source,
            args.data,
            args.out or "eval-sts",
            text_a=args.text_a,
            text_b=args.text_b,
            label=args.label,
            skip_bad_rows=args.skip_bad_rows,
            device=args.device,
            max_batch_tokens=args.max_batch_tokens,
            progress=not args.no_progress,
            dimensions=args.dimensions,
        )
    else:
        res = cramkit.evaluate_retrieval(
            args.source,
            args.data,
            args.out or "eval-retrieval",
            split=args.split or "test",
            index=args.index,
            k=CUTOFF if args.k is None else args.k,
            skip_bad_rows=args.skip_bad_rows,
            device=args.device,
            max_batch_tokens=args.max_batch_tokens,
            progress=not args.no_progress,
            dimensions=args.dimensions,
        )
    from cramkit.evaluation.results import summary_line

    print(summary_line(res))
    if res.get("skipped_rows"):
        print(f"cramkit: note: skipped bad rows: {json.dumps(res['skipped_rows'])}", file=sys.stderr)
    return 0


def _print_settings(args: argparse.Namespace, what: str) -> int:
    import yaml

    settings = {"evaluation": what, "from": args.source, "data": args.data, "out": args.out or f"eval-{what}"}
    if what == "sts":
        settings.update(
            text_a=args.text_a or "sentence1", text_b=args.text_b or "sentence2", label=args.label or "score"
        )
    else:
        settings.update(split=args.split or "test", index=args.index, k=CUTOFF if args.k is None else args.k)
    settings.update(skip_bad_rows=args.skip_bad_rows, device=args.device, max_batch_tokens=args.max_batch_tokens)
    settings.update(dimensions=args.dimensions)
    print(yaml.safe_dump({"eval": settings}, sort_keys=False), end="")
    return 0
