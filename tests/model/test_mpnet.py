"""The real all-mpnet-base-v2 (MPNet, 110M: the strong teacher of issue 63), assembled from the package registry:
its sentence embeddings through cramkit equal sentence-transformers' own, and its export reads back in
sentence-transformers and transformers as the same model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cramkit.cli import main as cli_main

pytestmark = pytest.mark.slow


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_mpnet_embeds_as_sentence_transformers_and_exports_back(
    mpnet_dir: Path, builtin_docs: list[str], tmp_path: Path
) -> None:
    st = pytest.importorskip("sentence_transformers")
    from cramkit.infer import Engine
    from cramkit.loading import load

    # real prose: short lines, and paragraphs past the model's 384-token limit (cut there by both)
    texts = [d.split("\n")[0][:200] for d in builtin_docs[:48]] + [" ".join(builtin_docs[i : i + 20]) for i in (0, 40)]
    loaded = load(f"hf:{mpnet_dir}")
    assert loaded.config.hf_model_type == "mpnet" and loaded.pooling == "mean" and loaded.normalize
    assert loaded.max_length == 384  # sentence_bert_config.json's max_seq_length
    ours = np.asarray(Engine(loaded, precision="fp32").embed(texts))
    reference = st.SentenceTransformer(str(mpnet_dir), device="cpu")
    theirs = reference.encode(texts, convert_to_numpy=True)
    assert _cosines(ours, theirs).min() >= 0.99999

    out = tmp_path / "export"
    assert cli_main(["export", f"hf:{mpnet_dir}", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["MPNetModel"]
    again = st.SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    assert _cosines(again, theirs).min() >= 0.99999
    import transformers

    base, back = (transformers.AutoModel.from_pretrained(p) for p in (mpnet_dir, out))
    assert (base.pooler.dense.weight == back.pooler.dense.weight).all()  # the base model's pooler kept
