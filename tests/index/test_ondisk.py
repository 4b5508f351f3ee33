"""On-disk IVF indexes (`cramkit index build --on-disk`, `--workers`, `--shard i/N`) and resumable RETRO
neighbours, through the real commands on real text (ABC science news) embedded by a real pretraining run."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import cramkit
from clirun import cli
from cramkit.cli import main
from cramkit.index import ann

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "cramkit", *args]


def fails(capsys, *args: str) -> str:
    capsys.readouterr()
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("cramkit: error: ") and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def embedded(tmp_path_factory, shared_data, pretrained_run) -> Path:
    """2000 real lines of ABC science news embedded once into Parquet (`cramkit embed --format parquet`)."""
    text = (shared_data / "corpus" / "nltk-abc" / "science.txt").read_text(encoding="utf-8", errors="replace")
    rows = [" ".join(x.split()) for x in text.splitlines() if len(x.split()) > 6][:2000]
    assert len(rows) == 2000
    base = tmp_path_factory.mktemp("ondisk-emb")
    (base / "lines.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = base / "parquet"
    res = cli("embed", str(base / "lines.txt"), "--from", str(pretrained_run), "--out", str(out), "--format",
              "parquet", "--device", "cpu")  # fmt: skip
    assert res.returncode == 0, res.stderr
    return out


def build(src: Path, run: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return cli("index", "build", str(src), "--encoder", str(run), "--out", str(out), "--kind", "ivfsq8",
               "--device", "cpu", *extra)  # fmt: skip


@pytest.fixture(scope="module")
def builds(tmp_path_factory, embedded, pretrained_run) -> dict[str, Path]:
    """The same vectors indexed in RAM, on disk by one process, and on disk by two worker processes."""
    base = tmp_path_factory.mktemp("ondisk-idx")
    out = {"ram": base / "ram", "disk": base / "disk", "workers": base / "workers"}
    for name, extra in (("ram", ()), ("disk", ("--on-disk",)), ("workers", ("--on-disk", "--workers", "2"))):
        res = build(embedded, pretrained_run, out[name], *extra)
        assert res.returncode == 0, res.stderr
        assert ("on disk" in res.stdout) == (name != "ram"), res.stdout
    return out


def _data(idx: Path) -> Path:
    return idx / json.loads((idx / "index.json").read_text())["data"]


def test_on_disk_index_equals_the_in_ram_one(builds, capsys):
    m = json.loads((builds["disk"] / "index.json").read_text())
    ram = json.loads((builds["ram"] / "index.json").read_text())
    assert m["plan"]["on_disk"] is True and m["plan"]["factory"] == ram["plan"]["factory"]
    assert m["plan"]["ivfdata"] == "lists.ivfdata" and m["files"]["lists.ivfdata"] > 2000 * 64
    assert "on_disk" not in ram["plan"] and not (_data(builds["ram"]) / "lists.ivfdata").exists()
    # trained on the same sample and tuned on the same held-out rows (the parameters chosen are the fastest
    # that reach the target: a timing, so they may differ between two builds; the results below may not)
    assert m["recall"]["reached"] and ram["recall"]["reached"] and ram["recall"]["queries"] == 200
    assert m["recall"]["queries"] == 200 and m["recall"]["recall_at_10"] >= 0.95
    assert m["build"]["parts"] == 1 and len(m["build"]["part_peak_rss_mb"]) == 1
    disk, inram = cramkit.index.open(builds["disk"]), cramkit.index.open(builds["ram"])
    assert disk.index.ntotal == inram.index.ntotal == 2000
    assert disk.info()["on_disk"] and not inram.info()["on_disk"]
    q = np.asarray(inram.vectors[::7], dtype=np.float32) + 0.01  # 286 queries near (not at) indexed vectors
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    for nprobe in (1, 4, 16):
        params = {"nprobe": nprobe, "refine": 2}
        d1, i1 = ann.search(disk.index, disk.vectors, disk.plan, params, q, 10)
        d2, i2 = ann.search(inram.index, inram.vectors, inram.plan, params, q, 10)
        assert np.array_equal(i1, i2) and np.allclose(d1, d2)
    # and more probes find what exact search finds: the lists hold every vector
    _, exact = ann.exact_search(disk.vectors, q, 10)
    _, found = ann.search(disk.index, disk.vectors, disk.plan, {"nprobe": disk.plan["nlist"], "refine": 4}, q, 10)
    assert ann.recall_at(found, exact, 10) > 0.999
    assert main(["index", "info", str(builds["disk"])]) == 0
    said = capsys.readouterr().out
    assert "lists on disk" in said and "parts      1 filled" in said


def test_workers_build_equals_the_single_process_one(builds):
    m = json.loads((builds["workers"] / "index.json").read_text())
    assert m["build"]["parts"] == 2 and all(r > 0 for r in m["build"]["part_peak_rss_mb"])
    # each list holds its rows in row order whatever the number of parts: the same bytes on disk
    one = (_data(builds["disk"]) / "lists.ivfdata").read_bytes()
    assert (_data(builds["workers"]) / "lists.ivfdata").read_bytes() == one
    index_file = (_data(builds["disk"]) / "faiss.index").read_bytes()
    assert (_data(builds["workers"]) / "faiss.index").read_bytes() == index_file


@pytest.mark.integration
def test_shards_resume_after_a_kill_and_merge_like_one_process(tmp_path, builds, embedded, pretrained_run):
    out = tmp_path / "sharded"
    first = build(embedded, pretrained_run, out, "--on-disk", "--shard", "0/2")
    assert first.returncode == 0, first.stderr
    assert "--shard 1/2" in first.stderr and not (out / "index.json").exists()  # not finished: says who is missing
    work = out / ".build" / "ondisk"
    part0 = work / "part-00000-of-00002.index"
    stamp = part0.stat().st_mtime_ns
    # shard 1 killed (kill -9) once it has claimed its part
    args = cmd("index", "build", str(embedded), "--encoder", str(pretrained_run), "--out", str(out), "--kind",
               "ivfsq8", "--device", "cpu", "--on-disk", "--shard", "1/2")  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    t0 = time.time()
    while not (work / "part-00001-of-00002.lock").exists() and proc.poll() is None and time.time() - t0 < 120:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "index.json").exists() and part0.stat().st_mtime_ns == stamp
    part1_done = (work / "part-00001-of-00002.index").exists()  # the kill may land before or after it is written
    again = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "trained" not in again.stderr  # the trained quantizer is reused, not trained again
    assert "part 1/2" not in again.stderr  # shard 0's part is never rebuilt
    assert ("part 2/2" in again.stderr) != part1_done  # shard 1's part is built unless it was finished
    assert "on disk (2 parts)" in again.stdout
    assert (_data(out) / "lists.ivfdata").read_bytes() == (_data(builds["workers"]) / "lists.ivfdata").read_bytes()
    # a shard run after the merge: the index is there already
    late = build(embedded, pretrained_run, out, "--on-disk", "--shard", "0/2")
    assert late.returncode == 2 and "already holds an index" in late.stderr


@pytest.mark.integration
def test_two_shards_started_together_share_one_out(tmp_path, builds, embedded, pretrained_run):
    """A scheduler starts both shards at once: one prepares while the other waits, each fills its part, the
    last one merges; the result is the one-process index, byte for byte."""
    out = tmp_path / "together"
    procs = [
        subprocess.Popen(
            cmd(
                "index",
                "build",
                str(embedded),
                "--encoder",
                str(pretrained_run),
                "--out",
                str(out),
                "--kind",
                "ivfsq8",
                "--device",
                "cpu",
                "--on-disk",
                "--shard",
                f"{i}/2",
            ),  # fmt: skip
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    said = "".join(o for o, _ in outs)
    assert said.count("on disk (2 parts)") == 1  # exactly one of them merged
    assert sum(e.count("trained IVF") for _, e in outs) == 1  # and the index was trained once
    assert (_data(out) / "lists.ivfdata").read_bytes() == (_data(builds["workers"]) / "lists.ivfdata").read_bytes()


def test_crafted_list_paths_are_refused(tmp_path, builds, capsys):
    import faiss

    def copy(name: str) -> tuple[Path, dict]:
        d = tmp_path / name
        shutil.copytree(builds["disk"], d)
        return d, json.loads((d / "index.json").read_text())

    secret = tmp_path / "secret.ivfdata"
    shutil.copy(_data(builds["disk"]) / "lists.ivfdata", secret)
    # the manifest names a list file outside the index
    for bad in ("../../secret.ivfdata", str(secret), ""):
        d, m = copy(f"m{len(bad)}")
        m["plan"]["ivfdata"] = bad
        (d / "index.json").write_text(json.dumps(m))
        err = fails(capsys, "index", "query", str(d), "heat waves")
        assert "plan.ivfdata" in err and "refusing" in err
    # faiss.index itself names another list file (absolute, or climbing out): never opened
    for bad in (str(secret), "../../secret.ivfdata"):
        d, m = copy(f"f{len(bad)}")
        f = _data(d) / "faiss.index"
        index = faiss.read_index(str(f), faiss.IO_FLAG_SKIP_IVF_DATA)
        faiss.downcast_InvertedLists(faiss.extract_index_ivf(index).invlists).filename = bad
        faiss.write_index(index, str(f))
        m["files"]["faiss.index"] = f.stat().st_size
        (d / "index.json").write_text(json.dumps(m))
        err = fails(capsys, "index", "query", str(d), "heat waves")
        assert f"names its list file {bad!r}" in err and "refusing" in err
    # the list file a symlink to the outside copy, or cut short
    d, _ = copy("link")
    (_data(d) / "lists.ivfdata").unlink()
    (_data(d) / "lists.ivfdata").symlink_to(secret)
    assert "points outside the index directory" in fails(capsys, "index", "query", str(d), "heat waves")
    d, _ = copy("short")
    with open(_data(d) / "lists.ivfdata", "r+b") as fh:
        fh.truncate(1000)
    assert "truncated" in fails(capsys, "index", "query", str(d), "heat waves")
    # an on-disk index is not grown in place
    assert "does not grow it" in fails(capsys, "index", "add", str(builds["disk"]), "x.txt")


@pytest.mark.integration
def test_query_and_serve_over_the_on_disk_index(tmp_path, builds, pretrained_run):
    import httpx

    res = cli("index", "query", str(builds["disk"]), "solar panels and energy", "-k", "3", "--json")
    assert res.returncode == 0, res.stderr
    hits = json.loads(res.stdout)["hits"]
    ref = cramkit.index.open(builds["ram"]).search(["solar panels and energy"], k=3)[0]
    assert [h["chunk"] for h in hits] == [h["chunk"] for h in ref] and len(hits) == 3
    log = tmp_path / "serve.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            cmd("serve", str(pretrained_run), "--index", str(builds["disk"]), "--port", "0", "--threads", "1"),
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=ENV,
        )
    try:
        url = None
        t0 = time.time()
        while url is None and time.time() - t0 < 120 and proc.poll() is None:
            m = re.search(r"serving on (http://\S+)", log.read_text())
            url = m.group(1) if m else None
            time.sleep(0.2)
        assert url, log.read_text()
        for _ in range(50):
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        r = httpx.post(url + "/search", json={"inputs": ["solar panels and energy"], "k": 3}, timeout=60)
        assert r.status_code == 200, r.text
        assert [h["chunk"] for h in r.json()[0]] == [h["chunk"] for h in hits]
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def retro_disk(tmp_path_factory, builtin_docs, tok_dir, pretrained_run) -> tuple[Path, Path]:
    """A token store of 300 stdlib docstrings and its RETRO index on disk."""
    d = tmp_path_factory.mktemp("retro-disk")
    (d / "docs.txt").write_text("\n\n".join(x.replace("\n\n", "\n") for x in builtin_docs[:300]) + "\n")
    args = ["data", "build", str(d / "docs.txt"), "--tokenizer", str(tok_dir), "--out", str(d / "store"), "--quiet"]
    assert main(args) == 0
    res = cli("index", "build", str(d / "store"), "--encoder", str(pretrained_run), "--mode", "retro", "--out",
              str(d / "idx"), "--on-disk", "--device", "cpu")  # fmt: skip
    assert res.returncode == 0, res.stderr
    return d / "store", d / "idx"


@pytest.mark.integration
def test_retro_neighbours_on_disk_resume_after_a_kill(tmp_path, retro_disk):
    store, idx = retro_disk
    whole = tmp_path / "whole"
    res = cli("index", "neighbours", str(idx), "--store", str(store), "--out", str(whole), "-k", "2")
    assert res.returncode == 0, res.stderr
    info = json.loads((whole / "neighbours.json").read_text())
    assert info["index_on_disk"] and info["chunks_per_s"] > 0 and info["resumed_after"] == 0
    nb = np.load(whole / "neighbours.npy", allow_pickle=False)
    assert nb.shape == (info["chunks"], 2) and (nb >= 0).all() and info["chunks"] > 500
    # killed (kill -9) after some blocks were committed: the rerun continues after them
    out = tmp_path / "killed"
    args = cmd("index", "neighbours", str(idx), "--store", str(store), "--out", str(out), "-k", "2", "--block", "4")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    progress = out / ".neighbours.progress.json"
    t0 = time.time()
    while time.time() - t0 < 120 and proc.poll() is None:
        if progress.is_file() and json.loads(progress.read_text() or "{}").get("done", 0) >= 40:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "finished before it could be killed"
    done = json.loads(progress.read_text())["done"]
    assert 0 < done < info["chunks"] and not (out / "neighbours.npy").exists()
    again = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"resumed after {done} of {info['chunks']} chunks" in again.stderr
    assert json.loads((out / "neighbours.json").read_text())["resumed_after"] == done
    assert np.array_equal(np.load(out / "neighbours.npy", allow_pickle=False), nb)
    assert not progress.exists()


def test_memory_budget_chooses_the_on_disk_index(tmp_path, embedded, pretrained_run, capsys):
    # 20M x 384 under 4 GB: full-quality 4-bit codes (2.1 GB with their ids) fit in RAM; under 1 GB they do not
    assert "on_disk" not in ann.plan_index(20_000_000, 384, 4 << 30)
    plan = ann.plan_index(20_000_000, 384, 1 << 30)
    assert plan["on_disk"] and plan["factory"] == "IVF8192,SQ8" and plan["ivfdata"] == "lists.ivfdata"
    assert ann.plan_index(20_000_000, 384, 1 << 30, "ivfpq", on_disk=True)["factory"] == "IVF8192,PQ96"
    # through the command: 2000 x 64 vectors, whose 4-bit codes and ids (48,000 bytes) exceed 40 KB
    out = tmp_path / "auto"
    res = cli("index", "build", str(embedded), "--encoder", str(pretrained_run), "--out", str(out), "--memory",
              "40KB", "--device", "cpu")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "not even 4-bit codes" in res.stderr and "ivfsq8 on disk (1 parts)" in res.stdout
    assert json.loads((out / "index.json").read_text())["plan"]["on_disk"]
    err = fails(capsys, "index", "build", str(embedded), "--encoder", str(pretrained_run), "--out",
                str(tmp_path / "x"), "--on-disk", "--kind", "hnsw")  # fmt: skip
    assert "--on-disk keeps IVF lists on disk; --kind hnsw has none" in err
    err = fails(capsys, "index", "build", str(embedded), "--encoder", str(pretrained_run), "--out",
                str(tmp_path / "y"), "--shard", "2/2")  # fmt: skip
    assert "--shard 2/2" in err


def test_vectors_for_rescoring_are_read_not_mapped(tmp_path):
    # re-scoring reads a query's few candidate rows with pread (no read-ahead: under a memory limit below the
    # file's size, read-ahead around each row evicted the inverted lists); never mapped, so a file cut short
    # under a running server is one refused request, not SIGBUS
    rows = np.random.default_rng(0).normal(size=(5000, 16)).astype(np.float32)
    np.save(tmp_path / "vectors.npy", rows)
    got = ann.open_rows(tmp_path / "vectors.npy")
    assert np.array_equal(got[[3, 4000, 17, 3]], rows[[3, 4000, 17, 3]]) and np.array_equal(got[10:20], rows[10:20])
    assert np.array_equal(got[::7], rows[::7]) and np.array_equal(np.asarray(got), rows) and len(got) == 5000
    maps = Path("/proc/self/maps")
    if maps.is_file():
        assert str(tmp_path / "vectors.npy") not in maps.read_text()
    with open(tmp_path / "vectors.npy", "r+b") as fh:
        fh.truncate(128 + 100 * 64)
    with pytest.raises(cramkit.errors.CramkitError, match="cut short"):
        got[[4000]]


def test_shard_of_an_index_that_fits_in_ram_is_one_line(pretrained_run, tmp_path):
    """`index build --shard 0/2` without --on-disk: the build's own refusal, not a lock's "held by pid" and a
    RuntimeError from the waiting lock that took every error inside it for a held lock."""
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\nanother text here\nthird row\n", encoding="utf-8")
    proc = cli("index", "build", rows, "--encoder", pretrained_run, "--out", tmp_path / "ix", "--shard", "0/2")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "held by pid" not in proc.stderr, proc.stderr
    assert last.startswith("cramkit: error:") and "--on-disk" in last
