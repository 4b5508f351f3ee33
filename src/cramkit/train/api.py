"""``cramkit.pretrain``: raw text (or a token store) and a budget in, a run directory out.

Given raw text sources the tokenizer is trained (or ``tokenizer=DIR`` is used) and the token store is
built inside the run directory, both cached: a second run into the same directory with the same
sources reuses them. Given a token store it is used as it is, after checking that it was built with
the run's tokenizer. Given nothing, the built-in corpus (stdlib docstrings) is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from cramkit.errors import CramkitError
from cramkit.train import checkpoint as ckpt
from cramkit.train.config import RunConfig, build_config, resolve_config

RUN_FILE = "run.json"


def default_out(preset: str) -> Path:
    name = Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _is_store(path: str) -> bool:
    """A token store: a directory holding *.idx/*.bin, or a prefix / .bin / .idx file of one."""
    p = Path(path)
    if p.is_dir():
        return any(p.glob("*.idx")) and not any(p.glob("*.txt"))
    base = p.with_suffix("") if p.suffix in (".bin", ".idx") else p
    return base.with_suffix(".idx").is_file() and base.with_suffix(".bin").is_file()


def _sources_key(sources: Sequence[str], tok_hash: str, cfg: RunConfig) -> str:
    """Cache key of a store built from raw text: the files (path, size, mtime) and the tokenizer."""
    from cramkit.text.sources import expand_sources

    files = []
    for s in expand_sources(list(sources)) if sources else ["<built-in>"]:
        p = Path(s)
        stat = p.stat() if p.exists() else None
        files.append([s, stat.st_size if stat else None, stat.st_mtime_ns if stat else None])
    blob = json.dumps({"files": files, "tokenizer": tok_hash}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _tokenizer_for(run: Path, cfg: RunConfig, sources: list[str], tokenizer: str | None, store: str | None):
    """The run's tokenizer: RUN/tokenizer if cached, else --tokenizer, the store's own, or trained."""
    from cramkit.text.sources import iter_documents
    from cramkit.text.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer

    tok_dir = run / "tokenizer"
    key_file = tok_dir / "cramkit-source.json"
    want = {"tokenizer": str(tokenizer) if tokenizer else None, "store": store, "sources": sources,
            "settings": cfg.to_dict()["tokenizer"]}  # fmt: skip
    cached = (tok_dir / "tokenizer.json").is_file() and key_file.is_file()
    if cached and json.loads(key_file.read_text(encoding="utf-8")) == want:
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
        print(f"cramkit: training a WordPiece tokenizer (vocabulary {t.vocab_size}) on {_describe(sources)}")
        tok = train_tokenizer(lambda: iter_documents(sources or None), t.vocab_size, lowercase=t.lowercase,
                              strip_accents=t.strip_accents, min_frequency=t.min_frequency)  # fmt: skip
    tmp = run / ".tokenizer.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_tokenizer(tok, tmp)
    (tmp / "cramkit-source.json").write_text(json.dumps(want, indent=1), encoding="utf-8")
    shutil.rmtree(tok_dir, ignore_errors=True)
    os.replace(tmp, tok_dir)
    return tok


def _store_prefix(store: str) -> Path:
    from cramkit.data.tokenstore import resolve_prefix

    return resolve_prefix(store)


def _describe(sources: list[str]) -> str:
    if not sources:
        return "the built-in corpus (Python standard library docstrings)"
    return ", ".join(sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")


def _store_for(run: Path, cfg: RunConfig, sources: list[str], store: str | None, tok) -> Any:
    """The TokenStore to train on: the given one (tokenizer checked) or RUN/data built from sources."""
    from cramkit.data.build import build_store
    from cramkit.data.tokenstore import TokenStore
    from cramkit.text.tokenizer import tokenizer_hash

    if store:
        ts = TokenStore(store)
        ts.check_tokenizer(tok)
        return ts
    data_dir = run / "data"
    key = _sources_key(sources, tokenizer_hash(tok), cfg)
    key_file = data_dir / "cramkit-source.json"
    if key_file.is_file() and json.loads(key_file.read_text(encoding="utf-8")).get("key") == key:
        try:
            return TokenStore(data_dir / "train")
        except CramkitError:
            pass  # damaged cache: rebuild below
    print(f"cramkit: building the token store from {_describe(sources)}")
    tmp = run / ".data.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    build_store(sources or None, tok, tmp, name="train")
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
    preset: str = "tiny-cpu",
    budget: str | None = None,
    out: str | os.PathLike | None = None,
    overrides: Sequence[str] = (),
    resume: str | os.PathLike | None = None,
    tokenizer: str | os.PathLike | None = None,
) -> Path:
    """Pretrain a masked-LM encoder within ``budget``; returns the run directory.

    sources_or_store: text files / directories / globs / ``hf:`` datasets, or one token store
      directory; None: the built-in corpus.
    preset: ``tiny-cpu``, ``crammed-bert``, ``bert-base`` or a YAML path; overrides: ``["train.lr=1e-3"]``.
    budget: ``"5m"``, ``"24h"``, ``"2e9tok"``, ``"1000steps"`` (default: the preset's).
    resume: a run directory to continue from its latest checkpoint (its saved config is used; overrides
      and budget still apply, e.g. to extend the budget).
    """
    from cramkit.data.loader import PretrainData
    from cramkit.text.tokenizer import special_ids
    from cramkit.train.loop import train
    from cramkit.train.parallel import fault_guard, init_distributed, main_first, shutdown

    overrides = list(overrides) + ([f"train.budget={budget}"] if budget else [])
    if isinstance(sources_or_store, (str, os.PathLike)):
        inputs = [str(sources_or_store)]
    else:
        inputs = [str(s) for s in sources_or_store or []]

    if resume is not None:
        run = ckpt.require_run_dir(resume)
        saved = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
        cfg = resolve_config(base=saved, overrides=overrides)
        info = json.loads((run / RUN_FILE).read_text(encoding="utf-8")) if (run / RUN_FILE).is_file() else {}
        if inputs and inputs != info.get("inputs"):
            raise CramkitError(
                f"--resume {run}: the run was started on {info.get('inputs') or 'the built-in corpus'}, not "
                f"{inputs}; resume without naming the data (or start a new run)"
            )
        inputs = info.get("inputs", [])
        tokenizer = None
    else:
        cfg = resolve_config(preset, overrides)
        if out is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
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
        run.mkdir(parents=True, exist_ok=True)

    store = None
    if len(inputs) == 1 and _is_store(inputs[0]):
        store = str(Path(inputs[0]).resolve())
    elif any(_is_store(s) for s in inputs):
        raise CramkitError(f"give either one token store or raw text sources, not a mix: {inputs}")
    sources = [] if store else inputs

    ctx = init_distributed(cfg.train.device, cfg.parallel)
    # with several processes rank 0 trains the tokenizer and builds the store; the others then read them
    with main_first(ctx, "preparing the tokenizer and token store"):
        if resume is None or not (run / "tokenizer" / "tokenizer.json").is_file():
            tok = _tokenizer_for(run, cfg, sources, str(tokenizer) if tokenizer else None, store)
        else:
            from cramkit.text.tokenizer import load_tokenizer

            tok = load_tokenizer(run / "tokenizer")
        ts = _store_for(run, cfg, sources, store, tok)
        vocab = tok.get_vocab_size(with_added_tokens=True)
        cfg = cfg.replace(model=cfg.model.replace(vocab_size=vocab))
        if not resume:
            if ctx.is_main:
                _write_config(run, cfg)
            info = {"inputs": inputs, "store": str(ts.prefix), "preset": preset, "tokenizer": "tokenizer"}
            if ctx.is_main:
                (run / RUN_FILE).write_text(json.dumps(info, indent=1), encoding="utf-8")
        elif ctx.is_main and cfg.to_dict() != build_config(saved).to_dict():
            _write_config(run, cfg)  # e.g. an extended budget: part of the run from now on

    data = PretrainData(ts, cfg.data, special_ids(tok), vocab)
    with fault_guard(ctx):  # a dead or hung peer: one clear error on every surviving rank
        train(cfg, run, data, resume=resume is not None, ctx=ctx)
    shutdown(ctx)
    return run
