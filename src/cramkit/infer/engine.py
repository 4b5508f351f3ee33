"""Batched inference for any model ``cramkit.load`` opens (torch, or an export run by its backend: ONNX
Runtime, CTranslate2, a registered format): embeddings, classification, multiple choice, fill-mask.

The passes are ``cramkit.model.forward``'s (the same ones fine-tuning scores with): inputs sorted by length
and cut into forward passes by a token budget (rows x longest row), each padded to its own longest member,
results in the caller's order; the default budget is cache-sized on a CPU, large on CUDA. torch:
``torch.inference_mode`` always, autocast as ``cramkit.runtime`` decides (bf16 on CUDA by default). Inputs
longer than the model's limit are truncated (on by default) and reported per input in ``truncated``; with
``truncate=False`` they are an error instead.

The ``*_encoded`` methods take already tokenised inputs (:meth:`Engine.tokenize`) and cut them into passes;
the ``*_pass`` methods run given rows as exactly one forward pass: the server's batcher forms the passes
itself, from many requests, with :func:`fits` (the same rule), and runs each as it is.

:class:`Engine` is its capabilities together, each in its own module over the core (engine_core.py: loading,
tokenising, the passes' rows): embeddings (engine_embed.py), a head's scores (engine_scores.py: classify,
choose, rerank), fill-mask (engine_fill_mask.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from cramkit.infer.engine_core import MIN_CHOICES as MIN_CHOICES
from cramkit.infer.engine_core import InputTooLong as InputTooLong
from cramkit.infer.engine_core import TextOrPair as TextOrPair
from cramkit.infer.engine_core import check_model_weights as check_model_weights
from cramkit.infer.engine_embed import EmbeddingEngine
from cramkit.infer.engine_fill_mask import FillMaskEngine
from cramkit.infer.engine_scores import ChoiceResult as ChoiceResult
from cramkit.infer.engine_scores import ClassifyResult as ClassifyResult
from cramkit.infer.engine_scores import ScoringEngine
from cramkit.infer.engine_scores import probabilities as probabilities
from cramkit.infer.offload import check_expert_cache as check_expert_cache
from cramkit.model.forward import CPU_BATCH_TOKENS as CPU_BATCH_TOKENS
from cramkit.model.forward import CUDA_BATCH_TOKENS as CUDA_BATCH_TOKENS
from cramkit.model.forward import MAX_BATCH_ROWS as MAX_BATCH_ROWS
from cramkit.model.forward import default_batch_tokens as default_batch_tokens
from cramkit.model.forward import fits as fits

if TYPE_CHECKING:
    from cramkit.backends import ExportedModel
    from cramkit.loading import LoadedModel


class Engine(EmbeddingEngine, ScoringEngine, FillMaskEngine):
    """Batched inference over a model: a :class:`~cramkit.loading.LoadedModel`, an
    :class:`~cramkit.backends.ExportedModel`, or a path (anything ``cramkit.load`` opens: a run, a
    model directory, ``hf:DIR``, an export).

    backend: ``auto`` (the model's own: torch for a torch model, the export's format for an export), ``torch``,
    or an export format (``onnx``, ``ct2``, a registered one): asking for a format with a torch model exports
    it (at full precision) to a temporary directory first. The engine holds one runner
    (``model.runner()``) and never asks which backend it is.
    max_batch_tokens: padded tokens per forward pass (rows x longest row; default the runner's ``batch_tokens``
    where it has one, e.g. 512 for CTranslate2 on a CPU, else from the device: :func:`default_batch_tokens`);
    max_length: cut inputs to this many tokens ([CLS]/[SEP] included), default the model's limit;
    threads: an export runtime's CPU threads (default: the cores this process may use; torch keeps its own
    setting).
    offload_experts: of a mixture-of-experts torch model, keep its experts out of memory and bring in only the
    ones each pass's router picks (InfMoE): on a CPU read from the model's safetensors file through a memory
    map, on CUDA copied from pinned host memory on a side stream; attention, the dense blocks and the routers
    stay resident. The loaded model's experts leave it (it is changed in place). The outputs are the resident
    model's. expert_cache: experts kept resident per MoE layer (least recently used leave first; default 0).
    """

    def _compare_export(self, loaded: LoadedModel, exported: ExportedModel, texts: list[Any]) -> dict[str, Any]:
        return compare_outputs(loaded, exported, texts)

    def info(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "kind": self.kind,
            "backend": self.backend,
            "precision": self.runner.precision,
            "device": str(self.device),
            "labels": self.labels,
            "max_length": self.max_length,
            "max_batch_tokens": self.max_batch_tokens,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "dimensions": self.dimensions if self.can_embed else [],
            "prompts": self.prompts,
            "default_prompt_name": self.default_prompt_name,
            "rerank": self.can_rerank,
            "hidden_size": self.hidden_size,
            "embed": self.can_embed,
            "classify": self.can_classify,
            "choose": self.can_choose,
            "fill_mask": self.can_fill_mask,
            "offload_experts": self.offload,
        }


def compare_outputs(
    loaded: LoadedModel, exported: ExportedModel, texts: list[Any], reference: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The largest differences between the torch model's and its export's outputs on ``texts`` (the check of
    ``cramkit.backends.write_export``). ``reference``: a dict that keeps the torch model's outputs for these texts
    between calls, so that several exports of one model are checked against one fp32 pass (the race's)."""
    import torch

    ref = Engine(loaded, backend="torch", device="cpu", precision="fp32", max_batch_tokens=4096)
    got = Engine(exported, max_batch_tokens=4096)
    kept = reference if reference is not None else {}
    # another model's outputs, or of other texts, are no reference (each check gets a copy of the LoadedModel:
    # its module and its kind say which model it is)
    if kept.get("model") is not loaded.model or kept.get("kind") != loaded.kind or kept.get("texts") != texts:
        kept.clear()
        kept.update(model=loaded.model, kind=loaded.kind, texts=list(texts))

    def torch_side(name: str, compute: Callable[[], Any]) -> Any:  # the torch model's outputs, once
        if name not in kept:
            kept[name] = compute()
        return kept[name]

    res: dict[str, Any] = {"texts": len(texts)}
    with torch.inference_mode():
        if ref.can_embed and got.can_embed:  # a deep-prompt export gives its labels only
            enc = ref.tokenize(texts)
            mine = torch_side("embed", lambda: ref.embed_encoded(enc))
            for name, a, b in zip(("mean", "cls"), mine, got.embed_encoded(enc), strict=True):
                res[f"max_abs_diff_{name}"] = float(np.abs(a - b).max())
                res[f"scale_{name}"] = float(np.abs(a).max())
                cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
                res[f"cosine_{name}_mean"] = float(cos.mean())
                res[f"cosine_{name}_min"] = float(cos.min())
        if ref.can_classify or ref.can_choose:  # multiple choice: the scores of the pairs
            enc = ref.tokenize(texts)
            a, b = torch_side("logits", lambda: ref.logits_encoded(enc)), got.logits_encoded(enc)
            res["max_abs_diff_logits"] = float(np.abs(a - b).max())
            res["scale_logits"] = float(np.abs(a).max())
            if ref.can_classify and loaded.kind != "regression":
                res["label_agreement"] = float((a.argmax(1) == b.argmax(1)).mean())
        if ref.can_fill_mask:
            masked = [" ".join(t.split()[:6] + ["[MASK]"] + t.split()[6:12]) for t in texts[:32] if isinstance(t, str)]
            ra, ga = torch_side("fill_mask", lambda: ref.fill_mask(masked, top_k=1)), got.fill_mask(masked, top_k=1)
            pa = [m[0]["id"] for r in ra for m in r[:1]]
            pb = [m[0]["id"] for r in ga for m in r[:1]]
            sa = np.asarray([m[0]["score"] for r in ra for m in r[:1]])
            sb = np.asarray([m[0]["score"] for r in ga for m in r[:1]])
            res["fill_mask_top1_agreement"] = float(np.mean([x == y for x, y in zip(pa, pb, strict=True)]))
            res["max_abs_diff_fill_mask_top1_prob"] = float(np.abs(sa - sb).max()) if len(sa) else 0.0
    return res
