"""The ONNX export's graph: a loaded torch model traced by torch's ONNX exporter (dynamo, dynamic batch and
length), each block's attention core written as ONNX Runtime's fused ``MultiHeadAttention`` where it can be,
a masked-LM model's vocabulary head as a graph of its own, then ONNX Runtime's transformer fusions
(SkipLayerNorm, BiasGelu, ...) where they apply. The backend (``backends/onnx.py``) writes with these, checks
the result against torch and records what the graph holds (:func:`graph_ops`).
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cramkit.backends.base import LOGIT_KINDS
from cramkit.errors import CramkitError

if TYPE_CHECKING:
    from cramkit.model.encoder import Encoder
    from cramkit.model.loaded import LoadedModel


def attention_plan(loaded: LoadedModel) -> str | None:
    """None when every block's attention core can be exported as ONNX Runtime's fused
    ``MultiHeadAttention`` operator (com.microsoft: scaled dot-product attention over the unpadded keys; the
    projections, the rotary embedding where there is one, and the norms around it stay as they are), else
    why not (the export keeps the plain graph of matrix multiplies and a softmax)."""
    if loaded.encoder is None:
        return f"a {loaded.architecture} model: exported as its own graph"
    if loaded.encoder.relative is not None:
        return "MPNet's relative position bias is added to the attention scores, which the fused operator does not take"
    if loaded.encoder.cfg.disentangled_buckets:
        return "DeBERTa's position terms are added to the attention scores, which the fused operator does not take"
    if loaded.encoder.cfg.local_window:
        return "the local attention layers' band over the keys is a mask the fused operator does not take"
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


def _student_module(loaded: LoadedModel) -> Any:
    """Another architecture (a student): a module giving its logits only."""
    from torch import nn

    model, kind = loaded.model, loaded.kind

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            _, logits = self.model(input_ids, attention_mask, token_type_ids)
            return logits.float()

    if kind not in ("classifier", "multilabel", "regression"):
        raise CramkitError(
            f"{loaded.source}: a {loaded.architecture} {kind} model cannot be exported to ONNX; "
            "export a classifier or an encoder model"
        )
    return Logits().eval()


def _fused_layers(encoder: Encoder) -> Any:
    """The encoder's blocks, each with its attention core as one ``cramkit::attention`` (see
    :func:`attention_plan`); the same norms, MLP and residual order (pre, post, DeepNet)."""
    import torch
    from torch import nn

    op = _attention_op()[0]

    class FusedAttention(nn.Module):
        """The block's attention with its core (softmax(q k^T / sqrt(d)) v over the unpadded keys) as one
        ``cramkit::attention``, ONNX Runtime's MultiHeadAttention; the projections stay matrix multiplies."""

        def __init__(self, attn: nn.Module) -> None:
            super().__init__()
            self.attn = attn

        def forward(self, x, mask, select=None, prefix=None):
            attn: Any = self.attn  # the block's attention, of whichever encoder class
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

    return nn.ModuleList(with_fused_attention(b) for b in encoder.layers)


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
        return _student_module(loaded), ["logits"]

    prompt = loaded.prompt if loaded.architecture == "prompt" else None
    prefix = loaded.architecture == "prefix"
    # a deep-prompt model's labels only: the torch model's embeddings are its frozen base's, without the prefixes
    outputs = [] if prefix else ["mean", "cls"]
    if kind in LOGIT_KINDS:
        outputs.append("logits")
    if kind == "mlm":
        outputs.append("hidden")
    layers = _fused_layers(encoder) if fused else encoder.layers

    class Graph(nn.Module):
        model: Any  # the classifier, prompt or prefix model, read by what it has (duck-typed)
        encoder: Any

        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.encoder = encoder
            self.layers = layers

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            enc = self.encoder
            x = enc.embeddings(input_ids, token_type_ids)
            if fused:  # MultiHeadAttention takes the 1/0 key padding mask
                mask = attention_mask.to(torch.int32)
            else:  # always a mask: no data-dependent branch (MPNet's relative bias, local layers' band added)
                mask = additive_mask(attention_mask, x.dtype)
            masks = (mask, mask) if fused else enc.attention_masks(mask, x.dtype, input_ids.shape[1])
            for i, block in enumerate(self.layers):
                # a deep-prompt model: each layer's prefix keys and values baked in (PrefixClassifier.prefix)
                m = enc.mask_of(i, masks)
                x = block(x, m, None, self.model.prefix[i]) if prefix else block(x, m)
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

        def prompt_scores(self, input_ids, hidden):
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


def torch_export(loaded: LoadedModel, path: Path, opset: int, fused: bool) -> tuple[list[str], list[str]]:
    import torch

    module, outputs = _export_module(loaded, fused)
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if loaded.with_types else [])
    cfg = loaded.config
    longest = int(getattr(cfg, "positions", 0) or loaded.max_length)  # RoBERTa's: the table's rows past its offset
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


def head_export(loaded: LoadedModel, path: Path, opset: int) -> None:
    import warnings

    import torch
    from torch import nn

    head = loaded.model.head

    class Head(nn.Module):
        head: Any

        def __init__(self) -> None:
            super().__init__()
            self.head = head

        def forward(self, hidden):
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


def fuse(src: Path, dst: Path, loaded: LoadedModel) -> dict[str, Any]:
    """ONNX Runtime's transformer fusions (SkipLayerNorm, BiasGelu, ...) where they apply; the counts of the
    operators they fused (not those the export wrote itself), or why none were applied (the plain graph is
    kept)."""
    import logging

    cfg = loaded.config
    before = graph_ops(src)
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
    except Exception as exc:  # fusions are an optimisation: keep the plain graph
        from cramkit.io import disk_problem

        if disk_problem(exc):
            raise
        os.replace(src, dst)
        return {"applied": {}, "skipped": f"{type(exc).__name__}: {exc}"[:300]}


# the operators worth counting in an export: ONNX Runtime's fused ones (com.microsoft) and the matrix
# multiplies, plain (MatMul) or int8 (MatMulInteger)
def graph_ops(file: Path) -> dict[str, int]:
    """How many of each fused, quantized or matrix-multiply operator ``file``'s graph holds."""
    import onnx

    graph = onnx.load(str(file), load_external_data=False).graph
    counts: dict[str, int] = {}
    for node in graph.node:
        if node.domain == "com.microsoft" or node.op_type in ("MatMul", "MatMulInteger"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))
