"""The engine (train/trainer.fit) with a minimal objective: what it leaves in a run directory."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from cramkit.train.config import TrainConfig
from cramkit.train.distributed import ParallelConfig
from cramkit.train.objectives import Objective
from cramkit.train.trainer import fit


class _Loader:
    def __init__(self, micro: int) -> None:
        self.micro, self.gen = micro, torch.Generator().manual_seed(0)

    def __iter__(self) -> _Loader:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(self.micro, 4, generator=self.gen)}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class _Toy(Objective):
    title, resume_hint, flops_per_token = "toy", "rerun", None

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Linear(4, 1)

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1) -> _Loader:
        return _Loader(micro)

    def count(self, batch: dict) -> int:
        return batch["x"].shape[0]

    def tokens(self, batch: dict) -> int:
        return batch["x"].shape[0]

    def loss(self, model: torch.nn.Module, batch: dict, device: torch.device) -> torch.Tensor:
        return model(batch["x"].to(device)).pow(2).mean()

    def evaluate(self, model: torch.nn.Module, ctx: object, precision: str) -> None:
        return None


def test_a_fresh_run_does_not_inherit_the_loss_curve_an_earlier_attempt_left(tmp_path: Path) -> None:
    """An attempt killed before its first checkpoint leaves metrics.jsonl behind; starting again (not a
    resume) must not append to it, or the loss curve and plot would show both attempts."""
    run = tmp_path / "run"
    run.mkdir()
    stale = [{"step": s, "loss": 99.0} for s in range(1, 11)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stale), encoding="utf-8")
    tcfg = TrainConfig(
        budget="3steps",
        micro_batch=2,
        batch_size=2,
        batch_ramp=0.0,
        log_every=1,
        progress=False,
        threads=1,
        checkpoint_every="never",
        eval_every="never",
        device="cpu",
        lr=1e-2,
    )
    result = fit(_Toy(), tcfg, ParallelConfig(async_checkpoint=False), run)
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert result.step == 3
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["loss"] != 99.0 for r in records)
