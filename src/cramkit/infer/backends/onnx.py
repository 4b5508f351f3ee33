"""ONNX Runtime backend: export any loadable model to an ONNX directory, and load it for serving.

``cramkit export MODEL --format onnx [--quantize int8] --out DIR`` writes (through the shared template,
``cramkit.infer.backends.write_export``)::

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
Loading (``cramkit.infer.backends.open_export``) reads the manifest (JSON), checks
every file's SHA-256, and here refuses any tensor
stored as external data (a file ``location``: given a model as bytes, ONNX Runtime would resolve it against
the current working directory, so a crafted export could read e.g. ``.env`` and return it as scores), then
hands ONNX Runtime the model's bytes. An export written by cramkit keeps every tensor inside the file.
"""

from __future__ import annotations

import copy
import functools
import itertools
import os
import platform
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from cramkit.errors import CramkitError
from cramkit.infer.backends.base import LOGIT_KINDS, Backend, ExportedModel, ExportJob, Inputs, check_summary

if TYPE_CHECKING:
    from cramkit.model.encoder import Encoder
    from cramkit.model.loaded import LoadedModel

FORMAT = "cramkit-onnx-1"
MANIFEST = "cramkit-onnx.json"


# ------------------------------------------------------------------------------------------- export


def attention_plan(loaded: LoadedModel) -> str | None:
    """None when every block's attention core can be exported as ONNX Runtime's fused
    ``MultiHeadAttention`` operator (com.microsoft: scaled dot-product attention over the unpadded keys; the
    projections, the rotary embedding where there is one, and the norms around it stay as they are), else
    why not (the export keeps the plain graph of matrix multiplies and a softmax)."""
    if loaded.encoder is None:
        return f"a {loaded.architecture} model: exported as its own graph"
    return None


@functools.cache
def _attention_op() -> tuple[Any, Any]:
    """``cramkit::attention(q, k, v [B, L, hidden], mask [B, L] int32, heads)``: a torch operator (scaled
    dot-product attention over the unmasked keys, what the exporter traces) and its ONNX translation, ONNX
    Runtime's contrib ``MultiHeadAttention`` (onnx has no schema for it: one is declared here)."""
    import onnx
    import torch
    import torch.nn.functional as F
    from onnxscript.values import Op, Opset

    @torch.library.custom_op(
        "cramkit::attention",
        mutates_args=(),  # the schema is spelled out: this module's annotations are strings
        schema="(Tensor q, Tensor k, Tensor v, Tensor mask, int heads) -> Tensor",
    )
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, heads: int) -> Any:
        batch, length, hidden = q.shape  # keys and values may be longer: deep prompts' prefixes in front
        q, k, v = (t.view(batch, t.shape[1], heads, hidden // heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.bool()[:, None, None, :])
        return y.transpose(1, 2).reshape(batch, length, hidden)

    @attention.register_fake
    def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, heads: int) -> Any:
        return torch.empty_like(q)

    arg = onnx.defs.OpSchema.FormalParameter
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    schema = onnx.defs.OpSchema(
        "MultiHeadAttention",
        "com.microsoft",
        1,
        inputs=[
            arg("query", "T"),
            arg("key", "T"),
            arg("value", "T"),
            arg("bias", "T", param_option=optional),
            arg("key_padding_mask", "M", param_option=optional),
        ],
        outputs=[arg("output", "T")],
        type_constraints=[("T", ["tensor(float)"], ""), ("M", ["tensor(int32)"], "")],
        attributes=[onnx.defs.OpSchema.Attribute("num_heads", onnx.defs.OpSchema.AttrType.INT, "")],
    )
    fused = Op(Opset("com.microsoft", 1), "MultiHeadAttention", schema)

    def translate(q: Any, k: Any, v: Any, mask: Any, heads: int) -> Any:
        return fused(q, k, v, None, mask, num_heads=heads)

    return torch.ops.cramkit.attention.default, translate


def _export_module(loaded: LoadedModel, fused: bool) -> tuple[Any, list[str]]:
    """A module whose forward is the graph to export, and its output names; ``fused``: each block's
    attention core as ONNX Runtime's fused MultiHeadAttention (see :func:`attention_plan`)."""
    import torch
    from torch import nn

    from cramkit.model.encoder import additive_mask

    kind = loaded.kind
    encoder = cast("Encoder | None", loaded.encoder)  # LoadedModel.encoder: an Encoder or None
    model = loaded.model

    if encoder is None:  # another architecture (a student): its logits only

        class Logits(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, input_ids, attention_mask, token_type_ids=None):  # noqa: ANN001, ANN201
                _, logits = self.model(input_ids, attention_mask, token_type_ids)
                return logits.float()

        if kind not in ("classifier", "multilabel", "regression"):
            raise CramkitError(
                f"{loaded.source}: a {loaded.architecture} {kind} model cannot be exported to ONNX; "
                "export a classifier or an encoder model"
            )
        return Logits().eval(), ["logits"]

    prompt = loaded.prompt if loaded.architecture == "prompt" else None
    prefix = loaded.architecture == "prefix"
    # a deep-prompt model's labels only: the torch model's embeddings are its frozen base's, without the prefixes
    outputs = [] if prefix else ["mean", "cls"]
    if kind in LOGIT_KINDS:
        outputs.append("logits")
    if kind == "mlm":
        outputs.append("hidden")
    op = _attention_op()[0] if fused else None

    class FusedAttention(nn.Module):
        """The block's attention with its core (softmax(q k^T / sqrt(d)) v over the unpadded keys) as one
        ``cramkit::attention``, ONNX Runtime's MultiHeadAttention; the projections stay matrix multiplies."""

        def __init__(self, attn: nn.Module) -> None:
            super().__init__()
            self.attn = attn

        def forward(self, x, mask, select=None, prefix=None):  # noqa: ANN001, ANN201
            attn = self.attn
            batch, length, hidden = x.shape
            q, k, v = attn.qkv(x).chunk(3, dim=-1)
            if attn.rotary is not None:  # on [B, heads, L, head_dim], as the torch model does
                q, k = (
                    attn.rotary(t.view(batch, length, attn.heads, -1).transpose(1, 2))
                    .transpose(1, 2)
                    .reshape(batch, length, hidden)
                    for t in (q, k)
                )
            if prefix is not None:  # deep prompts: [2, P, hidden] keys and values in front, never masked
                pk, pv = prefix[0].expand(batch, -1, -1), prefix[1].expand(batch, -1, -1)
                k, v = torch.cat([pk, k], dim=1), torch.cat([pv, v], dim=1)
                mask = torch.cat([mask.new_ones(batch, prefix.shape[1]), mask], dim=1)
            return attn.out(op(q, k, v, mask, attn.heads))

    def with_fused_attention(block: nn.Module) -> nn.Module:
        new = copy.copy(block)  # the same norms, MLP and residual order (pre, post, DeepNet)
        new._modules = dict(block._modules)
        new.attn = FusedAttention(cast(nn.Module, block.attn))
        return new

    layers = nn.ModuleList(with_fused_attention(b) for b in encoder.layers) if fused else encoder.layers

    class Graph(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.encoder = encoder
            self.layers = layers

        def forward(self, input_ids, attention_mask, token_type_ids=None):  # noqa: ANN001, ANN201
            enc = self.encoder
            x = enc.embeddings(input_ids, token_type_ids)
            if fused:  # MultiHeadAttention takes the 1/0 key padding mask
                mask = attention_mask.to(torch.int32)
            else:  # always a mask: no data-dependent branch
                mask = additive_mask(attention_mask, x.dtype)
            for i, block in enumerate(self.layers):
                # a deep-prompt model: each layer's prefix keys and values baked in (PrefixClassifier.prefix)
                x = block(x, mask, None, self.model.prefix[i]) if prefix else block(x, mask)
            hidden = enc.final_norm(x)
            out = []
            if "mean" in outputs:
                w = attention_mask.to(hidden.dtype)[..., None]
                out += [(hidden * w).sum(1) / w.sum(1).clamp_min(1.0), hidden[:, 0]]
            if "logits" in outputs and prompt is not None:
                out.append(self.prompt_scores(input_ids, hidden))
            elif "logits" in outputs:
                out.append(self.model.classifier(self.model.pool(hidden, attention_mask)))
            if "hidden" in outputs:
                out.append(hidden)
            return tuple(out)

        def prompt_scores(self, input_ids, hidden):  # noqa: ANN001, ANN201
            """PromptClassifier's scores: the mean over the template's masks of log p(each label's word), the
            masked-LM head run at the masks only. Every input holds exactly ``masks`` of them (the engine
            encodes it through the template); the j-th mask of a row is found with fixed shapes (the first
            position whose running count of masks is j), no data-dependent size in the graph."""
            words = self.model.words  # [masks, labels]
            masks = int(words.shape[0])
            where = input_ids == self.model.mask_id
            count = where.to(torch.int64).cumsum(1)  # [B, L]: masks up to and including each position
            slots = torch.arange(1, masks + 1, dtype=torch.int64)
            hit = where[:, None, :] & (count[:, None, :] == slots[None, :, None])  # [B, masks, L]
            pos = hit.to(torch.float32).argmax(-1)  # [B, masks]
            at = hidden.gather(1, pos[..., None].expand(-1, -1, hidden.shape[-1]))  # [B, masks, hidden]
            logp = self.model.head(at).float().log_softmax(-1)  # [B, masks, vocab]
            picked = logp.gather(2, words[None].expand(hidden.shape[0], -1, -1))  # [B, masks, labels]
            return picked.mean(1)

    return Graph().eval(), outputs


def _torch_export(loaded: LoadedModel, path: Path, opset: int, fused: bool) -> tuple[list[str], list[str]]:
    import torch

    module, outputs = _export_module(loaded, fused)
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if loaded.with_types else [])
    cfg = loaded.config
    longest = int(getattr(cfg, "max_position", 0) or loaded.max_length)
    if getattr(cfg, "position", None) == "rope":
        longest = max(longest, loaded.max_length)
    longest = max(longest, 17)
    batch, length = torch.export.Dim("batch", min=1), torch.export.Dim("length", min=1, max=longest)
    gen = torch.Generator().manual_seed(0)
    vocab = int(getattr(cfg, "vocab_size", 0) or loaded.tokenizer.get_vocab_size())
    ids = torch.randint(5, max(6, vocab), (3, 16), generator=gen)
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1, 11:] = 0
    args: tuple[Any, ...] = (ids, mask)
    if loaded.with_types:
        types = torch.zeros(3, 16, dtype=torch.long)
        types[2, 8:] = 1
        args = (*args, types)
    dynamic = {n: {0: batch, 1: length} for n in names}
    import logging
    import warnings

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # e.g. "torchvision is not installed"
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            args,
            dynamo=True,
            input_names=names,
            output_names=outputs,
            dynamic_shapes=dynamic,
            opset_version=opset,
            optimize=True,
            verbose=False,
            custom_translation_table=dict([_attention_op()]) if fused else None,
        )
        assert program is not None  # dynamo=True returns the ONNXProgram
        _rename_shadows(program.model.graph)
        program.save(str(path), external_data=False)
    return names, outputs


def _rename_shadows(graph: Any) -> None:
    """Rename the inner values that bear an output's name (torch names a value after the code that made it:
    RMSNorm's decomposition makes a "mean"), which would make two definitions of that name."""
    outputs = {id(v) for v in graph.outputs}
    names = {v.name for v in graph.outputs}
    for node in graph:
        for value in node.outputs:
            if value.name in names and id(value) not in outputs:
                value.name = f"{value.name}_inner"


def _head_export(loaded: LoadedModel, path: Path, opset: int) -> None:
    import warnings

    import torch
    from torch import nn

    head = loaded.model.head

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = head

        def forward(self, hidden):  # noqa: ANN001, ANN201
            return self.head(hidden)

    n = torch.export.Dim("n", min=1)
    x = torch.randn(5, loaded.config.hidden)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            Head().eval(),
            (x,),
            dynamo=True,
            input_names=["hidden"],
            output_names=["logits"],
            dynamic_shapes={"hidden": {0: n}},
            opset_version=opset,
            optimize=True,
            verbose=False,
        )
        assert program is not None  # dynamo=True returns the ONNXProgram
        program.save(str(path), external_data=False)


def _fuse(src: Path, dst: Path, loaded: LoadedModel) -> dict[str, Any]:
    """ONNX Runtime's transformer fusions (SkipLayerNorm, BiasGelu, ...) where they apply; the counts of the
    operators they fused (not those the export wrote itself), or why none were applied (the plain graph is
    kept)."""
    import logging

    cfg = loaded.config
    before = _graph_ops(src)
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
        opt = optimize_model(
            str(src), model_type="bert", num_heads=int(cfg.heads), hidden_size=int(cfg.hidden), opt_level=0
        )
        stats = {k: int(v) - before.get(k, 0) for k, v in opt.get_fused_operator_statistics().items()}
        stats = {k: v for k, v in stats.items() if v > 0}
        opt.save_model_to_file(str(dst))
        return {"applied": stats}
    except Exception as exc:  # noqa: BLE001 - fusions are an optimisation: keep the plain graph
        from cramkit.io import disk_problem

        if disk_problem(exc):
            raise
        os.replace(src, dst)
        return {"applied": {}, "skipped": f"{type(exc).__name__}: {exc}"[:300]}


# Dynamic quantization: activations become uint8 at run time (DynamicQuantizeLinear), weights int8 (U8S8,
# ONNX Runtime's fastest CPU format). What differs per instruction set is the weights' range: without VNNI,
# x86 multiplies u8 x s8 pairs with vpmaddubsw, whose int16 sums saturate, so 7-bit weights are safer.
ISA_FORMATS: dict[str, tuple[bool, str]] = {
    "avx512_vnni": (False, "VNNI accumulates u8 x s8 products in int32: no saturation, full 8-bit weights"),
    "avx_vnni": (False, "VNNI accumulates u8 x s8 products in int32: no saturation, full 8-bit weights"),
    "avx512": (True, "no VNNI: vpmaddubsw sums u8 x s8 pairs in int16 and can saturate: 7-bit weights"),
    "avx2": (True, "no VNNI: vpmaddubsw sums u8 x s8 pairs in int16 and can saturate: 7-bit weights"),
    "x86-64": (True, "no AVX2: 7-bit weights, the conservative choice"),
    "arm64": (False, "ARM's int8 dot-product kernels accumulate in int32: full 8-bit weights"),
}


def cpu_isa(flags: set[str] | None = None, machine: str | None = None) -> str:
    """The instruction set the int8 kernels will use here: a key of :data:`ISA_FORMATS` (``flags``,
    ``machine``: the CPU's feature flags and ``platform.machine()``, read from this machine by default)."""
    machine = (machine or platform.machine()).lower()
    if machine in ("arm64", "aarch64") or machine.startswith("armv8"):
        return "arm64"
    if flags is None:
        flags = _cpu_flags()
    if flags & {"avx512_vnni", "amx_int8"}:
        return "avx512_vnni"
    if "avx_vnni" in flags:
        return "avx_vnni"
    if "avx512bw" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "x86-64"


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return set(value.split())
    except OSError:
        pass
    return set()


def _quantize(src: Path, dst: Path, isa: str, keep_down: bool) -> dict[str, Any]:
    """Dynamic int8 quantization of every matrix multiply by a weight (the QKV, output and MLP projections),
    with the weights' range chosen for ``isa``; ``keep_down``: keep the MLP
    down-projections in fp32 (their inputs, after the activation, carry the outliers that per-tensor
    activation scales handle worst)."""
    import logging

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    reduce_range, why = ISA_FORMATS[isa]
    graph = onnx.load(str(src)).graph
    producer = {out: node.op_type for node in graph.node for out in node.output}
    weights = {t.name for t in graph.initializer}
    after_activation = ("Gelu", "BiasGelu", "FastGelu", "Relu", "Mul", "Sigmoid")
    keep = [
        n.name
        for n in graph.node
        if keep_down
        and n.op_type == "MatMul"
        and n.input[1] in weights
        and producer.get(n.input[0]) in after_activation
    ]
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process is for static quantization
    try:
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=reduce_range,
            op_types_to_quantize=["MatMul"],
            nodes_to_exclude=keep,
        )
    finally:
        root.setLevel(level)
    return {
        "weights": "int8 per-channel" + (" (7-bit range)" if reduce_range else ""),
        "activations": "uint8 dynamic",
        "format": "U8S8",
        "isa": isa,
        "reduce_range": reduce_range,
        "why": why,
        "ops": ["MatMul"],
        "kept_fp32": f"{len(keep)} MLP down-projections" if keep else "none",
    }


# int8 everywhere is kept when its embeddings stay this close to torch's on the check's texts (mean cosine)
# and it changes at most this share of a classifier's labels; otherwise the MLP down-projections stay fp32
INT8_MIN_COSINE = 0.995
INT8_MAX_FLIPS = 0.02


def _int8_faithful(check: dict[str, Any]) -> bool:
    cosines = [v for k, v in check.items() if k.startswith("cosine_") and k.endswith("_mean")]
    return min(cosines, default=1.0) >= INT8_MIN_COSINE and check.get("label_agreement", 1.0) >= 1 - INT8_MAX_FLIPS


def _int8_cost(check: dict[str, Any]) -> str:
    parts = [f"{k} {v:.4f}" for k, v in check.items() if k.endswith("_mean") or k == "label_agreement"]
    return ", ".join(parts)


# the operators worth counting in an export: ONNX Runtime's fused ones (com.microsoft) and the matrix
# multiplies, plain (MatMul) or int8 (MatMulInteger)
def _graph_ops(file: Path) -> dict[str, int]:
    """How many of each fused, quantized or matrix-multiply operator ``file``'s graph holds."""
    import onnx

    graph = onnx.load(str(file), load_external_data=False).graph
    counts: dict[str, int] = {}
    for node in graph.node:
        if node.domain == "com.microsoft" or node.op_type in ("MatMul", "MatMulInteger"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


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


def _refuse_external_data(file: Path, data: bytes) -> None:
    """A CramkitError when any tensor of the model (graph, subgraphs, functions) lives in an external file."""
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
                inputs, outputs = _torch_export(loaded, tmp / "raw.onnx", opset, fused=why_not is None)
            except Exception as exc:  # noqa: BLE001 - the fused attention is an optimisation
                if why_not is not None or disk_problem(exc):
                    raise
                reason: BaseException = exc
                while reason.__cause__ is not None:  # the exporter wraps the reason in its own errors
                    reason = reason.__cause__
                why_not = f"the exporter failed with it ({type(reason).__name__}: {str(reason)[:200]})"
                inputs, outputs = _torch_export(loaded, tmp / "raw.onnx", opset, fused=False)
            if loaded.kind == "mlm":
                _head_export(loaded, tmp / "head.onnx", opset)
        except CramkitError:
            raise
        except Exception as exc:  # noqa: BLE001 - name the model and the exporter's reason
            if disk_problem(exc):
                raise
            raise CramkitError(
                f"{loaded.source}: torch's ONNX exporter failed ({type(exc).__name__}: {str(exc)[:300]}); "
                "export with --format hf instead, or report the model's architecture"
            ) from None
        if why_not is not None:
            job.say(f"attention not fused ({why_not}): the plain attention graph is kept")
        job.say("optimising the graph (ONNX Runtime's transformer fusions, where they apply)")
        fusions = _fuse(tmp / "raw.onnx", tmp / "fused.onnx", loaded)
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
                job.manifest["quantization"] = _quantize(tmp / "fused.onnx", tmp / "model.onnx", isa, keep_down)
            job.manifest["graph_ops"] = _graph_ops(tmp / "model.onnx")
            return job.check()

        if job.quantize == "int8":
            isa = isa or cpu_isa()
            job.say(f"quantizing every matrix multiply to int8 (dynamic, for {isa})")
            check = checked(keep_down=False)
            if not _int8_faithful(check):
                job.say(
                    f"int8 everywhere is too far from torch ({_int8_cost(check)}): keeping the MLP "
                    "down-projections in fp32"
                )
                refused = {"kept_fp32": "none", "check": check}
                fallback = checked(keep_down=True)
                if not _int8_faithful(fallback):  # ship only what passes the bar, never the lesser of two misses
                    raise CramkitError(
                        f"int8 is too far from torch on this model: everywhere {_int8_cost(check)}; with the MLP "
                        f"down-projections in fp32 {_int8_cost(fallback)} (the bar: mean cosine >= {INT8_MIN_COSINE} "
                        f"and at most {INT8_MAX_FLIPS:.0%} of the labels changed); export it without --quantize "
                        "(fp32), or try --format ct2 --quantize int8"
                    )
                job.say(f"int8 with the MLP down-projections in fp32 passes: {_int8_cost(fallback)}")
                job.manifest["quantization"]["refused"] = refused
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
            _refuse_external_data(path / name, files[name])
            try:
                return ort.InferenceSession(files[name], opts, providers=["CPUExecutionProvider"])
            except Exception as exc:  # noqa: BLE001 - a damaged or crafted model file
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
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's own errors: a graph that cannot take it
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
