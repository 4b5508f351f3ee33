"""Batched forward passes of a torch model over tokenised inputs: one implementation for every caller that
scores a model (``cramkit.infer.Engine``'s torch backend, fine-tuning's dev and test scores).

Inputs are sorted by length and cut into passes by a token budget (rows x longest row), not a row count,
so memory is the same for short and long inputs; each pass is padded to its own longest member only;
results come back in the caller's order. The default budget depends on the device: on a CPU a pass small
enough for the MLP's intermediate activations to stay in cache is fastest (measured in bench/RESULTS.md,
"Token budget on the CPU"), on CUDA a large one. A pass runs under ``torch.inference_mode`` and
``cramkit.runtime``'s autocast (bf16 on CUDA by default).

The passes take numpy inputs (:func:`pad`), so that ``cramkit.infer``'s ONNX Runtime and CTranslate2
backends run the very same passes as :class:`TorchRunner`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import numpy as np

from cramkit.data.batching import Encoded, token_budget_batches
from cramkit.errors import CramkitError
from cramkit.runtime import PASS_TOKENS, autocast, resolve_device, resolve_precision

T = TypeVar("T")

if TYPE_CHECKING:
    import torch

    from cramkit.model.heads import MaskedLM

CPU_BATCH_TOKENS = PASS_TOKENS["cpu"]  # padded tokens per forward pass by default (runtime.PASS_TOKENS)
CUDA_BATCH_TOKENS = PASS_TOKENS["cuda"]
MAX_BATCH_ROWS = 1024  # rows per forward pass, whatever their length

Inputs = dict[str, np.ndarray | None]  # input_ids, attention_mask (None: nothing padded), token_type_ids


def default_batch_tokens(device: Any) -> int:
    """The token budget of one forward pass on ``device``: cache-sized on a CPU, large on CUDA."""
    return CUDA_BATCH_TOKENS if str(device).startswith("cuda") else CPU_BATCH_TOKENS


def fits(rows: int, longest: int, budget: int) -> bool:
    """Whether ``rows`` inputs padded to ``longest`` tokens make one forward pass within ``budget``
    (one input always does, however long)."""
    return rows <= 1 or (rows <= MAX_BATCH_ROWS and rows * longest <= budget)


def passes(enc: Encoded, max_tokens: int, max_rows: int = MAX_BATCH_ROWS) -> list[np.ndarray]:
    """Length-sorted index batches of ``enc``, each within ``max_tokens`` padded tokens and ``max_rows``
    rows (each one :func:`fits`)."""
    return token_budget_batches(enc.lengths, max_tokens, max_rows)


def pad(enc: Encoded, rows: np.ndarray | None, pad_id: int, with_types: bool) -> Inputs:
    """``rows`` of ``enc`` (default: all) padded to their longest member: input_ids, attention_mask (None if
    nothing is padded), token_type_ids (None for models without them); int64."""
    if rows is None:
        rows = np.arange(len(enc))
    lengths = enc.lengths[rows]
    width = int(lengths.max())
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    for row, i in enumerate(rows):
        ids[row, : lengths[row]] = enc.ids[i]
    mask = None
    if (lengths != width).any():
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    types = None
    if with_types:
        pos = np.arange(width)[None, :]
        types = ((pos >= enc.b_start[rows][:, None]) & (pos < lengths[:, None])).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


class Runner(Protocol):
    """One forward pass over padded numpy inputs (torch here; ONNX Runtime and CTranslate2 in cramkit.infer)."""

    name: str
    precision: str

    def logits(self, x: Inputs) -> np.ndarray: ...


class TorchRunner:
    """Forward passes of a torch model on numpy batches: ``model(ids, mask, types)`` returns
    ``(loss, logits)`` (a classifier or multiple-choice scorer); ``encoder`` gives hidden states
    (embeddings); an MLM model's ``encoder`` and ``head`` give fill-mask predictions."""

    name = "torch"

    def __init__(
        self,
        model: torch.nn.Module,
        device: str | torch.device | None = "auto",
        precision: str = "auto",
        encoder: torch.nn.Module | None = None,
    ) -> None:
        import torch

        self.torch = torch
        self.device = resolve_device(device)
        if precision == "fp8":
            raise CramkitError("precision fp8 is for training; run the model in bf16 (or auto)")
        self.precision = resolve_precision(precision, self.device)
        self.model = model.to(self.device).eval()
        self.encoder = encoder

    def _amp(self) -> contextlib.AbstractContextManager:
        return autocast(self.precision, self.device)

    def _inputs(self, x: Inputs) -> tuple[Any, Any, Any]:
        t = self.torch
        ids = t.from_numpy(x["input_ids"]).to(self.device, non_blocking=True)
        mask = x["attention_mask"]
        mask = None if mask is None else t.from_numpy(mask).to(self.device, non_blocking=True)
        types = x["token_type_ids"]
        types = None if types is None else t.from_numpy(types).to(self.device, non_blocking=True)
        return ids, mask, types

    def pooled(self, x: Inputs) -> tuple[np.ndarray, np.ndarray]:
        """(mean over real tokens, first token) of the encoder's last hidden states, float32."""
        ids, mask, types = self._inputs(x)
        assert self.encoder is not None  # callers check that the model has one (Engine._need_embed)
        with self.torch.inference_mode(), self._amp():
            hidden = self.encoder(ids, mask, types).float()
            cls = hidden[:, 0]
            if mask is None:
                mean = hidden.mean(1)
            else:
                w = mask.to(hidden.dtype)[..., None]
                mean = (hidden * w).sum(1) / w.sum(1).clamp_min(1.0)
            return mean.cpu().numpy(), cls.cpu().numpy()

    def logits(self, x: Inputs) -> np.ndarray:
        ids, mask, types = self._inputs(x)
        with self.torch.inference_mode(), self._amp():
            _, logits = self.model(ids, mask, types)
            return logits.float().cpu().numpy()

    def mask_topk(self, x: Inputs, where: np.ndarray, k: int) -> tuple[Any, Any]:
        ids, mask, types = self._inputs(x)
        sel = self.torch.from_numpy(where).to(self.device)
        model = cast("MaskedLM", self.model)  # fill-mask: an MLM model
        with self.torch.inference_mode(), self._amp():
            hidden = model.encoder(ids, mask, types)
            probs = model.head(hidden[sel]).float().softmax(-1)
            p, t = probs.topk(k, dim=-1)
            return p.cpu().numpy(), t.cpu().numpy()


def run_passes(fn: Callable[[np.ndarray], T], batches: list[np.ndarray], workers: int = 1) -> list[T]:
    """``fn`` over each pass, results in order; ``workers`` > 1: that many passes at once, for a runtime that
    runs several in parallel (CTranslate2 on a CPU: one thread per pass)."""
    if workers <= 1 or len(batches) <= 1:
        return [fn(b) for b in batches]
    with ThreadPoolExecutor(min(workers, len(batches)), thread_name_prefix="cramkit-pass") as pool:
        return list(pool.map(fn, batches))


def logits(
    runner: Runner,
    enc: Encoded,
    *,
    pad_id: int,
    with_types: bool,
    max_tokens: int,
    max_rows: int = MAX_BATCH_ROWS,
    width: int = 1,
    workers: int = 1,
) -> np.ndarray:
    """The head's outputs [n, C] float32 for every input of ``enc``, in its order, pass by pass (``width``:
    C when there is no input; ``workers``: passes at once, :func:`run_passes`)."""
    out: np.ndarray | None = None
    batches = passes(enc, max_tokens, max_rows)
    parts = run_passes(lambda rows: runner.logits(pad(enc, rows, pad_id, with_types)), batches, workers)
    for rows, part in zip(batches, parts, strict=True):
        if out is None:
            out = np.zeros((len(enc), part.shape[1]), dtype=np.float32)
        out[rows] = part
    return out if out is not None else np.zeros((0, width), dtype=np.float32)
