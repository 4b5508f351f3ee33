"""Which checkpoint should a few-shot run keep? A bench-only diagnostic (issue 49): every dev evaluation of a
fine-tuning is also scored on the task's scored split (the split the protocol reads the result from, never shown to
the run), written beside the evaluation in the seed's metrics.jsonl as ``full_dev``; :func:`picks` then reads, for
a finished run, what each way of choosing among the evaluations would have scored there.

    python bench/bench_selftrain.py ... --trace      # each split's teacher and student, every rule

The rules: ``first`` (the first evaluation of the best dev score: cramkit before 2026-11-30), ``tie`` (the best dev
score, of equal ones the lowest dev loss: ``keep=best`` now), ``loss`` (the lowest dev loss), ``last``, and
``oracle`` (the best on the scored split itself: the ceiling, not a rule)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

RULES = ("first", "tie", "loss", "last", "oracle")


def install() -> Callable[[], None]:
    """Score the task's scored split at every dev evaluation of every fine-tuning in this process; returns what
    undoes it."""
    from cramkit.recipes import finetune as ft
    from cramkit.recipes import finetune_objective as fo

    seen: dict[str, Any] = {}
    train_seeds, evaluate = ft._train_seeds, fo.ClassifierObjective.evaluate
    signature = inspect.signature(train_seeds)

    def traced_seeds(*args: Any, **kwargs: Any) -> Any:
        seen["dev"] = signature.bind(*args, **kwargs).arguments["dev"]  # every dev split, encoded
        return train_seeds(*args, **kwargs)

    def traced_evaluate(self: Any, model: Any, ctx: Any, precision: str) -> Any:
        out = evaluate(self, model, ctx, precision)
        if out is None or self.dev is None:
            return out
        task, split, _ = self.dev
        scored = [s for s in task.scored_splits if s != split and s in seen.get("dev", {})]
        if scored:
            enc = seen["dev"][scored[0]]
            plain = getattr(model, "module", model)
            device = next(plain.parameters()).device
            logits = fo.predict(plain, enc, self.cfg, device, self.loaded.pad_id, self.loaded.with_types)
            out["full_dev"] = task.score(task.compute_metrics(logits, enc.labels, task.examples(scored[0])))
        return out

    def undo() -> None:
        ft._train_seeds, fo.ClassifierObjective.evaluate = train_seeds, evaluate  # type: ignore[method-assign]

    ft._train_seeds = traced_seeds
    fo.ClassifierObjective.evaluate = traced_evaluate  # type: ignore[method-assign]
    return undo


def evaluations(run: Path) -> list[dict[str, Any]]:
    """A fine-tuning's dev evaluations with their ``full_dev`` (seed 0's metrics.jsonl), in order."""
    f = Path(run) / "seeds" / "seed-0" / "metrics.jsonl"
    rows = [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines()] if f.is_file() else []
    return [r for r in rows if "val_loss" in r and "full_dev" in r]


def pick(evals: list[dict[str, Any]], rule: str) -> dict[str, Any]:
    """The evaluation ``rule`` keeps (see the module's doc)."""
    if rule == "first":
        return max(evals, key=lambda r: r["dev_score"])
    if rule == "tie":  # cramkit's own order for keep=best
        from cramkit.recipes.finetune_objective import rank

        return max(evals, key=lambda r: rank(r["dev_score"], r["val_loss"]))
    if rule == "loss":
        return min(evals, key=lambda r: r["val_loss"])
    if rule == "last":
        return evals[-1]
    return max(evals, key=lambda r: r["full_dev"])


def picks(run: Path) -> dict[str, dict[str, float]] | None:
    """Each rule's step, its dev rows' score and the scored split's, for the finished fine-tuning in ``run``."""
    evals = evaluations(run)
    if not evals or not (Path(run) / "results.json").is_file():
        return None
    return {
        rule: {k: round(float(e[k]), 2) for k in ("step", "dev_score", "full_dev")}
        for rule in RULES
        for e in [pick(evals, rule)]
    }
