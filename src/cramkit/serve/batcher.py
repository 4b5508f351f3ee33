"""The server's queues: one worker thread per model forms the forward passes from queued requests.

Requests arrive tokenised (:meth:`cramkit.infer.Engine.tokenize`), their inputs sorted by length. The worker
forms each forward pass itself: the oldest request's next input sets its length; the inputs no longer than
it (the oldest requests' first), then the shortest longer ones of all queued requests of its task, while the
pass still fits the engine's token budget (rows x longest row,
:func:`cramkit.infer.engine.fits`), waiting up to ``max_wait_ms`` after the oldest arrived for more (no wait
once the budget is full). Passes of inputs of like length pad little, and every pass advances the oldest
request. A request larger than one pass is answered over several; small ones share a pass.
The engine runs each pass as it is (``*_pass``), and each request's future is answered on its event loop
once all its inputs are done.

Admission: the queue is bounded in inputs (``max_queue``), and a request that could not be answered within
half of ``timeout_s`` at the measured rate (tokens per second of the passes so far; half: the rate of a
shared machine varies) is refused at once rather than left to time out: :meth:`Lane.reserve` (room held
while the request is tokenised, at the mean cost per input so far) and :meth:`Lane.submit` raise
:class:`Overloaded`, which the server answers with 429.
A request whose caller gave up (timed out, disconnected) is dropped from the queue.

:class:`SearchQueue` puts an index's searches under the same bounded admission, one request at a time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cramkit.data.batching import Encoded
from cramkit.infer.engine import fits


class Overloaded(Exception):
    """The request cannot be queued: the queue is full, or it would wait past the timeout."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Stopped(Exception):
    """The queue is shutting down."""


def _set(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


@dataclass(eq=False)
class Request:
    """One queued request: ``n`` inputs of ``cost`` work units, answered through ``future``."""

    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    n: int
    cost: float
    enqueued: float = field(default_factory=time.perf_counter)

    def answer(self, result: Any, error: BaseException | None = None) -> None:
        with contextlib.suppress(RuntimeError):  # RuntimeError: the loop is closed (shutdown)
            self.loop.call_soon_threadsafe(_set, self.future, result, error)

    @property
    def gone(self) -> bool:
        return self.future.done()


class Lane:
    """A bounded queue with ``workers`` worker threads (one unless the runtime runs several passes at once);
    ``submit`` from the event loop, answers come back there.

    Subclasses say how a worker takes (:meth:`_take`) and runs (:meth:`_work`) what is queued; the
    workers' measured rate (cost units per second, each) feeds admission."""

    unit = "inputs"

    def __init__(self, name: str, *, max_queue: int, timeout_s: float, metrics: Any = None, workers: int = 1) -> None:
        self.name = name
        self.max_queue = int(max_queue)
        self.timeout_s = float(timeout_s)
        self.metrics = metrics
        self._queue: collections.deque[Any] = collections.deque()
        self._depth = 0  # inputs queued
        self._cost = 0.0  # their cost
        self.rate = 0.0  # cost per second of one worker's work so far (moving average; 0: not measured yet)
        self.busy = 0.0  # cost of the work running now (all workers)
        self.per_input = 0.0  # mean cost of one input so far
        self._held = 0  # inputs of requests admitted and not yet submitted (being tokenised)
        self._held_cost = 0.0
        self._cond = threading.Condition()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._run, name=f"queue-{name}-{i}", daemon=True) for i in range(max(1, workers))
        ]

    # ---------------------------------------------------------------------------- event-loop side

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    @property
    def alive(self) -> bool:
        return all(t.is_alive() for t in self._threads) and not self._stopping

    @contextlib.contextmanager
    def reserve(self, n: int) -> Iterator[None]:
        """Hold room for a request of ``n`` inputs until it is submitted (:class:`Overloaded` if none)."""
        cost = n * self.per_input
        with self._cond:
            self.admit(n, cost)
            self._held += n
            self._held_cost += cost
        try:
            yield
        finally:
            with self._cond:
                self._held -= n
                self._held_cost -= cost

    def admit(self, n: int, cost: float) -> None:
        """Raise :class:`Overloaded` if ``n`` more inputs of ``cost`` could not be queued and answered in time."""
        depth = self._depth + self._held
        if depth and depth + n > self.max_queue:
            raise Overloaded(
                f"the queue of {self.name!r} is full ({depth} of {self.max_queue} {self.unit}); retry shortly",
                1,
            )
        if self.rate > 0 and (depth or self.busy):
            wait = (self.busy + self._cost + self._held_cost + cost) / (self.rate * len(self._threads))
            if wait > self.timeout_s / 2:
                raise Overloaded(
                    f"{self.name!r} has {depth} {self.unit} queued: this request would wait about "
                    f"{wait:.1f}s, too close to the {self.timeout_s:g}s timeout; retry later",
                    max(1, math.ceil(wait - self.timeout_s / 2)),
                )

    def submit(self, req: Any) -> None:
        with self._cond:
            if self._stopping:
                raise Stopped()
            self.admit(req.n, req.cost)
            self._queue.append(req)
            self._add(req.n, req.cost)
            self._cond.notify()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish what is queued, then end the worker thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        end = time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive():
                thread.join(max(0.0, end - time.monotonic()))

    # ---------------------------------------------------------------------------- worker side

    def _add(self, n: int, cost: float) -> None:
        """Account for inputs entering (positive) or leaving (negative) the queue; call under the lock."""
        self._depth += n
        self._cost = max(0.0, self._cost + cost)
        if self.metrics is not None:
            self.metrics.queue_depth.labels(self.name).set(self._depth)

    def _busy(self, cost: float) -> None:
        """Work of ``cost`` starting (positive) or done (negative)."""
        with self._cond:
            self.busy = max(0.0, self.busy + cost)

    def _measured(self, n: int, cost: float, seconds: float) -> None:
        if n:
            self.per_input = cost / n if self.per_input == 0 else 0.9 * self.per_input + 0.1 * cost / n
        if seconds > 0 and cost > 0:
            now = cost / seconds
            self.rate = now if self.rate == 0 else 0.7 * self.rate + 0.3 * now

    def _wait_for_work(self) -> bool:
        """Wait (under the lock) until something is queued; False: stopping and nothing left."""
        while not self._queue:
            if self._stopping:
                return False
            self._cond.wait()
        return True

    def _run(self) -> None:
        while True:
            backlog = bool(self._queue)
            start = time.perf_counter()
            work = self._take()
            if work is None:
                return
            if not backlog:  # waiting for work is not work
                start = time.perf_counter()
            n, cost = self._work(work)
            with self._cond:
                self._measured(n, cost, time.perf_counter() - start)  # the worker's whole cycle, not the pass alone

    def _take(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _work(self, work: Any) -> tuple[int, float]:  # pragma: no cover - abstract
        """Run ``work``; (inputs, cost) done."""
        raise NotImplementedError


@dataclass(eq=False)
class Job(Request):
    """A tokenised request for one model: ``task`` over ``enc``; its inputs leave the queue shortest first."""

    task: str = "embed"
    enc: Encoded = field(kw_only=True)  # always given (Job.make)
    top_k: int = 5
    order: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    taken: int = 0  # inputs of ``order`` handed to a pass
    done: int = 0  # inputs answered
    result: Any = None
    failed: bool = False

    @classmethod
    def make(
        cls, task: str, enc: Encoded, future: asyncio.Future, loop: asyncio.AbstractEventLoop, top_k: int = 5
    ) -> Job:
        return cls(
            future=future,
            loop=loop,
            n=len(enc),
            cost=float(enc.lengths.sum()),
            task=task,
            enc=enc,
            top_k=top_k,
            order=np.argsort(enc.lengths, kind="stable"),
        )

    @property
    def key(self) -> tuple[str, int]:
        return self.task, self.top_k if self.task == "fill_mask" else 0

    @property
    def left(self) -> int:
        return self.n - self.taken


def merge(parts: list[tuple[Job, np.ndarray]]) -> Encoded:
    """The inputs ``rows`` of each job, as one tokenised batch in that order."""
    ids = [job.enc.ids[i] for job, rows in parts for i in rows.tolist()]
    return Encoded(
        ids=ids,
        b_start=np.concatenate([job.enc.b_start[rows] for job, rows in parts]),
        lengths=np.concatenate([job.enc.lengths[rows] for job, rows in parts]),
        labels=None,
        idx=np.arange(len(ids), dtype=np.int64),
        truncated=np.concatenate([job.enc.truncated[rows] for job, rows in parts]),
    )


class Batcher(Lane):
    """Forms the forward passes of one engine from its queued jobs (see the module's docstring)."""

    def __init__(
        self,
        engine: Any,
        name: str,
        *,
        max_wait_ms: float,
        max_queue: int,
        timeout_s: float,
        metrics: Any = None,
    ) -> None:
        # as many workers as passes the engine's runtime runs at once: each takes the next pass while another runs
        workers = int(getattr(engine, "workers", 1))
        super().__init__(name, max_queue=max_queue, timeout_s=timeout_s, metrics=metrics, workers=workers)
        self.engine = engine
        self.max_batch_tokens = int(engine.max_batch_tokens)
        self.max_wait = max(0.0, float(max_wait_ms)) / 1000.0
        self.batches = 0

    def _take(self) -> list[tuple[Job, np.ndarray]] | None:
        """The next forward pass: (job, its rows) pieces (None: stopping and nothing left)."""
        with self._cond:
            while self._wait_for_work():
                parts = self._form()
                if parts:
                    return parts
            return None

    def _form(self) -> list[tuple[Job, np.ndarray]]:
        """Take a forward pass's inputs from the queue (under the lock; empty if every caller gave up),
        waiting up to ``max_wait`` after the oldest job arrived while the pass is not full."""
        deadline = self._queue[0].enqueued + self.max_wait if self._queue else 0.0
        while True:
            self._prune()
            if not self._queue:
                return []
            takes, full = self._plan()
            left = deadline - time.perf_counter()
            if full or left <= 0 or self._stopping:
                break
            self._cond.wait(left)
        parts: list[tuple[Job, np.ndarray]] = []
        for job, take in takes.items():
            piece = job.order[job.taken : job.taken + take]
            parts.append((job, piece))
            job.taken += take
            self._add(-take, -float(job.enc.lengths[piece].sum()))
            if not job.left:
                self._queue.remove(job)
        return parts

    def _prune(self) -> None:
        """Drop the jobs whose callers gave up (timed out, disconnected)."""
        for job in [j for j in self._queue if j.gone]:
            self._queue.remove(job)
            self._add(-job.left, -float(job.enc.lengths[job.order[job.taken :]].sum()))

    def _plan(self) -> tuple[dict[Job, int], bool]:
        """The next pass: inputs to take per job, and whether the budget is full. The oldest job's next input
        comes first (every pass advances it, so no job waits behind newer ones) and sets the pass's length:
        the inputs no longer than it fill the pass first, the oldest jobs' first, then (room left) the shortest
        longer ones among all queued jobs of its task; each job's inputs in its own length order. Passes of
        like lengths pad little, and older requests finish first."""
        oldest = self._queue[0]
        jobs = [j for j in self._queue if j.key == oldest.key]
        lengths = [j.enc.lengths[j.order[j.taken :]] for j in jobs]
        longest = int(lengths[0][0])
        takes = [0] * len(jobs)
        rows = 0
        for k, ls in enumerate(lengths):  # the inputs no longer than the first, oldest jobs first
            short = int(np.searchsorted(ls, longest, side="right"))
            while takes[k] < short and fits(rows + 1, longest, self.max_batch_tokens):
                takes[k] += 1
                rows += 1
            if takes[k] < short:  # full at this length
                return {j: t for j, t in zip(jobs, takes, strict=True) if t}, True
        heap = [(int(ls[t]), k) for k, (ls, t) in enumerate(zip(lengths, takes, strict=True)) if t < len(ls)]
        heapq.heapify(heap)
        while heap:  # then the shortest longer ones of all
            length, k = heap[0]
            if not fits(rows + 1, max(longest, length), self.max_batch_tokens):
                break
            heapq.heappop(heap)
            rows, longest = rows + 1, max(longest, length)
            takes[k] += 1
            if takes[k] < len(lengths[k]):
                heapq.heappush(heap, (int(lengths[k][takes[k]]), k))
        return {j: t for j, t in zip(jobs, takes, strict=True) if t}, bool(heap)

    def _work(self, parts: list[tuple[Job, np.ndarray]]) -> tuple[int, float]:
        job0 = parts[0][0]
        task = job0.task
        enc = merge(parts)
        running = float(enc.lengths.sum())
        self._busy(running)
        start = time.perf_counter()
        error: BaseException | None = None
        try:
            if task == "embed":
                mean, cls = self.engine.embed_pass(enc)
                out: Any = (mean, cls)
            elif task == "classify":
                out = self.engine.logits_pass(enc)
            elif task == "fill_mask":
                out = self.engine.fill_mask_pass(enc, None, job0.top_k)
            else:  # pragma: no cover - the routes only submit known tasks
                raise ValueError(f"unknown task {task}")
        except BaseException as exc:  # every caller gets the failure, the worker lives on
            error = exc
        finally:
            self._busy(-running)
        elapsed = time.perf_counter() - start
        with self._cond:
            self.batches += 1
        if self.metrics is not None:
            m, name = self.metrics, self.name
            m.inference_seconds.labels(name, task).observe(elapsed)
            m.batch_tokens.labels(name).observe(len(enc) * int(enc.lengths.max()))
            m.batch_inputs.labels(name).observe(len(enc))
            m.batch_requests.labels(name).observe(len({id(job) for job, _ in parts}))
        with self._cond:  # another worker may be filling other rows of the same jobs
            at = 0
            for job, rows in parts:
                if job.failed:
                    continue
                if error is not None:
                    job.failed = True
                    self._drop(job)
                    job.answer(None, error)
                    continue
                self._scatter(job, rows, out, at)
                at += len(rows)
                job.done += len(rows)
                if job.done == job.n:
                    job.answer(job.result)
        return len(enc), float(enc.lengths.sum())

    def _drop(self, job: Job) -> None:
        """Take a failed job's inputs still queued out of the queue."""
        with self._cond:
            if job in self._queue:
                self._queue.remove(job)
                self._add(-job.left, -float(job.enc.lengths[job.order[job.taken :]].sum()))
                job.taken = job.n

    @staticmethod
    def _scatter(job: Job, rows: np.ndarray, out: Any, at: int) -> None:
        """Put a pass's outputs for ``rows`` of ``job`` (at ``at`` in the pass) in the job's result."""
        end = at + len(rows)
        if job.task == "embed":
            mean, cls = out
            if job.result is None:
                job.result = (
                    np.zeros((job.n, mean.shape[1]), np.float32),
                    np.zeros((job.n, cls.shape[1]), np.float32),
                )
            job.result[0][rows] = mean[at:end]
            job.result[1][rows] = cls[at:end]
        elif job.task == "classify":
            if job.result is None:
                job.result = np.zeros((job.n, out.shape[1]), np.float32)
            job.result[rows] = out[at:end]
        else:
            if job.result is None:
                job.result = [[] for _ in range(job.n)]
            for i, masks in zip(rows.tolist(), out[at:end], strict=True):
                job.result[i] = masks


@dataclass(eq=False)
class Search(Request):
    """A search request: the ``k`` nearest passages of each of ``texts``."""

    texts: list[str] = field(default_factory=list)
    k: int = 10


class SearchQueue(Lane):
    """An index's searches, one request at a time, under bounded admission (cost: queries)."""

    unit = "queries"

    def __init__(self, index: Any, *, max_queue: int, timeout_s: float, metrics: Any = None) -> None:
        super().__init__("search", max_queue=max_queue, timeout_s=timeout_s, metrics=metrics)
        self.index = index

    def _take(self) -> Search | None:
        with self._cond:
            while True:
                if not self._wait_for_work():
                    return None
                req = self._queue.popleft()
                self._add(-req.n, -req.cost)
                if not req.gone:
                    return req

    def _work(self, req: Search) -> tuple[int, float]:
        self._busy(req.cost)
        try:
            hits, error = self.index.search(req.texts, req.k), None
        except BaseException as exc:  # the caller gets the failure, the worker lives on
            hits, error = None, exc
        finally:
            self._busy(-req.cost)
        req.answer(hits, error)
        return req.n, req.cost
