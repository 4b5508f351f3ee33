"""Ceilings that hold (issue 65, item 2): the doctor's figure is the best of several samples and the best ever
saved, a measurement at small shapes never lowers a saved ceiling, the instruction set's theoretical peak
(cramkit.peak, from crafted /proc/cpuinfo text) bounds every figure, and a training run that computes faster
than its ceiling says once that it is stale, raises it, and never records an MFU above 1.0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clirun import cli, ok
from conftest import TINY_MODEL_SETS
from cramkit import doctor, peak, runtime
from cramkit.train.metrics import read_metrics

HASWELL = """processor\t: 0
model name\t: Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz
cpu MHz\t\t: 2494.224
flags\t\t: fpu sse sse2 avx f16c fma avx2 bmi2
processor\t: 1
cpu MHz\t\t: 3000.000
flags\t\t: fpu sse sse2 avx f16c fma avx2 bmi2
"""
SKYLAKE_X = (
    "model name : Intel Xeon Gold 6148\ncpu MHz : 2400.000\nflags : sse2 avx fma avx2 avx512f avx512bw avx512_vnni\n"
)
ZEN4 = (
    "model name : AMD EPYC 9R14\ncpu MHz : 2600.000\n"
    "flags : sse2 avx fma avx2 avx512f avx512bw avx512_vnni avx512_bf16\n"
)
SAPPHIRE = (
    "model name : Intel Xeon Platinum 8488C\ncpu MHz : 2000.000\n"
    "flags : sse2 avx fma avx2 avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_int8 amx_tile\n"
)


@pytest.mark.parametrize(
    ("text", "precision", "want_isa", "per_cycle", "mhz"),
    [
        (HASWELL, "fp32", "avx2", 2 * 8 * 2, 3000.0),  # the largest cpu MHz line
        (HASWELL, "bf16", "emulated:avx2", 2 * 8 * 2, 3000.0),  # no native bf16: fp32's bound
        (HASWELL, "int8", "avx2", 2 * 8 * 4 * 2, 3000.0),
        (SKYLAKE_X, "fp32", "avx512", 2 * 16 * 2, 2400.0),
        (SKYLAKE_X, "int8", "avx512_vnni", 2 * 16 * 4 * 2, 2400.0),
        (ZEN4, "bf16", "avx512_bf16", 2 * 16 * 2 * 2, 2600.0),  # dot products: twice fp32's rate
        (ZEN4, "fp32", "avx512", 2 * 16 * 2, 2600.0),
        (SAPPHIRE, "bf16", "amx", 2048, 2000.0),
        (SAPPHIRE, "int8", "amx", 4096, 2000.0),
    ],
)
def test_the_peak_of_each_instruction_set_from_cpuinfo(text, precision, want_isa, per_cycle, mhz) -> None:
    info = peak.parse_cpuinfo(text)
    assert info.mhz == mhz and info.model
    assert peak.isa(info.flags, precision) == (want_isa, per_cycle)
    # width x min(threads, cores) x clock: more threads than cores add nothing
    assert peak.peak_flops(info.flags, info.mhz, precision, 4, 4) == pytest.approx(per_cycle * 4 * mhz * 1e6)
    assert peak.peak_flops(info.flags, info.mhz, precision, 8, 4) == peak.peak_flops(info.flags, mhz, precision, 4, 4)


def test_the_clock_and_the_unknowns() -> None:
    info = peak.parse_cpuinfo(HASWELL)
    assert peak.clock_mhz(info, "3600000\n") == 3600.0  # sysfs cpuinfo_max_freq (kHz) when readable and higher
    # without sysfs's maximum, /proc/cpuinfo's clock may be a VM's base clock: the bound allows the cores to boost
    assert peak.clock_mhz(info, "junk") == 3000.0 * peak.UNKNOWN_BOOST == peak.clock_mhz(info, None)
    bare = peak.parse_cpuinfo("processor : 0\nflags : fpu\n")  # no MHz, no vector flags
    assert bare.mhz is None and peak.isa(bare.flags, "fp32") is None
    assert peak.peak_flops(info.flags, None, "fp32", 1, 1) is None  # no clock: nothing bounded
    assert peak.peak_flops(bare.flags, 3000.0, "fp32", 1, 1) is None
    arm = peak.parse_cpuinfo("Features : fp asimd asimddp bf16 i8mm\n")
    assert peak.isa(arm.flags, "bf16")[0] == "arm_bf16" and peak.isa(arm.flags, "int8")[0] == "arm_i8mm"


@pytest.fixture
def avx2_at(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """``avx2_at(mhz)``: this CPU has AVX2 and FMA (no native bf16) at ``mhz``, its cache under tmp_path;
    returns the ceilings file."""

    def fake(mhz: float) -> Path:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        monkeypatch.setattr(doctor, "_SAID", set())
        monkeypatch.setattr(runtime, "cpu_flags", lambda: frozenset({"sse2", "avx", "avx2", "fma"}))
        monkeypatch.setattr(peak, "this_cpu", lambda: (peak.CpuInfo("crafted", frozenset(), mhz), mhz))
        path = tmp_path / "cache" / "cramkit" / doctor.CEILINGS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    return fake


SMALL = ("doctor", "--seconds", "0.01", "--tokens", "16", "--hidden", "16", "--intermediate", "32")


def test_a_doctor_at_small_shapes_keeps_the_better_saved_ceiling(avx2_at) -> None:
    cache = avx2_at(3000.0)  # fp32 peak on one thread: 32 x 3 GHz = 96 GFLOP/s
    # a cache written before this change: one shape and date for every figure
    cache.write_text(json.dumps({doctor._key(1): {"fp32": 95.0, "shape": [2048, 384, 1536], "date": "2025-01-01"}}))
    said = ok(*SMALL)
    assert "1 thread(s) fp32: kept the saved 95 (measured at 2048x384x1536 on 2025-01-01) over this run's" in said
    assert "fp32" in said and "(avx2, peak 96)" in said  # the ISA and its peak beside each figure
    assert doctor.cpu_ceiling("fp32", 1) == pytest.approx(95e9)
    entry = json.loads(cache.read_text())[doctor._key(1)]
    assert entry["fp32"] == 95.0 and entry["shapes"]["fp32"] == [2048, 384, 1536]
    assert entry["shapes"]["bf16"] == [16, 16, 32]  # a figure not saved before is kept with its shape


def test_a_figure_above_the_peak_is_clamped(avx2_at, tmp_path: Path) -> None:
    cache = avx2_at(1.0)  # a 1 MHz clock: a 32 MFLOP/s fp32 peak a thread, below any real measurement
    cache.write_text(json.dumps({doctor._key(1): {"fp32": 500.0, "bf16": 500.0}}))
    assert doctor.cpu_ceiling("fp32", 1) == pytest.approx(32e6)  # a saved figure above the peak, read back
    said = ok(*SMALL, "--json", str(tmp_path / "d.json"))
    assert "1 thread(s) fp32: measured" in said and "clamped to it" in said
    report = json.loads((tmp_path / "d.json").read_text())
    assert report["cpu_gflops"]["1"]["fp32"] == pytest.approx(0.032)
    assert report["cpu_peak_gflops"]["1"]["fp32"] == pytest.approx(0.032)
    assert json.loads(cache.read_text())[doctor._key(1)]["fp32"] == pytest.approx(0.032)


def _pretrain(tmp_path: Path, tok_dir: str, *more: str):
    sets = [x for item in [*TINY_MODEL_SETS, "train.threads=1", *more] for x in ("--set", item)]
    proc = cli("pretrain", "--budget", "10steps", "--tokenizer", tok_dir, "--out", tmp_path / "run", *sets)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    mfus = [r["mfu"] for r in read_metrics(tmp_path / "run") if "loss" in r]
    return proc.stderr, mfus


def test_a_stale_ceiling_is_said_once_raised_and_no_mfu_passes_100(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tok_dir: str
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(doctor, "_SAID", set())
    cache = tmp_path / "cache" / "cramkit" / doctor.CEILINGS_FILE
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({doctor._key(1): {"fp32": 0.001}}))  # 1 MFLOP/s: far below any run
    err, mfus = _pretrain(tmp_path, tok_dir)
    basis = doctor.cpu_basis("fp32", 1)
    # the opening line names the ceiling's precision, ISA, threads and peak; the stale line comes once
    assert "precision fp32 (" in err and "MFU against the measured ceiling, 0.001 GFLOP/s (fp32, " in err
    assert f"fp32, {basis.isa}, 1 thread(s); theoretical peak" in err
    assert err.count("ceiling stale (measured 0.001 GFLOP/s, this run reached ") == 1 and "re-measuring" in err
    assert len(mfus) >= 3 and all(isinstance(m, float) and 0 < m <= 1.0 for m in mfus), mfus
    assert "mfu=" in err and all(float(x.split("%")[0]) <= 100 for x in err.split("mfu=")[1:])
    assert json.loads(cache.read_text())[doctor._key(1)]["fp32"] > 0.001  # raised for the next run


def test_a_run_faster_than_the_peak_still_records_at_most_one(avx2_at, tmp_path: Path, tok_dir: str) -> None:
    cache = avx2_at(0.001)  # a 32 kFLOP/s peak: the run passes it, and so does any re-measure
    cache.write_text(json.dumps({doctor._key(1): {"fp32": 1e-6}}))
    err, mfus = _pretrain(tmp_path, tok_dir)
    assert err.count("ceiling stale") == 1 and "emulated" not in err and "avx2, 1 thread(s)" in err
    assert mfus and all(m <= 1.0 for m in mfus), mfus
    assert json.loads(cache.read_text())[doctor._key(1)]["fp32"] == pytest.approx(3.2e-5)  # capped at the peak
