"""precision auto on a CPU (bf16 where the CPU computes it natively, fp32 elsewhere), train.micro_batch=auto, and
`cramkit doctor`'s ceilings as a CPU run's MFU. The CPU's flags are faked: conftest pins auto to fp32 on every test
machine (CRAMKIT_CPU_BF16=0), these tests lift that and say which flags the CPU has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from clirun import cli, ok, one_line
from cramkit import runtime
from cramkit.train import config as train_config
from cramkit.train.config import resolve_config, resolve_micro_batch
from cramkit.train.metrics import read_metrics

CPU = torch.device("cpu")


@pytest.fixture
def cpu_with(monkeypatch: pytest.MonkeyPatch):
    """``cpu_with(*flags)``: this CPU reports these /proc/cpuinfo flags, and the rule is not pinned."""

    def fake(*flags: str) -> None:
        monkeypatch.delenv(runtime.CPU_BF16_ENV, raising=False)
        monkeypatch.setattr(runtime, "cpu_flags", lambda: frozenset(flags))

    return fake


@pytest.mark.parametrize(
    ("flags", "want", "because"),
    [
        (("avx2", "fma", "amx_bf16", "amx_tile", "avx512_bf16"), "bf16", "amx_bf16"),  # a Sapphire Rapids Xeon
        (("avx2", "avx512f", "avx512_bf16", "avx512_vnni"), "bf16", "avx512_bf16"),  # an AMD EPYC Zen 4
        (("avx2", "fma", "avx512f", "avx512_vnni"), "fp32", "no native bf16"),  # VNNI alone: int8, not bf16
        (("avx2", "fma"), "fp32", "no native bf16"),
        ((), "fp32", "no native bf16"),  # flags unreadable (not Linux)
    ],
)
def test_auto_is_bf16_only_where_the_cpu_computes_it(cpu_with, flags, want, because) -> None:
    cpu_with(*flags)
    got, why = runtime.precision_rule("auto", CPU)
    assert got == want and because in why
    assert runtime.resolve_precision("auto", CPU) == want
    # an explicit choice is kept whatever the CPU has
    assert runtime.precision_rule("fp32", CPU) == ("fp32", "asked for")
    assert runtime.precision_rule("bf16", CPU) == ("bf16", "asked for")
    assert runtime.precision_rule("auto", torch.device("cuda"))[0] == "bf16"


def test_the_override_wins_both_ways(cpu_with, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_with("amx_bf16")
    monkeypatch.setenv(runtime.CPU_BF16_ENV, "0")
    assert runtime.precision_rule("auto", CPU)[0] == "fp32"
    cpu_with("avx2")
    monkeypatch.setenv(runtime.CPU_BF16_ENV, "1")
    assert runtime.precision_rule("auto", CPU) == ("bf16", runtime.precision_rule("auto", CPU)[1])
    assert "CRAMKIT_CPU_BF16=1" in runtime.precision_rule("auto", CPU)[1]


def test_the_real_cpu_flags_are_read() -> None:
    flags = runtime.cpu_flags()
    assert isinstance(flags, frozenset)
    if Path("/proc/cpuinfo").is_file() and "x86" in __import__("platform").machine():
        assert "sse2" in flags  # every x86-64 CPU has it


def _pretrain(tmp_path: Path, wiki_files: list[str], tiny: list[str], *more: str):
    run = tmp_path / "run"
    sets = [x for s in ["tokenizer.vocab_size=1000", *tiny, *more] for x in ("--set", s)]
    return run, ok("pretrain", *wiki_files, "--out", str(run), "--budget", "3steps", *sets)


def test_pretrain_on_a_bf16_cpu_trains_in_bf16_keeps_fp32_weights_and_says_why(
    cpu_with, tmp_path: Path, wiki_files: list[str], tiny: list[str]
) -> None:
    cpu_with("avx2", "amx_bf16")
    run, said = _pretrain(tmp_path, wiki_files, tiny)
    assert "precision bf16 (auto: bf16 autocast, this CPU computes bf16 natively (amx_bf16)" in said
    records = [r for r in read_metrics(run) if "loss" in r]
    assert records and all(r["precision"] == "bf16" and r["loss"] == r["loss"] for r in records)
    weights = next((run / "checkpoints").glob("step-*/model.safetensors"))
    with safe_open(str(weights), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}  # noqa: SIM118


def test_pretrain_opts_out_with_fp32(cpu_with, tmp_path: Path, wiki_files: list[str], tiny: list[str]) -> None:
    cpu_with("avx2", "amx_bf16")
    run, said = _pretrain(tmp_path, wiki_files, tiny, "train.precision=fp32")
    assert "precision fp32 (asked for)" in said
    assert {r["precision"] for r in read_metrics(run) if "loss" in r} == {"fp32"}


def test_inference_takes_the_rule_and_the_export_check_stays_fp32(cpu_with, ft_model: Path, tmp_path: Path) -> None:
    from cramkit.infer.engine import Engine

    cpu_with("amx_bf16")
    assert Engine(str(ft_model), backend="torch", device="cpu").runner.precision == "bf16"
    # the export's check compares with the fp32 torch model: a bf16 reference would fail ONNX's 1e-3 tolerance
    ok("export", str(ft_model), "--format", "onnx", "--out", str(tmp_path / "onnx"))
    manifest = json.loads(next((tmp_path / "onnx").glob("*.json")).read_text())
    assert manifest["check"]["worst_relative_diff"] < 1e-3


# --------------------------------------------------------------------------- train.micro_batch=auto


@pytest.mark.parametrize(
    ("memory_gib", "want"),
    [(141, 256), (80, 256), (24, 256), (22, 128), (16, 128), (8, 32), (2, 8)],
)
def test_auto_micro_batch_fits_the_gpu(monkeypatch: pytest.MonkeyPatch, memory_gib: float, want: int) -> None:
    monkeypatch.setattr(runtime, "machine_memory", lambda device: (int(memory_gib * 2**30), "GPU memory (test)"))
    cfg, why = resolve_micro_batch(resolve_config("crammed-bert"), 32768)
    assert cfg.train.micro_batch == want and why and f"auto: {want}" in why
    # what it picked fits by the measured ratio to the estimate, and the next size up does not
    need = train_config.estimate_training_bytes(cfg, 32768)[1] * train_config.MEASURED_OVER_ESTIMATE
    if want > 8:
        assert need <= train_config.AUTO_MEMORY_SHARE * memory_gib * 2**30


def test_auto_micro_batch_on_a_cpu_and_never_above_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "machine_memory", lambda device: (24 * 2**30, "RAM"))
    assert resolve_micro_batch(resolve_config("crammed-bert"), 32768)[0].train.micro_batch == 32
    monkeypatch.setattr(runtime, "machine_memory", lambda device: (141 * 2**30, "GPU memory (test)"))
    small = resolve_config("crammed-bert", ["train.batch_size=64"])
    assert resolve_micro_batch(small, 32768)[0].train.micro_batch == 64
    explicit = resolve_config("crammed-bert", ["train.micro_batch=100"])
    assert resolve_micro_batch(explicit, 32768) == (explicit, None)


def test_a_wrong_micro_batch_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("some text\n" * 10, encoding="utf-8")
    res = cli("pretrain", str(tmp_path / "x.txt"), "--set", "train.micro_batch=big")
    assert "train.micro_batch must be a positive number or auto, got 'big'" in one_line(res)


# --------------------------------------------------------------------------- cramkit doctor


def test_doctor_measures_and_keeps_the_ceilings_a_cpu_run_reports_against(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, wiki_files: list[str], tiny: list[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    said = ok("doctor", "--seconds", "0.03", "--tokens", "256", "--json", str(tmp_path / "d.json"))
    report = json.loads((tmp_path / "d.json").read_text())
    one = report["cpu_gflops"]["1"]
    assert one["fp32"] > 0 and one["bf16"] > 0 and report["memory_gb_s"] > 0
    assert "GFLOP/s" in said and "precision auto on this CPU: fp32" in said  # (pinned by conftest)
    from cramkit.doctor import cpu_ceiling

    assert cpu_ceiling("fp32", 1) == pytest.approx(one["fp32"] * 1e9)
    # a CPU training run now reports its model FLOP/s as a share of that ceiling (one thread, as measured)
    run, _ = _pretrain(tmp_path, wiki_files, tiny)
    mfus = [r["mfu"] for r in read_metrics(run) if "loss" in r]
    assert mfus and all(isinstance(m, float) and m > 0 for m in mfus)


def test_doctor_refuses_bad_values_and_ignores_a_crafted_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert "--hidden must be between 1 and 65536, got 0" in one_line(cli("doctor", "--hidden", "0"))
    assert "--seconds must be between 0.01 and 60" in one_line(cli("doctor", "--seconds", "1e9"))
    from cramkit import doctor
    from cramkit.errors import CramkitError

    for request in (doctor.DoctorRequest(tokens=70000), None):  # a request, or its fields: the command's line
        with pytest.raises(CramkitError) as exc:
            doctor.doctor(request) if request is not None else doctor.doctor(tokens=70000)
        assert one_line(cli("doctor", "--tokens", "70000")) == f"cramkit: error: {exc.value}"

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "cramkit").mkdir()
    for crafted in (
        "[1, 2]",
        "not json",
        json.dumps({doctor._key(1): {"fp32": "fast"}}),
        json.dumps({doctor._key(1): {"fp32": 1e308}}),
    ):
        (tmp_path / "cramkit" / doctor.CEILINGS_FILE).write_text(crafted)
        assert doctor.cpu_ceiling("fp32", 1) is None
