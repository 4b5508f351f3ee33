"""Micro-batches prepared ahead: a background thread runs the loader while the model runs the step.

:class:`Prefetcher` wraps a loader (an endless iterator with ``state_dict()`` / ``load_state_dict()``).
One thread calls ``next(loader)`` up to ``depth`` batches ahead of the trainer (numpy masking and
collation, and torch's copies, leave the GIL often enough for the step's Python to go on); on CUDA it also
pins each batch's tensors, so that the objective's ``.to(device, non_blocking=True)`` is an asynchronous
copy.

Resume stays exact: with each batch the thread takes the loader's state *after* that batch, and
:meth:`Prefetcher.state_dict` is the state of the last batch handed out (consumed), not of the batches
waiting in the queue. A checkpoint therefore resumes with the first batch the trainer has not seen, as
without prefetching. The loader must be a function of its own state (its own seeded generators, no global
random state): it runs in another thread, interleaved with the step.
"""

from __future__ import annotations

import copy
import queue
import threading
import weakref
from typing import Any, cast

import torch

_END = object()  # the loader is exhausted


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def _pinned(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {k: _pinned(v) for k, v in batch.items()}
    return batch


def _produce(loader: Any, out: queue.Queue, stop: threading.Event, pin: bool) -> None:
    """The thread: (batch, loader state after it) into ``out`` until ``stop``; an error or the loader's end
    is handed on as an item too."""
    while not stop.is_set():
        try:
            batch = next(loader)
            item: Any = (_pinned(batch) if pin else batch, copy.deepcopy(loader.state_dict()))
        except StopIteration:
            item = _END
        except BaseException as error:  # handed to the consumer, raised there
            item = _Failed(error)
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                break
            except queue.Full:
                continue
        if item is _END or isinstance(item, _Failed):
            return


class Prefetcher:
    """``loader``'s batches, the same ones in the same order, prepared ``depth`` ahead by a thread; pinned
    for ``device`` when it is CUDA. The thread starts at the first ``next()``; :meth:`close` (or
    :meth:`load_state_dict`) stops and joins it, and dropping the prefetcher stops it too."""

    def __init__(self, loader: Any, depth: int = 2, device: torch.device | None = None) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.loader, self.depth = loader, depth
        self.pin = device is not None and device.type == "cuda"
        self._state = copy.deepcopy(loader.state_dict())  # the state of the batches handed out
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        if self._thread is None:
            self._start()
        assert self._queue is not None  # made by _start
        item = self._queue.get()
        if item is _END or isinstance(item, _Failed):
            self.close()
            if item is _END:
                raise StopIteration
            raise cast(_Failed, item).error
        batch, self._state = item
        return batch

    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(
            target=_produce,
            args=(self.loader, self._queue, self._stop, self.pin),
            name="cramkit-prefetch",
            daemon=True,
        )
        # the thread holds the loader, the queue and the flag, not the prefetcher: dropping it stops the thread
        weakref.finalize(self, self._stop.set)
        self._thread.start()

    def close(self) -> None:
        """Stop and join the thread; the batches it prepared are dropped (the state stays that of the
        batches handed out)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()  # a thread waiting to put sees it within 0.1 s
        self._queue = None
        thread.join()
        # the loader ran ahead: put it back where the batches handed out end
        self.loader.load_state_dict(copy.deepcopy(self._state))

    def state_dict(self) -> dict[str, Any]:
        """The loader's state after the last batch handed out."""
        return copy.deepcopy(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        self.loader.load_state_dict(state)
        self._state = copy.deepcopy(self.loader.state_dict())
