"""Where and how this process computes: the one place that decides it.

- :func:`resolve_device`: ``auto`` is CUDA when present, else the CPU; a CUDA device asked for on a
  machine without one is an error, not a silent CPU run.
- :func:`resolve_precision` and :func:`autocast`: one rule for training and inference alike. The
  allowed values are :data:`PRECISIONS`; ``auto`` is bf16 autocast on CUDA and on a CPU that computes bf16
  natively (AMX or AVX512_BF16 in its flags: :func:`cpu_bf16`), fp32 on any other CPU; :func:`precision_rule`
  says which and why (printed at the start of a run). Weights stay fp32 either way; fp16
  needs CUDA (its loss scaling is the trainer's); fp8 (training only) is bf16 autocast with the encoder's
  matrix multiplies in float8 through torchao, on a GPU with FP8 tensor cores.
- :func:`torchrun`: the facts torchrun puts in the environment (rank, local rank, world size). Nothing
  else in cramkit reads ``RANK``, ``LOCAL_RANK`` or ``WORLD_SIZE``.
- :func:`parse_shard`: ``--shard i/N``, the share of the work an independent process takes (a Slurm array).
- :func:`cpu_cores`: the CPU cores this process may run on.
- :class:`StopFlag`: SIGINT/SIGTERM become a flag the trainer checks between steps.

torch is imported where it is used, so that the command line starts without it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from cramkit import errors
from cramkit.errors import CramkitError

if TYPE_CHECKING:
    import torch

Precision = Literal["auto", "fp32", "bf16", "fp16", "fp8"]
PRECISIONS: tuple[str, ...] = ("auto", "fp32", "bf16", "fp16", "fp8")


# ---------------------------------------------------------------------------------- device, precision


# Padded tokens per forward pass by default, by where the pass runs: the one table of them (model/forward.py,
# the export runners, the Engine and the command line's help read it; kept here, where no numpy is imported, for
# the help). On a CPU, a pass small enough for the MLP's activations to stay in cache (bench/RESULTS.md, "Token
# budget on the CPU"); CTranslate2, and OpenVINO computing f32, run one matrix product after another over all of
# a pass's tokens and are fastest at 512 ("The CPU fast path against a plain CTranslate2 loop", "OpenVINO on a
# plain AVX2 CPU"); OpenVINO computing bf16 on AMX gains from 2,048 (+6% on short texts, +17% on long; 8,192
# loses again: "The silicon on an AMX Xeon"); on CUDA a large one.
PASS_TOKENS: dict[str, int] = {
    "cpu": 2048,
    "cuda": 16384,
    "ct2-cpu": 512,
    "openvino-f32": 512,
    "openvino-bf16": 2048,
}
# the help of every verb's --max-batch-tokens, from the table above
PASS_TOKENS_HELP = (
    f"padded tokens per forward pass (default: the runtime's own on a CPU: {PASS_TOKENS['ct2-cpu']} for a "
    f"CTranslate2 export, {PASS_TOKENS['openvino-f32']} for an OpenVINO one computing f32, "
    f"{PASS_TOKENS['openvino-bf16']} computing bf16; else {PASS_TOKENS['cpu']} on a CPU, {PASS_TOKENS['cuda']} "
    "on CUDA)"
)


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """The torch device for ``name`` (auto | cpu | cuda | cuda:N); auto: CUDA when present, else CPU."""
    import torch

    if name is None or str(name) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise CramkitError(f"unknown device {str(name)!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CramkitError(f"device {str(name)!r} was asked for but CUDA is not available here; use device cpu")
    return device


# the CPU flags (as /proc/cpuinfo names them) that make bf16 matrix products native, the fastest first
CPU_BF16_FLAGS: tuple[str, ...] = ("amx_bf16", "avx512_bf16")
# how a user keeps fp32 (pretrain's setting is train.precision; finetune's and distill's, precision)
OPT_OUT = "--set precision=fp32 to opt out (pretrain: train.precision=fp32)"
CPU_BF16_ENV = "CRAMKIT_CPU_BF16"  # 0: auto is fp32 on any CPU; 1: bf16 on any CPU (a test, a CPU the flags miss)


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags as Linux names them in /proc/cpuinfo (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_bf16() -> str | None:
    """Why this CPU computes bf16 natively (the flag, or the override), or None where it does not."""
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced == "0":
        return None
    found = next((flag for flag in CPU_BF16_FLAGS if flag in cpu_flags()), None)
    if found is None and forced == "1":
        return f"{CPU_BF16_ENV}=1"
    return found


def precision_rule(asked: str, device: torch.device) -> tuple[str, str]:
    """The precision actually used on ``device`` (fp32, bf16, fp16 or fp8) for ``asked`` (one of PRECISIONS),
    and the reason in words (what ``auto`` chose, and how to opt out)."""
    if asked not in PRECISIONS:
        raise CramkitError(f"precision must be one of {', '.join(PRECISIONS)}; got {asked!r}")
    if asked != "auto":
        return resolve_precision(asked, device), "asked for"
    if device.type == "cuda":
        return "bf16", f"auto: bf16 autocast on CUDA, fp32 weights; {OPT_OUT}"
    native = cpu_bf16()
    if native is not None:
        return "bf16", f"auto: bf16 autocast, this CPU computes bf16 natively ({native}); fp32 weights; {OPT_OUT}"
    return "fp32", "auto: fp32, this CPU has no native bf16 (no amx_bf16 or avx512_bf16 flag)"


def resolve_precision(asked: str, device: torch.device) -> str:
    """The precision actually used on ``device`` (fp32, bf16 or fp16) for ``asked`` (one of PRECISIONS)."""
    if asked not in PRECISIONS:
        raise CramkitError(f"precision must be one of {', '.join(PRECISIONS)}; got {asked!r}")
    if asked == "auto":
        return precision_rule(asked, device)[0]
    if asked == "fp16" and device.type != "cuda":
        raise CramkitError("precision fp16 needs a CUDA device; use fp32 (or bf16) on the CPU")
    if asked == "fp8":
        check_fp8(device)
    return asked


def check_fp8(device: torch.device) -> None:
    """Refuse fp8 where it cannot run: a device without FP8 tensor cores, or no torchao."""
    import torch

    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU"
        raise CramkitError(
            f"precision fp8 needs a GPU with FP8 tensor cores (compute capability 8.9 or newer: H100, H200, L4, "
            f"RTX 4090); {where} has none: use bf16 (or auto)"
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        raise CramkitError(
            f"precision fp8 trains through torchao's float8 ({e}): pip install torchao (a release made for "
            f"torch {torch.__version__.split('+')[0]}), or use bf16"
        ) from None


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context for a resolved ``precision`` (nothing for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    import torch

    dtype = torch.float16 if precision == "fp16" else torch.bfloat16  # fp8: the rest of the model in bf16
    return torch.autocast(device.type, dtype=dtype)


# ---------------------------------------------------------------------------------- torchrun, CPU


@dataclass(frozen=True)
class Torchrun:
    """This process's place in a torchrun job (rank 0 of a world of 1 when not launched by torchrun)."""

    rank: int = 0
    local_rank: int = 0
    world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torchrun() -> Torchrun:
    """Rank, local rank and world size from torchrun's environment."""
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    if world > 1 and ("RANK" not in env or "MASTER_ADDR" not in env):
        raise CramkitError(
            "WORLD_SIZE is set but RANK/MASTER_ADDR are not: start multi-process runs with "
            "`torchrun --nproc_per_node N -m cramkit pretrain ...` or `cramkit pretrain --nproc N ...`"
        )
    return Torchrun(rank=int(env.get("RANK", "0")), local_rank=int(env.get("LOCAL_RANK", "0")), world=max(world, 1))


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"i/N"`` (shard i of N, counted from 0) -> (i, N), checked; None -> (0, 1); one CramkitError naming
    ``--shard`` otherwise."""
    import re

    if text is None:
        return 0, 1
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m:
        raise CramkitError(
            f"--shard {text!r} is not i/N; give shard i of N counted from 0 (--shard 0/4 ... --shard 3/4)"
        )
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or i >= n:
        raise CramkitError(f"--shard {text}: i must be 0 to N-1 and N at least 1 (the shards of N=2 are 0/2 and 1/2)")
    if n > 99999:
        raise CramkitError(f"--shard {text}: at most 99999 shards")
    return i, n


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# ---------------------------------------------------------------------------------- signals


class StopFlag:
    """SIGINT/SIGTERM set a flag; the trainer finishes its step, saves and exits. A second SIGINT aborts at
    once, without saving (what is already on disk stays intact: a checkpoint is complete or ignored)."""

    def __init__(self, announce: bool = True) -> None:
        self.signum: int | None = None
        self.announce = announce
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            # the command line ends the process at once, wherever the main thread is (a KeyboardInterrupt
            # raised inside a checkpoint writer's critical section could leave a lock held and the process
            # waiting forever); a library caller gets a KeyboardInterrupt instead
            if errors.ABORT_AT_ONCE:
                print(
                    "\ncramkit: interrupted again: stopping now; the checkpoints already saved are intact",
                    file=sys.stderr,
                    flush=True,
                )
                sys.stdout.flush()
                os._exit(128 + signal.SIGINT)
            raise KeyboardInterrupt
        self.signum = signum
        if self.announce:
            print(
                f"\ncramkit: {signal.Signals(signum).name}: finishing this step and saving a checkpoint; "
                "press Ctrl-C again to abort without saving",
                file=sys.stderr,
                flush=True,
            )

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def machine_memory(device: str) -> tuple[int | None, str]:
    """(bytes, what) of the memory training will use: the GPU's when CUDA is used, else the RAM's."""
    if device != "cpu":
        try:
            import torch

            if torch.cuda.is_available():
                index = torch.device(device).index if device.startswith("cuda") else None
                if index is None:  # under torchrun each process uses its local rank's GPU
                    index = torchrun().local_rank % torch.cuda.device_count()
                props = torch.cuda.get_device_properties(index)
                return int(props.total_memory), f"GPU memory ({props.name})"
        except Exception:  # no usable GPU: the RAM decides
            pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "RAM"
    except (ValueError, OSError, AttributeError):
        return None, "RAM"


def die_with_parent(parent: int) -> None:
    """In a worker process (a pool's initializer): be killed when ``parent``, the process that started it, dies,
    even by ``kill -9`` (Linux's ``PR_SET_PDEATHSIG``; a worker whose parent is already gone exits at once).
    Without it, ``kill -9`` of ``cramkit data build`` left its encoding workers waiting on their queue forever."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):  # no prctl (an unusual libc): the check below holds
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)
