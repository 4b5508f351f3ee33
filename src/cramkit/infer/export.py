"""Exporting a model: a Hugging Face directory (``model.hf.export_hf``) or any export format of
``cramkit.infer.backends`` (ONNX Runtime, CTranslate2, a registered one), written by the one template
``backends.write_export`` and checked against the torch model by the engine. ``cramkit.export`` and
``cramkit export`` both come here."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cramkit.errors import CramkitError
from cramkit.infer import backends
from cramkit.io import read_json
from cramkit.load import LoadedModel, load_directory_architecture, load_torch


def formats() -> tuple[str, ...]:
    """hf, then every registered export format (onnx, ct2, ...)."""
    return ("hf", *backends.names())


@dataclass
class Exported:
    path: Path
    summary: str  # one line: what was written and how to load it


def export(
    model: str | os.PathLike | LoadedModel,
    out: str | os.PathLike,
    *,
    format: str = "hf",
    quantize: str | None = None,
    step: int | None = None,
    mlm_head: bool = True,
    force: bool = False,
    progress: bool = True,
    task: str | None = None,
    **options: Any,
) -> Exported:
    """Write ``model`` (anything ``cramkit.load`` takes but an export, or a loaded model) to ``out`` as a
    Hugging Face directory (``format="hf"``) or in an export format: ``onnx`` for ONNX Runtime
    (``quantize="int8"`` for dynamic int8 weights), ``ct2`` for CTranslate2 (``quantize``: float32 (default),
    int8, int8_float32 or bfloat16), or any registered format. ``out`` is replaced atomically; a non-empty
    ``out`` that is not a previous export is refused unless ``force``. task: the head to export of a model
    trained on a mixture. options: the format's own (ONNX: ``isa``, ``opset``)."""
    known = formats()
    if format not in known:
        raise CramkitError(f"format must be one of {', '.join(known)}, got {format!r}")
    backend = backends.get(format) if format != "hf" else None
    if backend is None and (quantize or options):
        raise CramkitError(
            "the hf format takes no quantize or options; quantize applies to "
            + ", ".join(f"{b.name} ({'/'.join(q for q in b.quantize if q)})" for b in backends.backends().values())
        )
    if backend is not None:
        backend.check_quantize(quantize)  # before the model is read
    out = Path(out)
    if isinstance(model, LoadedModel) and step is not None:
        raise CramkitError("step applies to a run directory, not to a loaded model")
    from cramkit.io import check_out, disk_errors
    from cramkit.model.hf import EXPORT_MARKER

    marker = backend.marker if backend is not None else EXPORT_MARKER
    removed = check_out(out, inputs=[model], own=[marker], replace=True, force=force)
    if removed:
        shown = ", ".join(removed[:20]) + (f" and {len(removed) - 20} more" if len(removed) > 20 else "")
        print(
            f"cramkit: --force: {out} will be replaced; removing its {len(removed)} entries: {shown}",
            file=sys.stderr,
        )
    from cramkit.load import for_task

    if not isinstance(model, LoadedModel) and load_directory_architecture(model) in ("prompt", "prefix"):
        raise CramkitError(
            f"{model} is a prompt or deep-prompt model (finetune --prompt / --method ptuning); exporting one is not "
            "supported yet: run it with cramkit predict, cramkit serve or cramkit.infer.Engine"
        )
    loaded = for_task(model if isinstance(model, LoadedModel) else load_torch(model, step=step, purpose="export"), task)
    if loaded.architecture in ("prompt", "prefix"):
        raise CramkitError(
            f"{loaded.source} is a prompt or deep-prompt model; exporting one is not supported yet: run it with "
            "cramkit predict, cramkit serve or cramkit.infer.Engine"
        )
    with disk_errors(out):
        if backend is None:
            return _export_hf(loaded, out, mlm_head, force)
        from cramkit.infer.engine import compare_outputs

        done = backends.write_export(
            backend, loaded, out, quantize, force, compare=compare_outputs, progress=progress, **options
        )
        precision = quantize or backend.quantize[0] or "fp32"
        what = f"{backend.title} {precision}; cramkit serve {done}"
        return Exported(done, f"exported {loaded.source} -> {done} ({what})")


def _export_hf(loaded: LoadedModel, out: Path, mlm_head: bool, force: bool) -> Exported:
    if loaded.encoder is None:
        raise CramkitError(
            f"{loaded.source}: a {loaded.architecture} model has no Hugging Face equivalent; use the onnx format"
        )
    from cramkit.model.hf import export_hf
    from cramkit.text.tokenizer import save_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = save_tokenizer(loaded.tokenizer, Path(tmp) / "tokenizer")
        done = export_hf(
            loaded.model,
            loaded.config,
            out,
            tokenizer_dir=tok_dir,
            mlm_head=mlm_head,
            force=force,
            labels=loaded.labels,
        )
    fmt = read_json(done / "cramkit_export.json", "export the model again")
    arch = fmt["architecture"]
    if "Classification" in arch:
        auto = "AutoModelForSequenceClassification"
    elif arch.endswith("ForMultipleChoice"):
        auto = "AutoModelForMultipleChoice"
    elif arch.endswith("ForMaskedLM"):
        auto = "AutoModelForMaskedLM"
    else:
        auto = "AutoModel"
    how = f"transformers.{auto}.from_pretrained(DIR)"
    if fmt["format"] == "cramkit":  # transformers' AutoTokenizer would prompt for the remote-code config
        how = (
            f"transformers.{auto}.from_pretrained(DIR, trust_remote_code=True); its tokenizer (plain BERT): "
            "BertTokenizerFast.from_pretrained(DIR)"
        )
    which = f" ({loaded.extra['checkpoint']})" if loaded.extra.get("checkpoint") else ""
    return Exported(done, f"exported {loaded.source}{which} -> {done} ({arch}; load with {how})")
