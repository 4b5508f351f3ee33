"""What the inference verbs (predict, embed, serve, index build) share, declared once as request field groups
(:mod:`cramkit.request`): where the forward passes run and how large they are, and a mixture of experts' experts
kept out of memory."""

from __future__ import annotations

from dataclasses import dataclass

from cramkit.request import param
from cramkit.runtime import PASS_TOKENS_HELP


@dataclass(kw_only=True)
class Passes:
    """``--device`` and ``--max-batch-tokens`` (the defaults: :data:`cramkit.runtime.PASS_TOKENS`)."""

    device: str = param("auto", help="auto, cpu, cuda, cuda:N")
    max_batch_tokens: int | None = param(None, metavar="N", help=PASS_TOKENS_HELP)


@dataclass(kw_only=True)
class Offload:
    """``--offload-experts`` and ``--expert-cache``: a mixture-of-experts model's experts read as the router picks
    them instead of all resident (``cramkit.infer.Engine``'s ``offload_experts``)."""

    offload_experts: bool = param(
        False,
        help="mixture-of-experts model: keep the experts out of memory and bring in only those each batch's router "
        "picks (CPU: read from the model's safetensors file, memory-mapped; CUDA: copied from host memory)",
    )
    expert_cache: str | None = param(
        None,
        metavar="N",
        help="with --offload-experts: experts kept resident per MoE layer, least recently used leaving first "
        "(default 0)",
    )
