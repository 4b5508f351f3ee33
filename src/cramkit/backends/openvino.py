"""OpenVINO backend: export a model to OpenVINO's IR (``model.xml`` + ``model.bin``) and run it on the CPU.

``cramkit export MODEL --format openvino [--quantize bf16] --out DIR`` writes (through the shared template,
``cramkit.backends.write_export``)::

    DIR/model.xml, DIR/model.bin
                            the network as OpenVINO's IR, converted straight from the torch module the ONNX
                            export traces (``onnx_graph``'s graph: the same inputs and outputs; attention as
                            OpenVINO's ScaledDotProductAttention), dynamic batch and length, fp32 weights
    DIR/tokenizer/          the model's tokenizer
    DIR/cramkit-openvino.json
                            what it is (kind, labels, max_length, pooling, ...), every file's SHA-256, the
                            precision it is compiled with, and the export's check against the torch model
                            on real text; written last

``--quantize`` is the precision OpenVINO computes in: none (f32, held to the torch model within 1e-3) or
``bf16`` (``INFERENCE_PRECISION_HINT``: the weights stay fp32 in the IR and the CPU plugin runs the matrix
products in bf16 on a CPU that has them, AMX or AVX512_BF16; elsewhere it runs f32, and the manifest and the
export's line say so). A bf16 export is kept when its check passes the bar int8 exports are held to (mean
cosine >= 0.995, at most 2% of the labels changed).

Which models: transformer encoders of every kind cramkit fine-tunes (a masked-LM model as its encoder: fill-mask
needs ``--format onnx``) and students (logits only); prompt and deep-prompt models are refused in one line
naming ``--format onnx``.

Runtime: one compiled model with as many streams as threads, one thread each, and one infer request per
stream: the Engine and the server's batcher run that many length-sorted passes side by side, as for
CTranslate2 (``Ct2Runner.workers``).

Loading (``cramkit.backends.open_export``) reads the manifest, checks every file's SHA-256, then here checks
the IR before OpenVINO sees it: ``model.xml`` no larger than :data:`MAX_XML_BYTES` (refused before it is
read), UTF-8, no document type declaration (no entity of any kind, external or internal), a ``<net>`` of IR
version 10 or 11 whose every constant lies inside ``model.bin`` and holds no NaN or infinity
(:func:`check_constants`); OpenVINO is then handed the two files' bytes (``Core.read_model(xml, weights)``)
and never opens a path.
"""

from __future__ import annotations

import dataclasses
import platform
import queue
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cramkit.backends.base import KINDS, Backend, ExportedModel, ExportJob, Inputs, check_summary
from cramkit.errors import CramkitError
from cramkit.runtime import PASS_TOKENS

if TYPE_CHECKING:
    from cramkit.model.loaded import LoadedModel

MANIFEST = "cramkit-openvino.json"
FORMAT = "cramkit-openvino-1"
FILES = ("model.xml", "model.bin")
# the largest model.xml a cramkit export may hold: a 24-layer encoder's is under 1 MB (the weights are in
# model.bin); a bigger one is refused before it is read
MAX_XML_BYTES = 32 << 20
# padded tokens per pass on a CPU, by the precision computed (runtime.PASS_TOKENS says why)
CPU_BATCH_TOKENS = PASS_TOKENS["openvino-f32"]
BF16_BATCH_TOKENS = PASS_TOKENS["openvino-bf16"]
# OpenVINO's name for the precision --quantize asks for
PRECISION_HINT = {None: "f32", "bf16": "bf16"}
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _openvino() -> Any:
    try:
        import openvino
    except ImportError as exc:
        raise CramkitError(
            f"the OpenVINO format needs openvino ({exc}); install cramkit's [openvino] extra: "
            "pip install 'cramkit[openvino]'"
        ) from None
    return openvino


def native_bf16() -> bool:
    """Whether OpenVINO's CPU plugin computes bf16 on this machine (else a bf16 hint runs f32)."""
    try:
        caps = _openvino().Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except CramkitError:
        raise
    except Exception:  # a plugin that cannot say: assume it does not
        return False
    return "BF16" in [str(c).upper() for c in caps]


# ------------------------------------------------------------------------- the IR, checked before use


def check_xml_size(root: Path) -> None:
    """Refuse a ``model.xml`` larger than :data:`MAX_XML_BYTES` before anything reads it."""
    file = root / "model.xml"
    try:
        size = file.lstat().st_size
    except OSError:
        return  # missing: the shared reader says so
    if size > MAX_XML_BYTES:
        raise CramkitError(
            f"{file} is {size:,} bytes, more than the {MAX_XML_BYTES >> 20} MiB an OpenVINO IR of an encoder "
            "takes (its weights live in model.bin); the file is damaged or crafted, export the model again"
        )


def check_ir(xml: bytes, weights: int, where: Path) -> tuple[str, dict[str, tuple[int, ...]]]:
    """The text of an IR ``model.xml`` that is safe to hand OpenVINO, and each constant's shape by name: UTF-8,
    no document type declaration (so no entity, external or internal, to resolve), a ``<net>`` of IR version 10
    or 11 whose every constant lies inside the ``weights`` bytes of model.bin. One CramkitError naming the
    file, else."""
    import xml.etree.ElementTree as ET

    fix = "the file is damaged or crafted, export the model again"
    if len(xml) > MAX_XML_BYTES:
        raise CramkitError(f"{where} is larger than {MAX_XML_BYTES >> 20} MiB; {fix}")
    try:
        text = xml.decode("utf-8")
    except UnicodeDecodeError:
        raise CramkitError(f"{where} is not UTF-8 text, so not an OpenVINO IR; {fix}") from None
    if re.search(r"<!\s*(DOCTYPE|ENTITY)", text, re.IGNORECASE):
        raise CramkitError(
            f"{where} declares a document type or entities, which an OpenVINO IR written by cramkit never does "
            f"(an entity may name a file outside the export); refusing to load it: {fix}"
        )
    try:
        net = ET.fromstring(text)
    except ET.ParseError as exc:
        raise CramkitError(f"{where} is not an OpenVINO IR (not XML: {exc}); {fix}") from None
    if net.tag != "net" or net.get("version") not in ("10", "11") or net.find("layers") is None:
        raise CramkitError(f"{where} is not an OpenVINO IR (a <net> of version 10 or 11 with <layers>); {fix}")
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in net.iter("layer"):
        data = layer.find("data")
        if layer.get("type") != "Const" or data is None or data.get("offset") is None:
            continue
        name = str(layer.get("name"))
        try:
            offset, size = int(data.get("offset", "")), int(data.get("size", ""))
            shape = tuple(int(d) for d in str(data.get("shape", "")).split(",") if d.strip())
        except ValueError:
            raise CramkitError(f"{where}: constant {name!r} has no integer offset, size and shape; {fix}") from None
        if offset < 0 or size < 0 or offset + size > weights:
            raise CramkitError(
                f"{where}: constant {name!r} reads bytes {offset}..{offset + size} of model.bin, which holds "
                f"{weights}; {fix}"
            )
        shapes[name] = shape
    return text, shapes


# the IR's floating-point element types and how their bytes read (bf16: raw 16-bit words, finite.bf16_faults)
FLOAT_CONSTANTS = {"f32": "<f4", "f16": "<f2", "f64": "<f8", "bf16": None}


def check_constants(text: str, weights: bytes, where: Path) -> None:
    """Refuse an IR whose floating-point constants (its weight tables, in model.bin) hold NaN or infinity, in one
    line naming the file and the constant; ``text`` is :func:`check_ir`'s (every constant inside ``weights``)."""
    import xml.etree.ElementTree as ET

    from cramkit.backends.finite import bf16_faults, refuse_table, weight_faults

    view = memoryview(weights)  # slices without copies
    for layer in ET.fromstring(text).iter("layer"):
        data = layer.find("data")
        kind = None if data is None else data.get("element_type")
        if layer.get("type") != "Const" or data is None or kind not in FLOAT_CONSTANTS:
            continue
        offset, size = int(data.get("offset", "0")), int(data.get("size", "0"))
        raw = view[offset : offset + size]
        dtype = FLOAT_CONSTANTS[kind]
        if dtype is None:
            raw = raw[: len(raw) // 2 * 2]
            bad, count = bf16_faults(raw), len(raw) // 2
        else:
            values = np.frombuffer(raw[: len(raw) // np.dtype(dtype).itemsize * np.dtype(dtype).itemsize], dtype)
            bad, count = weight_faults(values), values.size
        refuse_table(where.parent / "model.bin", str(layer.get("name")), bad, count)


def table_rows(shapes: dict[str, tuple[int, ...]], table: str) -> int | None:
    """The rows of the embedding table ``table`` (``word``, ``position``) among the IR's constants (its name ends
    in ``embeddings.TABLE.weight``), None when it has none (rotary positions, a student)."""
    rows = [shape[0] for name, shape in shapes.items() if name.endswith(f"embeddings.{table}.weight") and shape]
    return min(rows) if rows else None


# ---------------------------------------------------------------------------------------- the runner


def _type_name(t: Any) -> str:
    """An OpenVINO element type as its short name (f32, bf16)."""
    name = getattr(t, "to_string", None)
    return str(name() if callable(name) else t)


def _first_line(exc: BaseException) -> str:
    """The first non-empty line of an OpenVINO error that says what failed (its messages start with where)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith("Exception from")]
    return (said or lines or [type(exc).__name__])[0][:200]


class OpenVinoRunner:
    """Forward passes of an OpenVINO export on numpy batches, ``workers`` of them at once (one infer request
    per stream, one thread each)."""

    name = "openvino"

    def __init__(self, model: ExportedModel) -> None:
        self.model = model
        self.compiled, self.requests, _ = model.handle
        self.input_names = {p.get_any_name() for p in self.compiled.inputs}
        self.workers = self.requests.qsize()
        # what OpenVINO computes in here (a bf16 export on a CPU without bf16: f32)
        self.precision = _type_name(self.compiled.get_property("INFERENCE_PRECISION_HINT"))
        self.batch_tokens: int | None = BF16_BATCH_TOKENS if self.precision == "bf16" else CPU_BATCH_TOKENS

    def _feed(self, x: Inputs) -> dict[str, np.ndarray]:
        ids = x["input_ids"]
        assert ids is not None
        mask = x["attention_mask"]
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids) if mask is None else mask}
        if "token_type_ids" in self.input_names:
            types = x["token_type_ids"]
            feed["token_type_ids"] = np.zeros_like(ids) if types is None else types
        return feed

    def run(self, x: Inputs, names: tuple[str, ...]) -> list[np.ndarray]:
        """The outputs ``names`` of one pass, on a free infer request (one per stream)."""
        request = self.requests.get()
        try:
            out = request.infer(self._feed(x))  # copies the outputs: the request is reused at once
            return [np.asarray(out[name], dtype=np.float32) for name in names]
        finally:
            self.requests.put(request)

    def pooled(self, x: Inputs) -> tuple[np.ndarray, np.ndarray]:
        mean, cls = self.run(x, ("mean", "cls"))
        return mean, cls

    def logits(self, x: Inputs) -> np.ndarray:
        return self.run(x, ("logits",))[0]

    def mask_topk(self, x: Inputs, where: np.ndarray, k: int) -> tuple[Any, Any]:
        raise CramkitError(
            f"{self.model.path}: an OpenVINO export holds the encoder only; fill [MASK]s with the torch model or "
            "an ONNX export (cramkit export --format onnx)"
        )


# ---------------------------------------------------------------------------------------- the backend


def _convert(loaded: LoadedModel) -> tuple[Any, list[str], list[str]]:
    """``loaded`` as an OpenVINO model (the module ``onnx_graph`` exports, converted by OpenVINO's PyTorch
    frontend), with its input and output names."""
    import torch

    from cramkit.backends.onnx_graph import _export_module

    ov = _openvino()
    module, outputs = _export_module(loaded, fused=False)
    vocab = int(getattr(loaded.config, "vocab_size", 0) or loaded.tokenizer.get_vocab_size())
    ids = torch.randint(5, max(6, vocab), (3, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1, 11:] = 0  # padding in the example: the mask's path is traced
    example: tuple[Any, ...] = (ids, mask)
    if loaded.with_types:
        types = torch.zeros(3, 16, dtype=torch.long)
        types[2, 8:] = 1
        example = (*example, types)
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on constant branches (the position table's bound)
        model = ov.convert_model(module, example_input=example)
    for port, name in zip(model.outputs, outputs, strict=True):
        port.get_tensor().set_names({name})
    return model, list(INPUTS[: len(example)]), outputs


class OpenVinoBackend(Backend):
    """OpenVINO: transformer encoders and students, f32 or bf16 compute on the CPU."""

    name = "openvino"
    title = "OpenVINO"
    marker = MANIFEST
    format = FORMAT
    quantize = (None, "bf16")
    full_precision = (None,)
    tolerance = 1e-3
    exported_kinds = tuple(k for k in KINDS if k not in ("mlm", "multitask"))
    required_files = FILES
    fields = {"quantize": ("bf16",), "inputs": list, "outputs": list, "computed_in": ("f32", "bf16")}
    extra = "openvino"

    def available(self) -> None:
        _openvino()

    def exported_kind(self, loaded: LoadedModel) -> str:
        return "encoder" if loaded.kind == "mlm" else loaded.kind  # a masked-LM model as its encoder

    def write(self, job: ExportJob) -> None:
        from cramkit.backends.onnx_int8 import INT8_MAX_FLIPS, INT8_MIN_COSINE, _int8_cost, _int8_faithful
        from cramkit.io import disk_problem

        ov = _openvino()
        loaded = dataclasses.replace(job.loaded, kind=job.manifest["kind"])
        hint = PRECISION_HINT[job.quantize]
        job.say(f"converting {loaded.source} ({loaded.kind}) with OpenVINO's PyTorch frontend ({hint} compute)")
        try:
            model, inputs, outputs = _convert(loaded)
            ov.save_model(model, str(job.tmp / "model.xml"), compress_to_fp16=False)  # the weights stay fp32
        except CramkitError:
            raise
        except Exception as exc:  # name the model and the converter's reason
            if disk_problem(exc):
                raise
            raise CramkitError(
                f"{loaded.source}: OpenVINO's converter failed ({type(exc).__name__}: {str(exc)[:300]}); export "
                "it with --format onnx instead, or report the model's architecture"
            ) from None
        native = native_bf16()
        computed = "bf16" if hint == "bf16" and native else "f32"
        if hint == "bf16" and not native:
            job.say(
                "this CPU has no native bf16 (no amx_bf16 or avx512_bf16): OpenVINO runs the export in f32 here, "
                "so the check is at f32; on a CPU with bf16 it runs in bf16"
            )
        job.files = list(FILES)
        job.manifest.update(inputs=inputs, outputs=outputs, computed_in=computed)
        check = job.check()
        if job.quantize == "bf16" and not _int8_faithful(check):
            raise CramkitError(
                f"{loaded.source}: bf16 is too far from torch on this model ({_int8_cost(check)}; the bar: mean "
                f"cosine >= {INT8_MIN_COSINE} and at most {INT8_MAX_FLIPS:.0%} of the labels changed); export it "
                "without --quantize (f32)"
            )

    def validate(self, meta: dict[str, Any], file: Path) -> None:
        check_xml_size(file.parent)  # before the shared reader reads it
        inputs, outputs = meta.get("inputs") or [], meta.get("outputs") or []
        if inputs[:2] != ["input_ids", "attention_mask"] or not set(inputs) <= set(INPUTS):
            raise CramkitError(f"{file}: 'inputs' must be input_ids, attention_mask[, token_type_ids]")
        if not outputs or not set(outputs) <= {"mean", "cls", "logits"}:
            raise CramkitError(f"{file}: 'outputs' must name mean, cls and/or logits; export the model again")

    def open(self, path: Path, meta: dict[str, Any], files: dict[str, bytes], threads: int | None) -> Any:
        from cramkit.runtime import cpu_cores

        ov = _openvino()
        weights = files["model.bin"]
        text, shapes = check_ir(files["model.xml"], len(weights), path / "model.xml")
        check_constants(text, weights, path / "model.xml")
        # OpenVINO gathers an id past a table's end as zeros: a max_length beyond the position table would give
        # wrong vectors, not an error, so it is refused here (and the tokenizer against the word table on load)
        positions = table_rows(shapes, "position")
        if positions is not None and positions < meta["max_length"]:
            raise CramkitError(
                f"{path / MANIFEST}: max_length {meta['max_length']} is beyond the model's {positions} positions "
                "(model.xml); the manifest is damaged or crafted, export the model again"
            )
        workers = int(threads or cpu_cores())
        config = {
            "INFERENCE_PRECISION_HINT": PRECISION_HINT[meta.get("quantize")],
            "NUM_STREAMS": workers,  # passes side by side ...
            "INFERENCE_NUM_THREADS": workers,  # ... one thread each
            "PERFORMANCE_HINT": "LATENCY",
        }
        try:
            core = ov.Core()
            model = core.read_model(text, ov.Tensor(np.frombuffer(weights, dtype=np.uint8)))
            compiled = core.compile_model(model, "CPU", config)
        except Exception as exc:  # a damaged or crafted IR
            raise CramkitError(
                f"{path / 'model.xml'}: OpenVINO cannot load it ({_first_line(exc)}); export the model again"
            ) from None
        names = {p.get_any_name() for p in compiled.inputs}
        if names != set(meta["inputs"]):
            raise CramkitError(
                f"{path / 'model.xml'}: inputs {sorted(names)}, the manifest says {meta['inputs']}; export it again"
            )
        got = {n for p in compiled.outputs for n in p.get_names()}
        if not set(meta["outputs"]) <= got:
            raise CramkitError(
                f"{path / 'model.xml'}: outputs {sorted(got)}, the manifest says {meta['outputs']}; export it again"
            )
        requests: queue.Queue[Any] = queue.Queue()
        for _ in range(workers):
            requests.put(compiled.create_infer_request())
        return compiled, requests, table_rows(shapes, "word")

    def runner(self, model: ExportedModel) -> OpenVinoRunner:
        return OpenVinoRunner(model)

    def check_model(self, model: ExportedModel) -> None:
        """One forward pass of a [1, max_length] batch of pad ids: the IR must take the manifest's longest input
        and give outputs of the manifest's sizes (as many logits as labels, ``hidden`` wide pooled vectors)."""
        file, marker = model.path / "model.xml", model.path / MANIFEST
        rows, vocab = model.handle[2], model.tokenizer.get_vocab_size()
        if rows is not None and rows < vocab:
            raise CramkitError(
                f"{file}: the word table has {rows} rows, the tokenizer {vocab} ids (OpenVINO would read the ids past "
                "the table as zeros); the export is damaged or crafted, export the model again"
            )
        n = model.max_length
        ids = np.full((1, n), model.pad_id, dtype=np.int64)
        runner = self.runner(model)
        names = tuple(model.manifest["outputs"])
        try:
            got = dict(
                zip(
                    names,
                    runner.run({"input_ids": ids, "attention_mask": None, "token_type_ids": None}, names),
                    strict=True,
                )
            )
        except Exception as exc:  # OpenVINO's own errors: an IR that cannot take it
            raise CramkitError(
                f"{file} does not run on an input of max_length {n} tokens, the length {marker.name} allows "
                f"({_first_line(exc)}); the "
                "manifest's max_length is beyond the model's position table, or the file is damaged: export the "
                "model again"
            ) from None
        want: dict[str, list[int]] = {}
        if model.hidden is not None:
            want |= {"mean": [1, model.hidden], "cls": [1, model.hidden]}
        if model.kind in ("regression", "multiple_choice"):
            want["logits"] = [1, 1]
        elif model.kind in ("classifier", "multilabel") and model.labels:
            want["logits"] = [1, len(model.labels)]
        for name, shape in want.items():
            if name in got and list(got[name].shape) != shape:
                raise CramkitError(
                    f"{marker}: model.xml gives {name} of shape {list(got[name].shape)} where the manifest says "
                    f"{shape} (its labels or hidden size do not match the IR); export the model again"
                )

    def versions(self) -> dict[str, str]:
        import torch

        return {"openvino": _openvino().__version__, "torch": torch.__version__, "python": platform.python_version()}

    def summary(self, manifest: dict[str, Any]) -> str:
        parts = check_summary(manifest["check"], ("cosine_mean_mean", "cosine_mean_min", "label_agreement"))
        if manifest.get("quantize") == "bf16" and manifest.get("computed_in") != "bf16":
            parts.append("bf16 asked, checked in f32 (this CPU has no native bf16; a CPU with it runs bf16)")
        return "; ".join(parts)
