"""Sharded, asynchronous checkpoints through ``torch.distributed.checkpoint`` (DCP).

Layout of a run's ``checkpoints/`` folder::

    step-000120/            a complete checkpoint: every rank's shards, DCP's .metadata, trainer_state.json
    step-000240.tmp/        being written (or killed mid-write): never chosen on resume
    latest                  text file naming the newest complete checkpoint, replaced atomically

Each rank writes only its own shards (FSDP2: its slice of every parameter and optimizer moment;
DDP: DCP writes each replicated tensor once). ``save`` copies the state to host memory, then returns
while a background thread writes it; the training loop goes on. When the write has finished on every
rank and the metadata is down, rank 0 renames ``.tmp`` to its final name and then updates ``latest``,
so a crash at any moment leaves the previous checkpoint as the latest. Loading reshards: a checkpoint
written by N processes resumes on M (DCP reads each rank's slices of the saved tensors).

Only tensors go into the DCP shards; everything else (optimizer hyper-parameters, the trainer's step,
budget and data position) is JSON. DCP's ``.metadata`` is a pickle: it is read with an unpickler that
accepts only DCP's own metadata classes, so a foreign checkpoint cannot run code.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import pickle
import re
import shutil
import threading
import warnings
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cramkit.errors import CramkitError
from cramkit.train.parallel import DistContext

# a single-process save/load is what we mean when no process group exists: not worth a warning each time
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

STATE_FILE = "trainer_state.json"
LATEST = "latest"
_STEP_RE = re.compile(r"^step-(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


# ---------------------------------------------------------------------------------------------------
# finding checkpoints


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    """True for a complete DCP checkpoint directory (its metadata is written last)."""
    path = Path(path)
    return path.is_dir() and (path / ".metadata").is_file() and not path.name.endswith(".tmp")


def complete_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete sharded checkpoints under ``root``, oldest first (``.tmp`` ones are never listed)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_RE.match(p.name) and is_sharded_checkpoint(p)]
    return sorted(found, key=lambda p: int(_STEP_RE.match(p.name).group(1)))


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under ``root`` (a run's ``checkpoints/`` folder), or None.

    ``latest`` is trusted when it names a complete checkpoint; a torn or stale pointer falls back to
    the newest complete ``step-*`` directory.
    """
    root = Path(root)
    pointer = root / LATEST
    if pointer.is_file():
        name = pointer.read_text().strip()
        if name and "/" not in name and is_sharded_checkpoint(root / name):
            return root / name
    found = complete_checkpoints(root)
    return found[-1] if found else None


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A sharded checkpoint directory from a step directory, a ``checkpoints/`` folder or a run folder."""
    path = Path(path)
    if is_sharded_checkpoint(path):
        return path
    for root in (path, path / "checkpoints"):
        found = latest_checkpoint(root)
        if found is not None:
            return found
    if path.name.endswith(".tmp"):
        raise CramkitError(
            f"{path} is an incomplete checkpoint (still being written, or its writer was killed); "
            "use a complete step-* directory or the run directory"
        )
    raise CramkitError(
        f"{path}: no complete sharded checkpoint found (expected a step-* directory with a .metadata "
        "file, or a run directory holding checkpoints/); check the path"
    )


# ---------------------------------------------------------------------------------------------------
# safe reading of DCP metadata


_SAFE_MODULES = {
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
}
_SAFE_TORCH = {"Size", "strided", "contiguous_format", "channels_last", "preserve_format", "sparse_coo"}
_SAFE_NAMES = {
    ("collections", "OrderedDict"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
}
_SAFE_BUILTINS = {"set", "frozenset", "slice", "tuple", "list", "dict"}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _SAFE_MODULES:
            return super().find_class(module, name)
        if module == "torch" and (name in _SAFE_TORCH or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        if (module, name) in _SAFE_NAMES:
            return super().find_class(module, name)
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from checkpoint metadata")


def _reader(path: Path):
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
                try:
                    metadata = _MetadataUnpickler(io.BytesIO(f.read())).load()
                except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
                    raise CramkitError(
                        f"{self.path}/.metadata is not a valid cramkit checkpoint ({exc}); "
                        "use a checkpoint written by cramkit"
                    ) from None
            if getattr(metadata, "storage_meta", None) is None:
                from torch.distributed.checkpoint.metadata import StorageMeta

                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def read_metadata(path: str | os.PathLike):
    """DCP's metadata of a checkpoint (tensor names, global shapes and dtypes), read safely."""
    return _reader(Path(path)).read_metadata()


def read_trainer_state(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON trainer state saved with a checkpoint (step, budget, data position, ...)."""
    file = Path(path) / STATE_FILE
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise CramkitError(
            f"{file} is missing: the checkpoint is incomplete; resume from another one"
        ) from None
    except json.JSONDecodeError as exc:
        raise CramkitError(f"{file} is corrupt ({exc}); resume from another checkpoint") from None


# ---------------------------------------------------------------------------------------------------
# state dicts: tensors (sharded) and JSON (the rest)


def _options(full: bool = False):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full, flatten_optimizer_state_dict=True)


def _split(flat: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    tensors = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
    others = {k: v for k, v in flat.items() if not isinstance(v, torch.Tensor)}
    return tensors, others


def _jsonable(value: Any, where: str) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v, where) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise CramkitError(f"cannot checkpoint {where}={value!r}: only numbers, strings and lists are supported")


def _from_json(value: Any) -> Any:
    return tuple(_from_json(v) for v in value) if isinstance(value, list) else value


def get_states(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[dict, dict, dict]:
    """(model tensors, optimizer tensors, optimizer hyper-parameters) in DCP's sharded form."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return get_model_state_dict(model, options=_options()), {}, {}
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options())
    optim_tensors, hparams = _split(optim_sd)
    return model_sd, optim_tensors, {k: _jsonable(v, k) for k, v in hparams.items()}


# ---------------------------------------------------------------------------------------------------
# saving


class ShardedCheckpointer:
    """Writes sharded checkpoints of one run (all ranks call every method, in the same order)."""

    def __init__(
        self,
        root: str | os.PathLike,
        ctx: DistContext,
        keep: int = 3,
        async_save: bool = True,
        overlap_staging: bool = False,
    ):
        """``async_save``: write in a background thread. ``overlap_staging``: copy the state to host
        memory in the background too; the caller must then call :meth:`before_update` before anything
        modifies parameters or optimizer state (the optimizer step)."""
        self.root, self.ctx, self.keep, self.async_save = Path(root), ctx, max(1, keep), async_save
        self._future: Future | None = None
        self._staging: Future | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._stager = None
        if async_save:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = ctx.device.type == "cuda"
            # one stager for the whole run: its host buffers are reused from one checkpoint to the next
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda,
                    use_shared_memory=False,
                    use_async_staging=overlap_staging,
                    use_non_blocking_copy=cuda and overlap_staging,
                )
            )
        self.pg = None
        if ctx.distributed:
            import torch.distributed as dist

            # checkpoint collectives run on their own gloo group: the background writer must never
            # interleave its messages with the training step's all-reduces on the default group
            self.pg = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=ctx.timeout))
        if ctx.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            for stale in self.root.glob("step-*.tmp"):
                shutil.rmtree(stale, ignore_errors=True)

    # all ranks
    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        trainer_state: Mapping[str, Any] | None = None,
        *,
        block: bool = False,
    ) -> Path:
        """Checkpoint ``step``; returns once the state is copied to host memory (or written, if
        ``block`` or async saving is off). The directory becomes visible when every shard is down."""
        import torch.distributed.checkpoint as dcp

        self.wait()  # one write in flight at a time
        name = step_dir_name(step)
        tmp, final = self.root / f"{name}.tmp", self.root / name
        model_sd, optim_sd, hparams = get_states(model, optimizer)
        state = {"step": step, "world": self.ctx.world, "optimizer_hparams": hparams}
        state["trainer"] = dict(trainer_state or {})
        try:  # on every rank, so that all of them stop here alike
            text = json.dumps(state, indent=1, sort_keys=True)
        except TypeError as exc:
            raise CramkitError(f"trainer state of step {step} is not JSON-serializable: {exc}") from None
        if self.ctx.is_main:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            _write_synced(tmp / STATE_FILE, text)
        self._barrier()
        state_dict = {"model": model_sd, "optim": optim_sd}
        kwargs = dict(checkpoint_id=str(tmp), process_group=self.pg, no_dist=not self.ctx.distributed)
        if self.async_save and not block:
            response = dcp.async_save(state_dict, async_stager=self._stager, **kwargs)
            # with overlapped staging an AsyncSaveResponse: (host copy done, write done)
            upload = getattr(response, "upload_completion", response)
            self._staging = getattr(response, "staging_completion", None)
            # finished = written AND (on rank 0) renamed and pointed to by `latest`
            finished: Future = Future()
            self._future = finished

            def finish(f: Future) -> None:
                self._done(f, tmp, final)
                finished.set_result(None)

            upload.add_done_callback(finish)
        else:
            done: Future = Future()
            try:
                dcp.save(state_dict, **kwargs)
                done.set_result(None)
            except Exception as exc:  # noqa: BLE001 - reported by _raise, with the fix
                done.set_exception(exc)
            self._done(done, tmp, final)
            self._raise()
        return final

    def before_update(self) -> None:
        """Block until the state being checkpointed is copied to host memory (overlapped staging)."""
        staging, self._staging = self._staging, None
        if staging is not None:
            try:
                staging.result()
            except Exception as exc:  # noqa: BLE001 - reported with the fix
                with self._lock:
                    self._error = self._error or exc
                self._raise()

    def wait(self) -> None:
        """Block until the checkpoint in flight is complete (and visible); re-raise its error."""
        self.before_update()
        future, self._future = self._future, None
        if future is not None:
            try:
                future.result()
            except Exception as exc:  # the callback recorded it too
                with self._lock:
                    self._error = self._error or exc
        self._raise()

    def close(self, wait: bool = True) -> None:
        """Finish the write in flight (``wait=False`` when failing anyway: leave it to the background
        thread, which completes or fails on its own; an unfinished one stays an ignored ``.tmp``)."""
        try:
            if wait:
                self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None

    # internals
    def _done(self, future: Future, tmp: Path, final: Path) -> None:
        """Runs when this rank's write has finished; rank 0's finishes only after every rank's shards
        and the metadata are down (DCP gathers all ranks' write results before writing metadata)."""
        try:
            future.result()
            if self.ctx.is_main:
                if final.exists():
                    shutil.rmtree(final)
                os.replace(tmp, final)
                _fsync_dir(self.root)
                _write_atomic(self.root / LATEST, final.name + "\n")
                self._prune(final)
        except BaseException as exc:  # noqa: BLE001 - reported by wait()
            if self.ctx.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            with self._lock:
                self._error = self._error or exc

    def _prune(self, newest: Path) -> None:
        # sharded ones and single-file ones (cramkit.train.checkpoint) of earlier world sizes alike
        steps = [p for p in self.root.glob("step-*") if _STEP_RE.match(p.name) and p != newest]
        steps = [p for p in steps if is_sharded_checkpoint(p) or (p / "state.json").is_file()]
        complete = sorted(steps, key=lambda p: int(_STEP_RE.match(p.name).group(1)))
        for old in complete[: max(0, len(complete) - (self.keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)

    def _raise(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            if isinstance(error, CramkitError):
                raise error
            from cramkit.train.parallel import _is_comm_failure

            if self.ctx.distributed and _is_comm_failure(error):
                first = str(error).strip().splitlines()[0][:200]
                raise CramkitError(
                    f"rank {self.ctx.rank}/{self.ctx.world}: lost contact with the other ranks while writing a "
                    f"checkpoint ({first}); another process probably died or hung (see its log above). "
                    "Resume from the last complete checkpoint with `cramkit pretrain --resume RUN`"
                ) from None
            raise CramkitError(
                f"writing a checkpoint under {self.root} failed on rank {self.ctx.rank}: {error}; "
                "the previous checkpoint is intact (check free disk space and permissions)"
            ) from None

    def _barrier(self) -> None:
        if self.ctx.distributed:
            import torch.distributed as dist

            dist.barrier(group=self.pg)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp-write")
    _write_synced(tmp, text)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------
# loading


def load(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    ctx: DistContext | None = None,
    process_group: Any = None,
) -> dict[str, Any]:
    """Load a sharded checkpoint into ``model`` (plain, DDP or FSDP2) and ``optimizer`` in place,
    resharding to the current world size; returns the trainer state saved with it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = resolve_checkpoint(path)
    state = read_trainer_state(path)
    model_sd, optim_sd, _ = get_states(model, optimizer)
    state_dict = {"model": model_sd, "optim": optim_sd}
    try:
        dcp.load(
            state_dict, storage_reader=_reader(path), process_group=process_group, no_dist=not _dist_on()
        )
    except CramkitError:
        raise
    except (RuntimeError, ValueError, KeyError, OSError) as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise CramkitError(
            f"{path}: cannot load this checkpoint into the current model ({first}); it was written for a "
            "different model or optimizer configuration, or is corrupt"
        ) from None
    if optimizer is None:
        set_state_dict(
            model, [], model_state_dict=state_dict["model"], optim_state_dict={}, options=_options()
        )
    else:
        hparams = {k: _from_json(v) for k, v in state.get("optimizer_hparams", {}).items()}
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict={**state_dict["optim"], **hparams},
            options=_options(),
        )
    return state.get("trainer", {})


def load_full(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_sd: Mapping[str, torch.Tensor],
    optim_sd: Mapping[str, Any] | None,
) -> None:
    """Load full (unsharded) state, as ``torch.optim.Optimizer.state_dict()`` numbers it, into a model
    that is already sharded (FSDP2) or wrapped, and the optimizer built on it after sharding.

    Used to resume a single-process checkpoint on several processes. The optimizer's parameter numbers
    are matched to parameter names through the current optimizer's groups (same construction order).
    """
    from torch.distributed.checkpoint.state_dict import set_state_dict

    names: dict[int, str] = {}
    for name, param in unwrap_named_parameters(model):
        names.setdefault(id(param), name)
    full = dict(model_sd)
    for name, param in unwrap_named_parameters(model, remove_duplicate=False):  # tied weights: every name
        first = names[id(param)]
        if name not in full and first in full:
            full[name] = full[first]
    nested: dict[str, Any] = {}
    if optimizer is not None and optim_sd is not None:
        order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
        saved_groups = optim_sd["param_groups"]
        saved_ids = [int(pid) for g in saved_groups for pid in g["params"]]
        if len(saved_ids) != len(order) or len(saved_groups) != len(optimizer.param_groups):
            raise CramkitError(
                "the checkpoint's optimizer state does not fit this model; resume with its config"
            )
        index = dict(zip(saved_ids, order, strict=True))
        nested = {
            "state": {index[int(pid)]: dict(pstate) for pid, pstate in optim_sd["state"].items()},
            "param_groups": [
                {
                    **{k: v for k, v in g.items() if k != "params"},
                    "params": [index[int(i)] for i in g["params"]],
                }
                for g in saved_groups
            ],
        }
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    options = StateDictOptions(full_state_dict=True)
    set_state_dict(model, optimizer if optimizer is not None else [], model_state_dict=full,
                   optim_state_dict=nested, options=options)  # fmt: skip


def unwrap_named_parameters(
    model: nn.Module, remove_duplicate: bool = True
) -> list[tuple[str, nn.Parameter]]:
    from cramkit.train.parallel import unwrap

    return list(unwrap(model).named_parameters(remove_duplicate=remove_duplicate))


def _dist_on() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def load_model_state(checkpoint_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Full (unsharded) model weights of a sharded checkpoint, on CPU, in one process.

    ``checkpoint_dir`` may be a ``step-*`` directory, a ``checkpoints/`` folder or a run folder.
    Keys are the plain model's parameter names (tied weights appear under each of their names).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = resolve_checkpoint(checkpoint_dir)
    metadata = read_metadata(path)
    state: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata):
            state[key[len("model.") :]] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not state:
        raise CramkitError(
            f"{path}: the checkpoint holds no model weights; use a cramkit pretraining checkpoint"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"model": state}, storage_reader=_reader(path), no_dist=True)
    return state


def consolidate(checkpoint_dir: str | os.PathLike, out_file: str | os.PathLike) -> Path:
    """Write the full model weights of a sharded checkpoint to one ``model.safetensors`` file."""
    from safetensors.torch import save_file

    state = load_model_state(checkpoint_dir)
    # tied weights come back as separate tensors under each name, as safetensors wants them
    unique = {key: tensor.contiguous() for key, tensor in state.items()}
    out = Path(out_file)
    if out.is_dir() or out.suffix != ".safetensors":
        out = out / "model.safetensors"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    save_file(unique, str(tmp), metadata={"format": "pt", "source": str(resolve_checkpoint(checkpoint_dir))})
    os.replace(tmp, out)
    return out
