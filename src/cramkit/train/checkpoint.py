"""Checkpoints: the one module that writes ``RUN/checkpoints/`` (its read side: ``cramkit.rundir``).

One format for every world size::

    RUN/checkpoints/step-000120/
        __0_0.distcp ...    model and optimizer tensors, each rank's shards (torch.distributed.checkpoint)
        metadata.json       DCP's index of those shards, as JSON (never a pickle)
        model.safetensors   the full model weights, readable without torch.distributed
        state.json          trainer state, optimizer hyper-parameters, SHA-256 of every file; written last
    RUN/checkpoints/step-000240.tmp/   being written (or killed mid-write): never read
    RUN/checkpoints/latest             names the newest complete checkpoint, replaced atomically

Saving (:class:`Checkpointer`, called by every rank): the state is copied to host memory (overlapping the
next forward/backward), then written in a background thread; rank 0 then merges the model's shards into
``model.safetensors``, hashes every file into ``state.json`` and renames ``.tmp`` to its final name. A crash
at any moment leaves the previous checkpoint as the latest; a failed write (a full disk) removes its
temporary directory and says so in one line.

Loading (:func:`load`) reshards: a checkpoint written by N processes resumes on M. Checksums are verified
first, so flipped bytes are an error, never a silent resume. Nothing here unpickles: DCP's metadata is
JSON that we parse into DCP's own classes, an entry of DCP's "bytes" kind (which DCP would ``torch.load``
without ``weights_only``) is refused, shard file names must lie inside the checkpoint directory, and
tensor shards are read by DCP with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import re
import shutil
import threading
import warnings
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from cramkit.errors import CramkitError
from cramkit.io import BadJson, json_loads, json_text, sha256_file, write_text_atomic

# the read side of the format (cramkit.rundir), under its old names too
from cramkit.rundir import (  # noqa: F401
    FORMAT,
    LATEST,
    META_FILE,
    STATE_FILE,
    WEIGHTS_FILE,
    checkpoints_dir,
    find_latest,
    is_complete,
    is_run_dir,
    list_checkpoints,
    model_weights,
    read_state,
    require_run_dir,
    resolve_checkpoint,
    step_dir_name,
    verify,
)

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
from cramkit.rundir import inside_checkpoint as _inside
from cramkit.train.distributed import DistContext

# a single-process save/load is what we mean when no process group exists: not worth a warning each time
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

META_FORMAT = "cramkit-dcp-metadata-1"

# ---------------------------------------------------------------------------------------------------
# DCP metadata as JSON (DCP's own FileSystemWriter/Reader pickle it)


def _metadata_to_json(metadata: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    tensors = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, BytesStorageMetadata) or not isinstance(md, TensorStorageMetadata):
            raise CramkitError(f"cannot checkpoint {fqn}: only tensors go into shards (the rest is JSON)")
        tensors[fqn] = {
            "dtype": str(md.properties.dtype).removeprefix("torch."),
            "size": list(md.size),
            "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in md.chunks],
        }
    storage = []
    for index, info in (metadata.storage_data or {}).items():
        if info.transform_descriptors:
            raise CramkitError(f"cannot checkpoint {index.fqn}: storage transforms are not supported")
        storage.append(
            {
                "fqn": index.fqn,
                "offset": list(index.offset) if index.offset is not None else None,
                "index": index.index,
                "file": info.relative_path,
                "start": int(info.offset),
                "length": int(info.length),
            }
        )
    planner = metadata.planner_data
    planner = {k: list(v) for k, v in planner.items()} if isinstance(planner, Mapping) else None
    return {
        "format": META_FORMAT,
        "version": metadata.version,
        "tensors": tensors,
        "storage": storage,
        "planner": planner,
    }


def _metadata_from_json(data: Any, where: Path) -> Any:
    """DCP Metadata from our JSON, checked field by field (names, dtypes, shapes, file names)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    def ints(value: Any) -> list[int]:
        if not isinstance(value, list) or not all(isinstance(v, int) and v >= 0 for v in value):
            raise ValueError(f"expected a list of non-negative integers, got {value!r}")
        return value

    try:
        if not isinstance(data, dict) or data.get("format") != META_FORMAT:
            raise ValueError(f"format {data.get('format') if isinstance(data, dict) else None!r}")
        sd_meta: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
        for fqn, md in data["tensors"].items():
            dtype = getattr(torch, str(md["dtype"]), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"{fqn}: unknown dtype {md['dtype']!r}")
            chunks = [
                ChunkStorageMetadata(offsets=torch.Size(ints(c["offsets"])), sizes=torch.Size(ints(c["sizes"])))
                for c in md["chunks"]
            ]
            sd_meta[str(fqn)] = TensorStorageMetadata(
                properties=TensorProperties(dtype=dtype), size=torch.Size(ints(md["size"])), chunks=chunks
            )
        storage = {}
        for e in data["storage"]:
            if e["fqn"] not in sd_meta:
                raise ValueError(f"storage entry for unknown tensor {e['fqn']!r}")
            _inside(where, e["file"])
            offset = ints(e["offset"]) if e["offset"] is not None else None
            index = e["index"] if isinstance(e["index"], int) else None
            storage[MetadataIndex(str(e["fqn"]), offset, index)] = _StorageInfo(
                relative_path=e["file"], offset=int(e["start"]), length=int(e["length"])
            )
        planner = data.get("planner")
        if planner is not None:
            planner = {str(k): tuple(v) for k, v in planner.items()}
        return Metadata(
            state_dict_metadata=sd_meta,
            planner_data=planner,
            storage_data=storage,
            version=data.get("version"),
        )
    except CramkitError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CramkitError(
            f"{where / META_FILE} is not a valid cramkit checkpoint index ({exc}); the checkpoint is damaged or "
            "was not written by cramkit. Resume from another checkpoint"
        ) from None


def _writer(path: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter

    class JsonMetadataWriter(FileSystemWriter):
        """DCP's file-system writer, with its index written as JSON instead of a pickle."""

        def finish(self, metadata: Any, results: list[list[Any]]) -> None:
            storage = {}
            for result in results:
                storage.update({wr.index: wr.storage_data for wr in result})
            metadata.storage_data = storage
            write_text_atomic(Path(self.path) / META_FILE, json.dumps(_metadata_to_json(metadata)))

    return JsonMetadataWriter(str(path), single_file_per_rank=True, sync_files=True)


def _reader(path: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.planner import LoadItemType

    class JsonMetadataReader(FileSystemReader):
        """DCP's file-system reader over our JSON index; "bytes" entries (torch.load of anything) refused."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            file = Path(self.path) / META_FILE
            try:
                data = json_loads(json_text(file))
            except FileNotFoundError:
                raise CramkitError(f"{file} is missing; the checkpoint is incomplete; resume from another") from None
            except (UnicodeDecodeError, BadJson) as exc:
                raise CramkitError(f"{file} is corrupt ({exc}); resume from another checkpoint") from None
            metadata = _metadata_from_json(data, Path(self.path))
            metadata.storage_meta = StorageMeta(load_id=self.load_id)
            return metadata

        def read_data(self, plan: Any, planner: Any) -> Any:
            if any(item.type == LoadItemType.BYTE_IO for item in plan.items):
                raise CramkitError(f"{self.path}: refusing a checkpoint entry of DCP's pickled 'bytes' kind")
            return super().read_data(plan, planner)

    return JsonMetadataReader(str(path))


# ---------------------------------------------------------------------------------------------------
# state dicts: tensors (sharded) and JSON (the rest)


def _options(full: bool = False) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full, flatten_optimizer_state_dict=True)


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
    tensors = {k: v for k, v in optim_sd.items() if isinstance(v, torch.Tensor)}
    hparams = {k: _jsonable(v, k) for k, v in optim_sd.items() if not isinstance(v, torch.Tensor)}
    return model_sd, tensors, hparams


def _whole(state: dict[str, Any], *, empty: bool = False) -> dict[str, Any]:
    """``state`` with each tensor-parallel weight split per part (``tensor_parallel.split_per_part``: the fused
    Q/K/V and GLU projections) as one whole tensor: DCP writes a rank's part of a tensor as one block,
    but such a rank holds several (its rows of Q, of K and of V). Gathered (or, with ``empty``, allocated
    for loading into); every other tensor is left as it is."""
    from cramkit.train.tensor_parallel import split_per_part

    def whole(v: Any) -> Any:
        if not split_per_part(v):
            return v
        return torch.empty(v.shape, dtype=v.dtype, device=v.to_local().device) if empty else v.full_tensor()

    return {k: whole(v) for k, v in state.items()}


def _resplit(loaded: dict[str, Any], like: dict[str, Any]) -> dict[str, Any]:
    """Loaded whole tensors split again as the tensors of ``like`` (the inverse of :func:`_whole`)."""
    from torch.distributed.tensor import distribute_tensor

    from cramkit.train.tensor_parallel import split_per_part

    return {
        k: distribute_tensor(v, like[k].device_mesh, like[k].placements) if split_per_part(like[k]) else v
        for k, v in loaded.items()
    }


def tied_aliases(model: nn.Module) -> list[str]:
    """Parameter names that repeat an earlier parameter (tied weights): stored once in model.safetensors."""
    from cramkit.train.distributed import unwrap

    seen: set[int] = set()
    aliases = []
    for name, param in unwrap(model).named_parameters(remove_duplicate=False):
        if id(param) in seen:
            aliases.append(name)
        seen.add(id(param))
    return aliases


# ---------------------------------------------------------------------------------------------------
# saving


class Checkpointer:
    """Writes the checkpoints of one run (every rank calls every method, in the same order)."""

    def __init__(
        self,
        run: str | os.PathLike,
        ctx: DistContext,
        keep: int = 3,
        async_save: bool = True,
        overlap_staging: bool = True,
    ) -> None:
        """``async_save``: write in a background thread. ``overlap_staging``: copy the state to host
        memory in the background too; the caller must then call :meth:`before_update` before anything
        modifies parameters or optimizer state (the optimizer step)."""
        self.run = Path(run)
        self.root = checkpoints_dir(run)
        self.ctx, self.keep, self.async_save = ctx, max(1, keep), async_save
        self._future: Future | None = None
        self._staging: Future | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._stager = None
        self._umask = os.umask(0)  # read once, here: os.umask is process-wide and not thread-safe
        os.umask(self._umask)
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

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        trainer_state: Mapping[str, Any] | None = None,
        *,
        block: bool = False,
        tied: list[str] | None = None,
    ) -> Path:
        """Checkpoint ``step``; returns once the state is copied to host memory (or written, if ``block``
        or async saving is off). The directory becomes visible when everything in it is down."""
        import torch.distributed.checkpoint as dcp

        self.wait()  # one write in flight at a time
        name = step_dir_name(step)
        tmp, final = self.root / f"{name}.tmp", self.root / name
        model_sd, optim_sd, hparams = get_states(model, optimizer)
        state = {
            "format": FORMAT,
            "step": step,
            "world": self.ctx.world,
            "optimizer_hparams": hparams,
            # (a pipeline stage holds part of the model: the caller names the whole model's tied aliases)
            "tied": tied_aliases(model) if tied is None else tied,
            "trainer": dict(trainer_state or {}),
        }
        try:  # on every rank, so that all of them stop here alike
            json.dumps(state)
        except (TypeError, ValueError) as exc:
            raise CramkitError(f"trainer state of step {step} is not JSON-serializable: {exc}") from None
        if self.ctx.is_main:
            try:
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir(parents=True)
            except OSError as exc:
                raise self._write_error(exc) from None
        self._barrier()
        state_dict = {"model": _whole(model_sd), "optim": _whole(optim_sd)}
        kwargs = dict(storage_writer=_writer(tmp), process_group=self.pg, no_dist=not self.ctx.distributed)
        if self.async_save and not block:
            response = dcp.async_save(state_dict, async_stager=self._stager, **kwargs)
            # with overlapped staging an AsyncSaveResponse: (host copy done, write done)
            upload = cast(Future, getattr(response, "upload_completion", response))
            self._staging = getattr(response, "staging_completion", None)
            finished: Future = Future()  # written AND (on rank 0) completed, renamed, pointed to
            self._future = finished

            def finish(f: Future) -> None:
                self._done(f, tmp, final, state)
                finished.set_result(None)

            upload.add_done_callback(finish)
        else:
            done: Future = Future()
            try:
                dcp.save(state_dict, **kwargs)
                done.set_result(None)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # reported by _raise (CheckpointException is one)
                done.set_exception(exc)
            self._done(done, tmp, final, state)
            self._raise()
            self._barrier()  # a blocking save returns on every rank once the checkpoint is complete
        return final

    def before_update(self) -> None:
        """Block until the state being checkpointed is copied to host memory (overlapped staging)."""
        staging, self._staging = self._staging, None
        if staging is not None:
            try:
                staging.result()
            except Exception as exc:  # reported with the fix
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
    def _done(self, future: Future, tmp: Path, final: Path, state: dict[str, Any]) -> None:
        """After this rank's write: rank 0 (whose write ends only once every rank's shards and the index
        are down) merges the model weights, hashes every file, writes state.json, renames, points ``latest``."""
        try:
            future.result()
            if self.ctx.is_main:
                from safetensors.torch import save_file

                weights = {k: v.contiguous() for k, v in load_model_state(tmp, check=False).items()}
                for alias in state["tied"]:
                    weights.pop(alias, None)
                save_file(weights, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "step": str(state["step"])})
                files = [p for p in sorted(tmp.iterdir()) if p.is_file()]
                for p in files:  # safetensors and DCP create files 0600: follow the umask like any file
                    os.chmod(p, 0o666 & ~self._umask)
                sums = {p.name: sha256_file(p) for p in files}
                _write_synced(tmp / STATE_FILE, json.dumps({**state, "sha256": sums}, indent=1))
                if final.exists():
                    shutil.rmtree(final)
                os.replace(tmp, final)
                _fsync_dir(self.root)
                write_text_atomic(self.root / LATEST, final.name + "\n")
                _fsync_dir(self.root)
                self._prune(final)
        except BaseException as exc:  # reported by wait()
            if self.ctx.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            with self._lock:
                self._error = self._error or exc

    def _prune(self, newest: Path) -> None:
        complete = [p for p in list_checkpoints(self.run) if p != newest]
        for old in complete[: max(0, len(complete) - (self.keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)

    def _write_error(self, exc: BaseException) -> CramkitError:
        from cramkit.io import disk_problem

        prev = find_latest(self.run)
        kept = f"the previous checkpoint {prev.name} is intact" if prev else "no earlier checkpoint exists"
        # torch.distributed.checkpoint wraps each rank's error in a CheckpointException (``failures``)
        failures = getattr(exc, "failures", None)
        causes = [f[0] if isinstance(f, tuple) else f for f in failures.values()] if isinstance(failures, dict) else []
        problem = next((p for p in map(disk_problem, [exc, *causes]) if p), None)
        if problem:
            reason = f"the disk is full or not writable ({problem})"
        else:
            first = next((c for c in causes if isinstance(c, BaseException)), exc)
            reason = getattr(first, "strerror", None) or f"{type(first).__name__}: {str(first).splitlines()[0][:200]}"
        then = f"continue with `cramkit pretrain --resume {self.run}`" if prev else "run the same command again"
        return CramkitError(
            f"could not write a checkpoint under {self.root}: {reason}; the partial checkpoint was removed and "
            f"{kept}. Free space (or fix the problem), then {then}"
        )

    def _raise(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is None:
            return
        if isinstance(error, CramkitError):
            raise error
        from cramkit.train.distributed import _is_comm_failure

        if self.ctx.distributed and _is_comm_failure(error):
            first = str(error).strip().splitlines()[0][:200]
            raise CramkitError(
                f"rank {self.ctx.rank}/{self.ctx.world}: lost contact with the other ranks while writing a "
                f"checkpoint ({first}); another process probably died or hung (see its log above). "
                "Resume from the last complete checkpoint with `cramkit pretrain --resume RUN`"
            ) from None
        # a full disk shows up as OSError, SafetensorError or DCP's wrapped CheckpointException alike
        text = str(error)
        if "No space left" in text or (isinstance(error, OSError) and error.errno == errno.ENOSPC):
            error = OSError(errno.ENOSPC, "No space left on device")
        raise self._write_error(error) from None

    def _barrier(self) -> None:
        if self.ctx.distributed:
            import torch.distributed as dist

            dist.barrier(group=self.pg)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


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


def _reason(exc: BaseException) -> str:
    """One line for an error; for DCP's CheckpointException (a traceback per rank) its underlying error."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^\w*(Error|Exception): ", ln)]
    return (errors[-1] if errors else lines[0] if lines else type(exc).__name__)[:300]


def _dist_on() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def load(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    process_group: Any = None,
) -> dict[str, Any]:
    """Load a checkpoint into ``model`` (plain, DDP or FSDP2) and ``optimizer`` in place, resharding to
    the current world size, after checking every file's checksum; returns the trainer state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = resolve_checkpoint(path)
    state = verify(path)
    model_sd, optim_sd, current = get_states(model, optimizer)
    state_dict = {"model": _whole(model_sd, empty=True), "optim": _whole(optim_sd, empty=True)}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(state_dict, storage_reader=_reader(path), process_group=process_group, no_dist=not _dist_on())
    except (CramkitError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        first = _reason(exc)
        raise CramkitError(
            f"{path}: cannot load this checkpoint into the current model ({first}); it was written for a "
            "different model or optimizer configuration (was config.yaml edited?). Resume with the run's own "
            "config, or start a new run"
        ) from None
    state_dict = {
        "model": _resplit(state_dict["model"], model_sd),
        "optim": _resplit(state_dict["optim"], optim_sd),
    }
    if optimizer is None:
        set_state_dict(model, [], model_state_dict=state_dict["model"], optim_state_dict={}, options=_options())
    else:
        # a group's settings are keyed by its first parameter's name, which depends on the layout (a pipeline
        # stage's first parameter, a tensor-parallel model's order): the saved ones where this layout names the
        # same group, this optimizer's own otherwise (the learning rate is set again at every step)
        saved = state.get("optimizer_hparams")
        saved = saved if isinstance(saved, dict) else {}
        hparams = {k: _from_json(saved.get(k, v)) for k, v in current.items()}
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict={**state_dict["optim"], **hparams},
            options=_options(),
        )
    return state.get("trainer", {})


def load_model_state(checkpoint: str | os.PathLike, *, check: bool = True) -> dict[str, torch.Tensor]:
    """Full model weights of a checkpoint's shards, on CPU, in one process (tied weights under each name).

    ``checkpoint`` may be a ``step-*`` directory, a ``checkpoints/`` folder or a run folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = Path(checkpoint) if not check else resolve_checkpoint(checkpoint)
    if check:
        verify(path, [META_FILE, *_shard_files(path)])
    metadata = _reader(path).read_metadata()
    state: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata):
            state[key[len("model.") :]] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not state:
        raise CramkitError(f"{path}: the checkpoint holds no model weights; use a cramkit pretraining checkpoint")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"model": state}, storage_reader=_reader(path), no_dist=True)
    return state


def _shard_files(path: Path) -> list[str]:
    sums = read_state(path).get("sha256") or {}
    return [n for n in sums if n.endswith(".distcp")]


def consolidate(checkpoint: str | os.PathLike, out_file: str | os.PathLike) -> Path:
    """Copy a checkpoint's full model weights to ``out_file`` (or ``out_file/model.safetensors``)."""
    path = resolve_checkpoint(checkpoint)
    verify(path, [WEIGHTS_FILE])
    out = Path(out_file)
    if out.is_dir() or out.suffix != ".safetensors":
        out = out / WEIGHTS_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.copyfile(path / WEIGHTS_FILE, tmp)
    os.replace(tmp, out)
    return out


# ---------------------------------------------------------------------------------------------------
# RNG state as JSON


def encode_rng() -> dict[str, Any]:
    """Torch RNG states (CPU and CUDA) as base64 strings."""
    import base64

    out: dict[str, Any] = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(rng: dict[str, Any]) -> None:
    import base64

    def tensor(b64: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.uint8)

    torch.set_rng_state(tensor(rng["torch"]))
    if "cuda" in rng and torch.cuda.is_available():
        states = [tensor(s) for s in rng["cuda"]]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
