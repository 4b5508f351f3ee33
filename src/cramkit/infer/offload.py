"""A mixture-of-experts torch model's experts kept out of memory for inference (``Engine(...,
offload_experts=True)``, InfMoE): the routers pick, and only the picked experts are brought in; on a CPU read
from the model's safetensors file through a memory map (each parameter's key found and checked against the
loaded model), on CUDA copied from pinned host memory. The moving itself is ``cramkit.model.moe``'s."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError

if TYPE_CHECKING:
    from cramkit.backends import ExportedModel
    from cramkit.loading import LoadedModel


def check_expert_cache(value: Any, offload: bool = True) -> int:
    """``expert_cache`` as an int (None: 0), or one CramkitError line: a non-negative integer, with offloading."""
    if value is None:
        return 0
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CramkitError(
            f"--expert-cache {value!r}: give a non-negative integer, the experts kept resident per MoE layer "
            "(0: none, each pass reads the ones it needs)"
        )
    if not offload:
        raise CramkitError("--expert-cache applies with --offload-experts (it sizes the offloaded experts' cache)")
    return value


def offload_model(src: LoadedModel | ExportedModel, device: Any, cache: int) -> dict[str, Any]:
    """Move the MoE experts of ``src`` out of memory (:func:`cramkit.model.moe.offload_experts`); one line
    when the model has none or is an export, or when on a CPU its weights file cannot be found."""
    from cramkit.loading import LoadedModel
    from cramkit.model.moe import MoE, offload_experts
    from cramkit.runtime import resolve_device

    if not isinstance(src, LoadedModel):
        raise CramkitError(
            f"--offload-experts: {src.source} is an export in the {src.backend.title} format; offloading experts "
            "runs the torch model: give the model it was exported from"
        )
    names = [name for name, m in src.model.named_modules() if isinstance(m, MoE)]
    if not names:
        raise CramkitError(
            f"--offload-experts: {src.source} is a dense model (no mixture-of-experts layers); drop the flag, or "
            "give a model trained with --set model.moe_experts=E"
        )
    dev = resolve_device(device)
    file = keys = None
    if dev.type != "cuda":
        file = _weights_file(src)
        keys = _expert_keys(src, file, names)
    layers = offload_experts(src.model, device=dev, cache=cache, file=file, keys=keys)
    if dev.type != "cuda":
        _release_freed_memory()
    return {
        "layers": len(layers),
        "experts": layers[0].experts,
        "cache": cache,
        "from": str(file) if file is not None else "pinned host memory",
    }


def _weights_file(src: LoadedModel) -> Path:
    """The safetensors file ``src``'s weights were read from: a model directory's, or a run checkpoint's."""
    from cramkit import rundir

    file = src.weights_file
    run, checkpoint = src.extra.get("run"), src.extra.get("checkpoint")
    if file is None and isinstance(run, str) and isinstance(checkpoint, str):
        file = rundir.checkpoints_dir(Path(run)) / checkpoint / rundir.WEIGHTS_FILE
    if file is None or not Path(file).is_file():
        raise CramkitError(
            f"--offload-experts on a CPU reads the experts from the model's safetensors file, and {src.source} "
            "has none at hand; save the model first (cramkit.load(...).save(DIR)) and give DIR"
        )
    return Path(file)


def _expert_keys(src: LoadedModel, file: Path, names: list[str]) -> dict[str, str]:
    """Each MoE parameter's key in ``file`` (``encoder.layers.1.mlp.w_in``; a compiled or DDP run's prefixes
    ignored), its shape and first expert checked against the loaded model's."""
    import torch
    from safetensors import SafetensorError, safe_open

    from cramkit.model.moe import EXPERT_PARAMS

    keys: dict[str, str] = {}
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            stored = {k.replace("_orig_mod.", "").removeprefix("module."): k for k in f.keys()}  # noqa: SIM118
            for name in names:
                module = src.model.get_submodule(name)
                for p in EXPERT_PARAMS:
                    w = getattr(module, p)
                    if w is None:
                        continue
                    full = f"{name}.{p}"
                    tail = full[full.find("layers.") :] if "layers." in full else full
                    found = [k for n, k in stored.items() if n == full] or [
                        k for n, k in stored.items() if n.endswith("." + tail) or n == tail
                    ]
                    ok = len(found) == 1
                    if ok:
                        part = f.get_slice(found[0])
                        ok = tuple(part.get_shape()) == tuple(w.shape) and torch.equal(part[0], w[0].detach().cpu())
                    if not ok:
                        raise CramkitError(
                            f"--offload-experts: {file} does not hold the experts of {src.source} as loaded "
                            f"({full}); give the model as it was saved"
                        )
                    keys[full] = found[0]
    except (OSError, SafetensorError) as exc:
        raise CramkitError(f"--offload-experts: {file} cannot be read ({exc})") from None
    return keys


def _release_freed_memory() -> None:
    """Hand the freed experts' pages back to the system (glibc keeps freed heap memory otherwise)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass
