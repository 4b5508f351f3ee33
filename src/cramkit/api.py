"""The one front door: the verbs of the command line as typed Python functions (``cramkit.finetune``,
``cramkit.evaluate``, ...). Every ``cramkit VERB`` parses its flags and calls the function here, so the
checks (the model exists, the task resolves, the output may be written, what combines with what) are made
once, in this library code, and give the same line from both doors.

This module imports nothing heavy at import time (``cramkit --help`` builds every parser from it); each
verb imports its recipe when called. Where the library function is the verb already (its checks inside it),
``cramkit`` exports it as it is: ``cramkit.pretrain``, ``cramkit.predict``, ``cramkit.embed``,
``cramkit.evaluate_sts``, ``cramkit.evaluate_retrieval`` (see ``cramkit.__init__``). Verbs that hold
sub-verbs keep them in their package: ``cramkit.index.build_index`` (``cramkit index build``),
``cramkit.serve.serve`` (``cramkit serve``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.distillation.verb import check_student as check_student
from cramkit.distillation.verb import distill as distill
from cramkit.errors import CramkitError
from cramkit.recipes import DEV_FRACTION, FEWSHOT_SPLITS

if TYPE_CHECKING:
    from cramkit.loading import LoadedModel
    from cramkit.recipes.contrastive_config import ContrastiveConfig
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.tasks.mixtures import Mixture

PathLike = str | os.PathLike


def _report_to(settings: dict[str, Any], report_to: str | Sequence[str] | None) -> None:
    """The ``report_to`` keyword as the setting it stands for (a recipe config's ``report_to``)."""
    if report_to is not None:
        from cramkit.train.report import report_to_setting

        settings["report_to"] = report_to_setting(report_to)


def _check_source(source: PathLike | LoadedModel, flag: str = "--from") -> None:
    if isinstance(source, (str, os.PathLike)):
        from cramkit.loading import check_source

        check_source(str(source), flag)


def _preload(*tasks: Any) -> None:
    """Every split a run needs, read before any training starts: a missing or malformed file fails fast."""
    for task in tasks:
        for split in [task.train_split, *task.dev_splits]:
            task.examples(split)


def finetune_config(
    config: FinetuneConfig | str | os.PathLike | None = None,
    settings: Mapping[str, Any] | None = None,
    *,
    prompt: str | None = None,
    label_words: str | Mapping[str, str] | None = None,
    report_to: str | Sequence[str] | None = None,
) -> FinetuneConfig:
    """The fine-tuning settings: ``config`` (a FinetuneConfig, or a settings file as ``--config FILE`` takes and
    ``--print-config`` writes; default: the defaults) with ``settings`` (FinetuneConfig fields) and the keywords on
    top; an unknown or bad setting is one line."""
    from cramkit.recipes.finetune_config import config_from, settings_file

    if isinstance(config, (str, os.PathLike)):
        config = config_from(settings_file(config))
    over = dict(settings or {})
    _report_to(over, report_to)
    if prompt is not None:
        over["prompt"] = prompt
    if label_words is not None:
        over["label_words"] = (
            label_words if isinstance(label_words, str) else ",".join(f"{k}={v}" for k, v in label_words.items())
        )
    return config_from(over, base=config)


def check_finetune(
    *,
    task: str | None = None,
    train: PathLike | None = None,
    mixture: str | None = None,
    rates: str | None = None,
    weighting: str | None = None,
    primary: str | None = None,
    few_shot: int | None = None,
    splits: int = FEWSHOT_SPLITS,
    fewshot_splits: str | Sequence[str] | None = None,
    config: FinetuneConfig | None = None,
    unlabelled: Any = None,
) -> Mixture | None:
    """What :func:`finetune`'s routes allow together, checked before anything is read (the command line
    checks it before it starts processes too); the resolved mixture when one is given."""
    mix = None
    if rates is not None and mixture is None:
        raise CramkitError("--rates applies to --mixture; give the tasks with --mixture glue/mrpc,glue/rte,...")
    if mixture is not None:
        from cramkit.tasks.mixtures import resolve_mixture

        if task or train:
            raise CramkitError("give either --mixture or --task/--train, not both")
        mix = resolve_mixture(mixture, rates)  # an unknown name or a bad rate: one line
        if weighting is not None or primary is not None:
            from cramkit.recipes.finetune_config import FinetuneConfig
            from cramkit.recipes.multitask import check_weighting_settings

            if rates:
                raise CramkitError(
                    "--rates draws one task per step; --weighting/--primary train every task at every step: give "
                    "one of them"
                )
            check_weighting_settings(weighting, primary, list(mix.tasks), config or FinetuneConfig())
    elif weighting is not None or primary is not None:
        flag = "--weighting" if weighting is not None else "--primary"
        raise CramkitError(f"{flag} applies to --mixture; give the tasks with --mixture glue/mrpc,glue/cola,...")
    if few_shot is not None and fewshot_splits:
        raise CramkitError(
            "--few-shot K (LM-BFF's protocol) and --fewshot-splits (FewCLUE's) are two protocols: give one"
        )
    if few_shot is not None and splits < 1:
        raise CramkitError(f"--splits must be at least 1, got {splits}")
    if unlabelled is not None and mixture is not None:
        raise CramkitError("--unlabelled self-trains one task; leave out --mixture")
    if config is not None and config.method == "auto":
        from cramkit.recipes.method_auto import check_route

        check_route(config, few_shot=few_shot)
    if (few_shot is not None or fewshot_splits) and mixture is not None:
        flag = "--few-shot" if few_shot is not None else "--fewshot-splits"
        raise CramkitError(f"{flag} runs one task in one process; leave out --nproc and --mixture")
    return mix


def finetune(
    source: PathLike | LoadedModel,
    *,
    task: str | None = None,
    data_dir: PathLike | Sequence[str] | None = None,
    train: PathLike | None = None,
    dev: PathLike | None = None,
    test: PathLike | None = None,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str = "label",
    regression: bool = False,
    choices: Sequence[str] | None = None,
    name: str | None = None,
    dev_fraction: float = DEV_FRACTION,
    skip_bad_rows: bool = False,
    mixture: str | None = None,
    rates: str | None = None,
    weighting: str | None = None,
    primary: str | None = None,
    few_shot: int | None = None,
    splits: int = FEWSHOT_SPLITS,
    fewshot_splits: str | Sequence[str] | None = None,
    unlabelled: PathLike | Sequence[str] | None = None,
    out: PathLike | None = None,
    progress: bool = True,
    prompt: str | None = None,
    label_words: str | Mapping[str, str] | None = None,
    report_to: str | Sequence[str] | None = None,
    config: FinetuneConfig | str | os.PathLike | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Fine-tune ``source`` (anything :func:`cramkit.load` takes) on a registered ``task``, on your files
    (``train``, optional ``dev``: else ``dev_fraction`` of train is held out), or on a ``mixture`` of tasks
    (``"glue/mrpc,glue/cola"`` or a registered name; ``rates``, or ``weighting`` sum|gradnorm|pcgrad with a
    ``primary`` task). ``settings`` are FinetuneConfig fields (lr=2e-5, epochs=3, seeds=[0, 1, 2],
    method="ptuning", "setfit" or "auto", ...) on top of ``config`` (a FinetuneConfig, or the file
    ``cramkit finetune --print-config`` writes). ``prompt`` and ``label_words``
    (``{"0": "terrible", "1": "great"}``): prompt-based fine-tuning through the MLM head. With ``out`` the model of
    the median seed is saved there (``cramkit.load(out)``; None: one task trains in a temporary directory and keeps
    no model, a mixture or a few-shot protocol writes to finetune-NAME). ``few_shot=K``: LM-BFF's protocol, ``splits``
    splits of K examples per class (and a dev set of K per class that picks the checkpoint), scored on the
    task's dev split;
    ``fewshot_splits`` ("0,1,2,3,4" or "few_all"): FewCLUE's. ``unlabelled`` (a file as ``train``'s columns, or
    a .txt of one text per line; or a list of texts): self-training, the model fine-tuned on the labels labels
    them and a student learns from both (with ``few_shot``: on every split; the ``self_train_*`` settings).
    Returns the results (also out/results.json).
    ``report_to``: experiment trackers that also get the training metrics and settings ("tensorboard",
    "wandb", "mlflow", "trackio"; several as a list or comma-separated). The same as ``cramkit finetune``."""
    cfg = finetune_config(config, settings, prompt=prompt, label_words=label_words, report_to=report_to)
    mix = check_finetune(
        task=task,
        train=train,
        mixture=mixture,
        rates=rates,
        weighting=weighting,
        primary=primary,
        few_shot=few_shot,
        splits=splits,
        fewshot_splits=fewshot_splits,
        config=cfg,
        unlabelled=unlabelled,
    )
    if mix is not None:
        return _finetune_mixture(source, mix, data_dir, cfg, out, skip_bad_rows, weighting, primary, progress)
    from cramkit.tasks.resolve import resolve_task

    the_task = resolve_task(
        task,
        data_dir=data_dir,
        train=train,
        dev=dev,
        test=test,
        text_a=text_a,
        text_b=text_b,
        label=label,
        regression=regression,
        choices=choices,
        name=name,
        dev_fraction=dev_fraction,
        skip_bad_rows=skip_bad_rows,
    )
    _check_source(source)
    rows = None
    if unlabelled is not None:
        from cramkit.selftraining.recipe import unlabelled_rows

        rows = unlabelled_rows(unlabelled, the_task, cfg, text_a=text_a, text_b=text_b, skip_bad_rows=skip_bad_rows)
    if few_shot is not None or fewshot_splits:
        return _fewshot(the_task, source, cfg, out, few_shot, splits, fewshot_splits, rows, progress)
    _preload(the_task)
    if rows is not None:
        from cramkit.selftraining.recipe import run_self_train

        if not isinstance(source, (str, os.PathLike)):
            raise CramkitError("unlabelled: the teacher and the student load the model afresh; give its directory")

        return run_self_train(the_task, source, cfg, out, rows, progress=progress)
    from cramkit.recipes.finetune import finetune as _finetune

    return _finetune(the_task, source, cfg, out, progress=progress)  # out None: a temporary directory


def _fewshot(
    the_task: Any,
    source: Any,
    cfg: Any,
    out: Any,
    few_shot: int | None,
    splits: int,
    fewshot_splits: Any,
    rows: Any,
    progress: bool,
) -> dict[str, Any]:
    """``finetune(few_shot=K)`` (LM-BFF's protocol) or ``finetune(fewshot_splits=...)`` (FewCLUE's), each split
    self-trained on ``rows`` when there are unlabelled rows."""
    stem = the_task.name.replace("/", "-")
    from cramkit.recipes.evaluate import fewshot_run

    if not isinstance(source, (str, os.PathLike)):
        raise CramkitError("few_shot and fewshot_splits load the model once per split: give its directory")

    if few_shot is not None:
        keys, suffix = [str(i) for i in range(splits)], f"{few_shot}shot"
    else:
        from cramkit.tasks.clue import parse_fewshot_splits

        given = fewshot_splits if isinstance(fewshot_splits, str) else ",".join(fewshot_splits or ())
        keys, suffix = parse_fewshot_splits(given), "fewshot"
    where = out or f"finetune-{stem}-{suffix}"
    if rows is None:
        return fewshot_run(the_task, source, cfg, where, keys, k=few_shot, progress=progress)
    import functools

    from cramkit.selftraining.recipe import self_train, summary

    every = functools.partial(_self_train_split, self_train, rows)
    return fewshot_run(
        the_task,
        source,
        cfg,
        where,
        keys,
        k=few_shot,
        progress=progress,
        train_split=every,
        summarize=lambda per_split: {"self_training": summary(per_split)},
    )


def _self_train_split(self_train: Any, rows: Any, view: Any, loaded: Any, cfg: Any, run: Any, **kw: Any) -> Any:
    """One split of a few-shot protocol self-trained on ``rows`` (the unlabelled text every split shares)."""
    return self_train(view, loaded, cfg, run, rows, **kw)


def _finetune_mixture(
    source: PathLike | LoadedModel,
    mix: Mixture,
    data_dir: PathLike | Sequence[str] | None,
    cfg: FinetuneConfig,
    out: PathLike | None,
    skip_bad_rows: bool,
    weighting: str | None,
    primary: str | None,
    progress: bool,
) -> dict[str, Any]:
    from cramkit.io import RUN_OUTPUTS, check_out, disk_errors
    from cramkit.recipes.multitask import SETTINGS_FILE, finetune_mixture
    from cramkit.tasks.registry import get_task
    from cramkit.tasks.resolve import data_dir_for

    tasks = [get_task(n, data_dir=data_dir_for(n, data_dir), skip_bad_rows=skip_bad_rows) for n in mix.tasks]
    _check_source(source)
    _preload(*tasks)
    where = Path(out or f"finetune-{mix.name}")
    own = {SETTINGS_FILE: ("tasks", "config")}  # a mixture's settings
    check_out(where, inputs=[source], own=own, writes=RUN_OUTPUTS, command="the mixture fine-tuning")
    with disk_errors(where):
        return finetune_mixture(
            mix,
            tasks,
            source,
            cfg,
            where,
            progress=progress,
            weighting=weighting or ("sum" if primary else None),
            primary=primary,
        )


def embedding_config(
    config: ContrastiveConfig | None = None,
    settings: Mapping[str, Any] | None = None,
    *,
    objective: str | None = None,
    report_to: str | Sequence[str] | None = None,
) -> ContrastiveConfig:
    """The contrastive stage's settings: ``config`` with ``settings`` (ContrastiveConfig fields) on top."""
    from cramkit.config import to_dict
    from cramkit.recipes import contrastive_config

    over = {**(to_dict(config) if config is not None else {}), **(settings or {})}
    _report_to(over, report_to)
    if objective is not None:
        over["objective"] = objective
    if over.get("budget"):
        from cramkit.train.budget import parse_budget

        parse_budget(str(over["budget"]), "--budget")
    return contrastive_config.config_from(over)


def train_embeddings(
    source: PathLike | LoadedModel,
    *,
    train: PathLike | None = None,
    text_a: str | None = None,
    text_b: str | None = None,
    negative: str | None = None,
    dev: PathLike | None = None,
    task: str | None = None,
    data_dir: PathLike | Sequence[str] | None = None,
    objective: str | None = None,
    out: PathLike | None = None,
    skip_bad_rows: bool = False,
    progress: bool = True,
    report_to: str | Sequence[str] | None = None,
    config: ContrastiveConfig | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """The contrastive stage (``cramkit finetune --objective contrastive|simcse``): ``source`` trained to embed
    on the pairs of ``train`` (columns ``text_a``, ``text_b``, hard negatives in ``negative``) or of a pair
    ``task`` (glue/mrpc's paraphrases); ``objective="simcse"`` on single texts (default: contrastive).
    ``settings``: ContrastiveConfig fields (batch_size=64, temperature=0.05, symmetric=True,
    matryoshka="256,128", budget="10m", ...) on top of ``config``. The model directory ``out`` (default
    OBJECTIVE-NAME) is an encoder of normalised vectors (``cramkit.load(out)``, embed, index, serve). Returns the
    results (also out/results.json): steps, the held-out pairs' recall@1 and MRR before and after.
    ``report_to``: experiment trackers that also get the training metrics and settings ("tensorboard", "wandb",
    "mlflow", "trackio"; several as a list or comma-separated)."""
    from cramkit.recipes import contrastive as con
    from cramkit.recipes import contrastive_data

    cfg = embedding_config(config, settings, objective=objective, report_to=report_to)
    the_task = None
    if train is None and task is not None:
        from cramkit.tasks.resolve import resolve_task

        the_task = resolve_task(task, data_dir=data_dir, skip_bad_rows=skip_bad_rows)
    _check_source(source)
    rows, dev_rows, skipped = contrastive_data.training_rows(
        cfg,
        train=train,
        dev=dev,
        task=the_task,
        text_a=text_a,
        text_b=text_b,
        negative=negative,
        skip_bad_rows=skip_bad_rows,
    )
    where = out or f"{cfg.objective}-{Path(str(train or task or 'pairs')).stem.replace('/', '-')}"
    return con.train_embeddings(source, rows, cfg, where, dev_rows=dev_rows, progress=progress, skipped=skipped)


def evaluate(
    source: PathLike,
    data_dir: PathLike | None = None,
    out: PathLike | None = None,
    *,
    suite: str = "glue",
    tasks: Sequence[str] | None = None,
    fewshot_splits: str | Sequence[str] | None = None,
    progress: bool = True,
    few_shot: int | None = None,
    splits: int = FEWSHOT_SPLITS,
    skip_bad_rows: bool = False,
    report_to: str | Sequence[str] | None = None,
    config: FinetuneConfig | str | os.PathLike | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Fine-tune and score ``source`` on every task of ``suite`` (glue, clue, ...) in ``data_dir`` (or only
    ``tasks``); out defaults to eval-SUITE. fewshot_splits: FewCLUE's splits (e.g. ["0", "1"] or "0,1");
    few_shot=K: LM-BFF's protocol (``splits`` splits of K per class) for every classification task.
    ``settings`` (FinetuneConfig fields) on top of ``config``. ``report_to``: experiment trackers that also get
    the training metrics and settings ("tensorboard", "wandb", "mlflow", "trackio"; several as a list or
    comma-separated). The same as ``cramkit eval SUITE``."""
    from cramkit.recipes.evaluate import evaluate_suite
    from cramkit.tasks.registry import get_suite

    the_suite = get_suite(suite.lower())  # an unknown suite: did-you-mean, before anything else
    cfg = finetune_config(config, settings, report_to=report_to)
    keys = None
    if fewshot_splits:
        from cramkit.tasks.clue import parse_fewshot_splits

        keys = parse_fewshot_splits(fewshot_splits if isinstance(fewshot_splits, str) else ",".join(fewshot_splits))
    if cfg.method == "auto":
        from cramkit.recipes.method_auto import check_route

        check_route(cfg, few_shot=few_shot, suite=few_shot is None and not keys)
    _check_source(source)
    return evaluate_suite(
        the_suite.name,
        source,
        data_dir,
        out or f"eval-{the_suite.name}",
        cfg,
        skip_bad_rows=skip_bad_rows,
        tasks=tasks,
        progress=progress,
        fewshot_splits=keys,
        few_shot=few_shot,
        splits=splits,
    )


def export(
    model: PathLike | LoadedModel,
    out: PathLike,
    *,
    format: str = "hf",  # the flag's name
    quantize: str | None = None,
    step: int | None = None,
    mlm_head: bool = True,
    force: bool = False,
    task: str | None = None,
    base: PathLike | LoadedModel | None = None,
    progress: bool = True,
    **options: Any,
) -> Path:
    """Write ``model`` as a Hugging Face directory, or in an export format: ``onnx`` (ONNX Runtime), ``ct2``
    (CTranslate2) or a registered one (the same as ``cramkit export MODEL --out OUT [--format ...]``). task: the
    head of a model trained on a mixture; base: of a deep-prompt directory, its base model; options: the
    format's own (ONNX: ``isa``, ``opset``). See :func:`cramkit.infer.export.export` (which ``cramkit export``
    calls: it also returns the summary the command prints); returns the directory written."""
    from cramkit.infer.export import export as _export

    done = _export(
        model,
        out,
        format=format,
        quantize=quantize,
        step=step,
        mlm_head=mlm_head,
        force=force,
        task=task,
        base=base,
        progress=progress,
        **options,
    )
    return done.path
