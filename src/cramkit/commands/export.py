"""`cramkit export RUN_OR_CHECKPOINT --out DIR [--step N]`: a Hugging Face model directory.

A run directory holds ``config.yaml`` (its ``model:`` section), ``tokenizer/`` and
``checkpoints/{latest,step-NNNNNN/}``; a checkpoint directory inside ``checkpoints/`` works too.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cramkit.errors import CramkitError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a run's checkpoint as a Hugging Face model directory",
        description="Write a checkpoint as a Hugging Face directory. BERT-shaped models (post-LN, learned "
        "positions, biases, GELU) load with transformers.AutoModel; other architectures ship "
        "modeling_cramkit.py and load with trust_remote_code=True.",
    )
    p.add_argument("source", metavar="RUN_OR_CHECKPOINT", help="a run directory or one of its checkpoints")
    p.add_argument("--out", required=True, help="the directory to write (replaced atomically)")
    p.add_argument("--step", type=int, default=None, help="export checkpoint step-N instead of the latest")
    p.add_argument("--no-mlm-head", action="store_true", help="export the encoder only (BertModel)")
    p.add_argument("--force", action="store_true", help="replace --out even if it is not a previous export")
    p.set_defaults(func=run)


def resolve_checkpoint(source: Path, step: int | None) -> tuple[Path, Path]:
    """(run directory, checkpoint directory) for a run or a checkpoint path."""
    if not source.exists():
        raise CramkitError(
            f"{source} does not exist; give a run directory (with config.yaml) or a checkpoint"
        )
    if (source / "config.yaml").exists():
        run_dir = source
        ckpts = run_dir / "checkpoints"
        if step is not None:
            ckpt = ckpts / f"step-{step:06d}"
            if not ckpt.is_dir():
                have = sorted(p.name for p in ckpts.glob("step-*")) if ckpts.is_dir() else []
                raise CramkitError(
                    f"{run_dir}: no checkpoint for --step {step} ({ckpt.name}); available: {', '.join(have) or 'none'}"
                )
            return run_dir, ckpt
        latest = ckpts / "latest"
        if not latest.exists():
            raise CramkitError(f"{run_dir}: no checkpoints/latest; has the run saved a checkpoint yet?")
        name = latest.read_text(encoding="utf-8").strip()
        ckpt = ckpts / name
        if not name or not ckpt.is_dir():
            raise CramkitError(f"{latest} names {name!r}, which is not a checkpoint directory in {ckpts}")
        return run_dir, ckpt
    if source.parent.name == "checkpoints" and (source.parent.parent / "config.yaml").exists():
        if step is not None:
            raise CramkitError(f"--step applies to a run directory; {source} is already a checkpoint")
        return source.parent.parent, source
    raise CramkitError(
        f"{source}: neither a run directory (config.yaml) nor a checkpoint inside RUN/checkpoints/"
    )


def _hook(module_name: str):
    """``module_name.load_model_state`` if that trainer module exists, else None."""
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise  # the module exists but is broken: show it
        return None
    return getattr(module, "load_model_state", None)


def load_model_state(ckpt: Path) -> dict[str, Any]:
    """The model's state dict: through the trainer's loader when it has one
    (``cramkit.train.checkpoint.load_model_state``; DCP-sharded checkpoints through
    ``cramkit.train.dcp.load_model_state``), else from ``model.safetensors``."""
    loader = _hook("cramkit.train.checkpoint")
    if loader is None and (ckpt / ".metadata").is_file():
        loader = _hook("cramkit.train.dcp")
    if loader is not None:
        return loader(ckpt)
    from cramkit.model.hf import read_weights

    file = ckpt / "model.safetensors"
    if not file.exists():
        raise CramkitError(f"{ckpt}: no model.safetensors; is the checkpoint complete?")
    return read_weights(file)


def build_model(run_dir: Path, ckpt: Path):  # -> tuple[MaskedLM, ModelConfig]
    from cramkit.config import from_dict, load_yaml
    from cramkit.model import MaskedLM, ModelConfig

    section = load_yaml(run_dir / "config.yaml").get("model")
    if not isinstance(section, dict):
        raise CramkitError(f"{run_dir / 'config.yaml'} has no 'model:' section")
    cfg = from_dict(ModelConfig, section, "model")
    state = load_model_state(ckpt)
    # wrappers' prefixes (torch.compile, DDP), if a trainer ever saves them
    state = {k.replace("_orig_mod.", "").removeprefix("module."): v for k, v in state.items()}
    model = MaskedLM(cfg)
    if cfg.tie_embeddings:  # tied weights may be stored under either name only
        word, decoder = "encoder.embeddings.word.weight", "head.decoder.weight"
        if decoder not in state and word in state:
            state[decoder] = state[word]
        elif word not in state and decoder in state:
            state[word] = state[decoder]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CramkitError(
            f"{ckpt}: the weights do not fit the model in {run_dir / 'config.yaml'} "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.eval(), cfg


def run(args: argparse.Namespace) -> int:
    from cramkit.model.hf import export_hf

    run_dir, ckpt = resolve_checkpoint(Path(args.source), args.step)
    model, cfg = build_model(run_dir, ckpt)
    tok = run_dir / "tokenizer"
    out = export_hf(
        model,
        cfg,
        Path(args.out),
        tokenizer_dir=tok if tok.is_dir() else None,
        mlm_head=not args.no_mlm_head,
        force=args.force,
    )
    import json

    fmt = json.loads((out / "cramkit_export.json").read_text(encoding="utf-8"))["format"]
    how = "transformers.AutoModel.from_pretrained(DIR)"
    if fmt == "cramkit":
        how = (
            "transformers.AutoModel.from_pretrained(DIR, trust_remote_code=True) and "
            "AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)"
        )
    print(f"exported {ckpt} -> {out} ({fmt} format; load with {how})")
    return 0
