"""The ONNX export's int8 form: dynamic quantization of the matrix multiplies by a weight, at the weights'
range right for the CPU's instruction set (:func:`cpu_isa`, :data:`ISA_FORMATS`), kept only when it stays
close enough to torch on the export's check (the bar: :data:`INT8_MIN_COSINE`, :data:`INT8_MAX_FLIPS`);
else with the MLP down-projections in fp32, else refused (:func:`quantize_checked`).
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError

if TYPE_CHECKING:
    from cramkit.backends.base import ExportJob


# Dynamic quantization: activations become uint8 at run time (DynamicQuantizeLinear), weights int8 (U8S8,
# ONNX Runtime's fastest CPU format). What differs per instruction set is the weights' range: without VNNI,
# x86 multiplies u8 x s8 pairs with vpmaddubsw, whose int16 sums saturate, so 7-bit weights are safer.
ISA_FORMATS: dict[str, tuple[bool, str]] = {
    "avx512_vnni": (False, "VNNI accumulates u8 x s8 products in int32: no saturation, full 8-bit weights"),
    "avx_vnni": (False, "VNNI accumulates u8 x s8 products in int32: no saturation, full 8-bit weights"),
    "avx512": (True, "no VNNI: vpmaddubsw sums u8 x s8 pairs in int16 and can saturate: 7-bit weights"),
    "avx2": (True, "no VNNI: vpmaddubsw sums u8 x s8 pairs in int16 and can saturate: 7-bit weights"),
    "x86-64": (True, "no AVX2: 7-bit weights, the conservative choice"),
    "arm64": (False, "ARM's int8 dot-product kernels accumulate in int32: full 8-bit weights"),
}


def cpu_isa(flags: set[str] | None = None, machine: str | None = None) -> str:
    """The instruction set the int8 kernels will use here: a key of :data:`ISA_FORMATS` (``flags``,
    ``machine``: the CPU's feature flags and ``platform.machine()``, read from this machine by default)."""
    machine = (machine or platform.machine()).lower()
    if machine in ("arm64", "aarch64") or machine.startswith("armv8"):
        return "arm64"
    if flags is None:
        flags = _cpu_flags()
    if flags & {"avx512_vnni", "amx_int8"}:
        return "avx512_vnni"
    if "avx_vnni" in flags:
        return "avx_vnni"
    if "avx512bw" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "x86-64"


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return set(value.split())
    except OSError:
        pass
    return set()


def quantize(src: Path, dst: Path, isa: str, keep_down: bool) -> dict[str, Any]:
    """Dynamic int8 quantization of every matrix multiply by a weight (the QKV, output and MLP projections),
    with the weights' range chosen for ``isa``; ``keep_down``: keep the MLP
    down-projections in fp32 (their inputs, after the activation, carry the outliers that per-tensor
    activation scales handle worst)."""
    import logging

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    reduce_range, why = ISA_FORMATS[isa]
    graph = onnx.load(str(src)).graph
    producer = {out: node.op_type for node in graph.node for out in node.output}
    weights = {t.name for t in graph.initializer}
    after_activation = ("Gelu", "BiasGelu", "FastGelu", "Relu", "Mul", "Sigmoid")
    keep = [
        n.name
        for n in graph.node
        if keep_down
        and n.op_type == "MatMul"
        and n.input[1] in weights
        and producer.get(n.input[0]) in after_activation
    ]
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process is for static quantization
    try:
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=reduce_range,
            op_types_to_quantize=["MatMul"],
            nodes_to_exclude=keep,
        )
    finally:
        root.setLevel(level)
    return {
        "weights": "int8 per-channel" + (" (7-bit range)" if reduce_range else ""),
        "activations": "uint8 dynamic",
        "format": "U8S8",
        "isa": isa,
        "reduce_range": reduce_range,
        "why": why,
        "ops": ["MatMul"],
        "kept_fp32": f"{len(keep)} MLP down-projections" if keep else "none",
    }


# int8 everywhere is kept when its embeddings stay this close to torch's on the check's texts (mean cosine)
# and it changes at most this share of a classifier's labels; otherwise the MLP down-projections stay fp32
INT8_MIN_COSINE = 0.995
INT8_MAX_FLIPS = 0.02


def _int8_faithful(check: dict[str, Any]) -> bool:
    cosines = [v for k, v in check.items() if k.startswith("cosine_") and k.endswith("_mean")]
    return min(cosines, default=1.0) >= INT8_MIN_COSINE and check.get("label_agreement", 1.0) >= 1 - INT8_MAX_FLIPS


def _int8_cost(check: dict[str, Any]) -> str:
    parts = [f"{k} {v:.4f}" for k, v in check.items() if k.endswith("_mean") or k == "label_agreement"]
    return ", ".join(parts)


def quantize_checked(job: ExportJob, isa: str, checked: Callable[[bool], dict[str, Any]]) -> None:
    """int8 everywhere when it passes the bar, else with the MLP down-projections in fp32 when that passes
    (the refused check recorded in the manifest), else a CramkitError with both checks' figures. checked:
    writes model.onnx at int8 (``keep_down``: those projections in fp32) and returns its check against torch."""
    job.say(f"quantizing every matrix multiply to int8 (dynamic, for {isa})")
    check = checked(False)
    if not _int8_faithful(check):
        job.say(
            f"int8 everywhere is too far from torch ({_int8_cost(check)}): keeping the MLP down-projections in fp32"
        )
        refused = {"kept_fp32": "none", "check": check}
        fallback = checked(True)
        if not _int8_faithful(fallback):  # ship only what passes the bar, never the lesser of two misses
            raise CramkitError(
                f"int8 is too far from torch on this model: everywhere {_int8_cost(check)}; with the MLP "
                f"down-projections in fp32 {_int8_cost(fallback)} (the bar: mean cosine >= {INT8_MIN_COSINE} "
                f"and at most {INT8_MAX_FLIPS:.0%} of the labels changed); export it without --quantize "
                "(fp32), or try --format ct2 --quantize int8"
            )
        job.say(f"int8 with the MLP down-projections in fp32 passes: {_int8_cost(fallback)}")
        job.manifest["quantization"]["refused"] = refused
