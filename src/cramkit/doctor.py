"""What this machine can compute: ``cramkit doctor``.

No tool in this field says whether its throughput is slow or at the wall. The doctor measures the wall: the
CPU's instruction sets (the ones that decide cramkit's paths: AVX2, AVX-512, VNNI, BF16, AMX), the rate of a
matrix product at an encoder layer's own shape (``tokens x hidden @ hidden x intermediate``) in fp32, bf16 and
int8 (fbgemm's dynamic int8 linear, the kernels that use VNNI and AMX) at one thread and at all of them,
memory bandwidth (a large copy), and on a GPU its bf16 and fp8 matrix rates at the crammed-bert shape.

The figures are saved (:func:`save`, under the cache directory, keyed by the CPU, the thread count and torch's
version) so that a CPU training run reports its model FLOP/s as a share of the measured ceiling of its own
precision (:func:`cpu_ceiling`) without measuring anything itself.
"""

from __future__ import annotations

import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cramkit import runtime

# the flags shown, in the order of what they add (Linux /proc/cpuinfo names)
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")
CEILINGS_FILE = "ceilings.json"


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


def _rate(fn: Callable[[], Any], flops: float, seconds: float = 0.4, sync: Callable[[], Any] | None = None) -> float:
    """FLOP/s of ``fn`` (``flops`` each call): one warm-up, then calls for about ``seconds``, the best of 3."""
    fn()
    if sync:
        sync()
    best = 0.0
    for _ in range(3):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            if sync:
                sync()
            dt = time.perf_counter() - t0
            if dt >= seconds / 3:
                break
        best = max(best, flops * n / dt)
    return best


def cpu_matmul(tokens: int, hidden: int, inter: int, threads: int, seconds: float = 0.4) -> dict[str, float]:
    """GFLOP/s (GOP/s for int8) of ``tokens x hidden @ hidden x inter`` on ``threads`` CPU threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        flops = 2.0 * tokens * hidden * inter
        x = torch.randn(tokens, hidden)
        w = torch.randn(hidden, inter)
        out = {"fp32": _rate(lambda: x @ w, flops, seconds) / 1e9}
        # bf16 without native instructions is emulated at a few GFLOP/s: measured on fewer rows, not for minutes
        rows = tokens if runtime.cpu_bf16() else max(1, tokens // 16)
        xb, wb = x[:rows].bfloat16(), w.bfloat16()
        out["bf16"] = _rate(lambda: xb @ wb, flops * rows / tokens, seconds) / 1e9
        try:  # fbgemm's dynamic int8 linear: activations quantized per call, VNNI/AMX where the CPU has them
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's deprecation notice of its quantized tensors
                lin = torch.nn.Linear(hidden, inter, bias=False)
                q = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, torch.qint8)
                with torch.inference_mode():
                    out["int8"] = _rate(lambda: q(x), flops, seconds) / 1e9
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


def examine(tokens: int = 2048, hidden: int = 384, inter: int = 1536, seconds: float = 0.4) -> dict[str, Any]:
    """Everything the doctor reports, measured now."""
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
        "cpu_gflops": {"1": cpu_matmul(tokens, hidden, inter, 1, seconds)},
        "date": time.strftime("%Y-%m-%d"),
    }
    if cores > 1:
        report["cpu_gflops"][str(cores)] = cpu_matmul(tokens, hidden, inter, cores, seconds)
    report["memory_gb_s"] = memory_bandwidth(seconds=seconds)
    if torch.cuda.is_available():
        report["gpu"] = torch.cuda.get_device_name()
        report["gpu_tflops"] = gpu_matmul(seconds=seconds)
    return report


def _key(threads: int) -> str:
    import torch

    return f"{cpu_name()}|{threads}|{torch.__version__}"


def save(report: dict[str, Any]) -> Path:
    """Keep ``report``'s CPU ceilings for this CPU (one entry per thread count), for :func:`cpu_ceiling`."""
    from cramkit.io import write_json_atomic

    path = cache_dir() / CEILINGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    known = _read(path)
    for threads, rates in report["cpu_gflops"].items():
        known[_key(int(threads))] = {**rates, "shape": report["shape"], "date": report["date"]}
    write_json_atomic(path, known)
    return path


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
    ``cramkit doctor`` saved it; None when it has not been measured here."""
    entry = _read(cache_dir() / CEILINGS_FILE).get(_key(threads))
    value = entry.get(precision) if isinstance(entry, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e9:
        return float(value) * 1e9
    return None


def format_report(r: dict[str, Any]) -> list[str]:
    """The report in lines, units stated."""
    t, h, i = r["shape"]
    flags = ", ".join(r["flags"]) or "none of " + ", ".join(FLAGS)
    lines = [
        f"CPU: {r['cpu']}, {r['cores']} usable core(s); flags: {flags}",
        f"precision auto on this CPU: {r['cpu_auto_precision']} ({r['cpu_auto_reason']})",
        f"matrix product {t}x{h} @ {h}x{i} (an encoder layer's MLP), GFLOP/s (int8: GOP/s, fbgemm dynamic):",
    ]
    for threads, rates in r["cpu_gflops"].items():
        cells = ", ".join(f"{k} {v:,.0f}" for k, v in rates.items())
        lines.append(f"  {threads} thread(s): {cells}")
    lines.append(f"memory bandwidth (a 256 MiB copy, read + written): {r['memory_gb_s']:,.1f} GB/s")
    if "gpu" in r:
        g = r["gpu_tflops"]
        cells = ", ".join(f"{k} {v:,.0f} TFLOP/s" for k, v in g.items() if k != "copy_gb_s")
        lines.append(f"GPU: {r['gpu']}: 32768x768 @ 768x3072 (crammed-bert's MLP): {cells}")
        lines.append(f"GPU memory bandwidth (a 1 GiB copy, read + written): {g['copy_gb_s']:,.0f} GB/s")
    return lines
