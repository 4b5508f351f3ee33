"""/tokenize's answer bounded like its request (issue 50, case 7): 40 texts of 49,000 characters with
``truncate: false`` (a 1.96 MB body) were answered with 146 MB of tokens in 28 s, and four such requests took
the server from 1.4 to 4.5 GB. Now an answer holds at most the model's max_length tokens per input, as /embed
reads them; beyond, 413 before a token is listed. In-process (Starlette's TestClient), the real app."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from cramkit.infer import Engine
from cramkit.serve.app import create_app


@pytest.fixture(scope="module")
def client(ft_model):
    with TestClient(create_app({"ft": Engine(ft_model, device="cpu")})) as c:
        yield c


def test_untruncated_long_texts_are_refused_with_413_not_listed(client) -> None:
    text = ("an unexpectedly touching film about nothing much " * 1000)[:49_000]
    body = {"inputs": [text] * 40, "truncate": False}
    r = client.post("/tokenize", json=body)
    assert r.status_code == 413, r.text[:500]
    err = r.json()["error"]
    assert "truncate: true" in err and "40 inputs" in err and len(r.content) < 1000
    # the same texts cut at the model's limit: answered, each input at most max_length tokens
    limit = client.get("/info").json()["models"]["ft"]["max_length"]
    r = client.post("/tokenize", json={"inputs": [text] * 40})
    assert r.status_code == 200 and [len(x) for x in r.json()] == [limit] * 40
    assert len(r.content) < 40 * limit * 120  # about 70 bytes a token: the answer is bounded like the request
    # short texts need no truncation to be answered in full
    r = client.post("/tokenize", json={"inputs": ["a fine film"] * 3, "truncate": False})
    assert r.status_code == 200 and all(x[0]["special"] and len(x) < 10 for x in r.json())
    assert client.get("/health").status_code == 200
