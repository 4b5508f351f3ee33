"""``cramkit.pretrain``: raw text (or a token store) and a budget in, a run directory out.

Given raw text sources the tokenizer is trained (or ``tokenizer=DIR`` is used) and the token store is
built inside the run directory, both cached: a second run into the same directory with the same
sources reuses them (pretrain_inputs.py). Given a token store it is used as it is, after checking that it
was built with the run's tokenizer. Given nothing, the built-in corpus (stdlib docstrings) is used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from cramkit import runtime
from cramkit.config import load_yaml, start_preset
from cramkit.data.tokenstore import is_store
from cramkit.errors import CramkitError
from cramkit.io import read_json_object
from cramkit.recipes.pretrain_inputs import RUN_FILE, prepare_run
from cramkit.recipes.pretrain_request import PretrainRequest
from cramkit.request import verb
from cramkit.train import checkpoint as ckpt
from cramkit.train.config import RunConfig, check_fits, resolve_config, resolve_micro_batch
from cramkit.train.report import require_trackers


def default_out(preset: str) -> Path:
    name = Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


@verb(PretrainRequest)
def pretrain(request: PretrainRequest) -> Path:
    """Pretrain a masked-LM encoder within ``budget``; returns the run directory. Takes a
    :class:`~cramkit.recipes.pretrain_request.PretrainRequest` or its fields (each field's help says what it does:
    ``cramkit pretrain --help``); ``inputs`` None or empty: the built-in corpus; ``resume``: the run's saved config,
    with ``overrides`` and ``budget`` on top (e.g. to extend the budget)."""
    from cramkit.train.distributed import fault_guard, shutdown
    from cramkit.train.trainer import fit

    resume = request.resume
    if resume is not None:
        run, saved, cfg, info = _run_to_resume(request)
        if not _resume_plan(run, cfg):
            return run
        start = _resumed_start(request, run, saved, cfg, info)
    else:
        start = _new_run(request)
    run = start.run
    with _lock_run(run, "--resume" if resume is not None else "--out"):
        if resume is None:  # another process got there first
            _refuse_checkpoints(run)
        cfg, objective, ctx = _prepared_objective(start)
        with fault_guard(ctx):  # a dead or hung peer: one clear error on every surviving rank
            result = fit(objective, cfg.train, cfg.parallel, run, resume=resume is not None, ctx=ctx)
        drift = [r["start_cosine"] for r in result.history if "start_cosine" in r]
        if drift and runtime.torchrun().is_main:
            print(
                f"cramkit: drift from {start.request.init}: mean cosine {drift[-1]:.3f} between the run's and the "
                "starting model's mean-pooled vectors of the held-out text (1 = unchanged; train.keep_vectors and "
                "train.l2sp hold it closer)",
                flush=True,
            )
        shutdown(ctx)
    return run


@dataclass
class _Start:
    """What a run starts with: its directory and config, the request as the run starts it (a resumed run's data,
    model and teacher are those its run.json recorded; the preset decided), how its text is read, and what it
    continues (``--from``) or learns from (``--inherit``)."""

    run: Path
    cfg: RunConfig
    request: PretrainRequest
    source_options: dict[str, Any]
    fresh_head: bool
    begin: Any = None  # what the run starts from: adapt.Start (--from), the teacher (--inherit)
    saved: dict[str, Any] | None = None  # a resumed run's config.yaml
    created: Path | None = None  # the run directory, when this call made it (removed again if preparation fails)


def _run_to_resume(request: PretrainRequest) -> tuple[Path, dict[str, Any], RunConfig, dict[str, Any]]:
    """(the run directory, its saved config, the config it resumes with, its run.json) of the run ``--resume``
    continues, checked against the flags given: a run keeps its experts, its model (``--from``), its teacher
    (``--inherit``) and its vocabulary."""
    run = ckpt.require_run_dir(request.resume)  # type: ignore[arg-type]  # a resume
    saved = load_yaml(run / "config.yaml")
    cfg = resolve_config(base=saved, overrides=request.settings())
    require_trackers(cfg.train.report_to, "train.report_to")  # before any work
    info = _read_run_info(run)
    _same_experts(run, saved, cfg)
    if request.upcycle:
        raise CramkitError(f"--resume {run}: --upcycle applies when a run starts (--from MODEL); resume without it")
    for flag, given, key in (("--from", request.init, "from"), ("--inherit", request.inherit, "inherit")):
        if given is not None and given != info.get(key):
            raise CramkitError(
                f"--resume {run}: the run was started "
                f"{f'{flag} {info[key]}' if info.get(key) else f'without {flag}'}"
                f", not {flag} {given}; resume without {flag} (or start a new run)"
            )
    if request.extend_vocab and request.extend_vocab != info.get("extend_vocab", 0):
        raise CramkitError(f"--resume {run}: --extend-vocab applies when a run starts; resume without it")
    return run, saved, cfg, info


def _resumed_start(
    request: PretrainRequest, run: Path, saved: dict[str, Any], cfg: RunConfig, info: dict[str, Any]
) -> _Start:
    """A resumed run starts with what it was started with (run.json: its data, reading options, model, teacher);
    data named again must be the same."""
    if request.sources and request.sources != info.get("inputs"):
        raise CramkitError(
            f"--resume {run}: the run was started on {info.get('inputs') or 'the built-in corpus'}, not "
            f"{request.sources}; resume without naming the data (or start a new run)"
        )
    started = dataclasses.replace(
        request,
        inputs=info.get("inputs", []),
        tokenizer=None,
        init=info.get("from"),
        inherit=info.get("inherit"),
        extend_vocab=0,
    )
    return _Start(
        run=run,
        cfg=cfg,
        request=started,
        source_options=request.source_options() or info.get("source_options", {}),
        fresh_head=bool(info.get("fresh_head")),
        saved=saved,
    )


def _new_run(request: PretrainRequest) -> _Start:
    """A new run: its config (the preset chosen from the text when none is given) checked to fit before anything
    is written, and its directory (``out``, else runs/PRESET-TIME) made, refused when it holds checkpoints."""
    r, source_options = request, request.source_options()
    init = r.init
    cfg, begin, preset = _fresh_config(
        r.sources, source_options, r.preset, r.settings(), init, r.inherit, r.tokenizer, r.extend_vocab, r.upcycle
    )
    require_trackers(cfg.train.report_to, "train.report_to")  # before any work
    fresh_head = bool(init) and begin.head_state is None
    if cfg.train.head_only and not init:
        raise CramkitError(
            "train.head_only trains the MLM head of a model given with --from MODEL (the encoder frozen); "
            "a run from scratch has no encoder to keep: leave it out"
        )
    anchors = [k for k in ("keep_vectors", "l2sp") if getattr(cfg.train, k) and not init]
    if anchors:
        raise CramkitError(
            f"train.{anchors[0]} holds a run near the model given with --from MODEL; a run from scratch (or "
            "--inherit) starts from no model to hold to: leave it out"
        )
    preset = start_preset(preset, bool(init))
    if r.out is None and runtime.torchrun().world > 1:
        raise CramkitError(
            "under torchrun give --out RUN: every process must write into the same run directory "
            "(or use `cramkit pretrain --nproc N`, which picks one)"
        )
    run = Path(r.out) if r.out is not None else default_out(preset)
    _refuse_checkpoints(run)
    # the micro-batch that fits (train.micro_batch=auto), then the model must fit before anything is written
    # (the exact vocabulary is checked again below)
    cfg, chosen = resolve_micro_batch(cfg, min(cfg.model.vocab_size, cfg.tokenizer.vocab_size))
    if chosen and runtime.torchrun().rank == 0:
        print(f"cramkit: {chosen}", file=sys.stderr)
    check_fits(cfg, min(cfg.model.vocab_size, cfg.tokenizer.vocab_size))
    created = run if not run.exists() and runtime.torchrun().world == 1 else None
    run.mkdir(parents=True, exist_ok=True)
    return _Start(
        run=run,
        cfg=cfg,
        request=dataclasses.replace(r, preset=preset),
        source_options=source_options,
        fresh_head=fresh_head,
        begin=begin,
        created=created,
    )


def _refuse_checkpoints(run: Path) -> None:
    """A new run never goes into a directory that holds a run with checkpoints, nor into a folder of the user's
    that holds a file a run writes (``metrics.jsonl``, ``config.yaml``, ...) without a run's ``run.json``
    (checked by the first process only: the others may find what it has begun writing)."""
    if ckpt.find_latest(run) is not None:
        raise CramkitError(
            f"--out {run} already holds a run with checkpoints; continue it with --resume {run} or choose another --out"
        )
    if runtime.torchrun().rank == 0:
        from cramkit.rundir import check_new_run

        check_new_run(run)


def _prepared_objective(start: _Start) -> tuple[RunConfig, Any, Any]:
    """(the final config, what the engine trains, the processes' context): the run's tokenizer and token store
    prepared (:func:`~cramkit.recipes.pretrain_inputs.prepare_run`), its data and objective built. A failed first
    attempt leaves no empty run directory behind."""
    from cramkit.data.loader import PretrainData
    from cramkit.text.tokenizer import special_ids
    from cramkit.text.words import WordBoundaries

    r = start.request
    try:
        cfg, ts, tok, vocab, ctx, extension = prepare_run(
            start.run,
            start.cfg,
            r.sources,
            r.tokenizer,
            r.resume,
            r.preset,
            start.source_options,
            start.saved,
            begin=start.begin,
            adapt_info={
                "from": r.init,
                "inherit": r.inherit,
                "extend_vocab": r.extend_vocab,
                "fresh_head": start.fresh_head,
                "upcycle": r.upcycle,
            },
        )
        words = WordBoundaries(tok) if cfg.data.masking == "whole_word" else None
        data = PretrainData(ts, cfg.data, special_ids(tok), vocab, words)
        objective = _objective(
            cfg,
            data,
            start.begin,
            extension,
            r.inherit,
            r.resume is not None,
            {"from": r.init, "fresh_head": start.fresh_head},
        )
    except BaseException:
        created = start.created
        if created is not None and created.is_dir() and ckpt.find_latest(created) is None:
            shutil.rmtree(created, ignore_errors=True)  # a failed first attempt leaves no empty run behind
        raise
    return cfg, objective, ctx


def resolved_config(request: PretrainRequest) -> RunConfig:
    """The configuration :func:`pretrain` would train with (preset, then ``--set``, then what a model given
    with ``init`` decides), validated, with nothing written: ``cramkit pretrain --print-config``."""
    return resolved_start(request)[0]


def resolved_start(request: PretrainRequest) -> tuple[RunConfig, str]:
    """(the configuration :func:`pretrain` would train with, the preset it starts from: text-aware, ``tiny-zh``
    for Chinese text, which names a default run directory; "" for a resumed run), decided once, nothing written
    (``--nproc`` checks the degrees and names the run by it before the processes start)."""
    r = request
    if r.resume is not None:
        run = ckpt.require_run_dir(r.resume)
        return resolve_config(base=load_yaml(run / "config.yaml"), overrides=r.settings()), ""
    cfg, _, chosen = _fresh_config(
        r.sources,
        r.source_options(),
        r.preset,
        r.settings(),
        r.init,
        r.inherit,
        r.tokenizer,
        r.extend_vocab,
        r.upcycle,
    )
    return cfg, start_preset(chosen, bool(r.init))


def decided(request: PretrainRequest) -> PretrainRequest:
    """The request with its run directory and preset decided (text-aware: ``tiny-zh`` for Chinese text), as
    torchrun's workers receive it: every process writes into the same run."""
    if request.resume is not None:
        return request
    _, preset = resolved_start(request)
    preset = request.preset or preset
    out = request.out if request.out is not None else str(default_out(preset))
    return dataclasses.replace(request, preset=preset, out=out)


def _fresh_config(
    inputs: list[str],
    source_options: dict[str, Any],
    preset: str | None,
    overrides: list[str],
    init: str | None,
    inherit: str | None,
    tokenizer: str | os.PathLike | None,
    extend_vocab: int,
    upcycle: bool = False,
) -> tuple[RunConfig, Any, str | None]:
    """A new run's config, what it starts from, and the preset (chosen from the text when none is given)."""
    if preset is None and not (init or inherit or tokenizer):
        preset = _preset_for_text(inputs, source_options)
    cfg, begin = _start_config(preset, overrides, init, inherit, tokenizer, extend_vocab, upcycle)
    return _masking_available(cfg, overrides), begin, preset


def _preset_for_text(inputs: list[str], source_options: dict) -> str | None:
    """tiny-zh when the raw text given is Chinese (said in the log), else None (the default preset)."""
    if not inputs or any(is_store(s) for s in inputs):
        return None
    from cramkit.text.sources import detect_language, iter_documents

    guess = detect_language(iter_documents(inputs, **source_options))
    if guess.lang != "zh":
        return None
    if runtime.torchrun().is_main:
        print(
            f"cramkit: {guess.describe()}: using the tiny-zh preset and a Chinese tokenizer (one token per "
            "character); give --preset to choose another"
        )
    return "tiny-zh"


def _masking_available(cfg: RunConfig, overrides: Sequence[str]) -> RunConfig:
    """Whole-word masking of Chinese needs jieba: when a preset asks for it (not ``--set data.masking``) and
    jieba is missing, mask WordPiece tokens (Chinese characters) instead, saying how to get jieba."""
    if cfg.data.masking != "whole_word" or cfg.tokenizer.lang != "zh":
        return cfg
    if any(o.replace(" ", "").startswith("data.masking=") for o in overrides):
        return cfg  # asked for explicitly: the segmenter's absence is an error where it is needed
    try:
        import jieba  # noqa: F401
    except ImportError:
        from cramkit.text.words import JIEBA_HINT

        if runtime.torchrun().is_main:
            print(
                "cramkit: whole-word masking of Chinese needs the word segmenter jieba, which is not installed: "
                f"masking single characters instead ({JIEBA_HINT} for whole words)"
            )
        return cfg.replace(data=dataclasses.replace(cfg.data, masking="wordpiece"))
    return cfg


def _start_config(
    preset: str | None,
    overrides: list[str],
    init: str | None,
    inherit: str | None,
    tokenizer: Any,
    extend_vocab: int,
    upcycle: bool = False,
) -> tuple[RunConfig, Any]:
    """The config of a new run, and what it starts from (``adapt.Start``) with --from / --inherit."""
    from cramkit.config import load_preset

    if init and inherit:
        raise CramkitError(
            "give --from MODEL (continue that model) or --inherit MODEL (train a new model that learns from "
            "it), not both"
        )
    if (init or inherit) and tokenizer:
        raise CramkitError(
            f"--tokenizer cannot be combined with {'--from' if init else '--inherit'}: the run uses that "
            "model's tokenizer (extend it with --extend-vocab N)"
        )
    if not isinstance(extend_vocab, int) or extend_vocab < 0:
        raise CramkitError(f"--extend-vocab must be a count of words (0 or more), got {extend_vocab!r}")
    if extend_vocab and not init:
        raise CramkitError("--extend-vocab grows an existing model's vocabulary: use it with --from MODEL")
    if upcycle and not init:
        raise CramkitError(
            "--upcycle turns a dense model into a mixture of experts: give it with --from MODEL and --set "
            "model.moe_experts=E"
        )
    if preset == "continue" and not init:
        raise CramkitError("the continue preset continues a model: add --from MODEL (a run, model directory or hf:DIR)")
    if not init and not inherit:
        return resolve_config(start_preset(preset), overrides), None
    from cramkit.recipes import adapt

    if init:
        begin = adapt.start_from(init)
        base = load_preset(start_preset(preset, from_model=True))
        base["model"] = adapt.config_dict(begin.config)
        base["data"] = {**(base.get("data") or {}), **begin.masking}
        if begin.config.position != "rope":  # the preset's sequences, at most as long as the model reads
            seq_len = int(base["data"].get("seq_len", 128))
            base["data"]["seq_len"] = min(seq_len, begin.config.positions)
        cfg = resolve_config(base=base, overrides=overrides)
        adapt.check_architecture(begin, cfg.model, upcycle=upcycle)
        adapt.check_fits(begin, cfg, "--from")
    else:
        begin = adapt.teacher_start(cast(str, inherit))  # (neither --from nor --inherit returned above)
        base = load_preset(start_preset(preset))
        base["data"] = {**(base.get("data") or {}), "add_cls": begin.masking.get("add_cls", False)}
        cfg = resolve_config(base=base, overrides=overrides)
        adapt.check_fits(begin, cfg, "--inherit")
    return cfg, begin


def _objective(
    cfg: RunConfig, data: Any, begin: Any, extension: Any, inherit: str | None, resumed: bool, init_info: dict
):
    """What the engine trains: plain MLM, MLM from a model's weights (--from), or with a teacher (--inherit)."""
    from cramkit.train.objectives import MLMObjective

    if inherit:
        from cramkit.recipes.adapt import InheritObjective

        teacher = begin.teacher if begin is not None else None
        return InheritObjective(cfg, data, inherit, teacher, init=not resumed)
    if init_info.get("from"):
        from cramkit.recipes.adapt import ContinueObjective

        fresh = bool(init_info.get("fresh_head"))
        return ContinueObjective(
            cfg, data, None if resumed else begin, extension, fresh_head=fresh, source=init_info["from"]
        )
    return MLMObjective(cfg, data)


def _lock_run(run: Path, what: str) -> contextlib.AbstractContextManager:
    """The run directory's lock, taken by one process (rank 0 under torchrun)."""
    from cramkit.io import dir_lock

    if not runtime.torchrun().is_main:
        return contextlib.nullcontext()
    return dir_lock(run, what)


def _resume_plan(run: Path, cfg: RunConfig) -> bool:
    """Say what resuming ``run`` under ``cfg.train.budget`` will do; False when there is nothing left to do."""
    from cramkit.train.schedule import lr_factor

    found = ckpt.find_latest(run)
    if found is None:
        return True  # the engine says there is no checkpoint to resume from
    state = ckpt.read_state(found).get("trainer", {})
    step, tokens, elapsed = state.get("step", 0), state.get("tokens", 0), state.get("elapsed", 0.0)
    before = state.get("budget")
    budget = cfg.train.parsed_budget
    fraction = budget.fraction(elapsed, tokens, step)
    quiet = not runtime.torchrun().is_main
    if fraction >= 1.0:
        if not quiet:
            print(
                f"cramkit: {run} already spent its budget of {cfg.train.budget} ({step} steps, {tokens:,} tokens); "
                f"nothing to do. To train further, resume with a larger --budget (e.g. --budget "
                f"{_larger(cfg.train.budget)}); the learning-rate schedule is keyed to the fraction of the budget "
                "spent, so it is stretched over the new budget",
                file=sys.stderr,
            )
        return False
    if before and before != cfg.train.budget and not quiet:
        t = cfg.train
        # the rate at the fraction of the old budget spent, as the checkpoint recorded it
        old_lr = t.lr * lr_factor(state.get("fraction", 0.0), t.schedule, t.warmup, t.cooldown, t.lr_start)
        new_lr = t.lr * lr_factor(fraction, t.schedule, t.warmup, t.cooldown, t.lr_start)
        print(
            f"cramkit: budget {before} -> {cfg.train.budget}: the run has spent {fraction:.0%} of the new budget; "
            f"the learning-rate schedule ({t.schedule}) is keyed to that fraction, so the learning rate goes "
            f"from {old_lr:.2e} to {new_lr:.2e} and follows the {cfg.train.budget} schedule from here "
            "(for a plain continuation at a fixed rate, add --set train.schedule=constant)",
            file=sys.stderr,
        )
    return True


MOE_KEYS = ("moe_experts", "moe_top_k", "moe_every")


def _same_experts(run: Path, saved: dict[str, Any], cfg: RunConfig) -> None:
    """A resumed run keeps its experts: a dense run resumed as MoE (or the reverse) is refused in one line."""
    before = saved.get("model") or {}
    for key in MOE_KEYS:
        old = before.get(key, getattr(type(cfg.model)(), key))
        new = getattr(cfg.model, key)
        if old != new:
            raise CramkitError(
                f"--resume {run}: the run was trained with model.{key}={old}, not {new}; a checkpoint keeps its "
                f"experts. To turn a dense model into a mixture of experts start a new run: cramkit pretrain TEXT "
                f"--from {run} --upcycle --set model.moe_experts=E"
            )


def _larger(budget: str) -> str:
    import re

    m = re.fullmatch(r"([0-9.eE+]+)(\D*)", budget.strip())
    return f"{float(m.group(1)) * 2:g}{m.group(2)}" if m else budget


def _read_run_info(run: Path) -> dict[str, Any]:
    return read_json_object(run / RUN_FILE, "the run directory is damaged")
