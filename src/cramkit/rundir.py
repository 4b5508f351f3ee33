"""The read side of a run directory: checkpoints listed, the latest found, checksums verified.

A run directory (``cramkit pretrain --out``, a fine-tuning seed, a student) holds ``config.yaml`` and::

    RUN/checkpoints/step-000120/     a complete checkpoint: its state.json is written last
    RUN/checkpoints/step-000240.tmp/ being written (or killed mid-write): never read
    RUN/checkpoints/latest           names the newest complete checkpoint

``cramkit.train.checkpoint`` writes them (and resumes training from them); everything that only reads
(``cramkit.load``, resuming, reports) comes through here. No torch at import; nothing here unpickles.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cramkit.errors import CramkitError
from cramkit.io import BadJson, json_loads, json_text, sha256_file

if TYPE_CHECKING:
    import torch

FORMAT = "cramkit-checkpoint-2"
STATE_FILE = "state.json"
META_FILE = "metadata.json"
WEIGHTS_FILE = "model.safetensors"
LATEST = "latest"
_STEP_RE = re.compile(r"^step-(\d+)$")
_SHARD_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def finished_result(
    file: str | os.PathLike, *, needs: tuple[str | os.PathLike, ...] = (), key: str | None = None
) -> dict[str, Any] | None:
    """The results a finished piece of work wrote last (``file``, a JSON object), for a rerun to reuse; None
    when it is absent, damaged, lacks ``key``, or a file it ``needs`` is gone (then the work is done again).
    The one "reuse a finished run" check of the recipes (fine-tuning seeds, suites, mixtures, students)."""
    path = Path(file)
    if not path.is_file() or not all(Path(n).exists() for n in needs):
        return None
    try:
        data = json_loads(json_text(path))
    except (OSError, ValueError, BadJson):
        return None
    return data if isinstance(data, dict) and (key is None or data.get(key)) else None


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


# ---------------------------------------------------------------------------------------------------
# run directories and finding checkpoints


def checkpoints_dir(run: str | os.PathLike) -> Path:
    return Path(run) / "checkpoints"


def is_run_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / "config.yaml").is_file()


# what a run writes at the top of its directory (the run's record, the engine's, its trackers')
RUN_NAMES = (
    "config.yaml",
    "run.json",
    "metrics.jsonl",
    "loss.png",
    "checkpoints",
    "tokenizer",
    "data",
    "vocab-extension.json",
    "pooler.safetensors",
    "trackers.json",
    "tb",
    "wandb",
    "mlruns",
    "trackio",
)


def check_new_run(run: str | os.PathLike) -> None:
    """A new run (``cramkit pretrain --out RUN``) goes into ``run`` only when it is new or empty, a run of
    cramkit's (its ``run.json``, as a failed first attempt leaves it), or a folder holding none of
    :data:`RUN_NAMES` (a user's ``metrics.jsonl`` or ``config.yaml`` is never appended to or replaced): else
    one CramkitError naming the file and the fix (:func:`cramkit.io.check_out`)."""
    from cramkit.io import check_out

    own = {"run.json": ("inputs", "store", "tokenizer")}  # what pretrain records of the run
    check_out(run, own=own, writes=RUN_NAMES, command="cramkit pretrain")


def require_run_dir(path: str | os.PathLike) -> Path:
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


def is_complete(path: str | os.PathLike) -> bool:
    """A finished checkpoint: a ``step-N`` directory (never ``.tmp``) holding its state.json."""
    path = Path(path)
    return bool(_STEP_RE.match(path.name)) and (path / STATE_FILE).is_file()


def list_checkpoints(run: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoints_dir(run)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: int(cast("re.Match[str]", _STEP_RE.match(p.name)).group(1)))  # complete: a match


def find_latest(run: str | os.PathLike) -> Path | None:
    """The checkpoint ``latest`` names when it is complete; else the newest complete one; else None."""
    root = checkpoints_dir(run)
    pointer = root / LATEST
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8", errors="replace").strip()
        cand = root / name
        if _STEP_RE.match(name) and is_complete(cand):
            return cand
    done = list_checkpoints(run)
    return done[-1] if done else None


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A complete checkpoint from a step directory, a ``checkpoints/`` folder or a run folder."""
    path = Path(path)
    if is_complete(path):
        return path
    for run in [path, *([path.parent] if path.name == "checkpoints" else [])]:
        found = find_latest(run)
        if found is not None:
            return found
    if path.name.endswith(".tmp"):
        raise CramkitError(
            f"{path} is an incomplete checkpoint (still being written, or its writer was killed); "
            "use a complete step-* directory or the run directory"
        )
    raise CramkitError(
        f"{path}: no complete checkpoint found (a step-* directory with {STATE_FILE}, or a run directory "
        "holding checkpoints/); check the path"
    )


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON written last into a checkpoint: trainer state, optimizer hyper-parameters, checksums."""
    file = Path(path) / STATE_FILE
    fix = "resume from another checkpoint (delete this one) or start a new run"
    try:
        state = json_loads(json_text(file))
    except FileNotFoundError:
        raise CramkitError(f"{file} is missing: the checkpoint is incomplete; {fix}") from None
    except (UnicodeDecodeError, BadJson) as exc:
        raise CramkitError(f"{file} is corrupt ({exc}); {fix}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else None
        raise CramkitError(
            f"{file}: not a checkpoint this cramkit reads (format {found!r}, expected {FORMAT!r}; an older "
            "cramkit or another tool wrote it); start a new run, or export it with the cramkit that wrote it"
        )
    return state


def verify(path: str | os.PathLike, files: list[str] | None = None) -> dict[str, Any]:
    """Check the SHA-256 of the checkpoint's files (all, or ``files``) against its state.json."""
    path = Path(path)
    state = read_state(path)
    sums = state.get("sha256")
    if not isinstance(sums, dict) or not sums:
        raise CramkitError(f"{path / STATE_FILE} lists no checksums; the checkpoint is damaged; resume from another")
    for name in files if files is not None else sorted(sums):
        inside_checkpoint(path, name)
        expected = sums.get(name)
        file = path / name
        if expected is None or not file.is_file():
            raise CramkitError(
                f"checkpoint {path}: {name} is missing; the checkpoint is damaged. Delete it to resume from the "
                "one before it, or start a new run"
            )
        if sha256_file(file) != expected:
            raise CramkitError(
                f"checkpoint {path}: {name} does not match its checksum (the file was changed or corrupted on "
                "disk). Delete this checkpoint to resume from the one before it, or start a new run"
            )
    return state


def inside_checkpoint(root: Path, name: str) -> Path:
    """``root/name`` for a bare file name read from a checkpoint; anything that could leave ``root`` is refused."""
    if not isinstance(name, str) or not _SHARD_RE.match(name) or name in (".", ".."):
        raise CramkitError(
            f"checkpoint {root} names a file {name!r} outside its directory; it was not written by cramkit. "
            "Refusing to read it"
        )
    return root / name


def model_weights(checkpoint: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model's weights from ``model.safetensors`` of a checkpoint, checksum verified (tied weights once)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = resolve_checkpoint(checkpoint)
    verify(path, [WEIGHTS_FILE])
    try:
        return load_file(str(path / WEIGHTS_FILE))
    except (OSError, SafetensorError) as exc:
        raise CramkitError(f"{path / WEIGHTS_FILE} cannot be read ({exc}); the checkpoint is damaged") from None
