"""`cramkit serve` at its base URL, as a text-embeddings-inference server is called: huggingface_hub's own
``InferenceClient(model=URL)`` posts ``feature_extraction`` and ``text_classification`` to ``/``, SageMaker
to ``/invocations`` (issue 66, item 16); and a model that answers NaN is a 500 naming it, the server up
(issue 66, item 6). Real servers as subprocesses on a free 127.0.0.1 port, spoken to over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from infer.test_nonfinite import HUGE_TOKEN, huge_row_model
from serve.test_rerank import cross_encoder  # noqa: F401  (the fixture: a cross-encoder fine-tuned on MRPC)
from serve.test_server import start

pytestmark = pytest.mark.integration  # `cramkit serve` processes

QUERY = "The company said its profit rose sharply in the third quarter."
PASSAGES = [
    "The weather in the north will be cold and wet.",
    "Its third-quarter profit rose sharply, the company said.",
    "Shares fell after the report.",
]


def _serve(*models: str) -> Iterator[str]:
    proc, url = start(*models)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def embedder(pretrained_run: Path) -> Iterator[str]:
    """A server whose (only) model embeds: a pretraining run."""
    yield from _serve(f"emb={pretrained_run}")


@pytest.fixture(scope="module")
def classifiers(ft_model: Path, cross_encoder: Path, tmp_path_factory) -> Iterator[str]:  # noqa: F811
    """A server whose first model classifies, with a cross-encoder and a model that overflows on one token."""
    bad = huge_row_model(ft_model, tmp_path_factory.mktemp("huge") / "huge")
    yield from _serve(f"ft={ft_model}", f"ce={cross_encoder}", f"bad={bad}")


@pytest.fixture
def client(monkeypatch) -> type:
    """huggingface_hub's InferenceClient, allowed to reach 127.0.0.1 (the tests run with HF_HUB_OFFLINE=1)."""
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return InferenceClient


def test_feature_extraction_at_the_base_url_is_embed(embedder: str, client) -> None:
    text = "the value of the key is returned"
    got = client(model=embedder).feature_extraction(text)
    want = np.asarray(httpx.post(f"{embedder}/embed", json={"inputs": text}, timeout=60).json(), np.float32)
    assert got.shape == want.shape == (1, want.shape[1]) and np.array_equal(got, want)
    # TEI's parameters at the top level of the body, as huggingface_hub sends them
    raw = client(model=embedder).feature_extraction([text, "a list"], normalize=False)
    want = httpx.post(f"{embedder}/embed", json={"inputs": [text, "a list"], "normalize": False}, timeout=60).json()
    assert np.array_equal(raw, np.asarray(want, np.float32)) and abs(np.linalg.norm(raw[0]) - 1) > 1e-3
    # SageMaker's route is the same
    same = httpx.post(f"{embedder}/invocations", json={"inputs": text}, timeout=60)
    assert same.status_code == 200 and np.array_equal(np.asarray(same.json(), np.float32), got)


def test_text_classification_at_the_base_url_is_predict(classifiers: str, client) -> None:
    text = "a gorgeous, witty film"
    got = client(model=classifiers).text_classification(text)
    want = httpx.post(f"{classifiers}/predict", json={"inputs": text}, timeout=60).json()
    assert isinstance(got, list) and [(g.label, g.score) for g in got] == [(w["label"], w["score"]) for w in want]
    assert {g.label for g in got} == {"0", "1"} and abs(sum(g.score for g in got) - 1) < 1e-5
    # the Inference API's parameters
    top = client(model=classifiers).text_classification(text, top_k=1)
    assert [(g.label, g.score) for g in top] == [(want[0]["label"], want[0]["score"])]
    raw = client(model=classifiers).text_classification(text, function_to_apply="none")
    logits = httpx.post(f"{classifiers}/predict", json={"inputs": text, "raw_scores": True}, timeout=60).json()
    assert [(g.label, g.score) for g in raw] == [(w["label"], w["score"]) for w in logits]
    # several inputs: a list of labels per input, as /predict answers them; /invocations the same
    texts = [["a gorgeous, witty film"], ["a dull mess"]]
    many = httpx.post(f"{classifiers}/invocations", json={"inputs": texts}, timeout=60)
    assert many.status_code == 200
    assert many.json() == httpx.post(f"{classifiers}/predict", json={"inputs": texts}, timeout=60).json()


def test_a_cross_encoder_reranks_at_the_base_url(classifiers: str) -> None:
    body = {"query": QUERY, "texts": PASSAGES, "model": "ce", "return_text": True}
    got = httpx.post(f"{classifiers}/", json=body, timeout=60)
    assert got.status_code == 200, got.text
    assert got.json() == httpx.post(f"{classifiers}/rerank", json=body, timeout=60).json()
    assert {g["index"] for g in got.json()} == {0, 1, 2} and all("text" in g for g in got.json())
    # given inputs instead of a query, the cross-encoder classifies its pairs
    pairs = httpx.post(f"{classifiers}/?model=ce", json={"inputs": [[QUERY, PASSAGES[1]]]}, timeout=60)
    assert pairs.status_code == 200 and len(pairs.json()) == 1 and len(pairs.json()[0]) == 2


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{", 400, "not valid JSON"),
        (b"[1]", 422, "JSON object"),
        (b"{}", 422, "missing field 'inputs'"),
        (b'{"inputs": 3}', 422, "'inputs' must be"),
        (b'{"inputs": []}', 422, "empty list"),
        (b'{"inputs": "x", "parameters": 3}', 422, "'parameters' must be an object"),
        (b'{"inputs": "x", "parameters": {"top_k": -1}}', 422, "'top_k'"),
        (b'{"inputs": "x", "parameters": {"function_to_apply": "relu"}}', 422, "'function_to_apply'"),
        (b'{"inputs": "x", "model": "nope"}', 404, "unknown model"),
        (b'{"query": "q", "texts": [], "model": "ce"}', 422, "empty list"),
    ],
)
def test_malformed_bodies_at_the_base_url_are_4xx_and_the_server_stays_up(
    classifiers: str, body: bytes, status: int, needle: str
) -> None:
    for path in ("/", "/invocations"):
        r = httpx.post(f"{classifiers}{path}", content=body, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == status and needle in r.json()["error"], r.text
    assert httpx.post(f"{classifiers}/", json={"inputs": "a film"}, timeout=60).status_code == 200


def test_a_model_that_answers_nan_is_a_500_naming_it_and_the_server_stays_up(classifiers: str) -> None:
    """Issue 66, item 6: finite weights whose forward pass overflows on one token; every route that runs the
    model answers 500 naming it, the next good request (to it or another model) is answered."""
    bad = f"the {HUGE_TOKEN} of the key is returned"
    for path, body in (
        ("/predict", {"inputs": bad, "model": "bad"}),
        ("/embed", {"inputs": [bad, "a film"], "model": "bad"}),
        ("/v1/embeddings", {"input": bad, "model": "bad"}),
        ("/", {"inputs": bad, "model": "bad"}),
    ):
        r = httpx.post(f"{classifiers}{path}", json=body, timeout=60)
        assert r.status_code == 500, (path, r.text)
        error = r.json()["error"]
        assert "'bad'" in error and "NaN or infinity" in error and "\n" not in error, error
        assert r.json()["error_type"] == "Backend"
    good = httpx.post(f"{classifiers}/predict", json={"inputs": "a gorgeous film", "model": "bad"}, timeout=60)
    assert good.status_code == 200 and all(np.isfinite(d["score"]) for d in good.json())
    assert httpx.post(f"{classifiers}/predict", json={"inputs": "a film"}, timeout=60).status_code == 200
    assert httpx.get(f"{classifiers}/health", timeout=60).json()["status"] == "ok"
    assert httpx.get(f"{classifiers}/ping", timeout=60).json()["status"] == "ok"  # SageMaker's health check
