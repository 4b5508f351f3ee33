"""The trainer's reports (:class:`TrainerProgress`): the steps' values read from the device, the held-out
evaluation, metrics.jsonl's records and the trackers' hyperparameters, the progress line."""

from __future__ import annotations

import math
from typing import Any

import torch

from cramkit.errors import CramkitError
from cramkit.progress import Pace, format_seconds
from cramkit.train.budget import Budget
from cramkit.train.trainer_parts import TrainerParts


class TrainerProgress(TrainerParts):
    """Reads, evaluates, logs and shows what the steps did."""

    def settle(self) -> None:
        """Read the device values of the steps run since the last read (one copy to the host), and count
        their non-finite losses: the skipped steps, the streak, the stop after ``train.max_nan_steps``."""
        pending, self._unsettled = self._unsettled, []
        if not pending:
            return
        values = torch.stack(
            [torch.stack([f["loss"], f["grad_norm"].to(f["loss"]), f["finite"].to(f["loss"])]) for f in pending]
        ).tolist()
        s = self.state
        for facts, (loss, norm, finite) in zip(pending, values, strict=True):
            facts.update(loss=loss, grad_norm=norm, finite=bool(finite))
            if facts["finite"]:
                s.nan_streak = 0
                self._window.append(loss)
                continue
            s.nan_streak, s.skipped = s.nan_streak + 1, s.skipped + 1
            self._bar.note(
                f"cramkit: step {facts['step']}: loss {loss} / gradient norm {norm} not finite; update "
                f"skipped ({s.nan_streak} in a row)"
            )
            if s.nan_streak >= self.tcfg.max_nan_steps:
                prev = (
                    f"the last good checkpoint is {self.last_checkpoint}"
                    if self.last_checkpoint
                    else ("no checkpoint was saved")
                )
                raise CramkitError(
                    f"the training loss was not finite for {s.nan_streak} steps in a row (step {facts['step']}); "
                    f"stopped; {prev}. Lower the learning rate, raise the warmup, use fp32 precision, or "
                    "check the data"
                )

    def eval_due(self) -> bool:
        s = self.state
        return self.eval_every.due(s.last_eval[0], s.elapsed, s.last_eval[1], s.step)

    def evaluate(self) -> float | None:
        """The objective's held-out loss, logged."""
        s, model = self.state, self.train_model
        was_training = model.training
        model.eval()
        result = self.objective.evaluate(model, self.data_ctx, self.precision)
        model.train(was_training)
        extra: dict[str, Any] = {}
        if isinstance(result, dict):  # the held-out loss and the recipe's own figures (dev metrics)
            extra = {k: v for k, v in result.items() if k != "val_loss"}
            result = result.get("val_loss")
        self.val_loss = result
        s.last_eval = (s.elapsed, s.step)
        if self.val_loss is not None:
            rec = {
                "step": s.step,
                "tokens": s.tokens,
                "elapsed": round(s.elapsed, 3),
                "val_loss": self.val_loss,
                **extra,
            }
            self.log.write(rec)
            self.history.append(rec)
        return self.val_loss

    def hyperparameters(self) -> dict[str, Any]:
        """The run's resolved configuration, for the trackers: the recipe's settings (the objective's ``cfg``,
        when it has one) and the engine's (``train``)."""
        import dataclasses

        from cramkit.config import to_dict

        cfg = self.objective.cfg
        settings = to_dict(cfg) if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type) else {}
        return {**settings, "train": to_dict(self.tcfg), "world": self.ctx.world}

    # ------------------------------------------------------------ progress

    def _log_step(self, facts: dict[str, Any], last: bool = False) -> None:
        s, world = self.state, self.ctx.world
        tps = self._window_tokens / max(self._window_time, 1e-9)
        flops_tok = self.objective.flops_per_token
        mfu = self._ceiling.mfu(flops_tok * tps / world, self._bar.note) if flops_tok else None
        window, norm = self._window, facts["grad_norm"]
        rec = {
            "step": s.step,
            "tokens": s.tokens,
            "elapsed": round(s.elapsed, 3),
            "loss": sum(window) / len(window) if window else float("nan"),
            "lr": facts["lr"],
            "tokens_per_s": round(tps, 1),
            "batch_size": facts["accum"] * self.micro * self.data_ctx.world,
            "grad_norm": norm if math.isfinite(norm) else str(norm),
            "mfu": mfu,
            "skipped": s.skipped or None,
            "precision": self.precision,
        } | facts["info"]
        rec |= self.objective.step_metrics() or {}
        self.log.write(rec)
        self.history.append(rec)
        fraction = self.budget.fraction(s.elapsed, s.tokens, s.step)
        shown = self._shown
        for i, v in enumerate((sum(window), len(window), self._window_tokens, self._window_time)):
            shown[i] += v
        loss = shown[0] / shown[1] if shown[1] else float("nan")
        fields = {"loss": f"{loss:.3f}", "tok/s": f"{shown[2] / max(shown[3], 1e-9):,.0f}", "lr": f"{facts['lr']:.2e}"}
        if mfu is not None:
            fields["mfu"] = f"{mfu:.1%}"
        if self.val_loss is not None:
            fields["val"] = f"{self.val_loss:.3f}"
        fields["left"] = _time_left(self.budget, fraction, s.elapsed, self._pace)
        if self._bar.to(round(fraction * 100, 1), fields, force=last):
            self._shown = [0.0, 0.0, 0.0, 0.0]
        self._window, self._window_tokens, self._window_time = [], 0, 0.0


def _time_left(budget: Budget, fraction: float, elapsed: float, pace: Pace | None = None) -> str:
    """Training time left: exact for a time budget; else the rest of the budget at ``pace``'s rate, averaged from
    the first log line on (so the first steps, allocation, compilation, a cold cache, do not inflate every later
    estimate, and one slow step does not swing it); at the rate since the start before ``pace`` has one."""
    if budget.kind == "time":
        return format_seconds(budget.amount - elapsed)
    left = pace.left(fraction, 1.0, elapsed) if pace is not None else None
    if left is not None:
        return "~" + format_seconds(left)
    if fraction <= 0:
        return "?"
    return "~" + format_seconds(elapsed / fraction - elapsed)
