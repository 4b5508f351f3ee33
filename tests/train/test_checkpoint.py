"""The checkpoint module: one format for every world size, atomic, checksummed, and never unpickled."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from cramkit.errors import CramkitError
from cramkit.model import MaskedLM, ModelConfig
from cramkit.train import checkpoint as ckpt
from cramkit.train import distributed as D
from cramkit.train.optim import build_optimizer


def _trained(seed: int = 0, layers: int = 1) -> tuple[MaskedLM, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = MaskedLM(ModelConfig(vocab_size=50, hidden=16, layers=layers, heads=2, intermediate=32, max_position=16))
    opt = build_optimizer(model, "adamw", 1e-3, (0.9, 0.98), 1e-12, 0.01, torch.device("cpu"))
    ids = torch.randint(5, 50, (4, 16))
    for _ in range(2):
        model(ids, torch.where(ids % 3 == 0, ids, -100)).loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _save(run: Path, steps: tuple[int, ...], model, opt, keep: int = 2, async_save: bool = True) -> Path:
    writer = ckpt.Checkpointer(run, D.DistContext(), keep=keep, async_save=async_save)
    try:
        for step in steps:
            last = writer.save(step, model, opt, {"step": step, "loader": {"epoch": 1}})
    finally:
        writer.close()
    return last


def _rehash(path: Path) -> None:
    """What an attacker who rewrote files would also do: make state.json's checksums match them."""
    state = json.loads((path / "state.json").read_text())
    state["sha256"] = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in path.iterdir()
        if p.is_file() and p.name != "state.json"
    }
    (path / "state.json").write_text(json.dumps(state))


def test_roundtrip_restores_model_and_optimizer_exactly(tmp_path: Path) -> None:
    model, opt = _trained()
    path = _save(tmp_path, (7,), model, opt)
    assert path.name == "step-000007"
    assert sorted(p.name for p in path.iterdir()) == [
        "__0_0.distcp",
        "metadata.json",
        "model.safetensors",
        "state.json",
    ]
    fresh, fresh_opt = _trained(seed=1)
    state = ckpt.load(ckpt.find_latest(tmp_path), fresh, fresh_opt)
    assert state == {"step": 7, "loader": {"epoch": 1}}
    for (n, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    assert fresh.head.decoder.weight is fresh.encoder.embeddings.word.weight  # still tied
    want, got = opt.state_dict(), fresh_opt.state_dict()
    assert [g["lr"] for g in want["param_groups"]] == [g["lr"] for g in got["param_groups"]]
    for pid, pstate in want["state"].items():
        for key, value in pstate.items():
            assert torch.equal(value, got["state"][pid][key]), (pid, key)
    # the full weights, readable without torch.distributed: tied weights stored once, as HF does
    weights = ckpt.model_weights(path)
    assert "head.decoder.weight" not in weights
    for name, tensor in weights.items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    # files respect the umask (not safetensors' 0600)
    mask = os.umask(0)
    os.umask(mask)
    assert (path / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~mask


def test_latest_pointer_and_keep_last_k(tmp_path: Path) -> None:
    model, opt = _trained()
    _save(tmp_path, (10, 20, 30, 40), model, opt, keep=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000030", "step-000040"]
    assert (root / "latest").read_text().strip() == "step-000040"


def test_incomplete_checkpoint_is_never_latest(tmp_path: Path) -> None:
    model, opt = _trained()
    _save(tmp_path, (5,), model, opt)
    # a crash mid-write: a .tmp directory, a step directory without state.json, a stale pointer
    (tmp_path / "checkpoints" / "step-000008.tmp").mkdir()
    half = tmp_path / "checkpoints" / "step-000009"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"partial")
    (tmp_path / "checkpoints" / "latest").write_text("step-000009\n")
    assert ckpt.find_latest(tmp_path).name == "step-000005"
    with pytest.raises(CramkitError, match="incomplete checkpoint"):
        ckpt.resolve_checkpoint(tmp_path / "checkpoints" / "step-000008.tmp")
    with pytest.raises(CramkitError, match="no complete checkpoint"):
        ckpt.resolve_checkpoint(tmp_path / "elsewhere")


def test_full_disk_keeps_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt = _trained()
    first = _save(tmp_path, (1,), model, opt)
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    real = ckpt._write_synced

    def full_disk(path: Path, text: str) -> None:
        if path.name == "state.json":
            path.write_text(text[:10])  # part of the file made it to disk
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, text)

    monkeypatch.setattr(ckpt, "_write_synced", full_disk)
    writer = ckpt.Checkpointer(tmp_path, D.DistContext(), keep=2)
    writer.save(2, model, opt, {"step": 2})
    with pytest.raises(CramkitError) as err:
        writer.close()
    msg = str(err.value)
    assert "disk is full" in msg and "step-000001 is intact" in msg and "--resume" in msg
    assert "\n" not in msg
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000001"]  # no .tmp left
    assert ckpt.find_latest(tmp_path) == first
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
    ckpt.load(first, *_trained(seed=3))  # still loads


@pytest.mark.parametrize("damage", ["flip-shard", "flip-weights", "truncate", "bad-json", "foreign", "no-shard"])
def test_corrupt_checkpoint_is_a_clear_error(tmp_path: Path, damage: str) -> None:
    model, opt = _trained()
    path = _save(tmp_path, (3,), model, opt)
    shard, weights = path / "__0_0.distcp", path / "model.safetensors"
    if damage.startswith("flip"):
        target = shard if damage == "flip-shard" else weights
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x10  # one flipped bit in the middle of the tensors
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "bad-json":
        (path / "state.json").write_text("{not json")
    elif damage == "foreign":
        (path / "state.json").write_text(json.dumps({"step": 3}))
    else:
        shard.unlink()
    fresh, fresh_opt = _trained(seed=1)
    with pytest.raises(CramkitError, match=r"step-000003") as err:
        if damage == "flip-weights":
            ckpt.model_weights(path)
        else:
            ckpt.load(path, fresh, fresh_opt)
    assert "\n" not in str(err.value)


def test_checkpoint_of_another_model_is_a_clear_error(tmp_path: Path) -> None:
    model, opt = _trained()
    path = _save(tmp_path, (3,), model, opt)
    other, other_opt = _trained(layers=2)
    with pytest.raises(CramkitError, match="different model"):
        ckpt.load(path, other, other_opt)


MARKER_CODE = "open({marker!r}, 'w').write('pwned')"


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (MARKER_CODE.format(marker=self.marker),))


def test_pickled_dcp_metadata_is_never_read(tmp_path: Path) -> None:
    """A step directory holding DCP's usual pickled .metadata (crafted to run code): never unpickled."""
    model, opt = _trained()
    path = _save(tmp_path, (5,), model, opt)
    marker = tmp_path / "MARKER"
    (path / ".metadata").write_bytes(pickle.dumps(_Evil(marker), protocol=4))
    (path / "metadata.json").unlink()
    _rehash(path)
    with pytest.raises(CramkitError, match="metadata"):
        ckpt.load(path, *_trained(seed=2))
    # also a run whose only checkpoint is a foreign DCP directory (no state.json at all)
    foreign = tmp_path / "run2" / "checkpoints" / "step-000001"
    foreign.mkdir(parents=True)
    (foreign / ".metadata").write_bytes(pickle.dumps(_Evil(marker), protocol=4))
    assert ckpt.find_latest(tmp_path / "run2") is None
    assert not marker.exists()


def test_bytes_entries_and_crafted_shards_cannot_run_code(tmp_path: Path) -> None:
    """DCP would torch.load a 'bytes' entry without weights_only: refused; a shard holding a pickle that
    runs code is read with weights_only=True and refused too; a shard path outside the directory is refused."""
    model, opt = _trained()
    path = _save(tmp_path, (5,), model, opt)
    marker = tmp_path / "MARKER"
    meta = json.loads((path / "metadata.json").read_text())

    # 1. an entry of DCP's bytes kind
    bad = json.loads(json.dumps(meta))
    first = next(iter(bad["tensors"]))
    bad["tensors"][first] = {"type": "bytes"}
    (path / "metadata.json").write_text(json.dumps(bad))
    _rehash(path)
    with pytest.raises(CramkitError, match="not a valid cramkit checkpoint index"):
        ckpt.load(path, *_trained(seed=2))

    # 2. a shard whose bytes are a code-running pickle
    (path / "metadata.json").write_text(json.dumps(meta))
    (path / "__0_0.distcp").write_bytes(pickle.dumps(_Evil(marker)) * 200)
    _rehash(path)
    with pytest.raises(CramkitError):
        ckpt.load(path, *_trained(seed=2))

    # 3. a shard file name that leaves the directory
    outside = json.loads(json.dumps(meta))
    outside["storage"][0]["file"] = "../../../../etc/passwd"
    (path / "metadata.json").write_text(json.dumps(outside))
    _rehash(path)
    with pytest.raises(CramkitError, match="outside its directory"):
        ckpt.load(path, *_trained(seed=2))
    assert not marker.exists()


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
