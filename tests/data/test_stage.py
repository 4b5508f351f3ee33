"""Data on shared file systems: staging to a node-local cache (data.stage=local), pread reading
(data.mmap=false) and sharded stores (data build --shard-size), through the real commands."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from clirun import cli, cli_process
from cramkit.data.loader import PretrainData
from cramkit.data.mlm import DataConfig
from cramkit.data.stage import stage
from cramkit.data.tokenstore import TokenStore
from cramkit.errors import CramkitError
from cramkit.text.tokenizer import load_tokenizer, special_ids
from cramkit.train.metrics import read_metrics

TINY = [
    "model.hidden=32",
    "model.layers=1",
    "model.heads=2",
    "model.intermediate=64",
    "data.seq_len=64",
    "data.validation_fraction=0.05",
    "train.micro_batch=4",
    "train.batch_size=8",
    "train.batch_ramp=0",
    "train.eval_every=never",
    "train.log_every=1",
    "train.progress=false",
    "train.threads=1",
    "train.checkpoint_every=never",
]
STEPS = 4


def cramkit(*args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
    proc = cli(*args)
    if check:
        assert proc.returncode == 0, f"cramkit {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def pretrain_args(store: Path, run: Path, *sets: str) -> list[str]:
    items = [x for s in [*TINY, *sets] for x in ("--set", s)]
    return ["pretrain", str(store), "--out", str(run), "--budget", f"{STEPS}steps", *items]


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run) if "loss" in r}


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory, wikitext_dir) -> Path:
    out = tmp_path_factory.mktemp("stok") / "tok"
    cramkit(
        "tokenizer",
        "train",
        str(wikitext_dir / "wiki.valid.tokens"),
        "--vocab-size",
        "800",
        "--out",
        str(out),
    )
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory, tok_path, wikitext_dir) -> tuple[Path, Path]:
    """The same text as one store and as a store of ~100 kB shards (`cramkit data build`)."""
    root = tmp_path_factory.mktemp("stores")
    src = str(wikitext_dir / "wiki.valid.tokens")
    cramkit("data", "build", src, "--tokenizer", str(tok_path), "--out", str(root / "one"), "--workers", "1")
    cramkit(
        "data",
        "build",
        src,
        "--tokenizer",
        str(tok_path),
        "--out",
        str(root / "sharded"),
        "--workers",
        "1",
        "--shard-size",
        "100kB",
    )
    return root / "one", root / "sharded"


@pytest.fixture(scope="module")
def reference(stores, tmp_path_factory) -> dict[int, float]:
    run = tmp_path_factory.mktemp("ref") / "run"
    cramkit(*pretrain_args(stores[0], run))
    curve = losses(run)
    assert sorted(curve) == list(range(1, STEPS + 1))
    return curve


def batches(store: TokenStore, tok_path: Path, n: int = 6, **cfg) -> list[np.ndarray]:
    tok = load_tokenizer(tok_path)
    data = PretrainData(store, DataConfig(seq_len=64, **cfg), special_ids(tok), tok.get_vocab_size())
    loader = data.train_loader(8)
    out = [np.concatenate([b["input_ids"].numpy(), b["labels"].numpy()]) for b in (next(loader) for _ in range(n))]
    return out + [np.concatenate([b["labels"].numpy() for b in data.val_batches(8)])]


def test_sharded_store_pread_and_staged_copy_give_the_same_batches(stores, tok_path, tmp_path):
    one, sharded = stores
    manifest = json.loads((sharded / "train.json").read_text())
    assert len(manifest["shards"]) >= 3 and not (sharded / "train.bin").exists()
    for name in manifest["shards"]:  # each shard is a Megatron store of its own
        assert len(TokenStore(sharded / f"{name}.idx")) > 0
    a, b = TokenStore(one), TokenStore(sharded)
    assert np.array_equal(a.sizes, b.sizes) and np.array_equal(a.doc_idx, b.doc_idx) and a.num_tokens == b.num_tokens
    want = batches(a, tok_path)
    for store, cfg in [
        (b, {}),
        (a, {"mmap": False}),
        (b, {"mmap": False}),
        (a, {"stage": "local", "stage_dir": str(tmp_path / "cache")}),
        (b, {"stage": "local", "stage_dir": str(tmp_path / "cache"), "mmap": False}),
    ]:
        got = batches(store, tok_path, **cfg)
        assert all(np.array_equal(x, y) for x, y in zip(want, got, strict=True)), cfg
    inspect = cramkit("data", "inspect", str(sharded), "--samples", "1").stdout
    assert (
        f"({len(manifest['shards'])} shards, {manifest['shards'][0]} ..." in inspect
        and f"tokens {a.num_tokens:,}" in inspect
    )


def test_staged_and_pread_runs_train_like_in_place(stores, reference, tmp_path):
    one, sharded = stores
    cache = tmp_path / "cache"
    first = cramkit(*pretrain_args(one, tmp_path / "staged", "data.stage=local", f"data.stage_dir={cache}"))
    assert "cramkit: staged" in first.stderr and losses(tmp_path / "staged") == reference
    (folder,) = [d for d in cache.iterdir() if d.is_dir()]
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert names[1:] == ["stage.json", "train.bin", "train.idx", "train.json"] and names[0].startswith("index-")
    again = cramkit(*pretrain_args(one, tmp_path / "again", "data.stage=local", f"data.stage_dir={cache}"))
    assert "using the staged copy" in again.stderr and "cramkit: staged" not in again.stderr
    assert losses(tmp_path / "again") == reference
    cramkit(*pretrain_args(sharded, tmp_path / "pread", "data.mmap=false"))
    assert losses(tmp_path / "pread") == reference
    # a sharded store named by its prefix (DIR/train, as a single store's DIR/train.bin would be)
    cramkit(*pretrain_args(sharded / "train", tmp_path / "prefix"))
    assert losses(tmp_path / "prefix") == reference


@pytest.mark.integration
def test_kill_9_during_staging_then_rerun_trains_correctly(stores, reference, tmp_path):
    one, _ = stores
    cache = tmp_path / "cache"
    # the real command, its copy slowed down (small blocks, a pause after each) so the kill lands mid-file
    slow = textwrap.dedent(
        f"""
        import sys, time
        import cramkit.data.stage as st
        st.BLOCK = 4096
        update = st.Progress.update
        st.Progress.update = lambda self, n: (update(self, n), time.sleep(0.02))
        from cramkit.cli import main
        sys.exit(main({pretrain_args(one, tmp_path / "killed", "data.stage=local", f"data.stage_dir={cache}")!r}))
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", slow], env=env, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    part = None
    while time.time() < deadline and part is None:
        part = next((p for p in cache.rglob(".train.bin.part") if p.stat().st_size > 8192), None)
        time.sleep(0.05)
    assert part is not None, "staging never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (part.parent / "train.bin").exists()  # nothing that looks staged
    rerun = cramkit(*pretrain_args(one, tmp_path / "rerun", "data.stage=local", f"data.stage_dir={cache}"))
    assert "cramkit: staged" in rerun.stderr and losses(tmp_path / "rerun") == reference
    assert not list(cache.rglob("*.part"))
    assert (part.parent / "train.bin").read_bytes() == (one / "train.bin").read_bytes()


def test_document_split_is_cached_beside_the_staged_copy(stores, tok_path, tmp_path, monkeypatch):
    import cramkit.data.loader as loader

    want = batches(TokenStore(stores[0]), tok_path)
    cfg = {"stage": "local", "stage_dir": str(tmp_path / "cache")}
    assert all(np.array_equal(x, y) for x, y in zip(want, batches(TokenStore(stores[0]), tok_path, **cfg), strict=True))
    (index,) = (tmp_path / "cache").rglob("index-*.npz")

    def no_recompute(*a):
        raise AssertionError("the split was computed again")

    monkeypatch.setattr(loader, "_split_documents", no_recompute)
    got = batches(TokenStore(stores[0]), tok_path, **cfg)
    assert all(np.array_equal(x, y) for x, y in zip(want, got, strict=True))
    with pytest.raises(AssertionError, match="computed again"):  # other settings: another key
        batches(TokenStore(stores[0]), tok_path, validation_fraction=0.2, **cfg)


def test_store_that_cannot_be_memory_mapped_is_read_with_pread(stores, tok_path, monkeypatch, capsys):
    import errno

    import cramkit.data.tokenstore as ts

    want = batches(TokenStore(stores[1]), tok_path)
    real = np.memmap

    def no_mmap(path, *a, **k):  # as a FUSE mount with direct_io answers
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(ts.np, "memmap", no_mmap)
    store = TokenStore(stores[1])
    assert isinstance(store.tokens.parts[0], ts.PreadTokens)
    assert capsys.readouterr().err.count("cannot be memory-mapped on its file system (No such device)") == 1
    monkeypatch.setattr(ts.np, "memmap", real)
    assert all(np.array_equal(x, y) for x, y in zip(want, batches(store, tok_path), strict=True))


def test_corrupted_staged_copy_is_copied_again(stores, tmp_path, capsys):
    one, _ = stores
    prefix = stage(TokenStore(one), tmp_path / "cache")
    copy = prefix.parent / "train.bin"
    with open(copy, "r+b") as fh:  # damage one byte of the staged copy
        fh.seek(100)
        byte = fh.read(1)
        fh.seek(100)
        fh.write(bytes([byte[0] ^ 0xFF]))
    capsys.readouterr()
    assert stage(TokenStore(one), tmp_path / "cache") == prefix
    assert "changed since it was staged" in capsys.readouterr().err
    assert copy.read_bytes() == (one / "train.bin").read_bytes()


def test_store_changed_under_the_job_is_one_line(stores, tmp_path):
    changed = tmp_path / "changed"
    shutil.copytree(stores[0], changed)
    with open(changed / "train.bin", "r+b") as fh:  # rewritten in place after its checksums were recorded
        fh.seek(10)
        fh.write(b"\x01\x00")
    proc = cramkit(
        *pretrain_args(changed, tmp_path / "run", "data.stage=local", f"data.stage_dir={tmp_path / 'c'}"),
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not match the checksum" in lines[0] and "changed under this job" in lines[0]
    assert not [p for p in (tmp_path / "c").rglob("train.bin")]  # the mismatching copy is not kept


def test_unwritable_or_too_small_stage_dir_is_one_line(stores, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = cramkit(
        *pretrain_args(stores[0], tmp_path / "run", "data.stage=local", f"data.stage_dir={blocker}/stage"),
        check=False,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert f"data.stage_dir {blocker}/stage is not writable" in line and "data.stage=none" in line
    assert not (tmp_path / "run" / "checkpoints").exists()
    with pytest.raises(CramkitError, match=r"too small for the token store: staging needs .* data.stage_max_size"):
        stage(TokenStore(stores[0]), tmp_path / "cache", max_size=1000)


def test_cache_is_cleaned_least_recently_used_first(stores, tmp_path):
    one, sharded = stores
    size = sum(f.stat().st_size for f in one.glob("train.*") if f.suffix in (".bin", ".idx", ".json"))
    cache = tmp_path / "cache"
    first = stage(TokenStore(one), cache, max_size=int(size * 1.5))
    second = stage(TokenStore(sharded), cache, max_size=int(size * 1.5))  # the first must go
    assert not first.parent.exists() and second.parent.is_dir()
    assert TokenStore(second).num_tokens == TokenStore(one).num_tokens


@pytest.mark.parametrize("bad", ["../../etc/passwd", "/etc/passwd", "sub/train-00000"])
def test_crafted_manifest_is_refused(stores, tmp_path, bad):
    crafted = tmp_path / "crafted"
    shutil.copytree(stores[1], crafted)
    manifest = json.loads((crafted / "train.json").read_text())
    manifest["shards"][1] = bad
    (crafted / "train.json").write_text(json.dumps(manifest))
    proc = cramkit("data", "inspect", str(crafted), check=False)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert f"names shard {bad!r}, which is not a plain file name" in line
    assert "root:" not in proc.stdout  # nothing of /etc/passwd was read


@pytest.mark.dist
def test_two_processes_stage_once_per_node(stores, reference, tmp_path):
    cache = tmp_path / "cache"
    proc = cli_process(  # a process: torchrun's workers print to the file descriptors
        *pretrain_args(stores[1], tmp_path / "run", "data.stage=local", f"data.stage_dir={cache}"),
        "--nproc",
        "2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert out.count("cramkit: staged") == 1  # local rank 0 copied; rank 1 waited for it, then read the copy
    assert sorted(losses(tmp_path / "run")) == sorted(reference)
    for step, loss in losses(tmp_path / "run").items():  # DDP over 2 ranks follows one process
        assert abs(loss - reference[step]) <= 2e-5 * max(1.0, abs(loss))


def test_bad_shard_size_is_one_line(tmp_path, tok_path, wikitext_dir):
    proc = cramkit(
        "data",
        "build",
        str(wikitext_dir / "wiki.valid.tokens"),
        "--tokenizer",
        str(tok_path),
        "--out",
        str(tmp_path / "s"),
        "--shard-size",
        "1 furlong",
        check=False,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "--shard-size '1 furlong' is not a size" in line and not (tmp_path / "s").exists()
