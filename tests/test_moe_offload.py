"""Offloaded mixture-of-experts inference (issue 32, item 2): `--offload-experts` / ``Engine(offload_experts=True)``
on a real MoE run made by `cramkit pretrain`: the experts leave the model, only the ones each pass's router picks
are read (from the checkpoint's safetensors file, memory-mapped), an LRU of `--expert-cache` stays resident, and
the outputs are the all-resident model's; the refusals are one line each (exit 2)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from clirun import cli as _cli
from cramkit.errors import CramkitError

EXPERTS = 8
MOE = ["--set", f"model.moe_experts={EXPERTS}", "--set", "model.moe_top_k=2", "--set", "model.moe_every=1"]
TEXTS = [
    "the cat sat on the mat",
    "a second, rather longer sentence about the history of the valley and the river that runs through it",
    "short one",
    "the weather was cold and the roads were closed for most of the winter",
    "numbers like 1999 and 2024 appear here",
    "another line of text with a few words",
] * 3
MASKED = ["the [MASK] of the valley", "it was a [MASK] day in the city", "she [MASK] the door"]


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory: pytest.TempPathFactory, tok_dir: Path) -> Path:
    from conftest import run_pretrain

    return run_pretrain(tmp_path_factory.mktemp("moe-offload") / "run", "--tokenizer", str(tok_dir), *MOE, steps=12)


def _one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("cramkit: error:") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_offloaded_outputs_equal_resident_and_experts_leave_memory(moe_run: Path, tmp_path: Path) -> None:
    import torch

    import cramkit
    from cramkit.infer import Engine
    from cramkit.model.moe import moe_layers
    from cramkit.serve.server import build_engines

    resident = Engine(moe_run, device="cpu", max_batch_tokens=96)  # several passes: routing varies per pass
    want_vec, want_mask = resident.embed(TEXTS), resident.fill_mask(MASKED, top_k=3)
    full = sum(p.numel() for p in resident.model.parameters())
    layers = moe_layers(resident.model)
    assert len(layers) == 2 and all(m.w_in.shape[0] == EXPERTS for m in layers)
    expert_params = sum(m.w_in.numel() + m.w_out.numel() for m in layers)
    # a model directory too (its weights file found through cramkit-model.json), not only the run's checkpoint
    model_dir = cramkit.load(moe_run).save(tmp_path / "model")
    for source, cache in ((moe_run, 0), (moe_run, 3), (moe_run, EXPERTS), (model_dir, 0)):
        eng = Engine(source, device="cpu", max_batch_tokens=96, offload_experts=True, expert_cache=cache)
        if source == model_dir:  # the directory saved again with other experts: the engine keeps the file it read
            other = cramkit.load(model_dir)
            with torch.no_grad():
                for m in moe_layers(other.model):
                    m.w_in.mul_(2.0)
            other.save(model_dir)
            changed = Engine(model_dir, device="cpu", max_batch_tokens=96).embed(TEXTS)
            assert np.abs(changed - want_vec).max() > 1e-3
        got_vec, got_mask = eng.embed(TEXTS), eng.fill_mask(MASKED, top_k=3)
        np.testing.assert_allclose(got_vec, want_vec, rtol=1e-5, atol=1e-5)
        assert [[[t["id"] for t in m] for m in r] for r in got_mask] == [
            [[t["id"] for t in m] for m in r] for r in want_mask
        ]
        # the experts are no longer the model's: its parameters are the rest, the stores hold at most the cache
        assert sum(p.numel() for p in eng.model.parameters()) == full - expert_params
        stores = [m.store for m in moe_layers(eng.model)]
        assert all(s is not None and len(s.resident) <= cache for s in stores)
        traffic = eng.expert_traffic()
        assert traffic is not None and traffic["reads"] > 0
        # cache 0 reads every use; a cache of all experts reads each at most once per layer, the rest are hits
        if cache == 0:
            assert traffic["hits"] == 0
        if cache == EXPERTS:
            assert traffic["reads"] <= 2 * EXPERTS and traffic["hits"] > 0
        info = eng.info()["offload_experts"]
        assert info["layers"] == 2 and info["experts"] == EXPERTS and info["cache"] == cache
        assert info["from"].endswith("model.safetensors")
    # serve builds its engines with the same option
    engines = build_engines([str(moe_run)], device="cpu", offload_experts=True, expert_cache=2)
    (eng,) = engines.values()
    assert eng.info()["offload_experts"]["cache"] == 2
    np.testing.assert_allclose(eng.embed(TEXTS[:4]), resident.embed(TEXTS[:4]), rtol=1e-5, atol=1e-5)


def test_embed_and_predict_commands_offload(moe_run: Path, tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    outs = {}
    for name, extra in (("resident", []), ("offloaded", ["--offload-experts", "--expert-cache", "2"])):
        proc = _cli("embed", texts, "--from", moe_run, "--out", tmp_path / name, "--device", "cpu", *extra)
        assert proc.returncode == 0, proc.stderr
        outs[name] = np.load(tmp_path / name / "embeddings.npy", allow_pickle=False)
    assert outs["resident"].shape == (len(TEXTS), 64)
    np.testing.assert_allclose(outs["offloaded"], outs["resident"], rtol=1e-5, atol=1e-5)
    # predict (fill-mask of a pretraining run) through the Python API that `cramkit predict` calls
    import cramkit

    masked = tmp_path / "masked.txt"
    masked.write_text("\n".join(MASKED) + "\n", encoding="utf-8")
    rows = {}
    for name, offload in (("resident", False), ("offloaded", True)):
        out = tmp_path / f"{name}.jsonl"
        cramkit.predict(str(moe_run), masked, out, device="cpu", offload_experts=offload, expert_cache=None)
        rows[name] = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows["resident"]) == len(MASKED)
    for a, b in zip(rows["resident"], rows["offloaded"], strict=True):
        assert len(a["masks"]) == 1 and [c["token"] for c in a["masks"][0]] == [c["token"] for c in b["masks"][0]]
        assert np.allclose([c["score"] for c in a["masks"][0]], [c["score"] for c in b["masks"][0]], atol=1e-5)


def test_bad_input_one_line(moe_run: Path, pretrained_run: Path, tmp_path: Path) -> None:
    from cramkit.infer import Engine

    texts = tmp_path / "texts.txt"
    texts.write_text("one line\nanother line\n", encoding="utf-8")
    # a dense model: nothing to offload
    proc = _cli("embed", texts, "--from", pretrained_run, "--out", tmp_path / "e", "--offload-experts")
    _one_line(proc, "--offload-experts", "dense model", "moe_experts")
    # a cache size that is not a non-negative integer, before anything is loaded
    for bad in ("-1", "abc", "1.5"):
        proc = _cli("predict", texts, "--from", moe_run, "--offload-experts", "--expert-cache", bad)
        _one_line(proc, f"--expert-cache {bad!r}", "non-negative integer")
    # a cache without offloading
    proc = _cli("predict", texts, "--from", moe_run, "--expert-cache", "2")
    _one_line(proc, "--expert-cache applies with --offload-experts")
    # the Python API says the same
    for kwargs, needle in (
        ({"offload_experts": True, "expert_cache": -3}, "non-negative integer"),
        ({"offload_experts": True, "expert_cache": True}, "non-negative integer"),
        ({"offload_experts": True, "backend": "onnx"}, "drop --backend onnx"),
    ):
        with pytest.raises(CramkitError, match=needle) as info:
            Engine(moe_run, device="cpu", **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(CramkitError, match="dense model") as info:
        Engine(pretrained_run, device="cpu", offload_experts=True)
    assert "\n" not in str(info.value)
