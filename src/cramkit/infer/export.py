"""Exporting a model: a Hugging Face directory (``model.hf.export_hf``) or any export format of
``cramkit.backends`` (ONNX Runtime, CTranslate2, a registered one), written by the one template
``backends.write_export`` and checked against the torch model by the engine. ``cramkit.export`` and
``cramkit export`` both come here."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from cramkit import backends
from cramkit.errors import CramkitError
from cramkit.infer.requests import ExportRequest
from cramkit.io import read_json
from cramkit.loading import LoadedModel, describe, load_torch
from cramkit.model.pooling import POOLINGS
from cramkit.request import verb


def cpu_target(serving: bool = False) -> tuple[str, str | None, str]:
    """The export format and quantization that run fastest on this machine's CPU, from its flags
    (``cramkit.runtime.cpu_flags``), and why in words. For batch work: OpenVINO bf16 where the CPU computes bf16
    natively (AMX, AVX512_BF16; on a 2-core AMX Xeon 1.1-1.3x the CTranslate2 int8 Engine at one thread, 1.0-1.3x
    at two, vectors at cosine 1.000 to fp32 where int8's are 0.997), otherwise CTranslate2 int8 (the fastest path
    on a plain AVX2 CPU). For serving (``serving``): CTranslate2 int8 on every CPU (on the AMX Xeon `cramkit
    serve` of OpenVINO bf16 was 0.62-0.88x CTranslate2 int8's sentences/s at one sentence a request, round by
    round, a tie at 16: a server's passes hold a few requests, each of another shape, and OpenVINO pays for every
    change of shape; bench/RESULTS.md, "Serving on an AMX Xeon"). Each falls back to what is installed."""
    import importlib.util

    from cramkit.runtime import cpu_bf16, cpu_flags

    def installed(module: str) -> bool:
        return importlib.util.find_spec(module) is not None

    native = cpu_bf16()
    if native is not None and installed("openvino") and not serving:
        return "openvino", "bf16", f"this CPU computes bf16 natively ({native}): OpenVINO with bf16 compute"
    if serving:
        why = "for serving many small requests"
    elif native is None:
        isas = [f for f in ("avx512_vnni", "avx_vnni", "avx512f", "avx2") if f in cpu_flags()]
        why = f"this CPU has no native bf16 ({', '.join(isas) or 'not even AVX2'})"
    else:
        why = f"this CPU computes bf16 ({native}) but OpenVINO is not installed (pip install 'cramkit[openvino]')"
    if installed("ctranslate2"):
        return (
            "ct2",
            "int8",
            f"{why}: CTranslate2 int8, the fastest path measured "
            + ("for a server on every CPU" if serving else "without OpenVINO bf16"),
        )
    return "onnx", "int8", f"{why}, without CTranslate2 (pip install 'cramkit[ct2]'): ONNX Runtime int8"


@dataclass
class Exported:
    path: Path
    summary: str  # one line: what was written and how to load it


@verb(ExportRequest, rest="options")
def export(request: ExportRequest) -> Exported:
    """Write ``model`` (anything ``cramkit.load`` takes but an export, or a loaded model) to ``out`` as a
    Hugging Face directory (``format="hf"``) or in an export format: ``onnx`` for ONNX Runtime
    (``quantize="int8"`` for dynamic int8 weights), ``ct2`` for CTranslate2 (``quantize``: float32 (default),
    int8, int8_float32 or bfloat16), or any registered format; returns the directory and the line
    ``cramkit export`` prints. Takes an :class:`~cramkit.infer.requests.ExportRequest` or its fields. ``out`` is
    replaced atomically when it holds a previous export of this format (``force``: of another format) and
    nothing its manifest does not list; any other non-empty ``out`` is refused (``force`` never deletes what an
    export did not write). task: the head to export of a model trained on a mixture. base: of a deep-prompt
    directory (finetune --method ptuning), the base model it was trained on; the ONNX export holds both (it runs
    without the base). A prompt model (finetune --prompt) exports to ONNX with its template (the export reads
    inputs through it) or to a Hugging Face BertForMaskedLM with the template recorded. target: ``cpu`` picks the
    format and quantization that run fastest on this machine's CPU for batch work, ``cpu-serve`` for a server,
    by racing the installed formats here (``cramkit.infer.race``; ``format`` and ``quantize`` are then left
    unset). race: True races again (a cached race of this kind of model on this CPU is not reused), False takes
    the CPU flags' rule (:func:`cpu_target`) without racing; default: ``$CRAMKIT_RACE`` (1 or 0), else a
    matching cached race or a new one. Other keywords are the format's own options (ONNX: ``isa``, ``opset``)."""
    request.check()
    if request.target is not None:
        return _export_to(request, *_target(request))
    return _export_to(request, request.format, request.quantize)


@verb(ExportRequest, rest="options")
def export_dir(request: ExportRequest) -> Path:
    """``cramkit.export``: :func:`export`, returning the directory written."""
    return export(request).path


def check_target_out(out: str | os.PathLike, model: Any) -> None:
    """The rule for ``--out`` of an export by ``--target``, before the race (the format is not known yet: an export
    of any format there may be replaced, nothing else): one CramkitError line naming the fix."""
    from cramkit.io import check_out

    markers = backends.export_markers()
    check_out(out, inputs=[model], own=list(markers), replace=True, force=True, kin=markers)


def _target(r: ExportRequest) -> tuple[str, str | None, dict[str, Any], LoadedModel]:
    """The format and quantization the request's target picks for its model: by a race on this machine
    (``cramkit.infer.race``), or, where none can run, by the CPU flags' rule (:func:`cpu_target`), said in one
    line; the record kept in the manifest, and the model, read once."""
    from cramkit.infer import race as racing
    from cramkit.loading import for_task

    racing.wanted(r.race)  # a bad CRAMKIT_RACE: one line, before the model is read
    check_target_out(r.out, r.model)
    loaded = (
        r.model if isinstance(r.model, LoadedModel) else load_torch(r.model, step=r.step, purpose="export", base=r.base)
    )
    loaded = for_task(loaded, r.task)
    try:
        fmt, q, record = racing.pick(loaded, cast(str, r.target), r.race)
        return fmt, q, record, loaded
    except racing.NoRace as exc:
        fmt, q, why = cpu_target(serving=r.target == "cpu-serve")
        line = f"cramkit: --target {r.target}: --format {fmt} --quantize {q or 'none'}: {why}"
        forced = str(exc) in ("--no-race", f"{racing.RACE_ENV}=0")
        print(line if forced else f"{line} (the CPU flags' rule: not raced, {exc})", file=sys.stderr)
        return fmt, q, {"target": r.target, "raced": False, "why_not": str(exc), "rule": why}, loaded


def _export_to(
    r: ExportRequest,
    format: str,
    quantize: str | None,
    record: dict[str, Any] | None = None,
    loaded: LoadedModel | None = None,
) -> Exported:
    """The export of the request's model (``loaded``: read already, for its task) in ``format``."""
    backend = backends.get(format) if format != "hf" else None
    out = Path(r.out)
    model = loaded if loaded is not None else r.model
    # what the format cannot hold is refused before the model (and a deep-prompt model's base) is read
    name, arch = (
        (model.source, model.architecture)
        if isinstance(model, LoadedModel)
        else (str(model), describe(model).architecture)
    )
    if backend is None and arch == "prefix":
        raise CramkitError(
            f"{name} is a deep-prompt model (finetune --method ptuning): Hugging Face BERT has no per-layer "
            "prefix keys and values; export it with --format onnx --base BASE (a standalone graph)"
        )
    if backend is not None and arch is not None:
        backends.check_architecture(backend, arch, name)
    from cramkit.io import check_out, disk_errors
    from cramkit.model.hf import EXPORT_MARKER

    marker = backend.marker if backend is not None else EXPORT_MARKER
    removed = check_out(out, inputs=[model], own=[marker], replace=True, force=r.force, kin=backends.export_markers())
    if removed:  # another format's export, every entry of it listed by its manifest
        shown = ", ".join(removed[:20]) + (f" and {len(removed) - 20} more" if len(removed) > 20 else "")
        print(
            f"cramkit: --force: {out} holds an export of another format; replacing its {len(removed)} entries: {shown}",
            file=sys.stderr,
        )
    if loaded is None:
        from cramkit.loading import for_task

        torch_model = (
            model if isinstance(model, LoadedModel) else load_torch(model, step=r.step, purpose="export", base=r.base)
        )
        loaded = for_task(torch_model, r.task)
    experts = getattr(loaded.config, "moe_experts", 0)
    if experts and (backend is None or backend.name != "onnx"):
        raise CramkitError(
            f"{loaded.source} is a mixture of experts (model.moe_experts={experts}): the "
            f"{backend.title if backend is not None else 'Hugging Face BERT'} format cannot express its routed "
            "experts; export it with --format onnx (every expert computed, E times the MLP's work) or use it "
            "through cramkit.load, predict, embed or serve (PyTorch)"
        )
    with disk_errors(out):
        if backend is None:
            return _export_hf(loaded, out, r.mlm_head, r.force)
        from cramkit.infer.engine import compare_outputs

        done = backends.write_export(
            backend,
            loaded,
            out,
            quantize,
            r.force,
            compare=compare_outputs,
            progress=r.progress,
            race=record,
            **r.options,
        )
        precision = quantize or backend.quantize[0] or "fp32"
        what = f"{backend.title} {precision}; cramkit serve {done}"
        if loaded.prompt is not None:
            what += f"; inputs are read through its template {loaded.prompt.template!r}"
        elif loaded.architecture == "prefix":
            what += "; the base model and the deep prompts in one graph: it runs without --base"
        return Exported(done, f"exported {loaded.source} -> {done} ({what})")


def _sentence_transformers(loaded: LoadedModel) -> dict[str, Any] | None:
    """An embedding model's (kind ``encoder``: the contrastive stage's, a sentence-transformers model's)
    pooling, normalisation, length limit, Matryoshka dimensions and named prompts: its HF export is a
    sentence-transformers folder too."""
    if loaded.kind != "encoder" or loaded.pooling not in POOLINGS:
        return None
    st: dict[str, Any] = {
        "pooling": loaded.pooling,
        "normalize": bool(loaded.normalize),
        "max_length": int(loaded.max_length),
    }
    if loaded.extra.get("matryoshka"):
        st["matryoshka"] = loaded.extra["matryoshka"]
    if loaded.extra.get("prompts"):  # config_sentence_transformers.json: encode(x, prompt_name=...)
        st["prompts"] = dict(loaded.extra["prompts"])
        st["default_prompt_name"] = loaded.extra.get("default_prompt_name")
    return st


def _export_hf(loaded: LoadedModel, out: Path, mlm_head: bool, force: bool) -> Exported:
    if loaded.encoder is None:
        raise CramkitError(
            f"{loaded.source}: a {loaded.architecture} model has no Hugging Face equivalent; use the onnx format"
        )
    prompt = loaded.prompt
    if prompt is not None and not mlm_head:
        raise CramkitError(
            f"{loaded.source} is a prompt model: its classifier is its masked-LM head; drop --no-mlm-head "
            "(or export the encoder of the run it was fine-tuned from)"
        )
    from cramkit.backends import export_markers
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
            prompt=prompt.meta() if prompt is not None else None,
            sentence_transformers=_sentence_transformers(loaded),
            kin=export_markers(),
            pooler_state=loaded.pooler_state,
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
    if prompt is not None:
        words = ", ".join(f"{label}={word}" for label, word in prompt.label_words.items())
        how += (
            f"; a prompt model: transformers users must apply the template themselves ({prompt.template!r}, then "
            f"read the label words {words} at the mask; recorded in cramkit_export.json), or export it with "
            "--format onnx to get labels"
        )
    if fmt.get("sentence_transformers"):
        trust = ", trust_remote_code=True" if fmt["format"] == "cramkit" else ""
        how += f"; or sentence_transformers.SentenceTransformer(DIR{trust})"
    return Exported(done, f"exported {loaded.source}{which} -> {done} ({arch}; load with {how})")
