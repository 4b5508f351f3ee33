"""The trainer's checkpoints (:class:`TrainerCheckpoints`): when one is due, what it records (the counters,
the loader's position as JSON, the random states), and the resume from the latest."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cramkit.errors import CramkitError
from cramkit.train import checkpoint as ckpt
from cramkit.train.trainer_parts import TrainState
from cramkit.train.trainer_progress import TrainerProgress

# ---------------------------------------------------------------- JSON-safe loader state


def _to_json(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, torch.Tensor):
        return {"__tensor__": value.tolist(), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.asarray(value["__ndarray__"], dtype=value["dtype"])
        if "__tensor__" in value:
            return torch.tensor(value["__tensor__"], dtype=getattr(torch, value["dtype"]))
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


class TrainerCheckpoints(TrainerProgress):
    """Saves the run's checkpoints and resumes from them."""

    def resume(self) -> None:
        """Continue from the run's latest checkpoint (written by any number of processes: resharded to this
        world size, checksums verified first)."""
        found = ckpt.find_latest(self.run_dir)
        if found is None:
            raise CramkitError(
                f"{self.run_dir}: the run has no complete checkpoint yet; start it again without resuming"
            )
        saved = ckpt.load(found, self.model, self.optimizer, process_group=self.writer.pg)
        if self.scaler is not None and saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])
        self.loader.load_state_dict(_from_json(saved["loader"]))
        ckpt.restore_rng(saved["rng"])
        self.state = TrainState.from_checkpoint(saved)
        self.last_checkpoint, self._resumed = found, True
        if self.ctx.is_main:
            print(
                f"cramkit: resuming {self.run_dir} from {found.name} (step {self.state.step}, "
                f"{self.state.tokens:,} tokens)",
                file=sys.stderr,
            )

    def checkpoint_due(self) -> bool:
        """Due by ``train.checkpoint_every``, never during a run of non-finite losses (the latest checkpoint
        stays a good one)."""
        s = self.state
        if not self.ckpt_every.due(s.last_ckpt[0], s.elapsed, s.last_ckpt[1], s.step):
            return False
        self.settle()
        return s.nan_streak == 0

    def save(self, reason: str) -> Path:
        """A checkpoint of everything a resume needs (every rank writes its shards; in the background
        unless ``reason`` is not "periodic")."""
        self.settle()
        s = self.state
        trainer_state = {
            "step": s.step,
            "tokens": s.tokens,
            "elapsed": s.elapsed,
            "nan_streak": s.nan_streak,
            "skipped": s.skipped,
            "last_eval": list(s.last_eval),
            "budget": self.tcfg.budget,
            "fraction": self.budget.fraction(s.elapsed, s.tokens, s.step),
            "world": self.ctx.world,
            "parallel": self.degrees,
            "reason": reason,
            "loader": _to_json(self.loader.state_dict()),
            "rng": ckpt.encode_rng(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }
        self.last_checkpoint = self.writer.save(
            s.step, self.model, self.optimizer, trainer_state, block=reason != "periodic", tied=self._tied
        )
        s.last_ckpt = (s.elapsed, s.step)
        return self.last_checkpoint
