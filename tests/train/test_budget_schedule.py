from __future__ import annotations

import math

import pytest

from cramkit.errors import CramkitError
from cramkit.train.budget import Budget, parse_budget, parse_every
from cramkit.train.schedule import accumulation_steps, lr_factor


@pytest.mark.parametrize(
    ("text", "kind", "amount"),
    [
        ("30s", "time", 30),
        ("5m", "time", 300),
        ("24h", "time", 86400),
        ("1.5h", "time", 5400),
        ("2e9tok", "tokens", 2e9),
        ("1000steps", "steps", 1000),
        ("1step", "steps", 1),
        (" 10M ", "time", 600),
    ],
)
def test_parse_budget_forms(text: str, kind: str, amount: float) -> None:
    assert parse_budget(text) == Budget(kind, amount)


@pytest.mark.parametrize("text", ["5 minutes", "5", "abc", "-3m", "0s", "2.5steps", "10 parsecs", ""])
def test_parse_budget_errors_name_accepted_forms(text: str) -> None:
    with pytest.raises(CramkitError) as err:
        parse_budget(text)
    assert repr(text) in str(err.value) and ("'5m'" in str(err.value) or "whole number" in str(err.value))


def test_budget_fraction_per_kind() -> None:
    assert parse_budget("100s").fraction(elapsed=25, tokens=10**9, steps=10**6) == 0.25
    assert parse_budget("1e6tok").fraction(elapsed=1e9, tokens=500_000, steps=0) == 0.5
    b = parse_budget("10steps")
    assert b.fraction(0, 0, 3) == 0.3 and not b.done(0, 0, 9) and b.done(0, 0, 10) and b.fraction(0, 0, 99) == 1.0


@pytest.mark.parametrize("text", ["30s", "5m", "1.5h", "0.25s", "2e9tok", "1000steps", "1step"])
def test_a_budgets_text_form_reads_back_as_itself(text: str) -> None:
    budget = parse_budget(text)
    assert parse_budget(budget.text) == budget


def test_a_step_budget_is_built_not_written() -> None:
    assert Budget.of_steps(12) == parse_budget("12steps") and Budget.of_steps(12).text == "12steps"
    for bad in (0, -3, 2.5, True):
        with pytest.raises(CramkitError, match="whole number of at least 1"):
            Budget.of_steps(bad)


def test_the_train_config_reads_its_budget_once() -> None:
    from cramkit.train.config import TrainConfig, resolve_config

    tcfg = resolve_config("tiny-cpu", ["train.budget=5m"]).train
    assert tcfg.budget == "5m" and tcfg.parsed_budget == Budget("time", 300.0)
    assert tcfg.parsed_budget is tcfg.parsed_budget  # read once, kept
    with pytest.raises(CramkitError, match=r"^train\.budget: cannot read budget '5x'"):
        resolve_config("tiny-cpu", ["train.budget=5x"])
    with pytest.raises(CramkitError, match=r"^--budget: cannot read budget '5x'"):
        TrainConfig.read_budget("5x", "--budget")


def test_parse_every() -> None:
    assert parse_every("10m", "x").kind == "time" and parse_every("10m", "x").amount == 600
    e = parse_every("500steps", "x")
    assert (e.kind, e.amount) == ("steps", 500) and e.due(0, 0, 100, 600) and not e.due(0, 0, 100, 599)
    assert parse_every("never", "x").kind == "never" and parse_every(0, "x").kind == "never"
    assert parse_every(25, "x").amount == 25
    with pytest.raises(CramkitError, match="train.eval_every"):
        parse_every("2e9tok", "train.eval_every")


def cramming_budget_triangle2(f: float, base: float = 0.25, falloff: float = 0.25) -> float:
    """Cramming's get_budget_triangle lr_lambda (budget-triangle2) with fake_step/steps = f."""
    return min(base + f * (1 - base) / (1 - falloff), 1 / falloff - f / falloff)


@pytest.mark.parametrize("f", [i / 40 for i in range(41)])
def test_budget_triangle_matches_cramming(f: float) -> None:
    assert lr_factor(f, "budget-triangle") == pytest.approx(cramming_budget_triangle2(f), abs=1e-12)


def test_schedule_shapes() -> None:
    # budget triangle: 25% at start, peak at 75%, 0 at the end
    assert lr_factor(0.0) == 0.25 and lr_factor(0.75) == 1.0 and lr_factor(1.0) == 0.0
    # linear (HF): 0 at start, peak after 6%, linear to 0
    assert lr_factor(0.0, "linear") == 0.0 and lr_factor(0.06, "linear") == 1.0
    assert lr_factor(0.53, "linear") == pytest.approx(0.5)
    # one-cycle: cosine from 4% to peak at 30%, cosine down to 0
    assert lr_factor(0.0, "one-cycle") == pytest.approx(0.04) and lr_factor(0.3, "one-cycle") == 1.0
    assert lr_factor(0.65, "one-cycle") == pytest.approx(0.5) and lr_factor(1.0, "one-cycle") == pytest.approx(0.0)
    # constant, with an optional warmup from 0
    assert lr_factor(0.0, "constant") == 1.0 and lr_factor(0.99, "constant") == 1.0
    assert lr_factor(0.05, "constant", warmup=0.1) == pytest.approx(0.5)
    # overrides: an earlier peak for the triangle
    assert lr_factor(0.5, "budget-triangle", warmup=0.5, cooldown=0.5, start=0.0) == 1.0
    assert lr_factor(0.25, "budget-triangle", warmup=0.5, cooldown=0.5, start=0.0) == 0.5
    # clamps outside [0, 1]
    assert lr_factor(-1.0) == 0.25 and lr_factor(2.0) == 0.0


def test_accumulation_ramp() -> None:
    assert accumulation_steps(0.0, 8, 0.6) == 1
    assert accumulation_steps(0.3, 8, 0.6) == 1 + math.floor(7 * 0.5)
    assert accumulation_steps(0.6, 8, 0.6) == 8 and accumulation_steps(0.99, 8, 0.6) == 8
    assert accumulation_steps(0.0, 8, 0.0) == 8  # no ramp
    values = [accumulation_steps(i / 100, 64, 0.6) for i in range(101)]
    assert values == sorted(values) and values[0] == 1 and values[-1] == 64
