"""What a pretraining run reads, prepared in its run directory (:func:`prepare_run`): the tokenizer (``--tokenizer``,
the token store's own, a model's for ``--from`` / ``--inherit`` (extended with ``--extend-vocab``), or trained on the
text) and the token store (the one given, or built from the text), each cached with the key it was made for, so a
second run into the same directory with the same sources reuses them; then the run's final config and run.json."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from cramkit.data.tokenstore import is_store
from cramkit.errors import CramkitError
from cramkit.io import json_loads, json_text, read_json
from cramkit.train.config import RunConfig, build_config, check_fits

RUN_FILE = "run.json"


def prepare_run(run, cfg, inputs, tokenizer, resume, preset, source_options, saved, *, begin, adapt_info):
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


def _cache_key(file: Path) -> Any:
    """The key a cache recorded in ``file``; None when it is unreadable (a damaged cache is built again)."""
    try:
        return json_loads(json_text(file))
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
