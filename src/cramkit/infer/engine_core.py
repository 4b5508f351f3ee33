"""The engine's core, which every capability builds on: the model loaded and its one runner, the inputs
tokenised, the rows of each forward pass (:class:`EngineCore`). The capabilities are its subclasses
(engine_embed.py, engine_scores.py, engine_fill_mask.py); ``cramkit.infer.engine.Engine`` is all of them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cramkit.backends.finite import FiniteRunner, check_weights
from cramkit.data.batching import Encoded, EncodedChoices, encode_choices, encode_texts
from cramkit.errors import CramkitError
from cramkit.infer.offload import check_expert_cache, offload_model
from cramkit.model import forward
from cramkit.model.forward import default_batch_tokens
from cramkit.text.tokenizer import special_token

if TYPE_CHECKING:
    import torch

    from cramkit.backends import ExportedModel, Runner
    from cramkit.data.prompts import PromptSpec
    from cramkit.loading import LoadedModel

TextOrPair = str | tuple[str, str] | list[str]

MIN_CHOICES = 2  # a multiple-choice input needs at least this many choices


class InputTooLong(CramkitError):
    """An input is longer than the model's limit and truncation was refused."""


def check_model_weights(loaded: LoadedModel) -> None:
    """One line naming the model when a weight of its torch module is NaN or infinite (training diverged, or
    the file is damaged or crafted)."""
    fix = "its training diverged or the file is damaged: train it again (a lower learning rate) or load a checkpoint"
    check_weights(loaded.source, loaded.model.named_parameters(), fix)


class EngineCore:
    """A model opened for batched inference, and its inputs tokenised and cut into passes (the arguments:
    :class:`~cramkit.infer.engine.Engine`'s)."""

    def __init__(
        self,
        model: LoadedModel | ExportedModel | str | os.PathLike,
        *,
        backend: str = "auto",
        device: str | torch.device | None = "auto",
        max_batch_tokens: int | None = None,
        max_length: int | None = None,
        precision: str = "auto",
        threads: int | None = None,
        offload_experts: bool = False,
        expert_cache: int | None = None,
    ) -> None:
        from cramkit import backends
        from cramkit.loading import LoadedModel, for_task, load

        known = ("auto", "torch", *backends.names())
        if backend not in known:
            raise CramkitError(f"backend must be one of {', '.join(known)}, got {backend!r}")
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise CramkitError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        cache = check_expert_cache(expert_cache, offload_experts)
        if offload_experts and backend not in ("auto", "torch"):
            raise CramkitError(f"--offload-experts runs the torch model; drop --backend {backend} (or use torch)")
        self._tmp: Any = None
        src = load(model, threads=threads) if isinstance(model, (str, os.PathLike)) else model
        if isinstance(src, LoadedModel):  # an export's tables are checked by its format, when it is opened
            check_model_weights(src)
        own = "torch" if isinstance(src, LoadedModel) else src.backend_name
        if isinstance(src, LoadedModel) and src.kind == "multitask":
            for_task(src, None)  # one line: choose the task (load(..., task=NAME))
        if backend not in ("auto", own):
            if not isinstance(src, LoadedModel):
                raise CramkitError(
                    f"{src.source} is an export in the {src.backend.title} format; run it with backend {own} (or "
                    "auto), or give the torch model it was exported from"
                )
            import tempfile

            self._tmp = tempfile.TemporaryDirectory(prefix=f"cramkit-{backend}-")
            out = backends.write_export(
                backend, src, Path(self._tmp.name) / "model", compare=self._compare_export, progress=False
            )
            src = backends.open_export(out, threads=threads)
        self.loaded: LoadedModel | ExportedModel = src
        self.offload: dict[str, Any] | None = None
        if offload_experts:
            self.offload = offload_model(src, device, cache)
        # the one place outputs leave a backend: NaN or infinity there is an error naming the model, every verb
        self.runner: Runner = FiniteRunner(src.runner(device, precision), str(src.source))
        self.device = getattr(self.runner, "device", "cpu")
        self.model = getattr(self.runner, "model", None)  # the torch module, for a torch model
        self.backend = self.runner.name
        self.kind: str = src.kind
        self.labels: list[str] | None = src.labels
        self.tokenizer = src.tokenizer
        self.pooling: str = src.pooling
        self.normalize: bool = src.normalize
        self.with_types: bool = src.with_types
        self.source: str = str(src.source)
        self.pad_id: int = src.pad_id
        self.model_max_length: int = int(src.max_length)
        # the runner's own budget where it has one (CTranslate2 on a CPU: smaller passes), else the device's
        own_budget = getattr(self.runner, "batch_tokens", None)
        self.max_batch_tokens = int(max_batch_tokens or own_budget or default_batch_tokens(self.device))
        self.max_length = min(int(max_length), self.model_max_length) if max_length else self.model_max_length
        if self.max_length < 3:
            raise CramkitError(f"max_length must be at least 3 tokens, got {self.max_length}")
        # a prompt model (finetune --prompt), or its export, reads its inputs through its template
        self.prompt: PromptSpec | None = src.prompt
        self._prompts()  # an embedding model's named prompts, checked once (a malformed entry: one line)

    def _compare_export(self, loaded: LoadedModel, exported: ExportedModel, texts: list[Any]) -> dict[str, Any]:
        """The check of an export made for this engine (``backend`` another format than the model's):
        ``cramkit.infer.engine.compare_outputs``, which needs the whole Engine."""
        raise NotImplementedError

    @property
    def hidden_size(self) -> int | None:
        return self.loaded.hidden

    def _prompts(self) -> tuple[dict[str, str], str | None]:
        """The model's recorded embedding prompts and its default prompt's name (a malformed entry: one line)."""
        from cramkit.model import embedding_prompts

        return embedding_prompts.recorded(self.loaded.extra, self.source)

    # ------------------------------------------------------------------------------ tokenisation

    def tokenize(
        self, inputs: Sequence[TextOrPair], max_length: int | None = None, *, truncate: bool = True
    ) -> Encoded:
        """Encode texts or (text_a, text_b) pairs; CramkitError naming the first bad input (or, with
        ``truncate=False``, the first one longer than the limit)."""
        a: list[str] = []
        b: list[str | None] = []
        for i, x in enumerate(inputs):
            if isinstance(x, str):
                a.append(x)
                b.append(None)
            elif isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(s, str) for s in x):
                a.append(x[0])
                b.append(x[1])
            else:
                raise CramkitError(f"input {i} is a {type(x).__name__}; give a string or a pair of strings")
        limit = max_length or self.max_length
        mask = special_token(self.tokenizer, "mask") if self.kind == "mlm" else None
        if mask is not None and mask != "[MASK]":  # cramkit's spelling of the blank, for RoBERTa's <mask> too
            a = [t.replace("[MASK]", mask) for t in a]
        if self.prompt is not None:
            from cramkit.data.prompts import encode_prompts

            enc = encode_prompts(self.tokenizer, self.prompt, a, b, limit)
        else:
            enc = encode_texts(self.tokenizer, a, b if any(s is not None for s in b) else None, limit)
        if not truncate and enc.truncated.any():
            i = int(np.flatnonzero(enc.truncated)[0])
            raise InputTooLong(
                f"input {i} is longer than the model's limit of {limit} tokens; shorten it or allow truncation"
            )
        return enc

    def tokenize_choices(
        self, contexts: Sequence[str], choices: Sequence[Sequence[str]], *, truncate: bool = True
    ) -> EncodedChoices:
        """Encode each context with each of its choices (a pair row per choice); CramkitError naming the
        first bad input (a context that is not a string, fewer than two choices, a choice not a string)."""
        if len(contexts) != len(choices):
            raise CramkitError(f"{len(contexts)} contexts but {len(choices)} lists of choices; give one per context")
        for i, (a, cs) in enumerate(zip(contexts, choices, strict=True)):
            if not isinstance(a, str):
                raise CramkitError(f"input {i}: the context is a {type(a).__name__}; give a string")
            if not isinstance(cs, (list, tuple)) or not all(isinstance(c, str) for c in cs):
                raise CramkitError(f"input {i}: the choices must be a list of strings")
            if len(cs) < MIN_CHOICES:
                raise CramkitError(f"input {i} has {len(cs)} choice(s); give at least {MIN_CHOICES}")
        enc = encode_choices(self.tokenizer, contexts, choices, self.max_length)
        if not truncate and enc.truncated.any():
            i = int(np.flatnonzero(enc.truncated)[0])
            raise InputTooLong(
                f"input {i} (with one of its choices) is longer than the model's limit of {self.max_length} "
                "tokens; shorten it or allow truncation"
            )
        return enc

    def _pad(self, enc: Encoded, rows: np.ndarray | None) -> forward.Inputs:
        return forward.pad(enc, rows, self.pad_id, self.with_types)

    @property
    def workers(self) -> int:
        """Forward passes the runtime runs at once (CTranslate2 on a CPU: one per thread; else 1)."""
        return int(getattr(self.runner, "workers", 1))

    def batches(self, enc: Encoded) -> list[np.ndarray]:
        """Length-sorted index batches within the token budget (each one :func:`fits`)."""
        return forward.passes(enc, self.max_batch_tokens)

    def expert_traffic(self) -> dict[str, int] | None:
        """Offloaded experts (``offload_experts``): how many were brought in and how many found resident,
        summed over the MoE layers since the engine started; None when the experts are resident."""
        if self.offload is None or self.model is None:
            return None
        from cramkit.model.moe import moe_layers

        stores = [m.store for m in moe_layers(self.model) if m.store is not None]
        return {"reads": sum(s.reads for s in stores), "hits": sum(s.hits for s in stores)}
