"""``CramkitEmbedder``: cramkit's encoder as a callable class for batch engines (Ray Data's ``map_batches``).

    import ray
    from cramkit.embeddings import CramkitEmbedder

    ds = ray.data.read_parquet("texts/")                     # a column "text"
    ds = ds.map_batches(CramkitEmbedder, fn_constructor_kwargs={"model": "hf:models/minilm"},
                        batch_format="pandas", batch_size=256, concurrency=4)
    ds.write_parquet("embedded/")                            # the rows, plus a column "vector"

Each actor builds one instance: the model is loaded once, in ``__init__``, and every batch goes through the
same engine as ``cramkit embed`` (same tokenizer, truncation, pooling and normalisation), so the vectors
equal those of ``cramkit embed`` on the same texts.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from cramkit.errors import CramkitError


class CramkitEmbedder:
    """Adds ``vector_column`` (float32 [dim] per row) to a batch that has ``text_column``.

    model: anything ``cramkit.load`` opens (a run, a model directory, ``hf:DIR``, an export).
    pooling / normalize: default the model's (as ``cramkit embed``). device: ``auto``, ``cpu``, ``cuda``...
    threads: torch intra-op threads for this actor (default: left as it is; Ray sets one per CPU it gives).
    prompt_name: one of the model's named prompts put before each text (default: its default prompt, if any).
    A batch is a pandas DataFrame (``batch_format="pandas"``) or a dict of numpy arrays (``"numpy"``,
    Ray's default); the same kind comes back, with every input column kept.
    """

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        text_column: str = "text",
        vector_column: str = "vector",
        pooling: str | None = None,
        normalize: bool | None = None,
        device: str = "auto",
        max_batch_tokens: int | None = None,
        threads: int | None = None,
        prompt_name: str | None = None,
    ) -> None:
        from cramkit.embeddings.encoder import load_encoder
        from cramkit.infer import Engine

        if threads is not None:
            import torch

            torch.set_num_threads(int(threads))
        self.loaded = load_encoder(str(model))
        self.engine = Engine(self.loaded, device=device, max_batch_tokens=max_batch_tokens)
        self.pooling = self.engine.check_pooling(pooling or self.loaded.pooling)
        self.normalize = bool(self.loaded.normalize if normalize is None else normalize)
        self.prompt = self.engine.prompt_text(prompt_name)  # as cramkit embed --prompt-name (default: the model's)
        self.text_column, self.vector_column = text_column, vector_column
        self.dim = int(self.engine.hidden_size or 0)

    def embed(self, texts: list[str]) -> np.ndarray:
        """float32 [len(texts), dim]."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return self.engine.embed(texts, pooling=self.pooling, normalize=self.normalize, prompt=self.prompt)

    @staticmethod
    def _texts(column: Any) -> list[str]:
        return [str(t) if t is not None else "" for t in list(column)]

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, dict):
            if self.text_column not in batch:
                raise CramkitError(
                    f"the batch has no column {self.text_column!r} (it has {', '.join(map(str, batch))}); "
                    "pass fn_constructor_kwargs={'text_column': NAME}"
                )
            out = dict(batch)
            out[self.vector_column] = self.embed(self._texts(batch[self.text_column]))
            return out
        columns = getattr(batch, "columns", None)
        if columns is None:
            raise CramkitError(
                f"CramkitEmbedder takes a pandas DataFrame or a dict of numpy arrays, not {type(batch).__name__}; "
                "use batch_format='pandas' or 'numpy'"
            )
        if self.text_column not in columns:
            raise CramkitError(
                f"the batch has no column {self.text_column!r} (it has {', '.join(map(str, columns))}); "
                "pass fn_constructor_kwargs={'text_column': NAME}"
            )
        vecs = self.embed(self._texts(batch[self.text_column]))
        out = batch.copy()
        out[self.vector_column] = list(vecs)
        return out
