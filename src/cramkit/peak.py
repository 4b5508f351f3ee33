"""The theoretical peak of a CPU's instruction set: an upper bound on any matrix-product rate measured on it.

peak FLOP/s = (FLOPs one core's vector units can retire per cycle, for the widest instruction set the CPU has at
that precision) x cores x clock. The per-cycle figures below are a rough table, deliberately generous (two FMA
units everywhere, the vendors' own matrix-unit figures for AMX): they bound a measurement from above, they do not
predict it. The clock is the largest the OS reports: ``cpuinfo_max_freq`` (sysfs, in kHz) when it is readable,
else the largest ``cpu MHz`` line of /proc/cpuinfo (in a virtual machine often the base clock, below a turbo).

Everything that reads text is a pure function of it (:func:`parse_cpuinfo`, :func:`clock_mhz`, :func:`isa`,
:func:`peak_flops`), so the table is tested on any machine with crafted /proc/cpuinfo text; :func:`this_cpu`
reads the real files.
"""

from __future__ import annotations

from dataclasses import dataclass

# (ISA name, the /proc/cpuinfo flags that must all be present, FLOPs (int8: ops) per cycle per core), best first
# fp32: FMA units x lanes x 2 (a fused multiply-add is 2 FLOPs)
FP32: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("avx512", ("avx512f",), 2 * 16 * 2),
    ("avx2", ("avx2", "fma"), 2 * 8 * 2),
    ("avx", ("avx",), 2 * 8),  # one add and one multiply a cycle, 8 lanes
    ("sse", ("sse2",), 2 * 4),
    ("neon", ("asimd",), 4 * 4 * 2),  # aarch64: up to 4 128-bit FMA pipes (Neoverse V2)
)
# bf16: dot products of bf16 pairs into fp32 lanes, twice fp32's rate; AMX: 1,024 bf16 FMAs a cycle (Intel's
# figure). Without a native instruction bf16 is converted and computed in fp32: fp32's bound
BF16: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("amx", ("amx_bf16",), 1024 * 2),
    ("avx512_bf16", ("avx512_bf16",), 2 * 16 * 2 * 2),
    ("arm_bf16", ("bf16",), 4 * 4 * 4 * 2),  # BFMMLA: 2x4 @ 4x2 per 128-bit instruction, 4 pipes
)
# int8 (ops: a multiply-add is 2): dot products of 4 int8 pairs into int32 lanes; AMX 2,048 int8 MACs a cycle
INT8: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("amx", ("amx_int8",), 2048 * 2),
    ("avx512_vnni", ("avx512_vnni",), 2 * 16 * 4 * 2),
    ("avx_vnni", ("avx_vnni",), 2 * 8 * 4 * 2),
    ("avx512", ("avx512bw",), 2 * 16 * 4 * 2),  # vpmaddubsw + vpmaddwd: VNNI's width, in more instructions
    ("avx2", ("avx2",), 2 * 8 * 4 * 2),
    ("arm_i8mm", ("i8mm",), 4 * 32 * 2),  # SMMLA: 2x8 @ 8x2 per 128-bit instruction, 4 pipes
    ("arm_dotprod", ("asimddp",), 4 * 16 * 2),
)
TABLES = {"fp32": FP32, "bf16": BF16, "int8": INT8}


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says of the CPU: its model, its flags (x86 ``flags``, aarch64 ``Features``) and the
    largest ``cpu MHz`` of its lines (None where no line gives one)."""

    model: str
    flags: frozenset[str]
    mhz: float | None


def parse_cpuinfo(text: str) -> CpuInfo:
    """The model, the flags of the first processor and the largest ``cpu MHz`` in /proc/cpuinfo's ``text``."""
    model, flags, mhz = "", frozenset[str](), None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "model name" and not model:
            model = value
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
        elif key == "cpu MHz":
            try:
                found = float(value)
            except ValueError:
                continue
            if 0 < found < 1e5 and (mhz is None or found > mhz):
                mhz = found
    return CpuInfo(model, flags, mhz)


# /proc/cpuinfo's "cpu MHz" in a virtual machine is often the base clock, and the cores boost above it (a Zen 5 EPYC
# read 2,596 MHz and measured 1.5x that clock's bf16 peak): without sysfs's maximum, the bound allows this much
UNKNOWN_BOOST = 2.0


def clock_mhz(info: CpuInfo, max_freq_khz: str | None = None) -> float | None:
    """The clock the peak assumes, in MHz: sysfs's ``cpuinfo_max_freq`` (``max_freq_khz``, its text) when it
    parses, else the largest ``cpu MHz`` of /proc/cpuinfo times :data:`UNKNOWN_BOOST` (the clock read may be the
    base one: the peak is an upper bound, never a figure a real run is held under); None when neither says."""
    if max_freq_khz is not None:
        try:
            khz = float(max_freq_khz.strip())
        except ValueError:
            khz = 0.0
        if 0 < khz < 1e8:
            return khz / 1000.0 if info.mhz is None else max(khz / 1000.0, info.mhz)
    return info.mhz * UNKNOWN_BOOST if info.mhz else info.mhz


def isa(flags: frozenset[str], precision: str) -> tuple[str, int] | None:
    """The widest instruction set ``flags`` have for ``precision`` (fp32, bf16, int8) and its FLOPs (ops) per
    cycle per core; bf16 without a native instruction is fp32's (``emulated:`` before its name); None when the
    table knows none of the flags."""
    if precision not in TABLES:
        return None
    for name, needs, per_cycle in TABLES[precision]:
        if all(flag in flags for flag in needs):
            return name, per_cycle
    if precision == "bf16":
        fp32 = isa(flags, "fp32")
        return (f"emulated:{fp32[0]}", fp32[1]) if fp32 else None
    return None


def peak_flops(flags: frozenset[str], mhz: float | None, precision: str, threads: int, cores: int) -> float | None:
    """The theoretical peak FLOP/s (int8: op/s) of ``precision`` on ``threads`` threads of a CPU with ``flags``,
    ``cores`` usable cores and a clock of ``mhz``: per-cycle width x min(threads, cores) x clock. None when the
    clock or the instruction set is unknown (then nothing is bounded)."""
    found = isa(flags, precision)
    if found is None or not mhz or mhz <= 0:
        return None
    return float(found[1]) * max(1, min(threads, cores)) * mhz * 1e6


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return None


def this_cpu() -> tuple[CpuInfo, float | None]:
    """This machine's /proc/cpuinfo, parsed, and the clock the peak assumes (MHz; None when unknown)."""
    info = parse_cpuinfo(_read("/proc/cpuinfo") or "")
    return info, clock_mhz(info, _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"))


@dataclass(frozen=True)
class Basis:
    """What a CPU ceiling is for: the instruction set, the precision, the threads, and the peak bounding it."""

    isa: str
    precision: str
    threads: int
    peak: float | None  # FLOP/s
    mhz: float | None

    def describe(self) -> str:
        """``fp32, avx512, 1 thread(s); theoretical peak 166 GFLOP/s at 2,596 MHz``."""
        if self.peak and self.mhz:
            bound = f"theoretical peak {self.peak / 1e9:,.0f} GFLOP/s at {self.mhz:,.0f} MHz"
        else:
            bound = "theoretical peak unknown (no clock or no known instruction set)"
        return f"{self.precision}, {self.isa}, {self.threads} thread(s); {bound}"


def basis(flags: frozenset[str], precision: str, threads: int, cores: int) -> Basis:
    """The :class:`Basis` of a ``precision`` ceiling on ``threads`` threads of this CPU (its clock read now),
    with ``flags`` (runtime.cpu_flags(), which tests fake)."""
    _, mhz = this_cpu()
    found = isa(flags, precision)
    return Basis(
        found[0] if found else "unknown ISA",
        precision,
        threads,
        peak_flops(flags, mhz, precision, threads, cores),
        mhz,
    )
