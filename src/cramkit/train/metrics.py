"""What the user sees: metrics.jsonl (and the trackers of ``--report-to``), a progress bar, a loss-curve PNG, MFU."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from cramkit.errors import CramkitError
from cramkit.io import BadJson, json_loads
from cramkit.train.report import Reporter, require_trackers

# peak dense bf16 tensor FLOP/s per GPU (vendor datasheets, without sparsity)
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX A6000", 155e12),
]


def peak_flops(device: torch.device) -> float | None:
    """The device's peak bf16 FLOP/s when known (None on CPU or an unknown GPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_BF16_FLOPS:
        if key.lower() in name.lower():
            return flops
    return None


class Ceiling:
    """The FLOP/s a run's MFU divides by, and the MFU itself, never above 100%.

    On a GPU: its dense bf16 datasheet peak (:func:`peak_flops`), for bf16/fp16/fp8 runs. On a CPU: the matrix-
    product rate `cramkit doctor` measured at the run's precision and thread count (cramkit.doctor.cpu_ceiling),
    bounded by the instruction set's theoretical peak (cramkit.peak). A CPU run that computes faster than its
    ceiling shows the ceiling was stale (measured under load, or at small shapes): it says so once, re-measures a
    short sample (the main process only), raises the ceiling to the better of that and what the run reached
    (capped at the peak) and keeps the raised figure in the doctor's cache. An MFU is at most 1.0 whatever the
    figures (a FLOP count above the kernels' work would otherwise show above it)."""

    def __init__(self, device: torch.device, precision: str, *, main: bool = True) -> None:
        self.device, self.precision, self.main = device, precision, main
        self.threads = torch.get_num_threads()
        self._stale_said = False
        self.peak: float | None = None  # the bound no ceiling passes (CPU: the ISA's theoretical peak)
        self.isa = ""
        if device.type == "cpu":
            from cramkit import doctor

            basis = doctor.cpu_basis(precision, self.threads)
            self.flops = doctor.cpu_ceiling(precision, self.threads)
            self.peak, self.isa, self._basis = basis.peak, basis.isa, basis.describe()
        else:
            self.flops = peak_flops(device) if precision in ("bf16", "fp16", "fp8") else None
            self._basis = f"{precision} on {device.type}"

    def describe(self) -> str:
        """What the MFU figures are a share of, for the line that opens the run."""
        if self.device.type != "cpu":
            if self.flops is None:
                return "no MFU (no datasheet peak for this GPU at this precision)"
            return f"MFU against the GPU's dense bf16 peak, {self.flops / 1e12:,.0f} TFLOP/s"
        from cramkit.doctor import gflops

        if self.flops is None:
            return f"no MFU: `cramkit doctor` has not measured the ceiling of {self._basis}"
        return f"MFU against the measured ceiling, {gflops(self.flops / 1e9)} GFLOP/s ({self._basis})"

    def mfu(self, flops_per_s: float, note: Callable[[str], None]) -> float | None:
        """The share of the ceiling ``flops_per_s`` (the model FLOP/s of one process) is, at most 1.0; a CPU
        ceiling below it is raised first (``note``: where the one line saying so goes)."""
        if not self.flops or flops_per_s <= 0 or not math.isfinite(flops_per_s):
            return None
        if flops_per_s > self.flops and self.device.type == "cpu":
            self._raise(flops_per_s, note)
        return min(1.0, flops_per_s / self.flops)

    def _raise(self, reached: float, note: Callable[[str], None]) -> None:
        from cramkit import doctor

        before, said = self.flops or 0.0, self._stale_said
        measured = doctor.remeasure(self.precision, self.threads) if self.main and not said else None
        best = max(reached, measured or 0.0)
        self.flops = max(before, min(best, self.peak) if self.peak else best)
        if self.main and self.flops > before:  # kept for the next run (the cache keeps the best figure)
            doctor.raise_ceiling(self.precision, self.threads, self.flops, "a training run and a re-measure")
        if self.main and not said:
            g = doctor.gflops
            again = f"{g(measured / 1e9)} GFLOP/s now" if measured else "no re-measure at this precision"
            note(
                f"cramkit: ceiling stale (measured {g(before / 1e9)} GFLOP/s, this run reached {g(reached / 1e9)} "
                "GFLOP/s): "
                f"re-measuring: {again}; MFU from here on against {g(self.flops / 1e9)} GFLOP/s ({self._basis})"
            )
        self._stale_said = True


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLog:
    """Appends one JSON object per record to RUN/metrics.jsonl, the run's record; the same records also go to the
    experiment trackers of ``report_to`` (train/report.py) once :meth:`start_reporting` has started them."""

    def __init__(self, run: Path, enabled: bool = True, report_to: str | Sequence[str] | None = None) -> None:
        self.path = Path(run) / "metrics.jsonl"
        self.enabled = enabled
        names = require_trackers(report_to)  # a tracker that is not installed: before any training
        self._reporter = Reporter(names, Path(run)) if enabled and names else None

    def start_reporting(self, step: int, config: Mapping[str, Any]) -> None:
        """Start the trackers at ``step`` (0, or the step a resumed run continues from) with the run's ``config``
        as hyperparameters."""
        if self._reporter is not None:
            self._reporter.start(step, config)

    def truncate_after(self, step: int) -> None:
        """Drop records past ``step`` (a resumed run rewrites them exactly as a run that never stopped)."""
        if not self.enabled or not self.path.exists():
            return
        kept = [line for line in self.path.read_text(encoding="utf-8").splitlines() if _step_of(line) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        tmp.replace(self.path)

    def write(self, record: dict[str, Any]) -> None:
        """The one place records go: metrics.jsonl, then the trackers."""
        if not self.enabled:
            return
        record = {k: _jsonable(v) for k, v in record.items() if v is not None}
        if isinstance(record.get("mfu"), float):  # a share of a ceiling: never above it (see Ceiling)
            record["mfu"] = min(1.0, record["mfu"])
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self._reporter is not None:
            self._reporter.log(record)

    def close(self, ok: bool = True) -> None:
        if self._reporter is not None:
            self._reporter.close(ok)


def _step_of(line: str) -> float:
    try:
        return json_loads(line).get("step", math.inf)
    except (ValueError, AttributeError):
        return math.inf


def read_metrics(run: Path) -> list[dict[str, Any]]:
    path = Path(run) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json_loads(line))
            except BadJson as exc:
                raise CramkitError(f"{path} line {lineno} is {exc}; the run's metrics are damaged") from None
    return rows


def plot_losses(
    run: Path, *, title: str | None = None, loss_name: str = "masked-LM loss (nats)", x: str = "tokens"
) -> Path | None:
    """RUN/loss.png: training and validation loss against ``x`` ("tokens" seen, or "step"), and the dev
    score at each evaluation when the recipe logs one (fine-tuning: ``dev_score``, on its own axis)."""
    records = read_metrics(run)
    train = [(r[x], r["loss"]) for r in records if isinstance(r.get("loss"), (int, float)) and x in r]
    val = [(r[x], r["val_loss"]) for r in records if isinstance(r.get("val_loss"), (int, float)) and x in r]
    dev = [(r[x], r["dev_score"]) for r in records if isinstance(r.get("dev_score"), (int, float)) and x in r]
    if not train and not val:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    if train:
        ax.plot(*zip(*train, strict=True), label=loss_name.split(" (")[0], lw=1.2)
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation loss", lw=1.5)
    ax.set_xlabel("tokens seen" if x == "tokens" else "optimizer step")
    ax.set_ylabel(loss_name)
    ax.set_title(title or Path(run).name)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if dev:
        ax2 = ax.twinx()
        ax2.plot(*zip(*dev, strict=True), "s--", color="#c44e52", label="dev score (main metric, x100)", lw=1.2)
        ax2.set_ylabel("dev score (x100)")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="best")
    fig.tight_layout()
    out = Path(run) / "loss.png"
    tmp = out.with_name(".loss.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)
    return out
