"""The reader of a pretraining run and of its checkpoints (``RUN/checkpoints/step-N``, any world size): the
run's config.yaml, the checkpoint's weights (checksum verified), the run's tokenizer and, for a run continued
from a model with BERT's pooler, that pooler (:data:`POOLER_FILE`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit import rundir
from cramkit.errors import CramkitError
from cramkit.io import json_loads, json_text
from cramkit.loading.common import check_size, default_max_length, load_weights
from cramkit.loading.kinds import is_checkpoint
from cramkit.model.loaded import LoadedModel
from cramkit.model.pooling import POOLINGS

if TYPE_CHECKING:
    import torch

POOLER_FILE = "pooler.safetensors"  # a run continued from a model with BERT's pooler keeps it here


def resolve_run_checkpoint(path: Path, step: int | None = None) -> tuple[Path, Path]:
    """(run directory, checkpoint directory) for a run (its latest, or ``step``) or a checkpoint path."""
    if is_checkpoint(path):
        if step is not None:
            raise CramkitError(f"--step applies to a run directory; {path} is already a checkpoint")
        if not rundir.is_complete(path):
            raise CramkitError(f"{path} is an incomplete checkpoint; use a complete step-* directory")
        return path.parent.parent, path
    run = path
    found: Path | None
    if step is not None:
        found = rundir.checkpoints_dir(run) / rundir.step_dir_name(step)
        if not (found.is_dir() and rundir.is_complete(found)):
            have = [p.name for p in rundir.list_checkpoints(run)]
            raise CramkitError(
                f"{run}: no complete checkpoint for --step {step}; available: {', '.join(have) or 'none'}"
            )
        return run, found
    found = rundir.find_latest(run)
    if found is None:
        raise CramkitError(
            f"{run}: the run has no complete checkpoint yet; pretrain until one is saved "
            "(train.checkpoint_every) or give a checkpoint directory"
        )
    return run, found


def _checkpoint_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model's weights of a checkpoint (any world size): its model.safetensors, checksum verified."""
    return rundir.model_weights(checkpoint)


def load_run(path: Path, step: int | None) -> LoadedModel:
    """The masked-LM model of a run's latest checkpoint (or ``step``), or of a checkpoint directory."""
    from cramkit.config import from_dict, load_yaml
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import MaskedLM

    run, checkpoint = resolve_run_checkpoint(path, step)
    try:
        section = load_yaml(run / "config.yaml").get("model")
    except CramkitError:
        raise
    except Exception as exc:  # a corrupt YAML file
        raise CramkitError(f"{run / 'config.yaml'} is not valid YAML ({exc}); restore the run's config") from None
    if not isinstance(section, dict):
        raise CramkitError(f"{run / 'config.yaml'} has no 'model:' section; is it a cramkit run?")
    cfg = from_dict(ModelConfig, section, "model")
    check_size(cfg, run / "config.yaml")
    state = _checkpoint_weights(checkpoint)
    state = {k.replace("_orig_mod.", "").removeprefix("module."): v for k, v in state.items()}
    model = MaskedLM(cfg.replace(gradient_checkpointing=False))
    load_weights(model, state, f"checkpoint {checkpoint}", tied=cfg.tie_embeddings)
    from cramkit.text.tokenizer import load_tokenizer

    if not (run / "tokenizer").is_dir():
        raise CramkitError(f"{run}: no tokenizer/ directory; the run is incomplete")
    from cramkit.io import read_json_object

    # a run continued from a model with BERT's pooler (pretrain --from) keeps it: fine-tuning starts from it
    info = read_json_object(run / "run.json", "the run directory is damaged") if (run / "run.json").is_file() else {}
    pooler = load_pooler(run, info, cfg.hidden)
    return LoadedModel(
        model=model,
        kind="mlm",
        config=cfg,
        tokenizer=load_tokenizer(run / "tokenizer"),
        max_length=default_max_length(cfg),
        pooling="mean",
        with_types=cfg.segment_types,
        extra={"run": str(run), "checkpoint": checkpoint.name, **_run_pooling(run)},
        pooler_state=pooler,
    )


def load_pooler(run: Path, info: dict[str, Any], hidden: int) -> dict[str, torch.Tensor] | None:
    """A continued run's kept pooler (``save_pooler``), its checksum verified; None when the run has none."""
    from cramkit.io import sha256_file
    from cramkit.model.hf import read_weights

    entry = info.get("pooler")
    file = run / POOLER_FILE
    if not entry:
        return None
    if not file.is_file():
        raise CramkitError(f"{run}: {POOLER_FILE} is missing (run.json records a kept pooler); the run is damaged")
    if not isinstance(entry, dict) or sha256_file(file) != entry.get("sha256"):
        raise CramkitError(
            f"{file} is corrupt (its SHA-256 differs from the one recorded in run.json); copy the run again"
        )
    state = read_weights(file)
    weight, bias = state.get("pooler.weight"), state.get("pooler.bias")
    if weight is None or bias is None or tuple(weight.shape) != (hidden, hidden) or tuple(bias.shape) != (hidden,):
        raise CramkitError(f"{file}: not a pooler of this run's model (hidden {hidden}); the run is damaged")
    return {"weight": weight, "bias": bias}


def _run_pooling(run: Path) -> dict[str, str]:
    """``{"st_pooling": ...}`` of a run continued from a sentence-transformers model (run.json records the
    model's own pooling; fine-tuning pools as it did), else nothing."""
    try:
        info = json_loads(json_text(run / "run.json"))
    except (OSError, ValueError):
        return {}
    value = info.get("pooling") if isinstance(info, dict) else None
    return {"st_pooling": value} if value in POOLINGS else {}
