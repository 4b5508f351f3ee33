"""`cramkit serve` as a real subprocess on a free 127.0.0.1 port, spoken to over HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

import cramkit
from cramkit.infer import Engine
from infer.models import cli, sst2

KEY = "test-key-123"


class Server:
    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url = proc, url
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)

    def post(self, path: str, body: object = None, **kw: object) -> httpx.Response:
        if body is not None:
            kw["json"] = body
        return self.http.post(path, **kw)

    def alive_and_correct(self) -> None:
        """The server still answers a good request correctly."""
        r = self.post("/predict", {"inputs": "a gorgeous, witty film", "model": "ft"})
        assert r.status_code == 200 and {d["label"] for d in r.json()} == {"0", "1"}
        assert abs(sum(d["score"] for d in r.json()) - 1) < 1e-5


pytestmark = pytest.mark.smoke  # one real `cramkit serve` process per module, spoken to over HTTP


def start(*args: str, timeout: float = 120) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cramkit", "serve", *args, "--port", "0", "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"serving on (http://\S+)", line)
        if m:
            url = m.group(1)
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining
            while time.time() < deadline:
                try:
                    if httpx.get(url + "/health", timeout=5).status_code == 200:
                        return proc, url
                except httpx.HTTPError:
                    time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server did not start:\n" + "".join(lines))


@pytest.fixture(scope="module")
def server(ft_model, ft_onnx, pretrained_run):
    proc, url = start(
        f"ft={ft_model}",
        f"onnx={ft_onnx}",
        f"mlm={pretrained_run}",
        "--api-key",
        KEY,
        "--max-queue",
        "200",
        "--max-inputs",
        "1000",
        "--body-timeout",
        "1",
        "--max-wait-ms",
        "2",
    )
    srv = Server(proc, url)
    yield srv
    if proc.poll() is None:
        proc.terminate()
        proc.wait(30)


def test_answers_match_the_in_process_engine(server, ft_model, ft_onnx, glue_dir) -> None:
    dev = [s for s, _ in sst2(glue_dir, "dev")[:64]]
    r = server.post("/predict", {"inputs": dev, "model": "ft"})
    assert r.status_code == 200, r.text
    ours = Engine(cramkit.load(ft_model), device="cpu").classify(dev)
    got = r.json()
    assert [row[0]["label"] for row in got] == ours.labels
    p1 = np.asarray([{d["label"]: d["score"] for d in row}["1"] for row in got])
    assert np.abs(p1 - ours.probs[:, 1]).max() < 1e-5
    r = server.post("/embed", {"inputs": dev[:10], "model": "ft", "normalize": False, "pooling": "cls"})
    ref = Engine(cramkit.load(ft_model), device="cpu").embed(dev[:10], pooling="cls", normalize=False)
    assert np.abs(np.asarray(r.json()) - ref).max() < 1e-5
    # the ONNX export by query parameter, OpenAI-shaped
    r = server.post("/v1/embeddings?model=onnx", {"input": dev[:3]})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "list" and body["model"] == "onnx"
    vec = np.asarray([d["embedding"] for d in body["data"]])
    assert np.allclose(np.linalg.norm(vec, axis=1), 1, atol=1e-5) and body["usage"]["prompt_tokens"] > 3
    ref8 = Engine(ft_onnx, threads=1).embed(dev[:3], normalize=True)
    assert np.abs(vec - ref8).max() < 1e-5
    # a pair, as TEI reads ["a", "b"]; fill-mask from the pretraining run
    assert len(server.post("/predict", {"inputs": ["a film", "a movie"], "model": "ft"}).json()) == 2
    r = server.post("/fill-mask", {"inputs": "return the [MASK] value", "model": "mlm", "top_k": 3})
    assert r.status_code == 200 and len(r.json()) == 1 and len(r.json()[0]) == 3


def test_tokenize_gives_the_tokens_the_model_reads(server, ft_model) -> None:
    """TEI's /tokenize: ids, token texts, special flags and character offsets, cut at the model's limit."""
    text = "An unexpectedly touching film."
    r = server.post("/tokenize", {"inputs": [text, "a"], "model": "ft"})
    assert r.status_code == 200, r.text
    rows = r.json()
    tok = cramkit.load(ft_model).tokenizer
    enc = tok.encode(text)
    assert [t["id"] for t in rows[0]] == enc.ids and [t["text"] for t in rows[0]] == enc.tokens
    assert rows[0][0]["special"] and rows[0][0]["start"] is None and not rows[0][1]["special"]
    assert all(
        text[t["start"] : t["stop"]].lower() == t["text"].removeprefix("##") for t in rows[0] if not t["special"]
    )
    plain = server.post("/tokenize", {"inputs": "a", "add_special_tokens": False, "model": "ft"}).json()
    assert [t["text"] for t in plain[0]] == ["a"]
    long = server.post("/tokenize", {"inputs": "film " * 5000, "model": "ft"}).json()[0]
    assert len(long) == server.http.get("/info").json()["models"]["ft"]["max_length"] and long[-1]["text"] == "[SEP]"
    bad = server.post("/tokenize", {"inputs": [1], "model": "ft"})
    assert bad.status_code == 422
    server.alive_and_correct()


def test_truncation_is_reported(server) -> None:
    long = "a very long review of a film " * 200
    r = server.post("/embed", {"inputs": ["short", long], "model": "ft"})
    assert r.status_code == 200 and r.headers["x-truncated-inputs"] == "1"
    r = server.post("/embed", {"inputs": ["short", long], "model": "ft", "truncate": False})
    assert r.status_code == 413 and "input 1 is longer" in r.json()["error"]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b'{"inputs": ["a", ', 400, "not valid JSON"),
        (b'{"inputs": "caf\xe9"}', 400, "not valid UTF-8"),
        (b'["a"]', 422, "JSON object"),
        (b'{"inputs": [1, 2]}', 422, "inputs[0] is a number"),
        (b'{"inputs": {"a": 1}}', 422, "must be a string or a list"),
        (b'{"inputs": []}', 422, "empty list"),
        (b'{"text": "a"}', 422, "missing field 'inputs'"),
        (b'{"inputs": "a", "normalize": "yes"}', 422, "'normalize' must be true or false"),
        (b'{"inputs": "a", "model": "nope"}', 404, "unknown model 'nope'"),
        (b'{"inputs": "a", "model": "mlm", "pooling": "max"}', 422, "'pooling' must be"),
    ],
)
def test_bad_requests_get_a_json_error_and_the_server_stays_up(server, body, status, needle) -> None:
    r = server.post("/embed", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert needle in r.json()["error"] and r.json()["error_type"]
    server.alive_and_correct()


def test_two_texts_to_a_single_text_model_are_not_read_as_a_pair(server) -> None:
    """TEI reads a flat list of two strings as one pair; a model fine-tuned on single texts says so (422)
    instead of scoring a pair it never saw, and takes the two texts as [["a"], ["b"]]."""
    r = server.post("/predict", {"inputs": ["a gorgeous film", "a dull film"], "model": "ft"})
    assert r.status_code == 422 and "fine-tuned on single texts" in r.json()["error"]
    r = server.post("/predict", {"inputs": [["a gorgeous film"], ["a dull film"]], "model": "ft"})
    assert r.status_code == 200 and len(r.json()) == 2
    server.alive_and_correct()


def test_limits(server) -> None:
    r = server.post("/embed", {"inputs": "x" * 10_000_000})  # 10 MB string
    assert r.status_code == 413 and "payload" in r.json()["error"]
    r = server.post("/embed", {"inputs": ["word"] * 10_000})
    assert r.status_code == 413 and "10000 inputs" in r.json()["error"]
    r = server.post("/embed", {"inputs": ["x" * 60_000]})
    assert r.status_code == 413 and "characters" in r.json()["error"]
    r = server.post("/predict", {"inputs": "fine", "model": "mlm"})
    assert r.status_code == 422 and "cannot do classification" in r.json()["error"]
    r = httpx.post(server.url + "/embed", json={"inputs": "a"})  # no key
    assert r.status_code == 401 and r.json()["error_type"] == "Unauthorized"
    r = server.post("/search", {"inputs": "a"})
    assert r.status_code == 404 and "--index" in r.json()["error"]
    r = server.http.get("/nowhere")
    assert r.status_code == 404 and r.json()["error_type"] == "NotFound"
    server.alive_and_correct()


def test_a_slow_client_gets_408(server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            f"POST /embed HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            'Content-Length: 100\r\n\r\n{"inputs": '.encode()
        )
        answer = b""
        while b"}" not in answer:  # the server gives up after --body-timeout 1
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
        answer = answer.decode()
    assert answer.startswith("HTTP/1.1 408") and "did not arrive" in answer
    server.alive_and_correct()


def test_a_flood_past_the_queue_gets_429_and_the_rest_succeed(server, glue_dir) -> None:
    dev = [s for s, _ in sst2(glue_dir, "dev")[:100]]
    codes: list[int] = []

    def hit() -> None:
        r = server.post("/embed", {"inputs": dev, "model": "ft"})
        codes.append(r.status_code)
        if r.status_code == 200:
            assert len(r.json()) == 100
        else:
            assert r.json()["error_type"] == "Overloaded" and r.headers.get("retry-after") == "1"

    threads = [threading.Thread(target=hit) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(codes) <= {200, 429} and 429 in codes and 200 in codes, codes
    server.alive_and_correct()
    metrics = server.http.get("/metrics").text
    assert 'cramkit_rejected_total{reason="queue_full"}' in metrics


def test_info_health_metrics_docs(server) -> None:
    info = server.http.get("/info").json()
    assert info["model_id"] == "ft" and set(info["models"]) == {"ft", "onnx", "mlm"}
    assert info["models"]["onnx"]["backend"] == "onnx" and info["models"]["onnx"]["precision"] == "fp32"
    assert info["model_type"]["classifier"]["id2label"] == {"0": "0", "1": "1"}
    assert httpx.get(server.url + "/health").json()["status"] == "ok"  # open without the key
    m = server.http.get("/metrics").text
    for name in (
        "cramkit_requests_total",
        "cramkit_request_duration_seconds_bucket",
        "cramkit_queue_depth",
        "cramkit_batch_tokens_bucket",
        "cramkit_inference_seconds_bucket",
    ):
        assert name in m, name
    assert 'route="/embed",status="413"' in m
    doc = httpx.get(server.url + "/openapi.json").json()
    assert {"/embed", "/predict", "/v1/embeddings", "/fill-mask"} <= set(doc["paths"])
    assert "inputs" in json.dumps(doc["paths"]["/embed"])
    assert httpx.get(server.url + "/docs").status_code == 200


def test_zz_graceful_shutdown_finishes_in_flight_requests(server, glue_dir) -> None:
    dev = [s for s, _ in sst2(glue_dir, "dev")[:800]]
    result: dict[str, object] = {}

    def long_request() -> None:
        try:
            result["r"] = server.post("/embed", {"inputs": dev, "model": "ft"})
        except httpx.HTTPError as exc:
            result["r"] = exc

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.5)
    server.proc.send_signal(signal.SIGTERM)
    t.join(60)
    r = result["r"]
    assert isinstance(r, httpx.Response) and r.status_code == 200 and len(r.json()) == 800
    assert server.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has finished


def test_command_line_errors_are_one_line(ft_model, tmp_path: Path) -> None:
    proc = cli("serve", str(tmp_path / "missing"), "--port", "0")
    assert proc.returncode == 2 and "no such file or directory" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("serve", str(ft_model), f"x={ft_model}", str(ft_model), "--port", "0")
    assert proc.returncode == 2 and "two models are named" in proc.stderr
    proc = cli("serve", str(ft_model), "--port", "0", "--index", str(tmp_path / "no-index"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "index" in proc.stderr
    proc = cli("serve", str(ft_model), "--port", "0", "--threads", "-1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--threads must be at least 1" in proc.stderr
