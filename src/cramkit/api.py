"""The one front door: the verbs of the command line as typed Python functions (``cramkit.finetune``,
``cramkit.evaluate``, ``cramkit.train_embeddings``, ...). Each takes its verb's request (declared once, beside its
recipe: :class:`~cramkit.recipes.finetune_request.FinetuneRequest`, :class:`~cramkit.evaluation.request.EvalRequest`)
or the request's fields as keywords; ``cramkit VERB`` builds the same request from its flags and calls the function
here, so the checks (the model exists, the task resolves, the output may be written, what combines with what) are
made once, in the request and this library code, and give the same line from both doors.

This module imports nothing heavy at import time (``cramkit --help`` builds every parser); each verb imports its
recipe when called. Where the library function is the verb already (its checks inside it), ``cramkit`` exports it
as it is: ``cramkit.pretrain``, ``cramkit.predict``, ``cramkit.embed``, ``cramkit.evaluate_sts``,
``cramkit.evaluate_retrieval`` (see ``cramkit.__init__``). Verbs that hold sub-verbs keep them in their package:
``cramkit.index.build_index`` (``cramkit index build``), ``cramkit.serve.serve`` (``cramkit serve``).
"""

from __future__ import annotations

import os
from typing import Any, cast

from cramkit.distillation.verb import check_student as check_student
from cramkit.distillation.verb import distill as distill
from cramkit.errors import CramkitError
from cramkit.evaluation.request import EvalRequest
from cramkit.infer.export import export_dir as export  # noqa: F401  (cramkit.export)
from cramkit.recipes.finetune_request import ContrastiveRequest, FinetuneRequest
from cramkit.request import verb


def _check_source(source: Any, flag: str = "--from") -> None:
    if isinstance(source, (str, os.PathLike)):
        from cramkit.loading import check_source

        check_source(str(source), flag)


def _preload(*tasks: Any) -> None:
    """Every split a run needs, read before any training starts: a missing or malformed file fails fast."""
    for task in tasks:
        for split in [task.train_split, *task.dev_splits]:
            task.examples(split)


@verb(FinetuneRequest, rest="settings")
def finetune(request: FinetuneRequest) -> dict[str, Any]:
    """Fine-tune ``source`` (anything :func:`cramkit.load` takes) on a registered ``task``, on your files
    (``train``, ``dev``, ``text_a``, ...), on a ``mixture`` of tasks, with few labels (``few_shot=K``: LM-BFF's
    protocol; ``fewshot_splits``: FewCLUE's), self-trained on ``unlabelled`` texts, or, ``objective="contrastive"``
    or ``"simcse"``, to embed (:func:`train_embeddings`). Takes a
    :class:`~cramkit.recipes.finetune_request.FinetuneRequest` or its fields (the flags of ``cramkit finetune``,
    each described there); the other keywords are FinetuneConfig settings (lr=2e-5, epochs=3, ...) on top of
    ``config`` (a FinetuneConfig, or the file ``cramkit finetune --print-config`` writes). With ``out`` the model
    of the median seed is saved there (``cramkit.load(out)``; None: one task trains in a temporary directory and
    keeps no model, a mixture or a few-shot protocol writes to finetune-NAME). Returns the results (also
    out/results.json)."""
    if request.embeds():
        return train_embeddings(request.contrastive())
    cfg, mix = request.resolve()
    out = request.out_dir(mix)
    source = request.source
    if mix is not None:
        return _finetune_mixture(request, mix, cfg, out)
    the_task = request.resolved_task()
    _check_source(source)
    rows = None
    if request.unlabelled is not None:
        from cramkit.selftraining.recipe import unlabelled_rows

        rows = unlabelled_rows(
            request.unlabelled,
            the_task,
            cfg,
            text_a=request.text_a,
            text_b=request.text_b,
            skip_bad_rows=request.skip_bad_rows,
        )
    if request.few_shot is not None or request.fewshot_splits:
        return _fewshot(request, the_task, cfg, out, rows)
    _preload(the_task)
    if rows is not None:
        from cramkit.selftraining.recipe import run_self_train

        if not isinstance(source, (str, os.PathLike)):
            raise CramkitError("unlabelled: the teacher and the student load the model afresh; give its directory")
        return run_self_train(the_task, source, cfg, out, rows, progress=request.progress)
    from cramkit.recipes.finetune import finetune as _finetune

    hint = _few_labels_hint(the_task) if cfg.method == "head" else None
    return _finetune(the_task, source, cfg, out, progress=request.progress, first_line=hint)  # out None: a temp dir


def _few_labels_hint(task: Any) -> str | None:
    """For a head trained on few labelled rows: what the few-label methods offer, said before it trains."""
    from cramkit.recipes import FEW_LABEL_ROWS

    rows = len(task.examples(task.train_split))
    if rows >= FEW_LABEL_ROWS:
        return None
    return (
        f"cramkit: {task.name}: {rows} labelled rows train a fresh head; with few labels --method auto chooses "
        "among a head, SetFit and prompts by cross-validation on them, --few-shot K scores K per class over "
        "several splits, and --unlabelled FILE adds your unlabelled text (docs/few-labels.md)"
    )


def _fewshot(request: FinetuneRequest, the_task: Any, cfg: Any, out: Any, rows: Any) -> dict[str, Any]:
    """``finetune(few_shot=K)`` (LM-BFF's protocol) or ``finetune(fewshot_splits=...)`` (FewCLUE's), each split
    self-trained on ``rows`` when there are unlabelled rows."""
    from cramkit.recipes.evaluate import fewshot_run

    source = request.source
    if not isinstance(source, (str, os.PathLike)):
        raise CramkitError("few_shot and fewshot_splits load the model once per split: give its directory")
    keys, k = request.fewshot_keys(), request.few_shot
    if rows is None:
        return fewshot_run(the_task, source, cfg, out, keys, k=k, progress=request.progress)
    import functools

    from cramkit.selftraining.recipe import self_train, summary

    return fewshot_run(
        the_task,
        source,
        cfg,
        out,
        keys,
        k=k,
        progress=request.progress,
        train_split=functools.partial(_self_train_split, self_train, rows),
        summarize=lambda per_split: {"self_training": summary(per_split)},
    )


def _self_train_split(self_train: Any, rows: Any, view: Any, loaded: Any, cfg: Any, run: Any, **kw: Any) -> Any:
    """One split of a few-shot protocol self-trained on ``rows`` (the unlabelled text every split shares)."""
    return self_train(view, loaded, cfg, run, rows, **kw)


def _finetune_mixture(request: FinetuneRequest, mix: Any, cfg: Any, out: Any) -> dict[str, Any]:
    from pathlib import Path

    from cramkit.io import RUN_OUTPUTS, check_out, disk_errors
    from cramkit.recipes.multitask import SETTINGS_FILE, finetune_mixture
    from cramkit.tasks.registry import get_task
    from cramkit.tasks.resolve import data_dir_for

    data_dir, skip = request.data_dir, request.skip_bad_rows
    tasks = [get_task(n, data_dir=data_dir_for(n, data_dir), skip_bad_rows=skip) for n in mix.tasks]
    _check_source(request.source)
    _preload(*tasks)
    where = Path(out)
    own = {SETTINGS_FILE: ("tasks", "config")}  # a mixture's settings
    check_out(where, inputs=[request.source], own=own, writes=RUN_OUTPUTS, command="the mixture fine-tuning")
    with disk_errors(where):
        return finetune_mixture(
            mix,
            tasks,
            request.source,
            cfg,
            where,
            progress=request.progress,
            weighting=request.weighting or ("sum" if request.primary else None),
            primary=request.primary,
        )


@verb(ContrastiveRequest, rest="settings")
def train_embeddings(request: ContrastiveRequest) -> dict[str, Any]:
    """The contrastive stage (``cramkit finetune --objective contrastive|simcse``): ``source`` trained to embed on
    the pairs of ``train`` (columns ``text_a``, ``text_b``, hard negatives in ``negative``) or of a pair ``task``;
    ``objective="simcse"`` on single texts (default: contrastive). Takes a
    :class:`~cramkit.recipes.finetune_request.ContrastiveRequest` or its fields; the other keywords are
    ContrastiveConfig settings (batch_size=64, temperature=0.05, matryoshka="256,128", ...) on top of ``config``.
    The model directory ``out`` (default OBJECTIVE-NAME) is an encoder of normalised vectors (``cramkit.load(out)``,
    embed, index, serve). Returns the results (also out/results.json): steps, the held-out pairs' recall@1 and MRR
    before and after."""
    from cramkit.recipes import contrastive as con
    from cramkit.recipes import contrastive_data

    cfg = request.resolve()
    the_task = None
    if request.train is None and request.task is not None:
        from cramkit.tasks.resolve import resolve_task

        the_task = resolve_task(request.task, data_dir=request.data_dir, skip_bad_rows=request.skip_bad_rows)
    _check_source(request.source)
    rows, dev_rows, skipped = contrastive_data.training_rows(
        cfg,
        train=request.train,
        dev=request.dev,
        task=the_task,
        text_a=request.text_a,
        text_b=request.text_b,
        negative=request.negative,
        skip_bad_rows=request.skip_bad_rows,
    )
    where = request.out_dir(cfg)
    return con.train_embeddings(
        request.source, rows, cfg, where, dev_rows=dev_rows, progress=request.progress, skipped=skipped
    )


@verb(EvalRequest, rest="settings")
def evaluate(request: EvalRequest) -> dict[str, Any]:
    """Fine-tune and score ``source`` on every task of ``suite`` (glue, clue, ...) in ``data_dir`` (or only
    ``tasks``; ``few_shot`` or ``fewshot_splits``: with few labels), or, ``suite="sts"`` / ``"retrieval"``, score its
    embeddings as they are on ``data`` (:func:`cramkit.evaluate_sts`, :func:`cramkit.evaluate_retrieval`). Takes a
    :class:`~cramkit.evaluation.request.EvalRequest` or its fields (the flags of ``cramkit eval SUITE``); the other
    keywords are FinetuneConfig settings on top of ``config``. ``out`` defaults to eval-SUITE. Returns the
    results (also out/results.json)."""
    cfg = request.resolve()
    out = request.out_dir()
    if cfg is None:
        return _evaluate_embeddings(request, out)
    from cramkit.recipes.evaluate import evaluate_suite

    _check_source(request.source)
    return evaluate_suite(
        request.suite_name(),
        request.source,
        request.data_dir,
        out,
        cfg,
        skip_bad_rows=request.skip_bad_rows,
        tasks=request.task_names(),
        progress=request.progress,
        fewshot_splits=request.fewclue_splits(),
        few_shot=request.few_shot,
        splits=request.splits,
    )


def _evaluate_embeddings(request: EvalRequest, out: str) -> dict[str, Any]:
    """``evaluate(suite="sts"|"retrieval")``: the model's embeddings scored as they are (``data`` checked given)."""
    r, data = request, cast("str | os.PathLike", request.data)
    if r.suite_name() == "sts":
        from cramkit.evaluation.sts import evaluate_sts

        return evaluate_sts(
            r.source,
            data,
            out,
            text_a=r.text_a,
            text_b=r.text_b,
            label=r.label,
            skip_bad_rows=r.skip_bad_rows,
            device=r.device,
            max_batch_tokens=r.max_batch_tokens,
            progress=r.progress,
            dimensions=r.dimensions,
        )
    from cramkit.evaluation import CUTOFF
    from cramkit.evaluation.retrieval import evaluate_retrieval

    return evaluate_retrieval(
        r.source,
        data,
        out,
        split=r.split or "test",
        index=r.index,
        k=CUTOFF if r.k is None else r.k,
        skip_bad_rows=r.skip_bad_rows,
        device=r.device,
        max_batch_tokens=r.max_batch_tokens,
        progress=r.progress,
        dimensions=r.dimensions,
    )
