"""cramkit: train BERT-style encoders on a budget.

Raw text -> WordPiece tokenizer -> memory-mapped token store -> budgeted masked-LM pretraining
(the Cramming recipe) -> fine-tuning and evaluation -> a kept model to predict with, export, serve,
distil and index. The Python API mirrors the command line::

    run = cramkit.pretrain(["corpus/"], preset="tiny-cpu", budget="5m", out="runs/x")
    res = cramkit.finetune(run, task="glue/sst2", data_dir="glue", out="ft/sst2", seeds=[0, 1, 2])
    model = cramkit.load("ft/sst2")
    cramkit.predict("ft/sst2", "reviews.csv", "reviews.predictions.jsonl")
    cramkit.export("ft/sst2", "hf/sst2")                  # or format="onnx" for ONNX Runtime
    cramkit.evaluate_retrieval("hf:models/minilm", "scifact/")  # embeddings scored as they are (also evaluate_sts)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.load import LoadedModel, load  # the function shadows the module name `cramkit.load`

if TYPE_CHECKING:
    from cramkit.infer.predict import predict
    from cramkit.recipes.pretrain import pretrain

# the verbs whose whole signature is the library's: imported on first use (`import cramkit` stays light)
_LAZY = {"pretrain": "cramkit.recipes.pretrain", "predict": "cramkit.infer.predict"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cramkit' has no attribute {name!r}")


__version__ = "0.1.0"
__all__ = [
    "CramkitError",
    "LoadedModel",
    "__version__",
    "evaluate",
    "evaluate_retrieval",
    "evaluate_sts",
    "export",
    "finetune",
    "load",
    "predict",
    "pretrain",
    "train_embeddings",
]

PathLike = str | os.PathLike


def _report_to(settings: dict[str, Any], report_to: str | Sequence[str] | None) -> None:
    """The ``report_to`` keyword as the setting it stands for (a recipe config's ``report_to``)."""
    if report_to is not None:
        from cramkit.train.report import report_to_setting

        settings["report_to"] = report_to_setting(report_to)


def finetune(
    source: PathLike,
    *,
    task: str | None = None,
    data_dir: PathLike | None = None,
    train: PathLike | None = None,
    dev: PathLike | None = None,
    test: PathLike | None = None,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str = "label",
    regression: bool = False,
    choices: Sequence[str] | None = None,
    name: str | None = None,
    dev_fraction: float = 0.1,
    skip_bad_rows: bool = False,
    out: PathLike | None = None,
    progress: bool = True,
    prompt: str | None = None,
    label_words: str | Mapping[str, str] | None = None,
    few_shot: int | None = None,
    splits: int = 5,
    report_to: str | Sequence[str] | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Fine-tune ``source`` (anything :func:`load` takes) on a registered ``task`` or on your files
    (``train``, optional ``dev``: else ``dev_fraction`` of train is held out). ``settings`` are
    FinetuneConfig fields (lr=2e-5, epochs=3, seeds=[0, 1, 2], method="ptuning", ...). ``prompt`` and
    ``label_words`` (``{"0": "terrible", "1": "great"}``): prompt-based fine-tuning through the MLM head.
    With ``out`` the model of the median seed is saved there (``cramkit.load(out)``). ``few_shot=K``:
    LM-BFF's protocol, ``splits`` splits of K examples per class (and a dev set of K per class that picks the
    checkpoint), scored on the task's dev split: the results hold each split's score, the mean and the
    standard deviation (``fewshot``); each split's model in out/split-S. Returns the results (also
    out/results.json). ``report_to``: experiment trackers that also get the training metrics and
    settings ("tensorboard", "wandb", "mlflow", "trackio"; several as a list or comma-separated)."""
    _report_to(settings, report_to)
    if prompt is not None:
        settings["prompt"] = prompt
    if label_words is not None:
        settings["label_words"] = (
            label_words if isinstance(label_words, str) else ",".join(f"{k}={v}" for k, v in label_words.items())
        )
    from cramkit.recipes.finetune import config_from
    from cramkit.recipes.finetune import finetune as _finetune
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
    if few_shot is not None:
        from cramkit.recipes.evaluate import fewshot_run

        if splits < 1:
            raise CramkitError(f"splits must be at least 1, got {splits}")
        where = out or f"finetune-{the_task.name.replace('/', '-')}-{few_shot}shot"
        return fewshot_run(
            the_task,
            source,
            config_from(settings),
            where,
            [str(i) for i in range(splits)],
            k=few_shot,
            progress=progress,
        )
    return _finetune(the_task, source, config_from(settings), out, progress=progress)


def evaluate(
    source: PathLike,
    data_dir: PathLike | None = None,
    out: PathLike | None = None,
    *,
    suite: str = "glue",
    tasks: Sequence[str] | None = None,
    fewshot_splits: Sequence[str] | None = None,
    progress: bool = True,
    few_shot: int | None = None,
    splits: int = 5,
    report_to: str | Sequence[str] | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Fine-tune and score ``source`` on every task of ``suite`` (glue, clue, ...) in ``data_dir`` (or only
    ``tasks``); out defaults to eval-SUITE. fewshot_splits: FewCLUE's splits (e.g. ["0", "1"]); few_shot=K:
    LM-BFF's protocol (``splits`` splits of K per class) for every classification task. ``report_to``: experiment
    trackers that also get the training metrics and settings ("tensorboard", "wandb", "mlflow", "trackio"; several
    as a list or comma-separated)."""
    _report_to(settings, report_to)
    from cramkit.recipes.evaluate import evaluate_suite
    from cramkit.recipes.finetune import config_from

    return evaluate_suite(
        suite,
        source,
        data_dir,
        out or f"eval-{suite}",
        config_from(settings),
        tasks=tasks,
        progress=progress,
        fewshot_splits=fewshot_splits,
        few_shot=few_shot,
        splits=splits,
    )


def evaluate_sts(
    model: PathLike | LoadedModel,
    data: PathLike,
    out: PathLike | None = "eval-sts",
    *,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str | None = None,
    skip_bad_rows: bool = False,
    device: str = "auto",
    max_batch_tokens: int | None = None,
    progress: bool = True,
    dimensions: int | None = None,
) -> dict[str, Any]:
    """Score ``model``'s embeddings (anything :func:`load` opens, exports included) on sentence pairs with a
    gold similarity: Spearman (main) and Pearson correlation x100 of the cosine similarity with the score, as
    ``cramkit eval sts --from MODEL --data FILE``. ``data``: TSV (GLUE STS-B's dev.tsv), CSV or JSON Lines;
    columns sentence1, sentence2, score unless ``text_a``/``text_b``/``label`` name others. Writes results.json,
    results.md and scores.png to ``out`` (None: nothing written); returns the results. ``dimensions``: a
    Matryoshka model's vectors cut to that many leading dimensions."""
    from cramkit.index.evaluate import evaluate_sts as _evaluate_sts

    return _evaluate_sts(
        model,
        data,
        out,
        text_a=text_a,
        text_b=text_b,
        label=label,
        skip_bad_rows=skip_bad_rows,
        device=device,
        max_batch_tokens=max_batch_tokens,
        progress=progress,
        dimensions=dimensions,
    )


def evaluate_retrieval(
    model: PathLike | LoadedModel,
    data: PathLike,
    out: PathLike | None = "eval-retrieval",
    *,
    split: str = "test",
    index: PathLike | None = None,
    k: int = 10,
    skip_bad_rows: bool = False,
    device: str = "auto",
    max_batch_tokens: int | None = None,
    progress: bool = True,
    dimensions: int | None = None,
) -> dict[str, Any]:
    """Score ``model``'s embeddings on a folder in BEIR's layout (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv):
    nDCG@k (main), recall@1/k/100, MRR@k and MAP@100, x100, by exact cosine search, or through ``index`` (built
    by ``cramkit index build DATA/corpus.jsonl --encoder MODEL``; exact search over its vectors is reported
    beside it). As ``cramkit eval retrieval``; writes results.json, results.md and scores.png to ``out`` (None:
    nothing written); returns the results."""
    from cramkit.index.evaluate import evaluate_retrieval as _evaluate_retrieval

    return _evaluate_retrieval(
        model,
        data,
        out,
        split=split,
        index=index,
        k=k,
        skip_bad_rows=skip_bad_rows,
        device=device,
        max_batch_tokens=max_batch_tokens,
        progress=progress,
        dimensions=dimensions,
    )


def export(
    model: PathLike | LoadedModel,
    out: PathLike,
    *,
    format: str = "hf",
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
    format's own (ONNX: ``isa``, ``opset``). See :func:`cramkit.infer.export.export`; returns the directory
    written."""
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


def train_embeddings(
    source: PathLike,
    *,
    train: PathLike | None = None,
    text_a: str | None = None,
    text_b: str | None = None,
    negative: str | None = None,
    dev: PathLike | None = None,
    task: str | None = None,
    data_dir: PathLike | None = None,
    objective: str = "contrastive",
    out: PathLike = "contrastive",
    skip_bad_rows: bool = False,
    progress: bool = True,
    report_to: str | Sequence[str] | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """The contrastive stage (``cramkit finetune --objective contrastive|simcse``): ``source`` trained to embed
    on the pairs of ``train`` (columns ``text_a``, ``text_b``, hard negatives in ``negative``) or of a pair
    ``task`` (glue/mrpc's paraphrases); ``objective="simcse"`` on single texts. ``settings``: ContrastiveConfig
    fields (batch_size=64, temperature=0.05, symmetric=True, matryoshka="256,128", budget="10m", ...). The
    model directory ``out`` is an encoder of normalised vectors (``cramkit.load(out)``, embed, index, serve).
    Returns the results (also out/results.json): steps, the held-out pairs' recall@1 and MRR before and after.
    ``report_to``: experiment trackers that also get the training metrics and
    settings ("tensorboard", "wandb", "mlflow", "trackio"; several as a list or comma-separated)."""
    _report_to(settings, report_to)
    from cramkit.recipes import contrastive as con

    cfg = con.config_from({**settings, "objective": objective})
    t = None
    if train is None and task is not None:
        from cramkit.tasks.registry import get_task

        t = get_task(task, data_dir=data_dir)
    rows, dev_rows, skipped = con.training_rows(
        cfg,
        train=train,
        dev=dev,
        task=t,
        text_a=text_a,
        text_b=text_b,
        negative=negative,
        skip_bad_rows=skip_bad_rows,
    )
    return con.train_embeddings(source, rows, cfg, out, dev_rows=dev_rows, progress=progress, skipped=skipped)
