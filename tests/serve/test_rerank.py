"""A cross-encoder through `cramkit serve /rerank` (TEI's shape) against the same model scored in Python: a
model `cramkit finetune` made on MRPC's pairs from a run `cramkit pretrain` made."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

import cramkit
from cramkit.errors import CramkitError
from cramkit.infer import Engine
from infer.models import cli
from serve.test_server import start

pytestmark = pytest.mark.integration  # a `cramkit serve` process


@pytest.fixture(scope="module")
def cross_encoder(pretrained_run: Path, glue_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rerank") / "mrpc"
    proc = cli(
        "finetune",
        *("--task", "glue/mrpc", "--from", str(pretrained_run), "--data-dir", str(glue_dir), "--out", str(out)),
        *("--set", "max_train_examples=64", "--set", "max_eval_examples=32", "--set", "epochs=1"),
        *("--set", "min_steps=0", "--seeds", "0", "--no-progress"),
    )
    assert proc.returncode == 0, proc.stderr
    return out


def test_rerank_answers_as_the_engine_scores(cross_encoder: Path, pretrained_run: Path) -> None:
    query = "The company said its profit rose sharply in the third quarter."
    texts = [
        "Profits at the company rose sharply in the third quarter, it said.",
        "The weather in the north will be cold and wet.",
        "Shares fell after the report.",
        "Its third-quarter profit rose sharply, the company said.",
    ]
    eng = Engine(cramkit.load(cross_encoder), device="cpu")
    assert eng.can_rerank
    want = eng.relevance(eng.logits([(query, t) for t in texts]))
    assert eng.rerank(query, texts) == [int(i) for i in np.argsort(-want, kind="stable")]
    server, url = start(f"ce={cross_encoder}", f"mlm={pretrained_run}")
    try:
        r = httpx.post(f"{url}/rerank", json={"query": query, "texts": texts, "return_text": True}, timeout=60)
        assert r.status_code == 200, r.text
        got = r.json()
        assert [g["index"] for g in got] == eng.rerank(query, texts)
        assert np.allclose([g["score"] for g in got], want[[g["index"] for g in got]], atol=1e-5)
        assert all(0 <= g["score"] <= 1 and g["text"] == texts[g["index"]] for g in got)
        raw = httpx.post(f"{url}/rerank", json={"query": query, "texts": texts, "raw_scores": True}, timeout=60).json()
        assert np.allclose(sorted(g["score"] for g in raw), sorted(np.log(want / (1 - want))), atol=1e-3)
        for body, status, needle in (
            ({"query": query, "texts": texts, "model": "mlm"}, 422, "cannot do reranking"),
            ({"texts": texts}, 422, "'query'"),
            ({"query": query, "texts": []}, 422, "empty list"),
            ({"query": query, "texts": [1]}, 422, "texts[0]"),
        ):
            bad = httpx.post(f"{url}/rerank", json=body, timeout=60)
            assert bad.status_code == status and needle in bad.json()["error"], bad.text
        assert httpx.post(f"{url}/rerank", json={"query": query, "texts": texts[:1]}, timeout=60).status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=30)
    with pytest.raises(CramkitError, match="not a cross-encoder"):
        Engine(cramkit.load(pretrained_run), device="cpu").rerank(query, texts)
