"""train.precision=fp8: torchao's float8 linear layers in the encoder blocks, refused where they cannot run.

FP8 tensor cores are a GPU's (the speed is measured by bench/gpu_day.py on one); on the CPU torchao emulates
the float8 matrix multiplies, which is enough to check that the swap keeps the model's names, weights and
loss, and that it trains."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from cramkit.errors import CramkitError
from cramkit.model import MaskedLM
from cramkit.runtime import resolve_precision
from cramkit.train import distributed, parallel
from cramkit.train.config import resolve_config


def _tiny() -> MaskedLM:
    cfg = resolve_config("tiny-cpu").model.replace(vocab_size=512, layers=2, hidden=64, heads=2, intermediate=256)
    torch.manual_seed(0)
    return MaskedLM(cfg)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 512, (8, 32), generator=g)
    chosen = torch.rand(8, 32, generator=g) < 0.25
    return ids.masked_fill(chosen, 4), torch.where(chosen, ids, torch.full_like(ids, -100))


def test_fp8_is_refused_on_the_cpu_with_one_line() -> None:
    with pytest.raises(CramkitError, match="fp8 needs a GPU with FP8 tensor cores.*the CPU has none"):
        resolve_precision("fp8", torch.device("cpu"))


@pytest.mark.integration
def test_fp8_pretrain_on_the_cpu_is_one_line(tmp_path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cramkit",
            "pretrain",
            "--preset",
            "tiny-cpu",
            "--budget",
            "2steps",
            "--out",
            str(out),
            "--no-progress",
            "--set",
            "train.precision=fp8",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "precision fp8 needs a GPU with FP8 tensor cores" in proc.stderr


def test_fp8_is_refused_for_inference() -> None:
    from cramkit.model.forward import TorchRunner

    with pytest.raises(CramkitError, match="fp8 is for training"):
        TorchRunner(_tiny(), device="cpu", precision="fp8")


def test_float8_swap_keeps_names_and_loss_and_trains() -> None:
    pytest.importorskip("torchao.float8")
    ref, model = _tiny(), _tiny()
    parallel.apply_float8(model)
    swapped = {n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    # the encoder's four matrices per block; the MLM head (tied decoder) stays as it is
    assert swapped == {f"encoder.layers.{i}.{k}" for i in range(2) for k in parallel.FP8_LAYERS}
    assert model.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values(), strict=True))
    ids, labels = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = ref(ids, labels).loss.float(), model(ids, labels).loss.float()
    assert abs(got - want) / want < 0.02, (got, want)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(8):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(ids, labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        first = first if first is not None else loss.item()
    assert loss.item() < first - 0.5, (first, loss.item())


def test_fp8_with_tensor_parallelism_is_refused() -> None:
    pytest.importorskip("torchao.float8")
    cfg = distributed.ParallelConfig(tp=2)
    ctx = distributed.DistContext(rank=0, world=2, local_rank=0, device=torch.device("cpu"))
    with pytest.raises(CramkitError, match="fp8 with tensor parallelism"):
        parallel.parallelize(_tiny(), cfg, ctx, "fp8")
