"""What ``cramkit.load`` returns for a torch model: the model with everything needed to feed it and read its
output, and the model directory it saves (``cramkit-model.json`` + ``model.safetensors`` + ``tokenizer/``).

It sits below the loader and the export formats, which both take it (``cramkit.backends`` exports one).
No torch at import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.text.tokenizer import special_id

if TYPE_CHECKING:
    import torch
    from torch import nn

    from cramkit.data.prompts import PromptSpec
    from cramkit.model.encoder import Encoder
    from cramkit.model.forward import TorchRunner

MODEL_FILE = "cramkit-model.json"
MODEL_FORMAT = "cramkit-model-1"
PathLike = str | os.PathLike


@dataclass
class LoadedModel:
    """A model ready for inference, with everything needed to feed it and read its output."""

    model: nn.Module
    kind: str
    config: Any  # ModelConfig, or a student's config dict
    tokenizer: Any  # tokenizers.Tokenizer (no truncation or padding set)
    labels: list[str] | None = None
    task: str | None = None
    max_length: int = 512
    pooling: str = "mean"
    normalize: bool = False
    with_types: bool = False
    source: str = ""
    architecture: str = "encoder"
    head: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # BERT's pooler (dense + tanh over [CLS]) of a checkpoint whose model holds none (an HF BertModel):
    # fine-tuning starts its classifier's pooler from it, as BertForSequenceClassification does
    pooler_state: dict[str, Any] | None = None
    # the one safetensors file the weights were read from (None: a checkpoint, sharded files, ...) and its
    # SHA-256 when one was recorded beside it
    weights_file: Path | None = None
    weights_sha256: str | None = None

    def weights_digest(self) -> str | None:
        """The SHA-256 of the weights file (the recorded one, else computed now); None without one file."""
        if self.weights_sha256 is None and self.weights_file is not None:
            from cramkit.io import sha256_file

            self.weights_sha256 = sha256_file(self.weights_file)
        return self.weights_sha256

    @property
    def encoder(self) -> Encoder | None:
        from cramkit.model.encoder import Encoder

        if isinstance(self.model, Encoder):
            return self.model
        enc = getattr(self.model, "encoder", None)
        return enc if isinstance(enc, Encoder) else None

    @property
    def num_labels(self) -> int | None:
        if self.kind in ("classifier", "multilabel"):
            return len(self.labels or []) or getattr(self.model, "num_labels", None)
        return 1 if self.kind in ("regression", "multiple_choice") else None

    @property
    def pad_id(self) -> int:
        pad = special_id(self.tokenizer, "pad")
        return int(pad) if pad is not None else int(getattr(self.config, "pad_token_id", 0) or 0)

    @property
    def can_embed(self) -> bool:
        return self.encoder is not None

    @property
    def prompt(self) -> PromptSpec | None:
        """A prompt model's template and label words (finetune --prompt): its inputs are read through them."""
        return getattr(self.model, "spec", None)

    @property
    def hidden(self) -> int | None:
        return getattr(self.config, "hidden", None)

    backend_name = "torch"

    def runner(self, device: str | torch.device | None = "auto", precision: str = "auto") -> TorchRunner:
        """Forward passes on numpy batches, on ``device`` (what :class:`~cramkit.infer.Engine` runs)."""
        from cramkit.model.forward import TorchRunner

        return TorchRunner(self.model, device, precision, encoder=self.encoder)

    def as_encoder(self, model: Any, **changes: Any) -> LoadedModel:
        """This model's tokenizer and settings around ``model``, a new bare encoder (an embedding model trained
        from it): no head, labels or task, and no weights file yet; ``changes`` (its config, max_length, pooling,
        extra, ...) on top."""
        import dataclasses

        bare = {"kind": "encoder", "architecture": "encoder", "labels": None, "task": None, "head": None}
        unsaved = {"pooler_state": None, "weights_file": None, "weights_sha256": None}
        return dataclasses.replace(self, model=model, **{**bare, **unsaved, **changes})

    def to(self, device: str | torch.device) -> LoadedModel:
        self.model.to(device)
        return self

    def meta(self) -> dict[str, Any]:
        """The JSON written to ``cramkit-model.json`` (without the weights' checksum)."""
        cfg = self.config
        if hasattr(cfg, "__dataclass_fields__"):
            import dataclasses

            cfg = dataclasses.asdict(cfg)
            cfg["gradient_checkpointing"] = False
        return {
            "format": MODEL_FORMAT,
            "architecture": self.architecture,
            "kind": self.kind,
            "model": cfg,
            "head": self.head,
            "num_labels": self.num_labels,
            "labels": self.labels,
            "task": self.task,
            "max_length": int(self.max_length),
            "pooling": self.pooling,
            "normalize": self.normalize,
            "with_types": self.with_types,
            "extra": self.extra,
        }

    def save(self, out: PathLike) -> Path:
        """Write a model directory at ``out`` (other files already there are kept).

        ``cramkit-model.json`` goes first out and last in: a crash midway leaves no file that claims a
        complete model."""
        from safetensors.torch import save_file

        from cramkit.io import atomic_path, sha256_file, write_json_atomic
        from cramkit.text.tokenizer import save_tokenizer

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / MODEL_FILE).unlink(missing_ok=True)
        own = getattr(self.model, "own_state", None)  # a deep-prompt model: its prefixes and head only
        state = unique_tensors(own() if callable(own) else self.model.state_dict())
        with atomic_path(out / "model.safetensors") as tmp:
            save_file(
                {k: v.detach().to("cpu").contiguous() for k, v in state.items()},
                str(tmp),
                metadata={"format": MODEL_FORMAT},
            )
        with atomic_path(out / "tokenizer") as tmp:
            save_tokenizer(self.tokenizer, tmp)
        meta = self.meta() | {"sha256": {"model.safetensors": sha256_file(out / "model.safetensors")}}
        write_json_atomic(out / MODEL_FILE, meta)
        return out


def unique_tensors(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop aliases of tied weights (safetensors refuses shared storage); the first name is kept."""
    out, seen = {}, set()
    for name, t in sd.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = t
    return out
