"""ONNX Runtime backend: export any loadable model to an ONNX directory, and load it for serving.

``cramkit export MODEL --format onnx [--quantize int8] --out DIR`` writes (through the shared template,
``cramkit.backends.write_export``)::

    DIR/model.onnx          the network (torch's ONNX exporter, dynamic batch and length), each block's
                            attention core written as ONNX Runtime's MultiHeadAttention, then its transformer
                            fusions (SkipLayerNorm, BiasGelu, ...) where they apply; int8: dynamic quantization
                            of the matrix multiplies (per-channel int8 weights at the range right for the CPU's
                            instruction set, activations quantised on the fly), every one unless the check
                            against torch refuses it (then the MLP down-projections stay fp32)
    DIR/head.onnx           masked-LM models only: the vocabulary head on [n, hidden] hidden states
    DIR/tokenizer/          the model's tokenizer (tokenizer.json, vocab.txt)
    DIR/cramkit-onnx.json   what it is (kind, labels, max_length, pooling, ...), the files' SHA-256, whether
                            the attention is fused (and why not), the fused and int8 operators the graph
                            holds, the int8 format and instruction set, and the export's check against the
                            torch model on real text; written last

The graph's inputs are ``input_ids``, ``attention_mask`` (int64, [batch, length]) and, for models with
token types, ``token_type_ids``; its outputs ``mean`` and ``cls`` (pooled last hidden states, [batch,
hidden]), ``logits`` ([batch, labels]) for classifiers and regressors ([pairs, 1] for a multiple-choice
model: one score per (context, choice) row; the engine regroups them per example), ``hidden`` ([batch, length, hidden])
for masked-LM models. A prompt model (finetune --prompt) gives ``logits`` as PromptClassifier does (the mean
over the template's masks of each label word's log-probability, the masked-LM head run at the masks only) and
its manifest records the template and label words (``prompt``), through which the engine encodes every input;
a deep-prompt model (finetune --method ptuning) is one standalone graph of its base encoder with each layer's
prefix keys and values baked in, giving ``logits`` only (the torch model's embeddings are its base's).
Loading (``cramkit.backends.open_export``) reads the manifest (JSON), checks
every file's SHA-256, and here refuses any tensor
stored as external data (a file ``location``: given a model as bytes, ONNX Runtime would resolve it against
the current working directory, so a crafted export could read e.g. ``.env`` and return it as scores), then
hands ONNX Runtime the model's bytes. An export written by cramkit keeps every tensor inside the file.

This module is the format (its manifest, the runtime session, the runner); the graph is written by
``onnx_graph.py`` (torch's exporter, the fused attention, ONNX Runtime's fusions) and made int8 by
``onnx_int8.py``.
"""

from __future__ import annotations

import itertools
import platform
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.backends.base import Backend, ExportedModel, ExportJob, Inputs, check_summary
from cramkit.backends.onnx_graph import attention_plan, fuse, graph_ops, head_export, torch_export
from cramkit.backends.onnx_int8 import ISA_FORMATS as ISA_FORMATS
from cramkit.backends.onnx_int8 import cpu_isa as cpu_isa
from cramkit.backends.onnx_int8 import quantize, quantize_checked
from cramkit.errors import CramkitError

FORMAT = "cramkit-onnx-1"
MANIFEST = "cramkit-onnx.json"


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torch

    return {
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
    }


# ------------------------------------------------------------------- loading: every tensor inside the file


def _graph_tensors(graph: Any) -> Iterator[Any]:
    """Every TensorProto of ``graph`` and of its subgraphs (initializers, sparse ones, node attributes)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    yield from _node_tensors(graph.node)


def _node_tensors(nodes: Any) -> Iterator[Any]:
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sparse in [attr.sparse_tensor, *attr.sparse_tensors]:
                yield from (sparse.values, sparse.indices)
            if attr.HasField("g"):
                yield from _graph_tensors(attr.g)
            for sub in attr.graphs:
                yield from _graph_tensors(sub)


def _check_tensors(file: Path, data: bytes) -> None:
    """A CramkitError when any tensor of the model (graph, subgraphs, functions) lives in an external file, or
    holds NaN or infinity (a weight table of a crafted or damaged export)."""
    try:
        import onnx
        from google.protobuf.message import DecodeError
    except ImportError as exc:
        raise CramkitError(f"loading an ONNX export needs onnx ({exc}): pip install 'cramkit[onnx]'") from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError as exc:
        raise CramkitError(f"{file} is not an ONNX model ({exc}); export the model again") from None
    tensors = itertools.chain(_graph_tensors(model.graph), *(_node_tensors(f.node) for f in model.functions))
    for t in tensors:
        if t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data):
            where = next((e.value for e in t.external_data if e.key == "location"), "?")
            raise CramkitError(
                f"{file}: tensor {t.name!r} keeps its data in an external file ({where!r}); cramkit exports "
                "hold every tensor inside the model, so this one was not written by cramkit. Refusing to load "
                "it: export the model again"
            )
        if t.data_type in _FLOAT_TYPES:
            _refuse_nonfinite(file, t)


# ONNX's floating-point element types (TensorProto.FLOAT, FLOAT16, DOUBLE, BFLOAT16)
_FLOAT_TYPES = (1, 10, 11, 16)


def _refuse_nonfinite(file: Path, tensor: Any) -> None:
    """One line naming the file and the tensor when a float tensor holds NaN or infinity (``weight_faults``)."""
    from onnx import numpy_helper

    from cramkit.backends.finite import bf16_faults, refuse_table, weight_faults

    if tensor.data_type == 16 and tensor.raw_data:  # bfloat16 as raw 16-bit words
        bad, size = bf16_faults(tensor.raw_data), len(tensor.raw_data) // 2
    else:
        values = numpy_helper.to_array(tensor)
        bad, size = weight_faults(values), int(values.size)
    refuse_table(file, tensor.name, bad, size)


# ---------------------------------------------------------------------------------------- the backend


class OnnxRunner:
    """Forward passes of an ONNX export on numpy batches."""

    name = "onnx"

    def __init__(self, model: ExportedModel) -> None:
        self.model = model
        self.main, self.head = model.handle
        self.input_names = [i.name for i in self.main.get_inputs()]
        self.precision = model.manifest.get("quantize") or "fp32"

    def _feed(self, x: Inputs) -> dict[str, np.ndarray]:
        ids = x["input_ids"]
        assert ids is not None
        mask = x["attention_mask"]
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids) if mask is None else mask}
        if "token_type_ids" in self.input_names:
            types = x["token_type_ids"]
            feed["token_type_ids"] = np.zeros_like(ids) if types is None else types
        return feed

    def pooled(self, x: Inputs) -> tuple[np.ndarray, np.ndarray]:
        mean, cls = self.main.run(["mean", "cls"], self._feed(x))
        return mean, cls

    def logits(self, x: Inputs) -> np.ndarray:
        return self.main.run(["logits"], self._feed(x))[0]

    def mask_topk(self, x: Inputs, where: np.ndarray, k: int) -> tuple[Any, Any]:
        if self.head is None:
            raise CramkitError(
                f"{self.model.path}: this export has no masked-LM head; fill [MASK]s with a masked-LM model"
            )
        hidden = self.main.run(["hidden"], self._feed(x))[0]
        logits = self.head.run(None, {"hidden": np.ascontiguousarray(hidden[where])})[0]
        z = np.exp(logits - logits.max(-1, keepdims=True))
        probs = z / z.sum(-1, keepdims=True)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        return np.take_along_axis(probs, top, -1), top


class OnnxBackend(Backend):
    """ONNX Runtime: any model cramkit loads (students included), fp32 or dynamic int8."""

    name = "onnx"
    title = "ONNX"
    marker = MANIFEST
    format = FORMAT
    quantize = (None, "int8")
    full_precision = (None,)
    tolerance = 1e-3
    required_files = ("model.onnx",)
    fields = {"quantize": ("int8",)}
    options = ("isa", "opset")
    extra = "onnx"
    prompts = True  # a prompt model's MLM scoring and a deep-prompt model's prefixes are part of the graph

    def available(self) -> None:
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            raise CramkitError(
                f"the ONNX format needs onnx and onnxruntime ({exc}): pip install 'cramkit[onnx]'"
            ) from None

    def write(self, job: ExportJob) -> None:
        from cramkit.io import disk_problem

        loaded, tmp = job.loaded, job.tmp
        opset = int(job.options.get("opset") or 18)
        isa = job.options.get("isa")
        if isa is not None and isa not in ISA_FORMATS:
            raise CramkitError(f"isa must be one of {', '.join(ISA_FORMATS)}, got {isa!r}")
        job.say(f"exporting {loaded.source} ({loaded.kind}) with torch.onnx (dynamo, opset {opset})")
        why_not = attention_plan(loaded)
        try:
            try:
                inputs, outputs = torch_export(loaded, tmp / "raw.onnx", opset, fused=why_not is None)
            except Exception as exc:  # the fused attention is an optimisation
                if why_not is not None or disk_problem(exc):
                    raise
                reason: BaseException = exc
                while reason.__cause__ is not None:  # the exporter wraps the reason in its own errors
                    reason = reason.__cause__
                why_not = f"the exporter failed with it ({type(reason).__name__}: {str(reason)[:200]})"
                inputs, outputs = torch_export(loaded, tmp / "raw.onnx", opset, fused=False)
            if loaded.kind == "mlm":
                head_export(loaded, tmp / "head.onnx", opset)
        except CramkitError:
            raise
        except Exception as exc:  # name the model and the exporter's reason
            if disk_problem(exc):
                raise
            raise CramkitError(
                f"{loaded.source}: torch's ONNX exporter failed ({type(exc).__name__}: {str(exc)[:300]}); "
                "export with --format hf instead, or report the model's architecture"
            ) from None
        if why_not is not None:
            job.say(f"attention not fused ({why_not}): the plain attention graph is kept")
        job.say("optimising the graph (ONNX Runtime's transformer fusions, where they apply)")
        fusions = fuse(tmp / "raw.onnx", tmp / "fused.onnx", loaded)
        if fusions.get("skipped"):
            job.say(f"no fusions applied ({fusions['skipped']}); the plain graph is kept")
        (tmp / "raw.onnx").unlink(missing_ok=True)
        job.files = ["model.onnx"] + (["head.onnx"] if loaded.kind == "mlm" else [])
        job.manifest.update(
            inputs=inputs,
            outputs=outputs,
            quantization=None,
            opset=opset,
            attention={"fused": why_not is None, **({"why_not": why_not} if why_not else {})},
            fusions=fusions,
        )

        def checked(keep_down: bool | None) -> dict[str, Any]:
            """model.onnx from fused.onnx (int8 unless keep_down is None), recorded, checked against torch."""
            if keep_down is None:
                shutil.copyfile(tmp / "fused.onnx", tmp / "model.onnx")
            else:
                assert isa is not None  # set (isa or cpu_isa()) before any int8 export
                job.manifest["quantization"] = quantize(tmp / "fused.onnx", tmp / "model.onnx", isa, keep_down)
            job.manifest["graph_ops"] = graph_ops(tmp / "model.onnx")
            return job.check()

        if job.quantize == "int8":
            isa = isa or cpu_isa()
            quantize_checked(job, isa, checked)
        else:
            checked(keep_down=None)
        (tmp / "fused.onnx").unlink()

    def open(self, path: Path, meta: dict[str, Any], files: dict[str, bytes], threads: int | None) -> Any:
        import onnxruntime as ort

        from cramkit.runtime import cpu_cores

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(threads or cpu_cores())
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3

        def session(name: str) -> Any:
            _check_tensors(path / name, files[name])
            try:
                return ort.InferenceSession(files[name], opts, providers=["CPUExecutionProvider"])
            except Exception as exc:  # a damaged or crafted model file
                raise CramkitError(
                    f"{path / name}: ONNX Runtime cannot load it ({str(exc)[:200]}); export the model again"
                ) from None

        main = session("model.onnx")
        head = session("head.onnx") if meta["kind"] == "mlm" and "head.onnx" in files else None
        names = [i.name for i in main.get_inputs()]
        if names[:2] != ["input_ids", "attention_mask"]:
            raise CramkitError(f"{path / 'model.onnx'}: inputs {names}, expected input_ids, attention_mask, ...")
        return main, head

    def runner(self, model: ExportedModel) -> OnnxRunner:
        return OnnxRunner(model)

    def check_model(self, model: ExportedModel) -> None:
        """One forward pass of a [1, max_length] batch of pad ids: the graph must take the manifest's longest
        input (its position table may be shorter than a crafted max_length) and give outputs of the
        manifest's sizes (as many logits as labels, ``hidden`` wide pooled vectors)."""
        import onnxruntime as ort

        file, marker = model.path / "model.onnx", model.path / MANIFEST
        n = model.max_length
        ids = np.full((1, n), model.pad_id, dtype=np.int64)
        runner = self.runner(model)
        x: Inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": None}
        names = [o.name for o in runner.main.get_outputs()]
        quiet = ort.RunOptions()
        quiet.log_severity_level = 4  # the failure is this check's one line, not ONNX Runtime's log
        try:
            got = dict(zip(names, runner.main.run(names, runner._feed(x), quiet), strict=True))
        except Exception as exc:  # ONNX Runtime's own errors: a graph that cannot take it
            raise CramkitError(
                f"{file} does not run on an input of max_length {n} tokens, the length {marker.name} allows "
                f"({str(exc).splitlines()[0][:160]}); the manifest's max_length is beyond the model's position "
                "table, or the file is damaged: export the model again"
            ) from None
        want: dict[str, list[int]] = {}
        if model.hidden is not None:
            want |= {"mean": [1, model.hidden], "cls": [1, model.hidden]}
        if model.kind in ("regression", "multiple_choice"):
            want["logits"] = [1, 1]
        elif model.kind in ("classifier", "multilabel") and model.labels:
            want["logits"] = [1, len(model.labels)]
        for name, shape in want.items():
            if name in got and list(np.shape(got[name])) != shape:
                raise CramkitError(
                    f"{marker}: model.onnx gives {name} of shape {list(np.shape(got[name]))} where the manifest "
                    f"says {shape} (its labels or hidden size do not match the graph); export the model again"
                )

    def versions(self) -> dict[str, str]:
        return _versions()

    def summary(self, manifest: dict[str, Any]) -> str:
        parts = check_summary(manifest["check"], ("cosine_mean_mean", "label_agreement", "fill_mask_top1_agreement"))
        attention = manifest["attention"]
        if not attention["fused"]:
            parts.append(f"attention not fused ({attention['why_not']})")
        parts.append("graph: " + ", ".join(f"{k} x{v}" for k, v in manifest["graph_ops"].items()))
        quant = manifest.get("quantization")
        if quant:
            parts.append(f"int8 for {quant['isa']} ({quant['why']}); fp32 kept: {quant['kept_fp32']}")
        return "; ".join(parts)
