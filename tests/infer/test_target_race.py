"""`cramkit export --target cpu|cpu-serve` by measurement (cramkit.infer.race): the installed formats raced on
this machine, the race recorded in the manifest and cached per CPU, the fastest that agrees with fp32 chosen,
the CPU flags' rule where no race can run. No timing is asserted: which format wins is the machine's business."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clirun import one_line
from cramkit import backends
from cramkit.infer import race
from cramkit.infer.export import cpu_target
from cramkit.loading import load_torch

from .models import cli, ok

pytest.importorskip("onnxruntime")
pytest.importorskip("ctranslate2")

TWO = (("ct2", "int8"), ("ct2", "float32"))  # two quick exports: a short race where the test is not about formats


@pytest.fixture(autouse=True)
def _quick_race(tmp_path, monkeypatch) -> Path:
    """A cache directory of the test's own and a short race (the measuring budget, not the exports)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv(race.SECONDS_ENV, "0.3")
    monkeypatch.delenv(race.RACE_ENV, raising=False)
    race._SAID.clear()
    return cache / "cramkit" / race.RACES_FILE


def _manifest(out: Path) -> dict:
    name = backends.kind_of(out)
    assert name is not None, list(out.iterdir())
    return json.loads((out / backends.get(name).marker).read_text())


def _line(said: str, target: str = "cpu") -> str:
    lines = [ln for ln in said.splitlines() if ln.startswith(f"cramkit: --target {target}: ") and "(1.00x)" in ln]
    assert len(lines) == 1, said
    return lines[0]


@pytest.mark.slow  # every installed format exported (the ONNX and OpenVINO ones take seconds each): ~30 s
def test_target_cpu_races_every_installed_format_and_reuses_the_race(ft_model, tmp_path, _quick_race) -> None:
    found, skipped = race.candidates(load_torch(ft_model))
    names = {race.label(f, q) for f, q in found}
    assert {"ct2 int8", "ct2 float32", "onnx int8", "onnx fp32"} <= names
    said = ok("export", str(ft_model), "--target", "cpu", "--out", str(tmp_path / "a"))
    line = _line(said)
    assert " raced " in line and " thread" in line and race.BASELINE in line, line
    rec = _manifest(tmp_path / "a")["race"]
    assert {c["name"] for c in rec["candidates"]} == names | {race.BASELINE} and rec["skipped"] == skipped
    chosen = next(c for c in rec["candidates"] if c["name"] == rec["chosen"])
    assert chosen["agrees"] is True and chosen["ratio"] == 1.0 and chosen["format"] != "torch"
    assert chosen["agreement"]["prob_max_diff"] <= race.AGREE_PROB  # a classifier: its probabilities
    assert line.split(": ", 2)[2].startswith(f"{rec['chosen']} (1.00x)")
    cells = {"short @1", "long @1"} | {f"short @{t}" for t in rec["threads"]} | {f"long @{t}" for t in rec["threads"]}
    for c in rec["candidates"]:
        assert c["error"] is not None or (set(c["texts_per_s"]) == cells and min(c["texts_per_s"].values()) > 0)
        # two rounds per cell each, more only for a contender: the chosen one, and never the baseline
        assert c["error"] is not None or (set(c["rounds"]) == cells and min(c["rounds"].values()) >= 2)
    assert max(next(c for c in rec["candidates"] if c["name"] == race.BASELINE)["rounds"].values()) == 2
    key = rec["key"]
    assert key["cpu"] and key["kind"] == "classifier" and key["shape"]["layers"] == 2 and key["shape"]["hidden"] == 64
    assert set(key["versions"]) >= {"torch", "ctranslate2"} and rec["reused"] is False
    # the export is the chosen one, checked as any export is
    assert backends.kind_of(tmp_path / "a") == chosen["format"]
    assert _manifest(tmp_path / "a")["quantize"] == chosen["quantize"]
    # the race is cached for this CPU model: a second export of this kind of model reuses it, and says so
    cache = json.loads(_quick_race.read_text())
    assert cache[rec["digest"]]["chosen"] == rec["chosen"]
    said = ok("export", str(ft_model), "--target", "cpu", "--out", str(tmp_path / "b"))
    line = _line(said)
    assert "the cached race of" in line and "--race runs it again" in line and "racing" not in said, said
    again = _manifest(tmp_path / "b")["race"]
    assert again["reused"] is True and again["chosen"] == rec["chosen"]


def test_the_race_is_cached_per_cpu_and_run_again_on_request(ft_model, tmp_path, monkeypatch, _quick_race) -> None:
    monkeypatch.setattr(race, "CANDIDATES", TWO)
    said = ok("export", str(ft_model), "--target", "cpu", "--out", str(tmp_path / "a"))
    assert "cramkit: --target cpu: racing ct2 int8, ct2 float32 and torch fp32 on this CPU" in said
    rec = _manifest(tmp_path / "a")["race"]
    assert " raced " in _line(said) and rec["reused"] is False
    assert {c["name"] for c in rec["candidates"]} == {"ct2 int8", "ct2 float32", race.BASELINE}
    chosen = next(c for c in rec["candidates"] if c["name"] == rec["chosen"])
    assert chosen["agrees"] and _manifest(tmp_path / "a")["quantize"] == chosen["quantize"]
    assert json.loads(_quick_race.read_text())[rec["digest"]]["chosen"] == rec["chosen"]
    # the same kind of model on the same CPU: the cached race, said so
    said = ok("export", str(ft_model), "--target", "cpu", "--out", str(tmp_path / "b"))
    assert "the cached race of" in _line(said) and "racing" not in said, said
    assert _manifest(tmp_path / "b")["race"]["reused"] is True
    # --race races again, cache or not
    said = ok("export", str(ft_model), "--target", "cpu", "--race", "--out", str(tmp_path / "c"))
    assert " raced " in _line(said) and _manifest(tmp_path / "c")["race"]["reused"] is False
    # a cached race is reused only for its key: another set of formats, another CPU, another shape of model
    loaded = load_torch(ft_model)
    found = list(TWO)
    key = race.race_key(loaded, "cpu", found)
    assert key == rec["key"] and race.cached(key, found) is not None
    other = race.race_key(loaded, "cpu", [("ct2", "int8"), ("ct2", "int8_float32")])
    assert race.cached(other, [("ct2", "int8"), ("ct2", "int8_float32")]) is None
    for field, value in (("cpu", "Another CPU"), ("flags", ["avx2"]), ("cores", 64), ("kind", "encoder")):
        assert race.cached({**key, field: value}, found) is None
    assert race.cached({**key, "shape": {**key["shape"], "layers": 12}}, found) is None
    assert race.cached(race.race_key(loaded, "cpu-serve", found), found) is None


def test_forcing_the_race_is_one_setting(monkeypatch) -> None:
    assert race.wanted(None) == (None, "")
    assert race.wanted(True) == (True, "--race") and race.wanted(False) == (False, "--no-race")
    monkeypatch.setenv(race.RACE_ENV, "1")
    assert race.wanted(None) == (True, f"{race.RACE_ENV}=1") and race.wanted(False)[0] is False
    monkeypatch.setenv(race.RACE_ENV, "0")
    assert race.wanted(None) == (False, f"{race.RACE_ENV}=0")


def test_a_corrupt_or_crafted_cache_is_ignored_in_one_line(
    ft_model, tmp_path, monkeypatch, capsys, _quick_race
) -> None:
    monkeypatch.setattr(race, "CANDIDATES", TWO)
    _quick_race.parent.mkdir(parents=True)
    _quick_race.write_text("{not json", encoding="utf-8")
    said = ok("export", str(ft_model), "--target", "cpu", "--out", str(tmp_path / "a"))
    damaged = [ln for ln in said.splitlines() if "cached races" in ln]
    assert len(damaged) == 1 and "damaged" in damaged[0] and "racing again" in damaged[0], said
    assert " raced " in _line(said)
    rec = _manifest(tmp_path / "a")["race"]
    assert json.loads(_quick_race.read_text())[rec["digest"]]["chosen"] == rec["chosen"]  # written anew
    # a crafted entry under this race's key (a chosen format that was not raced, a ratio that is no number,
    # a chosen one that failed): ignored, in one line each
    key, found = rec["key"], list(TWO)
    chosen = next(c for c in rec["candidates"] if c["name"] == rec["chosen"])
    for crafted in (
        {**rec, "chosen": "evil 9000"},
        {**rec, "candidates": [{**chosen, "ratio": "x", "error": None}]},
        {**rec, "candidates": [{**chosen, "error": "it failed"}]},
        {**rec, "candidates": [{**chosen, "format": "onnx"}]},
        {**rec, "threads": "all"},
        "a string",
    ):
        race._SAID.clear()
        _quick_race.write_text(json.dumps({rec["digest"]: crafted}), encoding="utf-8")
        assert race.cached(key, found) is None
        said = capsys.readouterr().err
        assert said.count("\n") == 1 and "malformed; ignored, racing again" in said, said
    _quick_race.write_text(json.dumps({rec["digest"]: rec}), encoding="utf-8")
    assert race.cached(key, found) is not None  # the record as written: reused
    # a cache that is valid JSON but not an object, or too large: ignored too, never a traceback
    race._SAID.clear()
    _quick_race.write_text("[1, 2]", encoding="utf-8")
    assert race.read_races() == {}
    _quick_race.write_text(" " * (race.RACES_BYTES + 1), encoding="utf-8")
    race._SAID.clear()
    assert race.read_races() == {}


def test_a_candidate_that_disagrees_with_fp32_is_never_chosen(pretrained_run, tmp_path, monkeypatch) -> None:
    """The embeddings of one format made wrong (in this process), and that format made the fastest: the race
    records it as disagreeing and chooses another."""
    from cramkit.backends.ct2 import Ct2Runner

    monkeypatch.setattr(race, "CANDIDATES", TWO)
    real_pooled = Ct2Runner.pooled
    exporting = {"done": False}

    def wrong(self, x):  # type: ignore[no-untyped-def]
        mean, cls = real_pooled(self, x)
        if not exporting["done"] or self.model.manifest["quantize"] != "int8":  # the export's check: real ones
            return mean, cls
        rng = np.random.default_rng(0)
        return rng.standard_normal(mean.shape).astype(np.float32), cls

    real_measure = race.measure

    def ct2_fastest(entrants, loaded, plan, seconds, texts):  # type: ignore[no-untyped-def]
        real_measure(entrants, loaded, plan, seconds, texts)
        for e in entrants:
            for cell in e.rates:
                e.rates[cell] = 1e6 if e.name == "ct2 int8" else 1.0

    real_agreement = race.agreement

    def agreement(entrants, loaded, texts, runs):  # type: ignore[no-untyped-def]
        exporting["done"] = True
        real_agreement(entrants, loaded, texts, runs)

    monkeypatch.setattr(Ct2Runner, "pooled", wrong)
    monkeypatch.setattr(race, "measure", ct2_fastest)
    monkeypatch.setattr(race, "agreement", agreement)
    said = ok("export", str(pretrained_run), "--target", "cpu", "--out", str(tmp_path / "a"))
    rec = _manifest(tmp_path / "a")["race"]
    ct2 = next(c for c in rec["candidates"] if c["name"] == "ct2 int8")
    assert ct2["agrees"] is False and ct2["agreement"]["cosine_mean"] < race.AGREE_COSINE
    assert rec["chosen"] == "ct2 float32" and _manifest(tmp_path / "a")["quantize"] == "float32"
    assert "ct2 int8 " in _line(said) and "(disagrees with fp32: cosine_mean" in _line(said), said
    fp32 = next(c for c in rec["candidates"] if c["name"] == "ct2 float32")
    assert (
        fp32["agrees"] is True and fp32["agreement"]["cosine_mean"] >= 0.999
    )  # an embedding model: its vectors' cosine


def test_without_a_race_the_cpu_flags_rule_decides_and_says_why(ft_model, tmp_path, monkeypatch) -> None:
    fmt, quantize, why = cpu_target()
    rule = f"cramkit: --target cpu: --format {fmt} --quantize {quantize or 'none'}: {why}"
    # one format installed that can hold the model: nothing to race
    monkeypatch.setattr(race, "CANDIDATES", (("onnx", "int8"),))
    said = ok("export", str(ft_model), "--target", "cpu", "--out", str(tmp_path / "one"))
    assert f"{rule} (the CPU flags' rule: not raced, only onnx int8 is installed and can hold this model" in said
    rec = _manifest(tmp_path / "one")["race"]
    assert rec["raced"] is False and rec["rule"] == why and "only onnx int8" in rec["why_not"]
    # a race that fails: the rule, and the failure in the same line
    monkeypatch.setattr(race, "CANDIDATES", TWO)

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("the runtime fell over")

    monkeypatch.setattr(race, "measure", broken)
    said = ok("export", str(ft_model), "--target", "cpu", "--out", str(tmp_path / "failed"))
    assert f"{rule} (the CPU flags' rule: not raced, the race failed (RuntimeError: the runtime fell over))" in said
    assert _manifest(tmp_path / "failed")["race"]["raced"] is False
    # --no-race, or CRAMKIT_RACE=0: the rule, as asked
    said = ok("export", str(ft_model), "--target", "cpu", "--no-race", "--out", str(tmp_path / "asked"))
    assert [ln for ln in said.splitlines() if ln.startswith("cramkit: --target")] == [rule], said
    said = ok("export", str(ft_model), "--target", "cpu", "--out", str(tmp_path / "env"), env={race.RACE_ENV: "0"})
    assert [ln for ln in said.splitlines() if ln.startswith("cramkit: --target")] == [rule], said
    # what cannot be: one line each, before the model is read
    proc = cli("export", str(ft_model), "--race", "--out", str(tmp_path / "x"))
    one_line(proc, "--race and --no-race apply to --target cpu or cpu-serve; add --target")
    proc = cli("export", str(ft_model), "--target", "cpu", "--out", str(tmp_path / "x"), env={race.RACE_ENV: "yes"})
    one_line(proc, f"{race.RACE_ENV} must be 1 (always race) or 0 (never: the CPU flags' rule), got 'yes'")
    assert not (tmp_path / "x").exists()


def test_target_cpu_serve_races_a_servers_request_shapes(ft_model, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(race, "CANDIDATES", TWO)
    said = ok("export", str(ft_model), "--target", "cpu-serve", "--out", str(tmp_path / "serve"))
    rec = _manifest(tmp_path / "serve")["race"]
    assert rec["target"] == "cpu-serve" and " raced " in _line(said, "cpu-serve")
    assert {c for c in rec["cells"]} == {
        f"{n} short text{'s' if n > 1 else ''}/call @{t}" for n in (1, 4) for t in rec["threads"]
    }
    assert rec["cells"]["4 short texts/call @1"]["per_call"] == 4
    # a race for a server is not a race for batch work: its own entry in the cache
    said = ok("export", str(ft_model), "--target", "cpu", "--out", str(tmp_path / "batch"))
    assert " raced " in _line(said) and _manifest(tmp_path / "batch")["race"]["digest"] != rec["digest"]


class _Clock:
    """A fake clock that each timed call advances by its own seconds: rounds without real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def entrant(self, seconds: list[float]):
        calls = iter(seconds)

        def timed() -> float:
            took = next(calls, seconds[-1])
            self.now += took
            return took

        return timed


def test_the_rounds_stop_timing_an_entrant_that_cannot_win() -> None:
    clock = _Clock()
    timed = {
        race.BASELINE: clock.entrant([1.0]),
        "ct2 int8": clock.entrant([0.3, 0.1]),  # a slow first call (its warm-up), then the fastest
        "onnx fp32": clock.entrant([0.2, 0.2]),  # ahead in the first round, 2x the best after the second
        "openvino bf16": clock.entrant([0.3, 0.12]),  # within 1.5x: a contender
    }
    times = race.rounds(timed, seconds=5.0, clock=clock)
    # everyone ran twice (the first kept: a warm-up only ever slows a round down) ...
    assert len(times[race.BASELINE]) == len(times["onnx fp32"]) == 2
    # ... then only the contenders went on, until the budget was spent, at least three rounds each
    assert len(times["ct2 int8"]) == len(times["openvino bf16"]) >= race.MIN_ROUNDS
    assert clock.now >= 5.0 and min(times["ct2 int8"]) == 0.1
    # a lone contender is not raced against itself
    clock = _Clock()
    alone = race.rounds({race.BASELINE: clock.entrant([1.0]), "ct2 int8": clock.entrant([0.1])}, 5.0, clock)
    assert {k: len(v) for k, v in alone.items()} == {race.BASELINE: 2, "ct2 int8": 2}
    assert clock.now < 5.0
    # a comparison of speeds (a student against its teacher): no one drops out, both timed to the budget
    clock = _Clock()
    both = race.rounds({"teacher": clock.entrant([0.3]), "student": clock.entrant([0.1])}, 5.0, clock, contend=None)
    assert len(both["teacher"]) == len(both["student"]) >= race.MIN_ROUNDS and clock.now >= 5.0


def test_the_race_checks_every_export_against_one_torch_pass(ft_model, tmp_path, monkeypatch) -> None:
    """The race exports every candidate, each checked against the fp32 torch model on the same texts: the torch
    side is computed for the first check and kept (``compare_outputs(reference=...)``), the results unchanged."""
    from functools import partial

    from cramkit.infer.engine import Engine, compare_outputs

    loaded, texts, reference = load_torch(ft_model), backends.check_texts()[:16], {}
    calls: list[str] = []
    for name in ("embed_encoded", "logits_encoded"):
        real = getattr(Engine, name)
        monkeypatch.setattr(Engine, name, lambda self, enc, _r=real, _n=name: calls.append(_n) or _r(self, enc))

    def export(out: str, ref: dict | None) -> dict:
        calls.clear()
        check = partial(compare_outputs, reference=ref) if ref is not None else compare_outputs
        backends.write_export("ct2", loaded, tmp_path / out, "float32", compare=check, texts=texts, progress=False)
        return _manifest(tmp_path / out)["check"]

    alone = export("alone", None)
    assert sorted(calls) == ["embed_encoded", "embed_encoded", "logits_encoded", "logits_encoded"]
    first = export("first", reference)
    assert len(calls) == 4 and {"embed", "logits"} <= set(reference)
    second = export("second", reference)
    assert sorted(calls) == ["embed_encoded", "logits_encoded"]  # the export's side only
    assert first == second == alone
    compare_outputs(loaded, backends.open_export(tmp_path / "first"), texts[:8], reference=reference)
    assert reference["texts"] == texts[:8]  # other texts: the reference started again
