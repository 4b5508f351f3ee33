"""Run directories and checkpoints.

Layout of a run directory::

    RUN/config.yaml            the resolved RunConfig
    RUN/run.json               what the run was made from (sources / store, cramkit version)
    RUN/tokenizer/             the tokenizer (tokenizer.json + vocab.txt)
    RUN/data/                  the token store, when built from raw text (cached)
    RUN/metrics.jsonl          one JSON object per logged step (and per evaluation)
    RUN/checkpoints/step-000123/{model.safetensors, optimizer.safetensors, optimizer.json, state.json}
    RUN/checkpoints/latest     names the last complete checkpoint

Two layers, kept apart so a sharded backend (torch.distributed.checkpoint) can sit beside this one:

- *gather / apply* (:func:`gather_state`, :func:`apply_state`): model and optimizer state as plain dicts;
- *format* (:func:`save_checkpoint`, :func:`load_checkpoint`): those dicts to and from files.

A checkpoint is written into a temporary directory, then renamed (``os.replace``); ``latest`` is
replaced atomically after that. A failure while writing (a full disk) removes the temporary directory
and leaves the previous checkpoint intact. Nothing is ever unpickled: tensors are safetensors, the rest
is JSON.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cramkit.errors import CramkitError

FORMAT = "cramkit-checkpoint-1"
_STEP_DIR = re.compile(r"^step-(\d+)$")


# ---------------------------------------------------------------- run directory


def checkpoints_dir(run: Path) -> Path:
    return Path(run) / "checkpoints"


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "config.yaml").is_file()


def require_run_dir(path: str | Path) -> Path:
    """``path`` if it is a cramkit run directory, else a CramkitError saying what it is not."""
    path = Path(path)
    if not path.exists():
        raise CramkitError(f"--resume {path}: the directory does not exist; give the --out of an earlier run")
    if not is_run_dir(path):
        raise CramkitError(
            f"--resume {path}: not a cramkit run directory (no config.yaml); give the --out directory "
            "of an earlier `cramkit pretrain`"
        )
    return path


def list_checkpoints(run: Path) -> list[Path]:
    """Complete checkpoints (those with a state.json, written last), oldest first."""
    root = checkpoints_dir(run)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name) and is_complete(p)]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def is_complete(path: Path) -> bool:
    """A finished checkpoint: this module's format (state.json is written last) or a sharded one
    written by several processes through ``cramkit.train.dcp`` (complete once renamed from .tmp)."""
    path = Path(path)
    if (path / "state.json").is_file():
        return True
    return (path / ".metadata").is_file() and (path / "trainer_state.json").is_file()


def find_latest(run: Path) -> Path | None:
    """The checkpoint named by ``latest``; failing that, the newest complete one; None if there is none."""
    root = checkpoints_dir(run)
    pointer = root / "latest"
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8").strip()
        cand = root / name
        if _STEP_DIR.match(name) and is_complete(cand):
            return cand
    done = list_checkpoints(run)
    return done[-1] if done else None


# ---------------------------------------------------------------- gather / apply (world size 1: plain state_dict)


def _unique_tensors(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop aliases of tied weights (safetensors refuses shared storage); the first name is kept."""
    out, seen = {}, set()
    for name, t in sd.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = t
    return out


def gather_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[dict, dict | None]:
    """Model weights (aliases removed) and optimizer state as plain dicts of CPU tensors."""
    model_sd = {k: v.detach().to("cpu").contiguous() for k, v in _unique_tensors(model.state_dict()).items()}
    optim_sd = optimizer.state_dict() if optimizer is not None else None
    return model_sd, optim_sd


def apply_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_sd: dict,
    optim_sd: dict | None,
    where: Path,
) -> None:
    """Load gathered state into a freshly built model and optimizer."""
    missing, unexpected = model.load_state_dict(model_sd, strict=False)
    aliases = set(model.state_dict()) - set(_unique_tensors(model.state_dict()))
    missing = [k for k in missing if k not in aliases]
    if missing or unexpected:
        raise CramkitError(
            f"checkpoint {where} does not fit this model (missing {missing[:3]}, unexpected {unexpected[:3]}); "
            "was the run's config.yaml edited? Resume with the config the run was started with"
        )
    if optimizer is not None and optim_sd is not None:
        try:
            optimizer.load_state_dict(optim_sd)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CramkitError(f"checkpoint {where}: optimizer state does not fit this run ({exc})") from None


# ---------------------------------------------------------------- format: safetensors + JSON


def _flatten_optimizer(optim_sd: dict) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for pid, pstate in optim_sd["state"].items():
        for key, value in pstate.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{pid}/{key}"] = value.detach().to("cpu").contiguous()
            else:
                scalars[f"{pid}/{key}"] = value
    groups = [
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in optim_sd["param_groups"]
    ]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for flat, value in [*tensors.items(), *meta["scalars"].items()]:
        pid, key = flat.split("/", 1)
        state.setdefault(int(pid), {})[key] = value
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def encode_rng() -> dict[str, Any]:
    """Torch RNG states (CPU and CUDA) as base64 strings."""
    out = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(rng: dict[str, Any]) -> None:
    def tensor(b64: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.uint8)

    torch.set_rng_state(tensor(rng["torch"]))
    if "cuda" in rng and torch.cuda.is_available():
        states = [tensor(s) for s in rng["cuda"]]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)


def _write_json(path: Path, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": FORMAT})


def save_checkpoint(
    run: Path, step: int, model_sd: dict, optim_sd: dict | None, state: dict[str, Any], keep: int = 2
) -> Path:
    """Write checkpoint ``step-{step:06d}`` atomically, point ``latest`` at it, keep the newest ``keep``."""
    root = checkpoints_dir(run)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    if (final / "state.json").is_file():
        return final  # this exact step is already saved
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        _save_tensors(model_sd, tmp / "model.safetensors")
        if optim_sd is not None:
            tensors, meta = _flatten_optimizer(optim_sd)
            _save_tensors(tensors, tmp / "optimizer.safetensors")
            _write_json(tmp / "optimizer.json", meta)
        _write_json(tmp / "state.json", {"format": FORMAT, **state})  # last: marks the checkpoint complete
        if final.exists():
            shutil.rmtree(final)  # an incomplete leftover of the same step
        os.replace(tmp, final)
        pointer_tmp = root / f".latest-{os.getpid()}"
        pointer_tmp.write_text(final.name + "\n", encoding="utf-8")
        os.replace(pointer_tmp, root / "latest")
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        prev = find_latest(run)
        kept = f"the previous checkpoint {prev} is intact" if prev else "no earlier checkpoint exists"
        reason = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise CramkitError(
            f"could not write checkpoint {final}: {reason}; {kept}. Free space (or fix the problem) and "
            f"continue with `cramkit pretrain --resume {run}`"
        ) from None
    prune_checkpoints(run, keep)
    return final


def prune_checkpoints(run: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints, and stale temporary directories."""
    root = checkpoints_dir(run)
    latest = find_latest(run)
    for old in list_checkpoints(run)[:-keep]:
        if old != latest:
            shutil.rmtree(old, ignore_errors=True)
    for tmp in root.glob(".tmp-step-*"):
        if not tmp.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(tmp, ignore_errors=True)


def load_checkpoint(path: Path) -> tuple[dict, dict | None, dict[str, Any]]:
    """Read a checkpoint written by :func:`save_checkpoint`; a damaged one raises a CramkitError."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    fix = f"delete {path} to resume from the checkpoint before it, or start a new run"
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError("state.json is not a cramkit checkpoint state")
        model_sd = load_file(str(path / "model.safetensors"))
        optim_sd = None
        if (path / "optimizer.json").is_file():
            meta = json.loads((path / "optimizer.json").read_text(encoding="utf-8"))
            optim_sd = _unflatten_optimizer(load_file(str(path / "optimizer.safetensors")), meta)
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
        raise CramkitError(f"checkpoint {path} is damaged or incomplete ({exc}); {fix}") from None
    return model_sd, optim_sd, state
