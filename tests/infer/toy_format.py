"""A toy export format in one file, as docs/extending.md describes: ``bag``, a bag of embeddings.

It keeps the model's word-embedding table and, for a classifier, its linear classifier; its runtime
(numpy) pools the embeddings of the tokens (no transformer) and applies the classifier to the mean. It is
not faithful to the torch model (``tolerance = None``: the check is recorded, not enforced), which is
what a toy may be. Registered by ``register(BagBackend)`` in-process, or by an installed package's entry
point in the group ``cramkit.backends`` (``bag = "toy_format:BagBackend"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cramkit.backends import Backend, ExportedModel, ExportJob
from cramkit.errors import CramkitError

WEIGHTS = "bag.safetensors"


class BagRunner:
    name = "bag"
    precision = "fp32"

    def __init__(self, model: ExportedModel) -> None:
        self.model = model
        self.table = model.handle["word"]
        self.classifier = (model.handle.get("classifier.weight"), model.handle.get("classifier.bias"))

    def pooled(self, x: dict[str, np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
        ids = x["input_ids"]
        mask = x["attention_mask"]
        mask = np.ones(ids.shape, np.float32) if mask is None else mask.astype(np.float32)
        vectors = self.table[ids]
        mean = (vectors * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1.0)
        return mean.astype(np.float32), vectors[:, 0].astype(np.float32)

    def logits(self, x: dict[str, np.ndarray | None]) -> np.ndarray:
        weight, bias = self.classifier
        if weight is None:
            raise CramkitError(f"{self.model.path}: this bag has no classifier")
        return (self.pooled(x)[0] @ weight.T + bias).astype(np.float32)

    def mask_topk(self, x: dict[str, np.ndarray | None], where: np.ndarray, k: int) -> tuple[Any, Any]:
        raise CramkitError(f"{self.model.path}: a bag of embeddings cannot fill masks")


class BagBackend(Backend):
    name = "bag"
    title = "bag-of-embeddings"
    marker = "cramkit-bag.json"
    format = "cramkit-bag-1"
    tolerance = None
    exported_kinds = ("encoder", "classifier")
    required_files = (WEIGHTS,)

    def incompatibilities(self, loaded: Any) -> list[str]:
        if loaded.encoder is None:
            return ["it has no word embeddings"]
        if loaded.kind not in ("encoder", "mlm", "classifier"):
            return [f"a {loaded.kind} model is not a bag"]
        return []

    def exported_kind(self, loaded: Any) -> str:
        return "encoder" if loaded.kind == "mlm" else loaded.kind

    def write(self, job: ExportJob) -> None:
        from safetensors.numpy import save_file

        model = job.loaded.model
        tensors = {"word": job.loaded.encoder.embeddings.word.weight.detach().float().numpy().copy()}
        if job.manifest["kind"] == "classifier":
            tensors["classifier.weight"] = model.classifier.weight.detach().float().numpy().copy()
            tensors["classifier.bias"] = model.classifier.bias.detach().float().numpy().copy()
        save_file(tensors, str(job.tmp / WEIGHTS))
        job.files = [WEIGHTS]
        job.say(f"wrote a bag of {tensors['word'].shape[0]} embeddings")

    def open(self, path: Path, meta: dict[str, Any], files: dict[str, bytes], threads: int | None) -> Any:
        from safetensors.numpy import load

        return load(files[WEIGHTS])

    def runner(self, model: ExportedModel) -> BagRunner:
        return BagRunner(model)
