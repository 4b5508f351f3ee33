"""The prefetcher (train/prefetch.py): the loader's batches in order, its state that of the batches consumed,
no thread left behind."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from cramkit.train.config import TrainConfig
from cramkit.train.distributed import ParallelConfig
from cramkit.train.objectives import Objective
from cramkit.train.prefetch import Prefetcher
from cramkit.train.trainer import Trainer


class _Counting:
    """Batch i is [i]; its state is the number of batches taken; fails at ``fail_at``."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.i, self.fail_at = 0, fail_at

    def __iter__(self) -> _Counting:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.i == self.fail_at:
            raise ValueError(f"bad batch {self.i}")
        self.i += 1
        return {"x": torch.tensor([float(self.i - 1)])}

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, state: dict) -> None:
        self.i = state["i"]


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "cramkit-prefetch"]


def _wait_until_full(p: Prefetcher) -> None:
    deadline = time.time() + 10
    while not p._queue.full() and time.time() < deadline:
        time.sleep(0.005)
    assert p._queue.full()


def test_the_state_is_that_of_the_batches_consumed_not_prefetched() -> None:
    p = Prefetcher(_Counting(), depth=3)
    assert [float(next(p)["x"]) for _ in range(4)] == [0.0, 1.0, 2.0, 3.0]
    _wait_until_full(p)  # the thread has read batches 4..7 (three waiting, one in hand)
    assert p.loader.i > 4 and p.state_dict() == {"i": 4}
    # a resume from that state continues with batch 4, as a run that never prefetched would
    resumed = Prefetcher(_Counting(), depth=3)
    resumed.load_state_dict(p.state_dict())
    assert float(next(resumed)["x"]) == 4.0
    p.close()
    resumed.close()
    assert p.loader.i == 4  # closing puts the loader back where the consumed batches end
    # the state can be set again after the thread ran: the batches prepared are dropped
    p.load_state_dict({"i": 1})
    assert float(next(p)["x"]) == 1.0
    p.close()
    assert not _prefetch_threads()


def test_a_loader_error_reaches_the_consumer_and_ends_the_thread() -> None:
    p = Prefetcher(_Counting(fail_at=2), depth=2)
    assert float(next(p)["x"]) == 0.0 and float(next(p)["x"]) == 1.0
    with pytest.raises(ValueError, match="bad batch 2"):
        next(p)
    assert not _prefetch_threads() and p.state_dict() == {"i": 2}


def test_a_dropped_prefetcher_stops_its_thread() -> None:
    p = Prefetcher(_Counting(), depth=2)
    next(p)
    thread = p._thread
    del p
    thread.join(timeout=5)
    assert not thread.is_alive()


class _Toy(Objective):
    title, resume_hint, flops_per_token = "toy", "rerun", None

    def __init__(self, poison_at: int | None = None) -> None:
        self.poison_at, self.seen = poison_at, 0

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Linear(1, 1)

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1) -> _Counting:
        return _Counting()

    def count(self, batch: dict) -> int:
        return 1

    def tokens(self, batch: dict) -> int:
        return 1

    def loss(self, model: torch.nn.Module, batch: dict, device: torch.device) -> torch.Tensor:
        self.seen += 1
        loss = model(batch["x"].to(device)).pow(2).mean()
        return loss * float("nan") if self.poison_at is not None and self.seen >= self.poison_at else loss

    def evaluate(self, model: torch.nn.Module, ctx: object, precision: str) -> None:
        return None


def _trainer(run: Path, toy: _Toy) -> Trainer:
    tcfg = TrainConfig(
        budget="5steps",
        micro_batch=1,
        batch_size=2,
        batch_ramp=0.0,
        log_every=1,
        progress=False,
        threads=1,
        checkpoint_every="never",
        eval_every="never",
        device="cpu",
        lr=1e-2,
        max_nan_steps=2,
    )
    return Trainer(toy, tcfg, ParallelConfig(async_checkpoint=False), run)


def test_a_run_consumes_in_order_saves_the_consumed_state_and_leaves_no_thread(tmp_path: Path) -> None:
    import json

    trainer = _trainer(tmp_path / "run", _Toy())
    result = trainer.run()
    assert result.step == 5 and not _prefetch_threads()
    state = json.loads((result.checkpoint / "state.json").read_text())
    assert state["trainer"]["loader"] == {"i": 10}  # 5 steps of 2 micro-batches, whatever was prefetched


def test_a_failed_run_leaves_no_thread(tmp_path: Path) -> None:
    from cramkit.errors import CramkitError

    with pytest.raises(CramkitError, match="not finite"):
        _trainer(tmp_path / "run", _Toy(poison_at=3)).run()
    assert not _prefetch_threads()
