"""The app in-process (starlette's TestClient): /search with an index, and the batcher's merging."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from starlette.testclient import TestClient

from cramkit.errors import CramkitError
from cramkit.infer import Engine
from cramkit.serve import Limits, create_app


class StubIndex:
    """What cramkit.index.open(IDX) returns: search(texts, k) -> per query a list of hits."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    def search(self, texts: list[str], k: int) -> list[list[dict]]:
        if any(not t.strip() for t in texts):
            raise CramkitError("an empty query; give text to search for")
        self.calls.append((texts, k))
        return [
            [{"score": 1.0 / (i + 1), "text": f"{t} {i}", "doc": i, "source": "stub"} for i in range(k)] for t in texts
        ]


@pytest.fixture(scope="module")
def engine(ft_model):
    return Engine(ft_model, device="cpu")


def test_search_route_calls_the_index(engine) -> None:
    index = StubIndex()
    with TestClient(create_app({"ft": engine}, index=index, index_path="IDX")) as client:
        r = client.post("/search", json={"inputs": ["good film", "bad film"], "k": 3})
        assert r.status_code == 200 and [len(h) for h in r.json()] == [3, 3]
        assert r.json()[0][0] == {"score": 1.0, "text": "good film 0", "doc": 0, "source": "stub"}
        assert index.calls == [(["good film", "bad film"], 3)]
        assert client.post("/search", json={"inputs": "one"}).json()[0]["source"] == "stub"  # k=10 default
        r = client.post("/search", json={"inputs": " "})
        assert r.status_code == 422 and "empty query" in r.json()["error"]
        assert client.post("/search", json={"inputs": "a", "k": 0}).status_code == 422
        assert client.get("/info").json()["index"] == "IDX"


def test_concurrent_requests_are_merged_and_answered_in_order(engine) -> None:
    texts = [f"review number {i} of a film that was {'good' if i % 2 else 'bad'}" for i in range(64)]
    ref = engine.embed(texts, normalize=True)
    app = create_app({"ft": engine}, max_wait_ms=50, limits=Limits(max_queue=10_000))
    out: dict[int, list] = {}
    with TestClient(app) as client:

        def one(i: int) -> None:
            out[i] = client.post("/embed", json={"inputs": texts[i : i + 4]}).json()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(0, 64, 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        metrics = client.get("/metrics").text
    got = np.concatenate([np.asarray(out[i]) for i in range(0, 64, 4)])
    assert np.abs(got - ref).max() < 1e-5
    # 16 requests arrived within the 50 ms wait: fewer forward calls than requests
    calls = float(
        next(line.split()[-1] for line in metrics.splitlines() if line.startswith("cramkit_batch_requests_count"))
    )
    assert calls < 16, metrics


def test_the_batcher_forms_each_forward_pass_and_the_engine_runs_it_as_it_is(ft_model, glue_dir) -> None:
    from infer.models import sst2

    engine = Engine(ft_model, device="cpu", max_batch_tokens=256)
    passes: list[tuple[int, int]] = []
    pooled = engine.runner.pooled

    def counted(x: dict) -> tuple:
        passes.append(x["input_ids"].shape)
        return pooled(x)

    engine.runner.pooled = counted
    texts = [s for s, _ in sst2(glue_dir, "dev")[:96]]
    ref = Engine(ft_model, device="cpu").embed(texts, normalize=True)
    app = create_app({"ft": engine}, max_wait_ms=50, limits=Limits(max_queue=10_000))
    out: dict[int, list] = {}
    with TestClient(app) as client:

        def one(i: int) -> None:
            out[i] = client.post("/embed", json={"inputs": texts[i : i + 24]}).json()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(0, 96, 24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        batcher = app.state.batchers["ft"]  # the Gate in front of the app holds the server state
        formed = batcher.batches
    got = np.concatenate([np.asarray(out[i]) for i in range(0, 96, 24)])
    assert np.abs(got - ref).max() < 1e-5
    # every pass the batcher formed ran once, as it was: within the budget of padded tokens
    assert len(passes) == formed and all(rows * width <= 256 for rows, width in passes), passes
    assert formed >= 2  # 96 sentences do not fit one pass of 256 tokens


def test_the_log_says_one_line_per_kind_per_second(capsys) -> None:
    from cramkit.serve.app import LogLimiter

    log = LogLimiter(every=0.2)
    for _ in range(1000):  # a flood of accept errors
        log("accept", "socket.accept() out of system resource: OSError: [Errno 24] Too many open files")
    log("other", "a different kind")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "Too many open files" in lines[0] and "a different kind" in lines[1]
    time.sleep(0.25)
    log("accept", "socket.accept() out of system resource")
    assert "and 999 more like it" in capsys.readouterr().err


def _formed(budget: int, *requests: list[int]) -> tuple[list, list]:
    """The passes a batcher with ``budget`` padded tokens forms from requests of these input lengths queued
    in this order: [[(request number, its rows)]]; and the jobs."""
    import asyncio
    import types

    from cramkit.data.batching import Encoded
    from cramkit.serve.batcher import Batcher, Job

    def enc(lengths: list[int]) -> Encoded:
        n = len(lengths)
        return Encoded(
            ids=[[1] * k for k in lengths],
            b_start=np.zeros(n, np.int64),
            lengths=np.asarray(lengths),
            labels=None,
            idx=np.arange(n),
            truncated=np.zeros(n, bool),
        )

    loop = asyncio.new_event_loop()
    batcher = Batcher(types.SimpleNamespace(max_batch_tokens=budget), "m", max_wait_ms=0, max_queue=1000, timeout_s=30)
    jobs = [Job.make("embed", enc(r), loop.create_future(), loop) for r in requests]
    for job in jobs:
        batcher.submit(job)
    passes = []
    with batcher._cond:
        while batcher._queue:
            passes.append([(jobs.index(job), rows.tolist()) for job, rows in batcher._form()])
    loop.close()
    return passes, jobs


def test_a_pass_takes_the_oldest_request_first_then_the_shortest_inputs_of_all() -> None:
    passes, _ = _formed(200, [100, 10], [10] * 8)
    # in arrival order the old request's two inputs would share a pass padded to 100 tokens (200), then the
    # new one's eight a pass of 80: like lengths together pad 90 + 100 instead
    assert passes == [[(0, [1]), (1, list(range(8)))], [(0, [0])]], passes


def test_the_oldest_input_sets_the_pass_length_and_older_requests_fill_it_first() -> None:
    passes, _ = _formed(200, [20] * 3, [20] * 5, [5] * 10)
    # the oldest input is 20 tokens: 10 rows fit. The two older requests' inputs (as long as it) go first and
    # finish them; the newest's short ones make the next pass at 5 tokens: 200 + 40 padded tokens. Taking the
    # shortest of all first would pad 200 (20 + nine 5s) + 160 (the rest, at 20)
    assert passes == [[(0, [0, 1, 2]), (1, [0, 1, 2, 3, 4]), (2, [0, 1])], [(2, list(range(2, 10)))]], passes
