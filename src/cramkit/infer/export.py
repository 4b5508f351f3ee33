"""Exporting a model: a Hugging Face directory (``model.hf.export_hf``) or an ONNX Runtime one
(``infer.onnx.export_onnx``, checked against the torch model by the engine). ``cramkit.export`` and
``cramkit export`` both come here."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cramkit.errors import CramkitError
from cramkit.load import CT2_MANIFEST, ONNX_MANIFEST, LoadedModel, load, load_directory_architecture

FORMATS = ("hf", "onnx", "ct2")


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
) -> Exported:
    """Write ``model`` (anything ``cramkit.load`` takes, or a loaded model) to ``out`` as a Hugging Face
    directory (``format="hf"``), an ONNX Runtime one (``format="onnx"``, ``quantize="int8"`` for
    dynamic int8 weights) or a CTranslate2 one (``format="ct2"``, ``quantize``: float32 (default), int8,
    int8_float32 or bfloat16). ``out`` is replaced atomically; a non-empty ``out`` that is not a previous
    export is refused unless ``force``. task: the head to export of a model trained on a mixture."""
    if format not in FORMATS:
        raise CramkitError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if quantize and format == "hf":
        raise CramkitError("quantize int8 applies to the onnx format (int8, int8_float32, bfloat16: ct2)")
    if quantize and format == "onnx" and quantize != "int8":
        raise CramkitError(f"quantize {quantize} applies to the ct2 format; the onnx format takes int8")
    out = Path(out)
    if isinstance(model, LoadedModel) and step is not None:
        raise CramkitError("step applies to a run directory, not to a loaded model")
    from cramkit.io import check_out, disk_errors
    from cramkit.model.hf import EXPORT_MARKER

    marker = {"onnx": ONNX_MANIFEST, "ct2": CT2_MANIFEST}.get(format, EXPORT_MARKER)
    removed = check_out(out, inputs=[model], own=[marker], replace=True, force=force)
    if removed:
        shown = ", ".join(removed[:20]) + (f" and {len(removed) - 20} more" if len(removed) > 20 else "")
        print(f"cramkit: --force: {out} will be replaced; removing its {len(removed)} entries: {shown}",
              file=sys.stderr)  # fmt: skip
    from cramkit.load import for_task

    if not isinstance(model, LoadedModel) and load_directory_architecture(model) in ("prompt", "prefix"):
        raise CramkitError(
            f"{model} is a prompt or deep-prompt model (finetune --prompt / --method ptuning); exporting one is not "
            "supported yet: run it with cramkit predict, cramkit serve or cramkit.infer.Engine"
        )
    loaded = for_task(model if isinstance(model, LoadedModel) else load(model, step=step), task)
    if loaded.architecture in ("prompt", "prefix"):
        raise CramkitError(
            f"{loaded.source} is a prompt or deep-prompt model; exporting one is not supported yet: run it with "
            "cramkit predict, cramkit serve or cramkit.infer.Engine"
        )
    with disk_errors(out):
        if format == "onnx":
            return _export_onnx(loaded, out, quantize, force, progress)
        if format == "ct2":
            return _export_ct2(loaded, out, quantize, force, progress)
        return _export_hf(loaded, out, mlm_head, force)


def _export_onnx(
    loaded: LoadedModel, out: Path, quantize: str | None, force: bool, progress: bool
) -> Exported:
    try:
        from cramkit.infer.engine import compare_outputs
        from cramkit.infer.onnx import export_onnx
    except ImportError as exc:
        raise CramkitError(
            f"ONNX export needs onnx and onnxruntime ({exc}): pip install 'cramkit[onnx]'"
        ) from None
    done = export_onnx(loaded, out, quantize, force, compare=compare_outputs, progress=progress)
    what = f"ONNX{' int8' if quantize else ''}; cramkit serve {done} --backend onnx"
    return Exported(done, f"exported {loaded.source} -> {done} ({what})")


def _export_ct2(
    loaded: LoadedModel, out: Path, quantize: str | None, force: bool, progress: bool
) -> Exported:
    from cramkit.infer.ct2 import export_ct2
    from cramkit.infer.engine import compare_outputs

    done = export_ct2(loaded, out, quantize, force, compare=compare_outputs, progress=progress)
    what = f"CTranslate2 {quantize or 'float32'}; cramkit serve {done} --backend ct2"
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
        done = export_hf(loaded.model, loaded.config, out, tokenizer_dir=tok_dir, mlm_head=mlm_head, force=force,
                         labels=loaded.labels)  # fmt: skip
    fmt = json.loads((done / "cramkit_export.json").read_text(encoding="utf-8"))
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
