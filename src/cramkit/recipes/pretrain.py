"""``cramkit.pretrain``: raw text (or a token store) and a budget in, a run directory out.

Given raw text sources the tokenizer is trained (or ``tokenizer=DIR`` is used) and the token store is
built inside the run directory, both cached: a second run into the same directory with the same
sources reuses them. Given a token store it is used as it is, after checking that it was built with
the run's tokenizer. Given nothing, the built-in corpus (stdlib docstrings) is used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import yaml

from cramkit import runtime
from cramkit.config import load_yaml
from cramkit.data.tokenstore import is_store
from cramkit.errors import CramkitError
from cramkit.io import json_loads, read_json, read_json_object
from cramkit.train import checkpoint as ckpt
from cramkit.train.config import RunConfig, build_config, check_fits, resolve_config
from cramkit.train.report import report_to_setting, require_trackers

RUN_FILE = "run.json"


def default_out(preset: str) -> Path:
    name = Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _cache_key(file: Path) -> Any:
    """The key a cache recorded in ``file``; None when it is unreadable (a damaged cache is built again)."""
    try:
        return json_loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _sources_key(sources: Sequence[str], tok_hash: str, cfg: RunConfig, source_options: dict) -> str:
    """Cache key of a store built from raw text: the files (path, size, mtime) and the tokenizer."""
    from cramkit.text.sources import expand_sources

    files = []
    for s in expand_sources(list(sources)) if sources else ["<built-in>"]:
        p = Path(s)
        stat = p.stat() if p.exists() else None
        files.append([s, stat.st_size if stat else None, stat.st_mtime_ns if stat else None])
    key: dict[str, Any] = {"files": files, "tokenizer": tok_hash}
    if source_options:  # only non-default reading options (keeps the keys of earlier runs valid)
        key["options"] = source_options
    blob = json.dumps(key, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _tokenizer_for(
    run: Path,
    cfg: RunConfig,
    sources: list[str],
    tokenizer: str | None,
    store: str | None,
    source_options: dict,
):
    """The run's tokenizer: RUN/tokenizer if cached, else --tokenizer, the store's own, or trained."""
    from cramkit.text.sources import detect_language, iter_documents
    from cramkit.text.tokenizer import load_tokenizer, train_tokenizer

    tok_dir = run / "tokenizer"
    key_file = tok_dir / "cramkit-source.json"
    want = {
        "tokenizer": str(tokenizer) if tokenizer else None,
        "store": store,
        "sources": sources,
        "settings": cfg.to_dict()["tokenizer"],
    }
    if source_options:
        want["source_options"] = source_options
    cached = (tok_dir / "tokenizer.json").is_file() and key_file.is_file()
    if cached and _cache_key(key_file) == want:
        return load_tokenizer(tok_dir)
    if tokenizer:
        tok = load_tokenizer(tokenizer)
    elif store:
        prefix = _store_prefix(store)
        beside = prefix.with_name(prefix.name + ".tokenizer.json")
        if not beside.is_file():
            raise CramkitError(
                f"token store {store} has no tokenizer beside it ({beside.name}); give the tokenizer it was "
                "built with: cramkit pretrain STORE --tokenizer DIR"
            )
        tok = load_tokenizer(beside)
    else:
        t = cfg.tokenizer
        if sources:
            from cramkit.text.sources import expand_sources

            expand_sources(sources)  # a missing path fails here, before any work is announced
        lang, why = t.lang, ""
        if lang == "auto":
            guess = detect_language(iter_documents(sources or None, **source_options))
            lang, why = guess.lang, f": {guess.describe()}"
        kind = "Chinese, one token per character" if lang == "zh" else "generic"
        print(
            f"cramkit: training a WordPiece tokenizer (vocabulary {t.vocab_size}; {kind}{why}) on {_describe(sources)}"
        )
        tok = train_tokenizer(
            lambda: iter_documents(sources or None, **source_options),
            t.vocab_size,
            lowercase=t.lowercase,
            strip_accents=t.strip_accents,
            min_frequency=t.min_frequency,
            lang=lang,
        )
        got = tok.get_vocab_size(with_added_tokens=True)
        if got < t.vocab_size:
            print(
                f"cramkit: note: the corpus yields only {got:,} of the {t.vocab_size:,} vocabulary entries asked "
                f"for (every word in it is whole); the model uses {got:,} (more text gives a larger vocabulary)"
            )
    _save_run_tokenizer(run, tok, want)
    return tok


def _save_run_tokenizer(run: Path, tok: Any, key: dict[str, Any]) -> None:
    """RUN/tokenizer, with the key it was made for (cramkit-source.json), replaced atomically."""
    from cramkit.text.tokenizer import save_tokenizer

    tmp, tok_dir = run / ".tokenizer.tmp", run / "tokenizer"
    shutil.rmtree(tmp, ignore_errors=True)
    save_tokenizer(tok, tmp)
    (tmp / "cramkit-source.json").write_text(json.dumps(key, indent=1), encoding="utf-8")
    shutil.rmtree(tok_dir, ignore_errors=True)
    os.replace(tmp, tok_dir)


def _store_prefix(store: str) -> Path:
    from cramkit.data.tokenstore import resolve_prefix

    return resolve_prefix(store)


def _describe(sources: list[str]) -> str:
    if not sources:
        return "the built-in corpus (Python standard library docstrings)"
    return ", ".join(sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")


def _store_for(
    run: Path,
    cfg: RunConfig,
    sources: list[str],
    store: str | None,
    tok,
    source_options: dict,
    explicit_tok: bool,
) -> Any:
    """The TokenStore to train on: the given one (tokenizer checked) or RUN/data built from sources."""
    from cramkit.data.build import build_store
    from cramkit.data.tokenstore import TokenStore
    from cramkit.text.tokenizer import tokenizer_hash

    if store:
        ts = TokenStore(store)
        ts.check_tokenizer(tok, explicit=explicit_tok)
        return ts
    data_dir = run / "data"
    key = _sources_key(sources, tokenizer_hash(tok), cfg, source_options)
    key_file = data_dir / "cramkit-source.json"
    if key_file.is_file() and (_cache_key(key_file) or {}).get("key") == key:
        try:
            return TokenStore(data_dir / "train")
        except CramkitError:
            pass  # damaged cache: rebuild below
    print(f"cramkit: building the token store from {_describe(sources)}")
    tmp = run / ".data.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    build_store(sources or None, tok, tmp, name="train", **source_options)
    (tmp / "cramkit-source.json").write_text(json.dumps({"key": key, "sources": sources}), encoding="utf-8")
    shutil.rmtree(data_dir, ignore_errors=True)
    os.replace(tmp, data_dir)
    return TokenStore(data_dir / "train")


def _write_config(run: Path, cfg: RunConfig) -> None:
    tmp = run / ".config.yaml.tmp"
    tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")
    os.replace(tmp, run / "config.yaml")


def pretrain(
    sources_or_store: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    *,
    preset: str | None = None,
    budget: str | None = None,
    out: str | os.PathLike | None = None,
    overrides: Sequence[str] = (),
    resume: str | os.PathLike | None = None,
    tokenizer: str | os.PathLike | None = None,
    encoding: str | None = None,
    errors: str = "strict",
    text_field: str = "text",
    doc_split: str = "auto",
    init: str | os.PathLike | None = None,
    inherit: str | os.PathLike | None = None,
    extend_vocab: int = 0,
    upcycle: bool = False,
    report_to: str | Sequence[str] | None = None,
) -> Path:
    """Pretrain a masked-LM encoder within ``budget``; returns the run directory.

    sources_or_store: text files / directories / globs / ``hf:`` datasets, or one token store
      directory; None: the built-in corpus.
    preset: ``tiny-cpu`` (the default; ``tiny-zh`` when the text is Chinese), ``crammed-bert``, ``bert-base``,
      ``continue`` (the default with ``init``) or a YAML path; overrides: ``["train.lr=1e-3"]``.
    budget: ``"5m"``, ``"24h"``, ``"2e9tok"``, ``"1000steps"`` (default: the preset's).
    resume: a run directory to continue from its latest checkpoint (its saved config is used; overrides
      and budget still apply, e.g. to extend the budget).
    encoding, errors, text_field, doc_split: how raw text sources are read (see
      ``cramkit.text.iter_documents``): e.g. ``encoding="cp1252"``, ``errors="replace"``,
      ``text_field="body"`` for JSON Lines / Parquet, ``doc_split="file"``.
    init: continue this model (``pretrain --from``): anything ``cramkit.load`` reads that has an encoder
      (a run, a checkpoint, a model directory, ``hf:DIR``); its tokenizer, architecture and masking are kept.
    inherit: a masked-LM teacher for knowledge inheritance (``pretrain --inherit``): the new model (the
      preset's shape) uses its tokenizer and learns from its predictions early in the run (``inherit.*``).
    extend_vocab: with ``init``, add this many frequent words of the corpus that the tokenizer splits.
    upcycle: with ``init`` a dense model and ``model.moe_experts`` set: a mixture of experts whose every expert
      starts as the model's feed-forward weights (``pretrain --upcycle``; the routers fresh).
    report_to: experiment trackers that also get metrics.jsonl's records and the configuration: ``"wandb"``,
      ``"tensorboard,mlflow"``, ``["trackio"]`` (``train.report_to``; None: the config's, ``"none"`` by default;
      a resumed run keeps reporting where it did).
    """
    from cramkit.data.loader import PretrainData
    from cramkit.text.tokenizer import special_ids
    from cramkit.text.words import WordBoundaries
    from cramkit.train.distributed import fault_guard, shutdown
    from cramkit.train.trainer import fit

    overrides = _with_report_to(list(overrides) + ([f"train.budget={budget}"] if budget else []), report_to)
    inputs = _inputs(sources_or_store)
    source_options = _source_options(encoding=encoding, errors=errors, text_field=text_field, doc_split=doc_split)
    init = str(init) if init is not None else None
    inherit = str(inherit) if inherit is not None else None
    begin = None  # what the run starts from: adapt.Start (--from), the teacher (--inherit)
    created = None  # the run directory, when this call made it (removed again if preparation fails)
    if resume is not None:
        run = ckpt.require_run_dir(resume)
        saved = load_yaml(run / "config.yaml")
        cfg = resolve_config(base=saved, overrides=overrides)
        require_trackers(cfg.train.report_to, "train.report_to")  # before any work
        info = _read_run_info(run)
        _same_experts(run, saved, cfg)
        if upcycle:
            raise CramkitError(f"--resume {run}: --upcycle applies when a run starts (--from MODEL); resume without it")
        for flag, given, key in (("--from", init, "from"), ("--inherit", inherit, "inherit")):
            if given is not None and given != info.get(key):
                raise CramkitError(
                    f"--resume {run}: the run was started "
                    f"{f'{flag} {info[key]}' if info.get(key) else f'without {flag}'}"
                    f", not {flag} {given}; resume without {flag} (or start a new run)"
                )
        if extend_vocab and extend_vocab != info.get("extend_vocab", 0):
            raise CramkitError(f"--resume {run}: --extend-vocab applies when a run starts; resume without it")
        init, inherit, extend_vocab = info.get("from"), info.get("inherit"), 0
        fresh_head = bool(info.get("fresh_head"))
        if not _resume_plan(run, cfg):
            return run
        if inputs and inputs != info.get("inputs"):
            raise CramkitError(
                f"--resume {run}: the run was started on {info.get('inputs') or 'the built-in corpus'}, not "
                f"{inputs}; resume without naming the data (or start a new run)"
            )
        inputs = info.get("inputs", [])
        source_options = source_options or info.get("source_options", {})
        tokenizer = None
    else:
        cfg, begin, preset = _fresh_config(
            inputs, source_options, preset, overrides, init, inherit, tokenizer, extend_vocab, upcycle
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
        preset = preset or ("continue" if init else "tiny-cpu")
        if out is None and runtime.torchrun().world > 1:
            raise CramkitError(
                "under torchrun give --out RUN: every process must write into the same run directory "
                "(or use `cramkit pretrain --nproc N`, which picks one)"
            )
        run = Path(out) if out is not None else default_out(preset)
        if ckpt.find_latest(run) is not None:
            raise CramkitError(
                f"--out {run} already holds a run with checkpoints; continue it with --resume {run} or "
                "choose another --out"
            )
        # the model must fit before anything is written (the exact vocabulary is checked again below)
        check_fits(cfg, min(cfg.model.vocab_size, cfg.tokenizer.vocab_size))
        if not run.exists() and runtime.torchrun().world == 1:
            created = run
        run.mkdir(parents=True, exist_ok=True)
    with _lock_run(run, "--resume" if resume is not None else "--out"):
        if resume is None and ckpt.find_latest(run) is not None:  # another process got there first
            raise CramkitError(
                f"--out {run} already holds a run with checkpoints; continue it with --resume {run} or "
                "choose another --out"
            )
        try:
            cfg, ts, tok, vocab, ctx, extension = _prepare(
                run,
                cfg,
                inputs,
                tokenizer,
                resume,
                preset,
                source_options,
                saved if resume is not None else None,
                begin=begin,
                adapt_info={
                    "from": init,
                    "inherit": inherit,
                    "extend_vocab": extend_vocab,
                    "fresh_head": fresh_head,
                    "upcycle": upcycle,
                },
            )
            words = WordBoundaries(tok) if cfg.data.masking == "whole_word" else None
            data = PretrainData(ts, cfg.data, special_ids(tok), vocab, words)
            objective = _objective(
                cfg,
                data,
                begin,
                extension,
                inherit,
                resume is not None,
                {"from": init, "fresh_head": fresh_head},
            )
        except BaseException:
            if created is not None and created.is_dir() and ckpt.find_latest(created) is None:
                shutil.rmtree(created, ignore_errors=True)  # a failed first attempt leaves no empty run behind
            raise

        with fault_guard(ctx):  # a dead or hung peer: one clear error on every surviving rank
            result = fit(objective, cfg.train, cfg.parallel, run, resume=resume is not None, ctx=ctx)
        drift = [r["start_cosine"] for r in result.history if "start_cosine" in r]
        if drift and runtime.torchrun().is_main:
            print(
                f"cramkit: drift from {init}: mean cosine {drift[-1]:.3f} between the run's and the starting "
                "model's mean-pooled vectors of the held-out text (1 = unchanged; train.keep_vectors and train.l2sp "
                "hold it closer)",
                flush=True,
            )
        shutdown(ctx)
    return run


def resolved_config(
    sources_or_store: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    *,
    preset: str | None = None,
    budget: str | None = None,
    overrides: Sequence[str] = (),
    resume: str | os.PathLike | None = None,
    tokenizer: str | os.PathLike | None = None,
    encoding: str | None = None,
    errors: str = "strict",
    text_field: str = "text",
    doc_split: str = "auto",
    init: str | os.PathLike | None = None,
    inherit: str | os.PathLike | None = None,
    extend_vocab: int = 0,
    upcycle: bool = False,
    report_to: str | Sequence[str] | None = None,
) -> RunConfig:
    """The configuration :func:`pretrain` would train with (preset, then ``--set``, then what a model given
    with ``init`` decides), validated, with nothing written: ``cramkit pretrain --print-config``."""
    overrides = _with_report_to(list(overrides) + ([f"train.budget={budget}"] if budget else []), report_to)
    if resume is not None:
        run = ckpt.require_run_dir(resume)
        return resolve_config(base=load_yaml(run / "config.yaml"), overrides=overrides)
    options = _source_options(encoding=encoding, errors=errors, text_field=text_field, doc_split=doc_split)
    init = str(init) if init is not None else None
    inherit = str(inherit) if inherit is not None else None
    return _fresh_config(
        _inputs(sources_or_store), options, preset, overrides, init, inherit, tokenizer, extend_vocab, upcycle
    )[0]


def _with_report_to(overrides: list[str], report_to: str | Sequence[str] | None) -> list[str]:
    """``report_to`` (the flag, the keyword) as the ``train.report_to`` override it stands for."""
    if report_to is None:
        return overrides
    return [*overrides, f"train.report_to={report_to_setting(report_to)}"]


def _inputs(sources_or_store: str | os.PathLike | Sequence[str | os.PathLike] | None) -> list[str]:
    if isinstance(sources_or_store, (str, os.PathLike)):
        return [str(sources_or_store)]
    return [str(s) for s in sources_or_store or []]


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
        return resolve_config(preset or "tiny-cpu", overrides), None
    from cramkit.recipes import adapt

    if init:
        begin = adapt.start_from(init)
        base = load_preset(preset or "continue")
        base["model"] = adapt.config_dict(begin.config)
        base["data"] = {**(base.get("data") or {}), **begin.masking}
        cfg = resolve_config(base=base, overrides=overrides)
        adapt.check_architecture(begin, cfg.model, upcycle=upcycle)
    else:
        begin = adapt.teacher_start(cast(str, inherit))  # (neither --from nor --inherit returned above)
        base = load_preset(preset or "tiny-cpu")
        base["data"] = {**(base.get("data") or {}), "add_cls": begin.masking.get("add_cls", False)}
        cfg = resolve_config(base=base, overrides=overrides)
        adapt.check_teacher_fits(begin, cfg)
    return cfg, begin


def _model_tokenizer(run: Path, begin: Any, extend: int, sources: list[str], source_options: dict) -> tuple[Any, Any]:
    """The tokenizer of a run that starts from a model: the model's, extended by ``extend`` words of the
    corpus (cached in RUN/tokenizer with RUN/vocab-extension.json)."""
    from cramkit.text.extend import Extension, check_extensible, count_words, extend_vocabulary
    from cramkit.text.sources import iter_documents
    from cramkit.text.tokenizer import load_tokenizer, tokenizer_hash

    tok_dir, ext_file = run / "tokenizer", run / "vocab-extension.json"
    key_file = tok_dir / "cramkit-source.json"
    want: dict[str, Any] = {"model": begin.source, "model_tokenizer": tokenizer_hash(begin.tokenizer)}
    if extend:
        want |= {"extend_vocab": extend, "sources": sources, "source_options": source_options}
    cached = (tok_dir / "tokenizer.json").is_file() and key_file.is_file() and (ext_file.is_file() or not extend)
    if cached and _cache_key(key_file) == want:
        ext = None
        if extend:
            saved = read_json(ext_file, f"delete {ext_file} (a cache) and run again")
            ext = Extension(
                saved["words"],
                saved["pieces"],
                saved["first_id"],
                saved["words_counted"],
                saved["split_share_before"],
                saved["split_share_after"],
            )
        return load_tokenizer(tok_dir), ext
    tok, ext = begin.tokenizer, None
    if extend:
        check_extensible(tok, begin.source)
        before = tok.get_vocab_size(with_added_tokens=True)
        print(f"cramkit: counting the words of {_describe(sources)} to extend the vocabulary by {extend:,}")
        counts = count_words(tok, iter_documents(sources or None, **source_options))
        tok, ext = extend_vocabulary(tok, counts, extend)
        print(
            f"cramkit: vocabulary {before:,} -> {tok.get_vocab_size(with_added_tokens=True):,} tokens (+"
            f"{len(ext.words):,} words: {', '.join(ext.words[:8])}, ...); words split into pieces: "
            f"{ext.split_before:.1%} -> {ext.split_after:.1%} of the {ext.words_counted:,} words counted "
            f"(details: {ext_file})"
        )
    if ext is not None:
        from cramkit.io import write_json_atomic

        write_json_atomic(ext_file, ext.to_json())
    _save_run_tokenizer(run, tok, want)
    return tok, ext


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
    from cramkit.train.budget import parse_budget
    from cramkit.train.schedule import lr_factor

    found = ckpt.find_latest(run)
    if found is None:
        return True  # the engine says there is no checkpoint to resume from
    state = ckpt.read_state(found).get("trainer", {})
    step, tokens, elapsed = state.get("step", 0), state.get("tokens", 0), state.get("elapsed", 0.0)
    before = state.get("budget")
    budget = parse_budget(cfg.train.budget)
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
        old_lr = t.lr * lr_factor(
            parse_budget(before).fraction(elapsed, tokens, step), t.schedule, t.warmup, t.cooldown, t.lr_start
        )
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


def _source_options(**given: Any) -> dict[str, Any]:
    """The reading options that differ from the defaults, checked (an unknown encoding fails here)."""
    from cramkit.text.sources import check_source_options

    check_source_options(**given)
    defaults = {"encoding": None, "errors": "strict", "text_field": "text", "doc_split": "auto"}
    return {k: v for k, v in given.items() if v != defaults[k]}


def _read_run_info(run: Path) -> dict[str, Any]:
    return read_json_object(run / RUN_FILE, "the run directory is damaged")


def _prepare(run, cfg, inputs, tokenizer, resume, preset, source_options, saved, *, begin, adapt_info):
    """Tokenizer, token store and final config of the run (rank 0 first, the others then read them)."""
    from cramkit.train.distributed import init_distributed, main_first

    store = None
    if len(inputs) == 1 and is_store(inputs[0]):
        store = str(Path(inputs[0]).resolve())
    elif any(is_store(s) for s in inputs):
        raise CramkitError(f"give either one token store or raw text sources, not a mix: {inputs}")
    sources = [] if store else inputs

    ctx = init_distributed(cfg.train.device, cfg.parallel)
    explicit_tok = tokenizer is not None or resume is not None  # a resumed run's store was checked at start
    # with several processes rank 0 trains the tokenizer and builds the store; the others then read them
    extension = None
    with main_first(ctx, "preparing the tokenizer and token store"):
        if resume is not None and (run / "tokenizer" / "tokenizer.json").is_file():
            from cramkit.text.tokenizer import load_tokenizer

            tok = load_tokenizer(run / "tokenizer")
        elif begin is not None:  # --from / --inherit: the model's tokenizer (extended with --extend-vocab)
            if store and adapt_info["extend_vocab"]:
                raise CramkitError(
                    "--extend-vocab changes the tokenizer, so the token store must be built with the new one: "
                    "give the raw text instead of a store"
                )
            tok, extension = _model_tokenizer(run, begin, adapt_info["extend_vocab"], sources, source_options)
        else:
            tok = _tokenizer_for(run, cfg, sources, str(tokenizer) if tokenizer else None, store, source_options)
        vocab = tok.get_vocab_size(with_added_tokens=True)
        check_fits(cfg, vocab)
        try:
            ts = _store_for(run, cfg, sources, store, tok, source_options, explicit_tok)
        except CramkitError as exc:
            if begin is None or "another tokenizer" not in str(exc):
                raise
            flag = "--from" if adapt_info["from"] else "--inherit"
            raise CramkitError(
                f"token store {store} was built with another tokenizer than {flag} {begin.source}'s, which this "
                f"run must use; give raw text (the store is then built with it), or build the store with that "
                f"tokenizer: `cramkit data build CORPUS --tokenizer DIR --out STORE`"
            ) from None
        ts.check_ids(vocab, tokenizer_name=str(tokenizer or run / "tokenizer"))
        cfg = cfg.replace(model=cfg.model.replace(vocab_size=vocab))
        if begin is not None:  # the model's tokenizer, not one trained to tokenizer.vocab_size
            cfg = cfg.replace(tokenizer=dataclasses.replace(cfg.tokenizer, vocab_size=vocab))
        if not resume:
            if ctx.is_main:
                _write_config(run, cfg)
            info = {"inputs": inputs, "store": str(ts.prefix), "preset": preset, "tokenizer": "tokenizer"}
            info |= {k: v for k, v in adapt_info.items() if v}
            if adapt_info["from"] and begin is not None and begin.pooling:  # fine-tuning pools as the model did
                info["pooling"] = begin.pooling
            if source_options:
                info["source_options"] = source_options
            if ctx.is_main:
                if begin is not None and adapt_info["from"]:  # what is kept of --from's model (its pooler)
                    from cramkit.recipes.adapt import kept_message, save_pooler

                    pooler = save_pooler(run, begin)
                    info |= {"pooler": pooler} if pooler else {}
                    print(kept_message(begin, run), flush=True)
                (run / RUN_FILE).write_text(json.dumps(info, indent=1), encoding="utf-8")
        elif ctx.is_main and cfg.to_dict() != build_config(saved).to_dict():
            _write_config(run, cfg)  # e.g. an extended budget: part of the run from now on
    return cfg, ts, tok, vocab, ctx, extension
