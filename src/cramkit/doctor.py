"""What this machine can compute: ``cramkit doctor``.

No tool in this field says whether its throughput is slow or at the wall. The doctor measures the wall: the
CPU's instruction sets (the ones that decide cramkit's paths: AVX2, AVX-512, VNNI, BF16, AMX), the rate of a
matrix product at an encoder layer's own shape (``tokens x hidden @ hidden x intermediate``) in fp32, bf16 and
int8 (fbgemm's dynamic int8 linear, the kernels that use VNNI and AMX) at one thread and at all of them,
memory bandwidth (a large copy), and on a GPU its bf16 and fp8 matrix rates at the crammed-bert shape.

Each CPU figure is the best of several samples (:data:`SAMPLES`): load on a shared machine lowers a sample, never
raises one. Each is bounded by the instruction set's theoretical peak (cramkit.peak: vector width x cores x
clock); a measurement above it is clamped to it. The figures are saved (:func:`save`, under the cache directory,
keyed by the CPU, the thread count and torch's version) keeping, per precision, the best figure ever measured:
a later run under load, or with small ``--tokens``/``--hidden`` shapes, never lowers a saved ceiling. A CPU
training run reports its model FLOP/s as a share of the ceiling of its own precision (:func:`cpu_ceiling`);
when it computes faster than that ceiling, the ceiling was stale: the run re-measures a short sample
(:func:`remeasure`) and raises the saved figure (:func:`raise_ceiling`), so that no MFU is above 100%.
"""

from __future__ import annotations

import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cramkit import peak, runtime
from cramkit.errors import CramkitError
from cramkit.request import param, verb

# the flags shown, in the order of what they add (Linux /proc/cpuinfo names)
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")
CEILINGS_FILE = "ceilings.json"
PRECISIONS = ("fp32", "bf16", "int8")
SAMPLES = 5  # a CPU figure is the best of this many samples
SHAPE = (2048, 384, 1536)  # the doctor's default product: tokens x hidden @ hidden x intermediate


@dataclass(kw_only=True)
class DoctorRequest:
    """What ``cramkit doctor`` measures (the matrix product's shape, the time per sample) and where its figures go."""

    hidden: int = param(SHAPE[1], help="the layer's width (default: %(default)s, all-MiniLM-L6-v2's)")
    intermediate: int = param(SHAPE[2], help="the MLP's width")
    tokens: int = param(SHAPE[0], help="tokens per product (default: %(default)s, 16 x 128)")
    seconds: float = param(0.4, help="time per measurement")
    json: str | None = param(None, metavar="FILE", help="also write the figures to FILE")
    save: bool = param(True, flags=("--no-save",), help="do not keep the figures in the cache directory")

    def check(self) -> None:
        """The shape and the time in range: one line naming the flag."""
        for name in ("hidden", "intermediate", "tokens"):
            if not 1 <= getattr(self, name) <= 65536:
                raise CramkitError(f"--{name} must be between 1 and 65536, got {getattr(self, name)}")
        if not 0.01 <= self.seconds <= 60:
            raise CramkitError(f"--seconds must be between 0.01 and 60, got {self.seconds}")


@verb(DoctorRequest)
def doctor(request: DoctorRequest) -> dict[str, Any]:
    """Measure this machine (:func:`examine`), write the figures to ``json`` and keep them (:func:`save`, unless
    ``save`` is False): the report, with ``kept_in`` (the file) or ``not_kept`` (why it could not be written)."""
    from cramkit.io import write_json_atomic

    request.check()
    report = examine(request.tokens, request.hidden, request.intermediate, request.seconds)
    if request.json:
        write_json_atomic(request.json, report)
    if request.save:
        try:
            report["kept_in"] = str(save(report))
        except OSError as e:
            report["not_kept"] = e.strerror or str(e)
    return report


def cache_dir() -> Path:
    """Where cramkit keeps what it measured of this machine (``$XDG_CACHE_HOME/cramkit``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cramkit"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _rate(
    fn: Callable[[], Any],
    flops: float,
    seconds: float = 0.4,
    sync: Callable[[], Any] | None = None,
    samples: int = 3,
) -> float:
    """FLOP/s of ``fn`` (``flops`` each call): one warm-up, then calls for about ``seconds`` in all, the best of
    ``samples`` samples (each at least one call)."""
    fn()
    if sync:
        sync()
    best = 0.0
    for _ in range(samples):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            if sync:
                sync()
            dt = time.perf_counter() - t0
            if dt >= seconds / samples:
                break
        best = max(best, flops * n / dt)
    return best


def cpu_matmul(
    tokens: int,
    hidden: int,
    inter: int,
    threads: int,
    seconds: float = 0.4,
    precisions: tuple[str, ...] = PRECISIONS,
    samples: int = SAMPLES,
) -> dict[str, float]:
    """GFLOP/s (GOP/s for int8) of ``tokens x hidden @ hidden x inter`` on ``threads`` CPU threads, at each of
    ``precisions``: the best of ``samples`` samples over about ``seconds`` each."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        flops = 2.0 * tokens * hidden * inter
        x = torch.randn(tokens, hidden)
        w = torch.randn(hidden, inter)
        out: dict[str, float] = {}
        if "fp32" in precisions:
            out["fp32"] = _rate(lambda: x @ w, flops, seconds, samples=samples) / 1e9
        if "bf16" in precisions:
            # bf16 without native instructions is emulated at a few GFLOP/s: measured on fewer rows, not minutes
            rows = tokens if runtime.cpu_bf16() else max(1, tokens // 16)
            xb, wb = x[:rows].bfloat16(), w.bfloat16()
            out["bf16"] = _rate(lambda: xb @ wb, flops * rows / tokens, seconds, samples=samples) / 1e9
        if "int8" in precisions:
            try:  # fbgemm's dynamic int8 linear: activations quantized per call, VNNI/AMX where the CPU has them
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # torch's deprecation notice of its quantized tensors
                    lin = torch.nn.Linear(hidden, inter, bias=False)
                    seq = torch.nn.Sequential(lin)
                    q = torch.ao.quantization.quantize_dynamic(seq, {torch.nn.Linear}, torch.qint8)
                    with torch.inference_mode():
                        out["int8"] = _rate(lambda: q(x), flops, seconds, samples=samples) / 1e9
            except (RuntimeError, AttributeError, NotImplementedError):
                pass
        return out
    finally:
        torch.set_num_threads(before)


def memory_bandwidth(megabytes: int = 256, seconds: float = 0.4) -> float:
    """GB/s of a large copy (bytes read plus written), on the current thread count."""
    import torch

    src = torch.empty(megabytes * 2**20 // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    return _rate(lambda: dst.copy_(src), 2.0 * src.numel() * 4, seconds) / 1e9


def gpu_matmul(tokens: int = 32768, hidden: int = 768, inter: int = 3072, seconds: float = 0.5) -> dict[str, float]:
    """TFLOP/s of the crammed-bert layer's product on the GPU: bf16, and fp8 (``torch._scaled_mm``, e4m3,
    tensorwise scales) where the GPU has FP8 tensor cores; GB/s of a device copy."""
    import torch

    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    flops = 2.0 * tokens * hidden * inter
    x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16)
    w = torch.randn(inter, hidden, device=dev, dtype=torch.bfloat16)
    out = {"bf16": _rate(lambda: x @ w.t(), flops, seconds, sync) / 1e12}
    if torch.cuda.get_device_capability(dev) >= (8, 9):
        try:
            x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
            one = torch.ones((), device=dev)
            out["fp8"] = (
                _rate(lambda: torch._scaled_mm(x8, w8.t(), one, one, out_dtype=torch.bfloat16), flops, seconds, sync)
                / 1e12
            )
        except (RuntimeError, AttributeError):
            pass
    big = torch.empty(2**30 // 2, dtype=torch.bfloat16, device=dev)
    copy = torch.empty_like(big)
    out["copy_gb_s"] = _rate(lambda: copy.copy_(big), 2.0 * big.numel() * 2, seconds, sync) / 1e9
    return out


def _peak_gflops(precision: str, threads: int) -> float | None:
    """The theoretical peak of ``precision`` on ``threads`` threads of this CPU, GFLOP/s (None when unknown)."""
    b = cpu_basis(precision, threads)
    return b.peak / 1e9 if b.peak else None


def cpu_basis(precision: str, threads: int) -> peak.Basis:
    """What a ``precision`` ceiling on ``threads`` threads of this CPU is measured on: its instruction set and
    the theoretical peak bounding it (cramkit.peak)."""
    return peak.basis(runtime.cpu_flags(), precision, threads, runtime.cpu_cores())


def bound(rates: dict[str, float], threads: int) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """``rates`` (GFLOP/s by precision, measured on ``threads`` threads) clamped to the instruction set's
    theoretical peak, the peaks (GFLOP/s by precision, where known), and one line per clamped figure."""
    out, peaks, clamped = dict(rates), {}, []
    for prec, value in rates.items():
        top = _peak_gflops(prec, threads)
        if top is None:
            continue
        peaks[prec] = top
        if value > top:
            out[prec] = top
            clamped.append(
                f"{threads} thread(s) {prec}: measured {value:,.0f} is above the {cpu_basis(prec, threads).isa} "
                f"peak {top:,.0f}; clamped to it (the clock read is below the one the CPU ran at)"
            )
    return out, peaks, clamped


def examine(tokens: int = 2048, hidden: int = 384, inter: int = 1536, seconds: float = 0.4) -> dict[str, Any]:
    """Everything the doctor reports, measured now: each CPU figure the best of :data:`SAMPLES` samples, clamped
    to the instruction set's theoretical peak."""
    import torch

    flags = runtime.cpu_flags()
    cores = runtime.cpu_cores()
    precision, why = runtime.precision_rule("auto", torch.device("cpu"))
    report: dict[str, Any] = {
        "cpu": cpu_name(),
        "cores": cores,
        "flags": [f for f in FLAGS if f in flags],
        "torch": torch.__version__,
        "shape": [tokens, hidden, inter],
        "cpu_auto_precision": precision,
        "cpu_auto_reason": why,
        "samples": SAMPLES,
        "cpu_gflops": {},
        "cpu_peak_gflops": {},
        "cpu_isa": {prec: cpu_basis(prec, 1).isa for prec in PRECISIONS},
        "clock_mhz": cpu_basis("fp32", 1).mhz,
        "clamped": [],
        "date": time.strftime("%Y-%m-%d"),
    }
    for threads in sorted({1, cores}):
        rates, peaks, clamped = bound(cpu_matmul(tokens, hidden, inter, threads, seconds), threads)
        report["cpu_gflops"][str(threads)] = rates
        report["cpu_peak_gflops"][str(threads)] = peaks
        report["clamped"] += clamped
    report["memory_gb_s"] = memory_bandwidth(seconds=seconds)
    if torch.cuda.is_available():
        report["gpu"] = torch.cuda.get_device_name()
        report["gpu_tflops"] = gpu_matmul(seconds=seconds)
    return report


def _key(threads: int) -> str:
    import torch

    return f"{cpu_name()}|{threads}|{torch.__version__}"


def _figure(value: Any) -> float | None:
    """A saved GFLOP/s figure, or None where it is not a number in range."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e9:
        return float(value)
    return None


def _merge(known: dict[str, Any], threads: int, rates: dict[str, float], shape: Any, date: str) -> list[str]:
    """Fold ``rates`` (GFLOP/s by precision, on ``threads`` threads) into ``known``, keeping per precision the
    better of the saved figure (clamped to the peak) and the new one; one line per saved figure kept."""
    key = _key(threads)
    found = known.get(key)
    old: dict[str, Any] = found if isinstance(found, dict) else {}
    shapes: dict[str, Any] = old["shapes"] if isinstance(old.get("shapes"), dict) else {}
    dates: dict[str, Any] = old["dates"] if isinstance(old.get("dates"), dict) else {}
    entry: dict[str, Any] = {}
    for prec in PRECISIONS:  # what was saved, clamped to the peak (a cache from before the peak was known)
        before = _figure(old.get(prec))
        if before is not None:
            top = _peak_gflops(prec, threads)
            entry[prec] = min(before, top) if top else before
            shapes.setdefault(prec, old.get("shape"))  # the one shape of every figure of an older cache
            dates.setdefault(prec, old.get("date"))
    kept = []
    for prec, value in rates.items():
        before = entry.get(prec)
        if before is None or value >= before:
            entry[prec], shapes[prec], dates[prec] = value, shape, date
        else:
            was = shapes.get(prec)
            at = "x".join(str(d) for d in was) if isinstance(was, list) else str(was or "an earlier shape")
            kept.append(
                f"{threads} thread(s) {prec}: kept the saved {gflops(before)} (measured at {at} on "
                f"{dates.get(prec) or 'an earlier day'}) over this run's {gflops(value)}"
            )
    known[key] = {**entry, "shapes": shapes, "dates": dates}
    return kept


def save(report: dict[str, Any]) -> Path:
    """Keep ``report``'s CPU ceilings for this CPU (one entry per thread count), for :func:`cpu_ceiling`: per
    precision the best figure measured so far, so that a measurement under load or at a small shape never
    lowers a saved ceiling. The figures kept over this report's go to ``report["kept_earlier"]`` (lines)."""
    from cramkit.io import write_json_atomic

    path = cache_dir() / CEILINGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    known = _read(path)
    report["kept_earlier"] = []
    for threads, rates in report["cpu_gflops"].items():
        report["kept_earlier"] += _merge(known, int(threads), rates, report["shape"], report["date"])
    write_json_atomic(path, known)
    return path


def raise_ceiling(precision: str, threads: int, flops: float, how: str) -> None:
    """Raise the saved ``precision`` ceiling on ``threads`` threads to ``flops`` FLOP/s (``how``: what measured
    it) where that is higher; a cache that cannot be written is left as it is."""
    from cramkit.io import write_json_atomic

    path = cache_dir() / CEILINGS_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        known = _read(path)
        _merge(known, threads, {precision: flops / 1e9}, how, time.strftime("%Y-%m-%d"))
        write_json_atomic(path, known)
    except OSError:
        pass


def remeasure(precision: str, threads: int, seconds: float = 0.3) -> float | None:
    """A short sample of ``precision``'s matrix product at the doctor's default shape on ``threads`` threads,
    FLOP/s clamped to the theoretical peak (None for a precision the doctor does not measure)."""
    if precision not in PRECISIONS:
        return None
    try:
        rate = cpu_matmul(*SHAPE, threads, seconds, precisions=(precision,), samples=3).get(precision)
    except (RuntimeError, MemoryError):  # a product this CPU's torch cannot run: the run's own rate stands
        return None
    if rate is None:
        return None
    top = _peak_gflops(precision, threads)
    return min(rate, top) * 1e9 if top else rate * 1e9


CEILINGS_BYTES = 1 << 20  # a few entries per CPU and thread count
_SAID: set[Path] = set()  # the damaged caches said so once in this process


def _read(path: Path) -> dict[str, Any]:
    """The ceilings cache ``path`` ({} when there is none); a damaged one (over CEILINGS_BYTES, nested too deep,
    not JSON, not an object) is ignored with one stderr line, and ``cramkit doctor`` measures it again."""
    from cramkit.io import BadJson, json_loads, json_text

    if not path.is_file():
        return {}
    try:
        data = json_loads(json_text(path, CEILINGS_BYTES), max_depth=8)
        if not isinstance(data, dict):
            raise BadJson("not a JSON object")
    except (OSError, UnicodeDecodeError, BadJson) as exc:
        if path not in _SAID:
            _SAID.add(path)
            print(
                f"cramkit: the measured ceilings {path} are damaged ({str(exc)[:120]}); ignored (`cramkit doctor` "
                "measures them again)",
                file=sys.stderr,
            )
        return {}
    return data


def cpu_ceiling(precision: str, threads: int) -> float | None:
    """FLOP/s of this CPU's measured matrix product at ``precision`` (fp32 or bf16) and ``threads``, as
    ``cramkit doctor`` saved it (the best figure measured), clamped to the instruction set's theoretical peak;
    None when it has not been measured here."""
    entry = _read(cache_dir() / CEILINGS_FILE).get(_key(threads))
    value = _figure(entry.get(precision)) if isinstance(entry, dict) else None
    if value is None:
        return None
    top = _peak_gflops(precision, threads)
    return (min(value, top) if top else value) * 1e9


def gflops(value: float) -> str:
    """A GFLOP/s figure in words: whole numbers from 10 up, two significant digits below."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def format_report(r: dict[str, Any]) -> list[str]:
    """The report in lines, units stated."""
    t, h, i = r["shape"]
    flags = ", ".join(r["flags"]) or "none of " + ", ".join(FLAGS)
    mhz = r.get("clock_mhz")
    lines = [
        f"CPU: {r['cpu']}, {r['cores']} usable core(s); flags: {flags}",
        f"precision auto on this CPU: {r['cpu_auto_precision']} ({r['cpu_auto_reason']})",
        f"matrix product {t}x{h} @ {h}x{i} (an encoder layer's MLP), GFLOP/s (int8: GOP/s, fbgemm dynamic), the "
        f"best of {r.get('samples', SAMPLES)} samples; in brackets the instruction set and its theoretical peak "
        f"(width x cores x {f'{mhz:,.0f} MHz' if mhz else 'an unknown clock'}), an upper bound:",
    ]
    isas, peaks = r.get("cpu_isa", {}), r.get("cpu_peak_gflops", {})
    for threads, rates in r["cpu_gflops"].items():
        shown = []
        for k, v in rates.items():
            top = peaks.get(threads, {}).get(k)
            shown.append(f"{k} {gflops(v)} ({isas.get(k, '?')}" + (f", peak {top:,.0f})" if top else ")"))
        lines.append(f"  {threads} thread(s): {', '.join(shown)}")
    lines += [f"  {line}" for line in r.get("clamped", [])]
    lines.append(f"memory bandwidth (a 256 MiB copy, read + written): {r['memory_gb_s']:,.1f} GB/s")
    if "gpu" in r:
        g = r["gpu_tflops"]
        cells = ", ".join(f"{k} {v:,.0f} TFLOP/s" for k, v in g.items() if k != "copy_gb_s")
        lines.append(f"GPU: {r['gpu']}: 32768x768 @ 768x3072 (crammed-bert's MLP): {cells}")
        lines.append(f"GPU memory bandwidth (a 1 GiB copy, read + written): {g['copy_gb_s']:,.0f} GB/s")
    return lines
