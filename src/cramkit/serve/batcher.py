"""The dynamic batcher: one thread per model merges queued requests into token-budgeted forward passes.

Requests arrive tokenised (:meth:`cramkit.infer.Engine.tokenize`). The worker takes the oldest request,
then keeps taking queued ones until their tokens fill ``max_batch_tokens`` or ``max_wait_ms`` has passed
since the oldest arrived (no wait at all when the queue already holds a full budget), runs them as one
call of the engine (which sorts the inputs by length and cuts token-budget batches), and answers each
request's future on its event loop. The queue is bounded in inputs: :meth:`Batcher.submit` refuses with
:class:`QueueFull` beyond it, which the server answers with 429. A request whose caller gave up (timed
out) is skipped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cramkit.data.batching import Encoded

TASKS = ("embed", "classify", "fill_mask")


class QueueFull(Exception):
    """The queue holds ``max_queue`` inputs already."""


class Stopped(Exception):
    """The batcher is shutting down."""


@dataclass
class Job:
    task: str
    enc: Encoded
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    top_k: int = 5
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def n(self) -> int:
        return len(self.enc)

    @property
    def tokens(self) -> int:
        return int(self.enc.lengths.sum())


def merge(encs: list[Encoded]) -> Encoded:
    """Several tokenised requests as one."""
    if len(encs) == 1:
        return encs[0]
    ids = [a for e in encs for a in e.ids]
    return Encoded(
        ids=ids,
        b_start=np.concatenate([e.b_start for e in encs]),
        lengths=np.concatenate([e.lengths for e in encs]),
        labels=None,
        idx=np.arange(len(ids), dtype=np.int64),
        truncated=np.concatenate([e.truncated for e in encs]),
    )


def _set(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class Batcher:
    """Merges concurrent requests for one engine; ``submit`` from the event loop, answers come back there."""

    def __init__(
        self,
        engine: Any,
        name: str,
        *,
        max_batch_tokens: int,
        max_wait_ms: float,
        max_queue: int,
        metrics: Any = None,
    ) -> None:
        self.engine = engine
        self.name = name
        self.max_batch_tokens = int(max_batch_tokens)
        self.max_wait = max(0.0, float(max_wait_ms)) / 1000.0
        self.max_queue = int(max_queue)
        self.metrics = metrics
        self._queue: collections.deque[Job] = collections.deque()
        self._depth = 0  # inputs queued
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"batcher-{name}", daemon=True)
        self.batches = 0
        self.busy = 0  # inputs in the forward pass now

    # ---------------------------------------------------------------------------- event-loop side

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def depth(self) -> int:
        return self._depth

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise Stopped()
            if self._depth and self._depth + job.n > self.max_queue:
                raise QueueFull()
            self._queue.append(job)
            self._depth += job.n
            self._gauge()
            self._cond.notify()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish what is queued, then end the worker thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ---------------------------------------------------------------------------- worker side

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.labels(self.name).set(self._depth)

    def _take(self) -> list[Job] | None:
        """The next group of jobs (None: stopping and nothing left)."""
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                self._cond.wait()
            jobs = [self._queue.popleft()]
            tokens = jobs[0].tokens
            deadline = jobs[0].enqueued + self.max_wait
            while tokens < self.max_batch_tokens:
                if self._queue:
                    nxt = self._queue[0]
                    if tokens + nxt.tokens > self.max_batch_tokens:
                        break
                    jobs.append(self._queue.popleft())
                    tokens += nxt.tokens
                    continue
                left = deadline - time.perf_counter()
                if left <= 0 or self._stopping:
                    break
                self._cond.wait(left)
            self._depth -= sum(j.n for j in jobs)
            self._gauge()
            return jobs

    def _run(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            live = [j for j in jobs if not j.future.done()]  # callers that timed out are gone
            by_task: dict[tuple[str, int], list[Job]] = {}
            for j in live:
                by_task.setdefault((j.task, j.top_k if j.task == "fill_mask" else 0), []).append(j)
            for (task, top_k), group in by_task.items():
                self._process(task, top_k, group)

    def _process(self, task: str, top_k: int, group: list[Job]) -> None:
        enc = merge([j.enc for j in group])
        self.busy = len(enc)
        start = time.perf_counter()
        try:
            if task == "embed":
                mean, cls = self.engine.embed_encoded(enc)
                results: list[Any] = []
                at = 0
                for j in group:
                    results.append((mean[at : at + j.n], cls[at : at + j.n]))
                    at += j.n
            elif task == "classify":
                logits = self.engine.logits_encoded(enc)
                results = []
                at = 0
                for j in group:
                    results.append(logits[at : at + j.n])
                    at += j.n
            elif task == "fill_mask":
                filled = self.engine.fill_mask_encoded(enc, top_k)
                results = []
                at = 0
                for j in group:
                    results.append(filled[at : at + j.n])
                    at += j.n
            else:  # pragma: no cover - the routes only submit known tasks
                raise ValueError(f"unknown task {task}")
            error: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - every caller gets the failure, the worker lives on
            results, error = [None] * len(group), exc
        finally:
            self.busy = 0
        elapsed = time.perf_counter() - start
        self.batches += 1
        if self.metrics is not None:
            self.metrics.inference_seconds.labels(self.name, task).observe(elapsed)
            self.metrics.batch_tokens.labels(self.name).observe(int(enc.lengths.sum()))
            self.metrics.batch_inputs.labels(self.name).observe(len(enc))
            self.metrics.batch_requests.labels(self.name).observe(len(group))
        for j, res in zip(group, results, strict=True):
            with contextlib.suppress(RuntimeError):  # RuntimeError: the loop is closed (shutdown)
                j.loop.call_soon_threadsafe(_set, j.future, res, error)
