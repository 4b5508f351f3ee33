from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from cramkit.errors import CramkitError
from cramkit.model import MaskedLM, ModelConfig
from cramkit.train import checkpoint as ckpt
from cramkit.train.optim import build_optimizer


def _trained(seed: int = 0) -> tuple[MaskedLM, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = MaskedLM(
        ModelConfig(vocab_size=50, hidden=16, layers=1, heads=2, intermediate=32, max_position=16)
    )
    opt = build_optimizer(model, "adamw", 1e-3, (0.9, 0.98), 1e-12, 0.01, torch.device("cpu"))
    ids = torch.randint(5, 50, (4, 16))
    for _ in range(2):
        model(ids, torch.where(ids % 3 == 0, ids, -100)).loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _save(run: Path, step: int, model: MaskedLM, opt: torch.optim.Optimizer, keep: int = 2) -> Path:
    model_sd, optim_sd = ckpt.gather_state(model, opt)
    return ckpt.save_checkpoint(run, step, model_sd, optim_sd, {"step": step, "loader": {}}, keep=keep)


def test_roundtrip_restores_model_and_optimizer_exactly(tmp_path: Path) -> None:
    model, opt = _trained()
    path = _save(tmp_path, 7, model, opt)
    assert path.name == "step-000007"
    assert sorted(p.name for p in path.iterdir()) == [
        "model.safetensors", "optimizer.json", "optimizer.safetensors", "state.json",
    ]  # fmt: skip
    fresh, fresh_opt = _trained(seed=1)
    model_sd, optim_sd, state = ckpt.load_checkpoint(ckpt.find_latest(tmp_path))
    ckpt.apply_state(fresh, fresh_opt, model_sd, optim_sd, path)
    assert state["step"] == 7
    for (n, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    # the tied decoder weight is still tied after loading
    assert fresh.head.decoder.weight is fresh.encoder.embeddings.word.weight
    want, got = opt.state_dict(), fresh_opt.state_dict()
    assert want["param_groups"] == got["param_groups"]
    for pid, pstate in want["state"].items():
        for key, value in pstate.items():
            assert torch.equal(value, got["state"][pid][key]), (pid, key)


def test_latest_pointer_and_keep_last_k(tmp_path: Path) -> None:
    model, opt = _trained()
    for step in (10, 20, 30, 40):
        _save(tmp_path, step, model, opt, keep=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000030", "step-000040"]
    assert (root / "latest").read_text().strip() == "step-000040"
    # no temporary directories left behind
    assert not list(root.glob(".tmp-*"))


def test_incomplete_checkpoint_is_never_latest(tmp_path: Path) -> None:
    model, opt = _trained()
    _save(tmp_path, 5, model, opt)
    # a crash mid-write: a directory without state.json, and a stale pointer to it
    half = tmp_path / "checkpoints" / "step-000009"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"partial")
    (tmp_path / "checkpoints" / "latest").write_text("step-000009\n")
    assert ckpt.find_latest(tmp_path).name == "step-000005"


def test_full_disk_keeps_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt = _trained()
    first = _save(tmp_path, 1, model, opt)
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    real = ckpt._save_tensors

    def full_disk(tensors: dict, path: Path) -> None:
        if path.name == "optimizer.safetensors":
            path.write_bytes(b"\0" * 10)  # part of the file made it to disk
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(tensors, path)

    monkeypatch.setattr(ckpt, "_save_tensors", full_disk)
    with pytest.raises(CramkitError) as err:
        _save(tmp_path, 2, model, opt)
    msg = str(err.value)
    assert "disk is full" in msg and "step-000001 is intact" in msg and "--resume" in msg
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000001"]
    assert ckpt.find_latest(tmp_path) == first
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
    ckpt.load_checkpoint(first)  # still loads


@pytest.mark.parametrize("damage", ["truncate-weights", "bad-json", "foreign-json", "missing-optimizer"])
def test_corrupt_checkpoint_is_a_clear_error(tmp_path: Path, damage: str) -> None:
    model, opt = _trained()
    path = _save(tmp_path, 3, model, opt)
    if damage == "truncate-weights":
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "bad-json":
        (path / "state.json").write_text("{not json")
    elif damage == "foreign-json":
        (path / "state.json").write_text(json.dumps({"step": 3}))
    else:
        (path / "optimizer.safetensors").unlink()
    with pytest.raises(CramkitError, match=r"checkpoint .*step-000003 is damaged or incomplete .*delete"):
        ckpt.load_checkpoint(path)


def test_checkpoint_from_another_model_is_a_clear_error(tmp_path: Path) -> None:
    model, opt = _trained()
    path = _save(tmp_path, 3, model, opt)
    other = MaskedLM(
        ModelConfig(vocab_size=50, hidden=16, layers=2, heads=2, intermediate=32, max_position=16)
    )
    model_sd, optim_sd, _ = ckpt.load_checkpoint(path)
    with pytest.raises(CramkitError, match="does not fit this model"):
        ckpt.apply_state(other, None, model_sd, optim_sd, path)


def test_not_a_run_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CramkitError, match="not a cramkit run directory"):
        ckpt.require_run_dir(tmp_path)
    with pytest.raises(CramkitError, match="does not exist"):
        ckpt.require_run_dir(tmp_path / "nope")


def test_rng_roundtrip() -> None:
    torch.manual_seed(123)
    saved = ckpt.encode_rng()
    a = torch.rand(5)
    torch.manual_seed(999)
    ckpt.restore_rng(json.loads(json.dumps(saved)))
    assert torch.equal(torch.rand(5), a)
