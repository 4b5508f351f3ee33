"""Export formats and the inference backends that run them, behind one seam.

A *backend* is one export format and the runtime that runs it: ``onnx`` (ONNX Runtime, ``backends/onnx.py``),
``ct2`` (CTranslate2, ``backends/ct2.py``) and ``openvino`` (OpenVINO, ``backends/openvino.py``) are built
in. Everything the formats share lives here, once:

- :func:`write_export`, the one export template: the output check (a non-empty ``out`` that is not a
  previous export is refused unless ``force``), the atomic directory, the tokenizer, the manifest's shared
  fields and every file's SHA-256, the check against the torch model on real text, the tolerance, and the
  manifest written last (its presence means the directory is complete). A format writes its own files
  (:meth:`Backend.write`) and nothing else.
- :func:`open_export`, the one reader: the manifest (JSON, its fields' types), every listed file read as
  bytes from inside the directory (no link, no separator in its name) and checked against its SHA-256, the
  tokenizer from inside the directory; the format turns the bytes into a runtime (:meth:`Backend.open`)
  and never opens a path of its own.
- :class:`ExportedModel`: what ``cramkit.load`` returns for an export directory; ``Engine`` runs it
  through ``model.runner()`` like a torch model, with no branch on the backend.

A new format is one module with a :class:`Backend` subclass, registered by :func:`register` or, from an
installed package, by an entry point in the group ``cramkit.backends`` (``name = "module:Class"``).
Directory kinds come from the registry: ``cramkit.load`` recognises a format's directory by its marker
file (``Backend.marker``). Only installed code is ever run: nothing in a directory names a module.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.backends.base import KINDS as KINDS
from cramkit.backends.base import LOGIT_KINDS as LOGIT_KINDS
from cramkit.backends.base import Backend as Backend
from cramkit.backends.base import ExportedModel as ExportedModel
from cramkit.backends.base import ExportJob as ExportJob
from cramkit.backends.base import Runner as Runner
from cramkit.backends.base import check_texts as check_texts
from cramkit.backends.base import open_dir, read_manifest
from cramkit.errors import CramkitError

if TYPE_CHECKING:
    from cramkit.model.loaded import LoadedModel

ENTRY_POINT_GROUP = "cramkit.backends"
# the architectures only a format with ``Backend.prompts`` holds, and why another cannot
PROMPT_ARCHITECTURES = {
    "prompt": "a prompt model scores its label words with the masked-LM head at the template's [MASK]s",
    "prefix": "a deep-prompt model has per-layer prefix keys and values",
}


# --------------------------------------------------------------------------------------------- registry

_REGISTRY: dict[str, Backend] = {}
_DISCOVERED = False


def register(backend: Backend | type[Backend]) -> Backend:
    """Add a format (a :class:`Backend` or its class) to the registry; returns the instance."""
    inst = backend() if isinstance(backend, type) else backend
    if not inst.name or not inst.marker or not inst.format:
        raise CramkitError(f"{type(inst).__name__}: a backend needs a name, a marker file and a format")
    if inst.name in ("auto", "torch", "hf"):
        raise CramkitError(f"{type(inst).__name__}: the backend name {inst.name!r} is cramkit's own")
    other = _REGISTRY.get(inst.name)
    if other is not None and type(other) is not type(inst):
        raise CramkitError(f"two backends are named {inst.name!r}: {type(other).__name__}, {type(inst).__name__}")
    _REGISTRY[inst.name] = inst
    return inst


def _discover() -> None:
    """The built-in formats, then those installed packages declare (entry point group ``cramkit.backends``)."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    from cramkit.backends.ct2 import Ct2Backend
    from cramkit.backends.onnx import OnnxBackend
    from cramkit.backends.openvino import OpenVinoBackend

    register(OnnxBackend)
    register(Ct2Backend)
    register(OpenVinoBackend)
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            register(ep.load())
        except Exception as exc:  # a broken plugin must not take cramkit down
            print(
                f"cramkit: the export format {ep.name!r} ({ep.value}) could not be loaded: {exc}",
                file=sys.stderr,
            )


def backends() -> dict[str, Backend]:
    """name -> backend, every registered format."""
    _discover()
    return dict(_REGISTRY)


def names() -> tuple[str, ...]:
    return tuple(backends())


def get(name: str) -> Backend:
    found = backends().get(name)
    if found is None:
        raise CramkitError(f"unknown export format or backend {name!r}; use one of {', '.join(names())}")
    return found


def markers() -> tuple[tuple[str, str], ...]:
    """(kind, marker file) of every format: the export rows of ``cramkit.load``'s table of directory kinds."""
    return tuple((b.name, b.marker) for b in backends().values())


def export_markers() -> tuple[str, ...]:
    """The manifest file of every export format: the Hugging Face export's and each backend's (what ``--force``
    may replace, the files it lists only: ``cramkit.io.check_out``'s ``kin``)."""
    return ("cramkit_export.json", *(marker for _, marker in markers()))  # (model.hf.EXPORT_MARKER)


def check_architecture(backend: Backend, architecture: str, source: str) -> None:
    """One line naming --format onnx when ``backend`` cannot hold a model of ``architecture`` (a prompt or a
    deep-prompt model, for a format without :attr:`Backend.prompts`)."""
    why = PROMPT_ARCHITECTURES.get(architecture)
    if why is not None and not backend.prompts:
        raise CramkitError(
            f"{source}: the {backend.title} format cannot hold this model ({why}); export it with --format onnx"
        )


def write_export(
    backend: Backend | str,
    loaded: LoadedModel,
    out: str | os.PathLike,
    quantize: str | None = None,
    force: bool = False,
    *,
    compare: Callable[[Any, Any, list[Any]], dict[str, Any]],
    texts: list[Any] | None = None,
    progress: bool = True,
    race: dict[str, Any] | None = None,
    **options: Any,
) -> Path:
    """Export ``loaded`` to ``out`` in ``backend``'s format (atomically) and check it against the torch model.

    quantize: one of the format's ``quantize`` values (default its first). compare: the check
    (``cramkit.infer.engine.compare_outputs``). texts: its inputs (default: real text, :func:`check_texts`).
    options: the format's own (``Backend.options``; ONNX: ``isa``, ``opset``). A non-empty ``out`` that is
    not a previous export of this format is refused unless ``force``. race: how ``export --target`` chose this
    format (``cramkit.infer.race``), kept in the manifest as ``race``."""
    from cramkit.io import atomic_path, check_out, listing, write_json_atomic
    from cramkit.text.tokenizer import save_tokenizer

    b = get(backend) if isinstance(backend, str) else backend
    quantize = b.check_quantize(quantize)
    unknown = sorted(set(options) - set(b.options))
    if unknown:
        raise CramkitError(
            f"the {b.name} format takes no option {', '.join(unknown)} (it takes: {', '.join(b.options) or 'none'})"
        )
    check_architecture(b, loaded.architecture, loaded.source)
    why = b.incompatibilities(loaded)
    if why:
        raise CramkitError(
            f"{loaded.source}: the {b.title} format cannot hold this model ({'; '.join(why)}); "
            "export it with --format onnx instead"
        )
    b.available()
    out = Path(out)
    kin = export_markers()
    check_out(out, inputs=[loaded], own=[b.marker], replace=True, force=force, kin=kin)
    start = time.perf_counter()
    loaded.model.to("cpu").eval()
    texts = list(texts or check_texts())
    if loaded.kind in LOGIT_KINDS and loaded.with_types:
        texts = [*texts, *[(texts[i], texts[i + 1]) for i in range(0, min(len(texts) - 1, 32), 2)]]
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        manifest: dict[str, Any] = {
            "format": b.format,
            "kind": b.exported_kind(loaded),
            "exported_from_kind": loaded.kind,
            "labels": loaded.labels,
            "task": loaded.task,
            "columns": loaded.extra.get("columns"),  # what it was fine-tuned on: predict's default columns
            "trained_inputs": loaded.extra.get("trained_inputs"),  # single texts, pairs or choices
            "matryoshka": loaded.extra.get("matryoshka"),  # the leading dimensions a vector may be cut to
            "prompts": loaded.extra.get("prompts"),  # an embedding model's named prompts ("query: ")
            "default_prompt_name": loaded.extra.get("default_prompt_name"),
            # a prompt model's template and label words: the export's inputs are read through them
            "prompt": loaded.prompt.meta() if loaded.prompt is not None else None,
            # a deep-prompt model's base (source, checksum, prefix length), baked into the export
            "base": loaded.extra.get("base") if loaded.architecture == "prefix" else None,
            "max_length": int(loaded.max_length),
            "pooling": loaded.pooling,
            "normalize": bool(loaded.normalize),
            "with_types": bool(loaded.with_types),
            "pad_id": int(loaded.pad_id),
            "hidden": getattr(loaded.config, "hidden", None),
            "architecture": loaded.architecture,
            "source": str(loaded.source),
            "quantize": quantize,
            "tokenizer": "tokenizer",
            "versions": b.versions(),
        }
        if race is not None:
            manifest["race"] = race
        job = ExportJob(loaded, tmp, quantize, texts, manifest, b, compare, progress, options)
        save_tokenizer(loaded.tokenizer, tmp / "tokenizer")
        b.write(job)
        check = job.checked if job.checked is not None else job.check()
        name, worst = check["worst_output"], check["worst_relative_diff"]
        if quantize in b.full_precision and b.tolerance is not None and worst > b.tolerance:
            raise CramkitError(
                f"{loaded.source}: the {b.title} export differs from the torch model by {worst:.2e} (relative, "
                f"output {name}) on real text, more than {b.tolerance:g}; the export is not kept. Export it "
                "with another --format, and report the model's architecture"
            )
        manifest["check"] = check
        manifest["seconds"] = round(time.perf_counter() - start, 1)
        manifest["entries"] = sorted([*listing(tmp), b.marker])  # what a later export replaces: this, no more
        check_out(out, inputs=[loaded], own=[b.marker], replace=True, force=force, kin=kin)  # (added meanwhile?)
        write_json_atomic(tmp / b.marker, manifest)
    job.say(f"done in {time.perf_counter() - start:.1f}s: {b.summary(manifest)}")
    return out


def kind_of(path: str | os.PathLike) -> str | None:
    """The format of the export directory ``path`` (its marker file), None when it is not one."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return None
    for name, marker in markers():
        if (p / marker).is_file():
            return name
    return None


def open_export(path: str | os.PathLike, *, threads: int | None = None) -> ExportedModel:
    """Open the export directory ``path`` with its format's backend (threads: the runtime's CPU threads,
    default every core this process may use)."""
    p = Path(path).expanduser()
    name = kind_of(p)
    if name is None:
        raise CramkitError(f"{path}: not an export directory (none of {', '.join(m for _, m in markers())})")
    b = get(name)
    return open_dir(p, read_manifest(p, b), b, threads)
