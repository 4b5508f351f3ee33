"""`cramkit finetune` (one task) and `cramkit eval` (a suite: GLUE, CLUE, ...). Heavy imports stay inside functions."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cramkit.commands import embed_eval
from cramkit.commands.checks import add_file_task_args, add_finetune_config_args, add_training_args
from cramkit.commands.finetune_report import report_fewshot, report_finetune, report_mixture
from cramkit.errors import CramkitError
from cramkit.recipes import FEWSHOT_SPLITS

FINETUNE_EPILOG = """\
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

EVAL_EPILOG = """\
examples:
  cramkit eval glue --from runs/tiny --data-dir glue_data
  cramkit eval clue --from runs/tiny-zh --data-dir clue_data --tasks afqmc,tnews
  cramkit eval clue --from runs/tiny-zh --data-dir FewCLUE/datasets --fewshot-splits 0-4
"""


def register(sub: argparse._SubParsersAction) -> None:
    _finetune_parser(sub)
    _eval_parser(sub)


def _finetune_parser(sub: argparse._SubParsersAction) -> None:
    """``cramkit finetune``: one task (registered, or from files), a mixture of tasks, few labels, or an encoder
    trained to embed (the contrastive stage)."""
    p = sub.add_parser(
        "finetune",
        help="fine-tune an encoder on one task (GLUE or your own file) and score it",
        description="Fine-tune a cramkit run or a Hugging Face BERT directory on one task; report the dev "
        "score (median over seeds) and write test predictions in the GLUE leaderboard format.",
        epilog=FINETUNE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--from",
        dest="source",
        metavar="MODEL",
        help="cramkit run / checkpoint directory, a model directory, or hf:PATH (a Hugging Face BERT directory)",
    )
    p.add_argument("--task", help="registered task name, e.g. glue/sst2 (see --list-tasks)")
    _mixture_args(p)
    p.add_argument("--list-tasks", action="store_true", help="list the registered tasks and mixtures and exit")
    p.add_argument(
        "--data-dir",
        action="append",
        metavar="[SUITE=]DIR",
        help="the benchmark's folder (GLUE: DIR/SST-2/train.tsv, ...; default $CRAMKIT_GLUE_DIR; CLUE: DIR/tnews/"
        "train.json or FewCLUE's DIR/eprstmt/train_0.json, default $CRAMKIT_CLUE_DIR); for a "
        "mixture across benchmarks, one per suite: --data-dir glue=DIR --data-dir clue=DIR2",
    )
    p.add_argument(
        "--out",
        help="output directory: the fine-tuned model (median seed; cramkit.load / predict / export / serve), "
        "results.json, test predictions (default: finetune-TASK)",
    )
    p.add_argument("--seeds", help="comma-separated seeds, e.g. 0,1,2 (the median is reported)")
    add_finetune_config_args(p)
    add_training_args(
        p,
        "override a fine-tuning setting, e.g. --set lr=2e-5 --set epochs=3; others: batch_size, "
        "max_length, warmup, weight_decay, dropout, pooling (first|mean), max_train_examples (use only the "
        "first N training rows; 0 = all), label_names (0=negative,1=positive: what the model answers), prior "
        "(LABEL=TEXT,...: the classes described), device, precision (an unknown key lists them all)",
        nproc="processes on this machine (starts torchrun; DDP, one per GPU); needs --out",
    )
    p.add_argument(
        "--fewshot-splits",
        metavar="SPLITS",
        help="a task in FewCLUE's layout: FewCLUE's protocol over these splits, e.g. 0-4, 0,2 or few_all "
        "(train on train_K, score on test_public; each split in --out/split-K, the mean and spread in --out)",
    )
    p.add_argument(
        "--unlabelled",
        metavar="FILE",
        help="self-training: texts without labels (a .txt of one per line, or a table read with --train's columns); "
        "the model fine-tuned on the labels labels them, and a student learns from the labels and the confident "
        "pseudo-labels (with --few-shot: on every split); settings: --set self_train_*",
    )
    _method_args(p.add_argument_group("few labels: prompts (PET / LM-BFF) and deep prompts (P-tuning v2)"))
    add_file_task_args(
        p.add_argument_group("a task from your own files (instead of --task)"),
        dev="dev file, scored after training (default: hold out --dev-fraction of --train)",
        held_out=True,
    )
    _embedding_args(p.add_argument_group("an encoder that embeds: the contrastive stage (instead of a classifier)"))
    p.set_defaults(func=run_finetune)


def _mixture_args(p: argparse.ArgumentParser) -> None:
    """``finetune --mixture``: several tasks trained together, how often each is drawn, how their gradients meet."""
    p.add_argument(
        "--mixture",
        metavar="MIXTURE",
        help="train several tasks together, one head each: a registered mixture (see --list-tasks) or "
        "task names separated by commas, e.g. glue/mrpc,glue/rte",
    )
    p.add_argument(
        "--rates",
        metavar="RULE",
        help="with --mixture: how often each task's batches are drawn: proportional (default: by size), "
        "capped:N (size, at most N), temperature:T, equal, or one weight per task (2,1,1)",
    )
    p.add_argument(
        "--weighting",
        metavar="RULE",
        help="with --mixture: every step takes one batch of every task and combines their gradients on the "
        "encoder: sum (of the losses), gradnorm (each task's gradient scaled to the mean norm) or pcgrad "
        "(conflicting components projected away); default without it: one task per step, drawn by --rates",
    )
    p.add_argument(
        "--primary",
        metavar="TASK",
        help="with --mixture: the task that matters; the other tasks' gradients are kept only where they do not "
        "oppose its gradient (implies --weighting sum unless given gradnorm)",
    )


def _embedding_args(c: argparse._ArgumentGroup) -> None:
    """``finetune --objective contrastive|simcse``: the contrastive stage's flags."""
    c.add_argument(
        "--objective",
        choices=("classify", "contrastive", "simcse"),
        default="classify",
        help="contrastive: in-batch negatives over pairs (--train FILE --text-a COL --text-b COL, or a pair "
        "task: --task glue/mrpc's paraphrases); simcse: single texts (a column, or a text file of lines), "
        "dropout as the positive; the output is an embedding model (embed, index, serve /embed). Settings "
        "(--set): batch_size, micro_batch (cached negatives), temperature, learn_temperature, symmetric, "
        "matryoshka (e.g. 256,128,64), lr, epochs, pooling, gather_negatives (with --nproc: every process's "
        "vectors are each anchor's negatives; default true)",
    )
    c.add_argument("--negative", metavar="COLUMN", help="--objective contrastive: a column of hard negatives")
    c.add_argument(
        "--query-prompt",
        metavar="TEXT",
        help="--objective contrastive: a text put before each anchor (E5's 'query: '), recorded as the model's "
        "prompt named query (embed/index/serve --prompt-name query; index queries get it)",
    )
    c.add_argument(
        "--passage-prompt",
        metavar="TEXT",
        help="--objective contrastive: a text put before each positive and negative (E5's 'passage: '), recorded "
        "as the prompt named passage (index documents get it)",
    )
    c.add_argument(
        "--default-prompt-name",
        choices=("query", "passage"),
        help="the prompt an input gets when a request names none (sentence-transformers' default_prompt_name)",
    )
    c.add_argument(
        "--budget",
        help="--objective contrastive|simcse: the training budget as in pretraining: '10m' (time), "
        "'2000steps' or '5e6tok' (default: --set epochs, 1)",
    )


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    """``cramkit eval SUITE``: fine-tune and score on every task of a suite, or score a model's embeddings."""
    e = sub.add_parser(
        "eval",
        help="fine-tune and score on every task of a suite (glue, clue, fewclue, ...) present in --data-dir; "
        "or score an embedding model as it is (sts, retrieval)",
        description="Fine-tune on every task of a suite found in --data-dir (one recipe for all), then write "
        "results.json, results.md (task by task + the suite's average), scores.png and submission/ (the test "
        "predictions in the leaderboard's file names). Tasks in FewCLUE's layout follow FewCLUE's protocol. "
        "`eval sts` and `eval retrieval` score a model's embeddings without fine-tuning (results.json, "
        "results.md, scores.png in --out).",
        epilog=EVAL_EPILOG + embed_eval.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    e.add_argument("-h", "--help", action=_SuiteHelp, help="show this help (after SUITE: with its tasks) and exit")
    e.add_argument(
        "suite",
        metavar="SUITE",
        help="the benchmark: glue, superglue, clue, fewclue (every registered suite); or sts / retrieval: the "
        "model's embeddings scored as they are (see --data)",
    )
    e.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="RUN_OR_HF",
        help="cramkit run / checkpoint directory, or hf:PATH",
    )
    e.add_argument(
        "--data-dir",
        help="the suite's root folder (DIR/TASK/...); default $CRAMKIT_GLUE_DIR or ./glue_data for glue, "
        "$CRAMKIT_CLUE_DIR or ./clue_data for clue",
    )
    e.add_argument("--out", help="output directory (default: eval-SUITE, eval-sts, eval-retrieval)")
    e.add_argument("--seeds", help="comma-separated seeds (median reported per task)")
    e.add_argument("--tasks", help="only these tasks, comma-separated, e.g. rte,stsb (default: every task present)")
    e.add_argument(
        "--fewshot-splits",
        metavar="SPLITS",
        help="tasks in FewCLUE's layout: the splits to train on, e.g. 0-4 (FewCLUE's protocol), 0,2 or "
        "few_all (the default); each is scored on test_public, reported with the mean and spread",
    )
    add_finetune_config_args(e)
    _method_args(e.add_argument_group("few labels (every task of the suite; prompts: the built-in ones)"), suite=True)
    add_training_args(
        e,
        "override a fine-tuning setting for every task, e.g. --set epochs=3 --set max_train_examples=2000 (as in "
        "cramkit finetune)",
    )
    embed_eval.add_arguments(e)
    e.set_defaults(func=run_eval)


def _method_args(g: argparse._ArgumentGroup, suite: bool = False) -> None:
    g.add_argument(
        "--few-shot",
        type=int,
        metavar="K",
        help="LM-BFF's few-shot protocol: K training examples per class and a dev set of K per class (it "
        "keeps the best checkpoint) drawn from the training data, --splits times; scored on the task's "
        "dev split; the mean and standard deviation over the splits are reported",
    )
    g.add_argument(
        "--splits",
        type=int,
        default=FEWSHOT_SPLITS,
        metavar="S",
        help="with --few-shot: how many splits (default %(default)s)",
    )
    g.add_argument(
        "--method",
        choices=["head", "prompt", "ptuning", "setfit", "auto"],
        help="head: a fresh classifier on the pooled output (default); prompt: the MLM head scores label "
        "words through a template; ptuning: the encoder frozen, trainable prefixes at every layer and a "
        "head (only those are stored, with the base model's checksum); setfit: the encoder trained on pairs "
        "of rows (same label or not), then a logistic-regression head (SetFit: no MLM head needed; "
        "--set setfit_pairs=20 pairs of each kind per row); auto: the one of them that cross-validation on the "
        "labelled rows scores best, trained on all of them (few labels; --set auto_folds=4)",
    )
    if not suite:
        g.add_argument(
            "--prompt",
            metavar="TEMPLATE",
            help="prompt-based fine-tuning: the template, with the task's fields and one [MASK], e.g. "
            "'{text_a} It was [MASK] .' or '{premise} ? [MASK] , {hypothesis}' (default: the task's built-in)",
        )
        g.add_argument(
            "--label-words",
            metavar="LABEL=WORD,...",
            help="the word for each label, scored at the mask, e.g. positive=great,negative=terrible",
        )
    g.add_argument("--prefix-len", type=int, metavar="N", help="--method ptuning: prefix keys/values per layer (16)")


class _SuiteHelp(argparse.Action):
    """``cramkit eval SUITE --help``: the help titled for the suite, with its tasks and where its data comes
    from (the suites are looked up only here, so that building the parser imports no task code)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        name = getattr(namespace, "suite", None)
        if name and name.lower() in embed_eval.EMBED_EVALS:
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


def _settings(args: argparse.Namespace) -> tuple[dict, dict]:
    """(``--config FILE``'s settings, ``--set``'s), each flat (``--set finetune.lr=...`` is taken too)."""
    from cramkit.config import parse_overrides

    overrides = parse_overrides(args.overrides)
    if isinstance(overrides.get("finetune"), dict):  # accept --set finetune.lr=... too
        nested = overrides.pop("finetune")
        overrides = {**overrides, **nested}
    base: dict = {}
    if getattr(args, "config", None):
        from cramkit.recipes.finetune_config import settings_file

        base = settings_file(args.config)
    return base, overrides


def _config(args: argparse.Namespace):
    """The fine-tuning settings the flags give (what ``cramkit.finetune``/``cramkit.evaluate`` take as
    ``config``): a mistyped setting fails here, before any process starts."""
    from cramkit.api import finetune_config

    base, overrides = _settings(args)
    for flag in ("method", "prefix_len"):
        if getattr(args, flag, None) is not None:
            overrides[flag] = getattr(args, flag)
    method = overrides.get("method", base.get("method"))
    if getattr(args, "prefix_len", None) is not None and method not in ("ptuning", "auto"):
        raise CramkitError("--prefix-len sizes deep prompts: give it with --method ptuning")
    if args.seeds:
        try:
            overrides["seeds"] = [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError:
            raise CramkitError(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2") from None
    cfg = finetune_config(
        None,
        {**base, **overrides},
        prompt=getattr(args, "prompt", None),
        label_words=getattr(args, "label_words", None),
        report_to=getattr(args, "report_to", None),
    )
    from cramkit.model.prompting import check_prefix_len

    check_prefix_len(cfg.prefix_len)  # --prefix-len, --set or --config: bounded before any work
    return cfg


def _print_config(cfg) -> int:
    import yaml

    from cramkit.config import to_dict

    print(yaml.safe_dump({"finetune": to_dict(cfg)}, sort_keys=False), end="")
    return 0


def _task_kwargs(args: argparse.Namespace) -> dict:
    """The task flags as ``cramkit.finetune``'s keywords (a registered task or the user's files)."""
    return dict(
        task=args.task,
        data_dir=args.data_dir,
        train=args.train,
        dev=args.dev,
        test=args.test,
        text_a=args.text_a,
        text_b=args.text_b,
        label=args.label,
        regression=args.regression,
        choices=_columns_list(args.choices, "--choices"),
        name=args.name,
        dev_fraction=args.dev_fraction,
        skip_bad_rows=args.skip_bad_rows,
    )


def _columns_list(value: str | None, flag: str) -> list[str] | None:
    """``A,B,C`` -> ["A", "B", "C"] (None when not given)."""
    if value is None:
        return None
    cols = [c.strip() for c in value.split(",") if c.strip()]
    if not cols:
        raise CramkitError(f"{flag} {value!r}: name the column(s), e.g. {flag} choice1,choice2")
    return cols


def run_finetune(args: argparse.Namespace) -> int:
    if args.list_tasks:
        return _list_tasks()
    prompts = (args.query_prompt, args.passage_prompt, args.default_prompt_name)
    if args.objective != "classify" or args.negative or args.budget or any(x is not None for x in prompts):
        return _run_contrastive(args)
    import cramkit
    from cramkit.api import check_finetune

    cfg = _config(args)  # a mistyped setting fails here, before --nproc starts the processes
    if args.print_config:
        return _print_config(cfg)
    if not args.source:
        raise CramkitError("cramkit finetune needs --from MODEL (a run directory, a model directory or hf:DIR)")
    routes = dict(
        mixture=args.mixture,
        rates=args.rates,
        weighting=args.weighting,
        primary=args.primary,
        few_shot=args.few_shot,
        splits=args.splits,
        fewshot_splits=args.fewshot_splits,
        unlabelled=args.unlabelled,
    )
    mixture = check_finetune(task=args.task, train=args.train, config=cfg, **routes)
    fewshot = args.fewshot_splits or args.few_shot is not None
    if args.nproc != 1:
        if cfg.method == "auto":
            raise CramkitError("--method auto trains its candidates one by one in one process: leave out --nproc")
        if fewshot:
            flag = "--few-shot" if args.few_shot is not None else "--fewshot-splits"
            raise CramkitError(f"{flag} runs one task in one process; leave out --nproc and --mixture")
        if args.unlabelled:
            raise CramkitError("--unlabelled self-trains in one process; leave out --nproc")
        if mixture is not None and (args.weighting is not None or args.primary is not None):
            _check_weighting_processes(args, mixture)
        return _launch_finetune(args)
    out = args.out
    if mixture is not None:
        kwargs = dict(data_dir=args.data_dir, skip_bad_rows=args.skip_bad_rows)
    else:
        kwargs = _task_kwargs(args)
        if out is None and not fewshot:  # the command keeps its model (Python's out=None keeps none)
            out = _default_out(args)
    res = cramkit.finetune(args.source, **kwargs, **routes, out=out, progress=not args.no_progress, config=cfg)
    if not res:  # under torchrun, a rank other than 0: rank 0 reports
        return 0
    if fewshot:
        report_fewshot(args, res)
    elif mixture is not None:
        report_mixture(res, Path(args.out or f"finetune-{mixture.name}"))
    else:
        report_finetune(args, cfg, res, Path(res.get("self_training", {}).get("model") or out))
    if res.get("self_training") and fewshot:
        from cramkit.selftraining.recipe import fewshot_line

        print(fewshot_line(res))
    if res.get("skipped_rows"):
        print(f"skipped bad rows: {json.dumps(res['skipped_rows'])}", file=sys.stderr)
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


def _default_out(args: argparse.Namespace) -> str:
    """finetune-TASK: the registered task's name, or the file task's (--name, else the train file's stem)."""
    name = (args.name or Path(args.train).stem) if args.train else str(args.task)
    return f"finetune-{name.replace('/', '-')}"


def _run_contrastive(args: argparse.Namespace) -> int:
    """``finetune --objective contrastive|simcse``: the contrastive stage (``cramkit.train_embeddings``)."""
    import cramkit
    from cramkit.api import embedding_config

    if args.objective == "classify":
        raise CramkitError(
            "--negative, --budget and the --*-prompt flags belong to --objective contrastive or simcse; add it"
        )
    unfit = [f for f, v in (("--mixture", args.mixture), ("--prompt", args.prompt), ("--few-shot", args.few_shot)) if v]
    unfit += ["--unlabelled"] * bool(args.unlabelled)
    unfit += ["--fewshot-splits"] * bool(args.fewshot_splits)
    if unfit:
        raise CramkitError(f"--objective {args.objective} trains an embedding model; {', '.join(unfit)} do not apply")
    base, overrides = _settings(args)
    if args.budget:
        overrides["budget"] = args.budget
    for flag in ("query_prompt", "passage_prompt", "default_prompt_name"):  # taken as given (not YAML)
        if getattr(args, flag) is not None:
            overrides[flag] = getattr(args, flag)
    cfg = embedding_config(None, {**base, **overrides}, objective=args.objective, report_to=args.report_to)
    if args.print_config:
        return _print_config(cfg)
    if not args.source:
        raise CramkitError("cramkit finetune needs --from MODEL (a run directory, a model directory or hf:DIR)")
    if args.nproc != 1:  # the same command on N processes (torchrun): negatives gathered across them
        if args.nproc > 1 and cfg.batch_size % args.nproc:
            raise CramkitError(
                f"batch_size {cfg.batch_size} does not divide over --nproc {args.nproc}; give a multiple of "
                f"{args.nproc} (each process embeds an equal share of every batch)"
            )
        return _launch_finetune(args)
    res = cramkit.train_embeddings(
        args.source,
        train=args.train,
        dev=args.dev,
        task=args.task,
        data_dir=args.data_dir,
        text_a=args.text_a,
        text_b=args.text_b,
        negative=args.negative,
        out=args.out,
        skip_bad_rows=args.skip_bad_rows,
        progress=not args.no_progress,
        config=cfg,
    )
    from cramkit.runtime import torchrun

    if not torchrun().is_main:  # rank 0 reports
        return 0
    before, after = res.get("before"), res.get("after")
    if after:
        was = f" (before: {before['dev_recall_at_1']:.1f}, {before['dev_mrr']:.1f})" if before else ""
        print(
            f"{cfg.objective}: dev recall@1 {after['dev_recall_at_1']:.1f}, MRR {after['dev_mrr']:.1f}{was}, "
            f"x100, over {res['dev_pairs']:,} held-out pairs"
        )
    print(
        f"trained {res['steps']} steps on {res['pairs']:,} pairs ({res['examples_per_s']:.1f} pairs/s)"
        + (f"; {res['skipped_rows']} rows skipped (an empty text)" if res["skipped_rows"] else "")
    )
    out = args.out or f"{cfg.objective}-{Path(args.train or args.task or 'pairs').stem.replace('/', '-')}"
    print(f"embedding model saved in {out}: cramkit embed --from {out} FILE; cramkit index build --from {out} ...")
    return 0


def _check_weighting_processes(args: argparse.Namespace, mixture) -> None:
    """``--weighting``/``--primary`` that combine the tasks' gradients in one process, given ``--nproc``."""
    from cramkit.recipes.weighting import check_weighting, needs_task_gradients

    weighting, index = check_weighting(args.weighting, args.primary, list(mixture.tasks))
    if needs_task_gradients(weighting, index):
        raise CramkitError(
            f"--weighting {weighting}{' with --primary' if index is not None else ''} combines the tasks' gradients "
            "in one process; leave out --nproc (only --weighting sum trains on several processes)"
        )


def _launch_finetune(args: argparse.Namespace) -> int:
    """``--nproc N``: the same command, without --nproc, on N processes started by torchrun."""
    from cramkit.train.launch import relaunch

    if not args.out:
        raise CramkitError("--nproc needs --out DIR: every process writes into the same directory")
    return relaunch(args.nproc, args.argv)


def run_eval(args: argparse.Namespace) -> int:
    import cramkit
    from cramkit.tasks.registry import get_suite

    if args.suite.lower() in embed_eval.EMBED_EVALS:
        return embed_eval.run_embed_eval(args)
    embed_eval.check_suite_args(args)
    suite = get_suite(args.suite.lower())  # an unknown suite: did-you-mean, before anything else
    cfg = _config(args)
    if args.print_config:
        return _print_config(cfg)
    out = Path(args.out or f"eval-{suite.name}")
    res = cramkit.evaluate(
        args.source,
        args.data_dir,
        out,
        suite=suite.name,
        skip_bad_rows=args.skip_bad_rows,
        progress=not args.no_progress,
        tasks=[t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None,
        fewshot_splits=args.fewshot_splits,
        few_shot=args.few_shot,
        splits=args.splits,
        config=cfg,
    )
    print((out / "results.md").read_text(encoding="utf-8"))
    if res["skipped"]:
        notes = "; ".join(f"{k} ({v})" for k, v in res["skipped"].items())
        print(f"note: skipped: {notes}", file=sys.stderr)
    return 0
