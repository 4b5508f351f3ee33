"""`cramkit embed --format parquet --shard i/N`, `--join`, `index build` from Parquet embeddings and the Ray
Data class `CramkitEmbedder`, through the real commands, on real text (ABC science news)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cramkit
from cramkit.cli import main

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
PART0, PART1 = "part-00000-of-00002.parquet", "part-00001-of-00002.parquet"


def fails(capsys, *args: str) -> str:
    """The CLI in-process must fail with one `cramkit: error:` line, exit 2, no traceback."""
    capsys.readouterr()
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("cramkit: error: ") and "Traceback" not in err and err.count("\n") == 1, err
    return err


def embed_cmd(src: Path, model: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cramkit",
        "embed",
        str(src),
        "--from",
        str(model),
        "--out",
        str(out),
        "--device",
        "cpu",
        *extra,
    ]


@pytest.fixture(scope="module")
def lines(tmp_path_factory, shared_data) -> Path:
    """240 real lines of ABC science news, one text per line."""
    text = (shared_data / "corpus" / "nltk-abc" / "science.txt").read_bytes()[:80000].decode("utf-8", "replace")
    rows = [" ".join(x.split()) for x in text.splitlines() if len(x.split()) > 6][:240]
    path = tmp_path_factory.mktemp("lines") / "science.txt"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def embedded(tmp_path_factory, lines, pretrained_run) -> dict[str, Path]:
    """The same rows embedded by `--shard 0/2` and `--shard 1/2` at once (two processes, one --out), and as .npy."""
    base = tmp_path_factory.mktemp("emb")
    out, npy = base / "parquet", base / "npy"
    procs = [
        subprocess.Popen(
            embed_cmd(lines, pretrained_run, out, "--format", "parquet", "--shard", f"{i}/2", "--block", "32"),
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
    assert said.count("embedded 240 rows x 64 dims in 2 Parquet parts") + said.count("parts still to come") == 2
    assert main(["embed", str(lines), "--from", str(pretrained_run), "--out", str(npy), "--device", "cpu"]) == 0
    return {"parquet": out, "npy": npy}


def test_shards_write_parquet_parts_and_a_manifest(embedded, lines, pretrained_run, capsys):
    out = embedded["parquet"]
    m = json.loads((out / "embed.json").read_text())
    assert m["format"] == "parquet" and m["rows"] == 240 and m["dim"] == 64 and m["shards"] == 2
    assert [p["file"] for p in m["parts"]] == [PART0, PART1] and [p["rows"] for p in m["parts"]] == [120, 120]
    for p in m["parts"]:
        data = (out / p["file"]).read_bytes()
        assert p["sha256"] == hashlib.sha256(data).hexdigest() and p["bytes"] == len(data)
    assert len(m["encoder"]["fingerprint"]) == 32 and m["encoder"]["source"] == str(pretrained_run)
    table = pq.read_table(out / PART1)
    assert table.column_names == ["id", "vector", "text", "doc", "source"]
    assert table.schema.field("vector").type == pa.list_(pa.float32(), 64)
    assert table.column("id").to_pylist() == list(range(120, 240)) == table.column("doc").to_pylist()
    rows = lines.read_text(encoding="utf-8").splitlines()
    assert table.column("text").to_pylist() == rows[120:]
    assert set(table.column("source").to_pylist()) == {str(lines)}
    # the vectors are those of the .npy output
    from cramkit.embeddings.parquet import read_vectors

    vecs, ids = read_vectors(out)
    assert np.array_equal(ids, np.arange(240))
    assert np.allclose(vecs, np.load(embedded["npy"] / "embeddings.npy", allow_pickle=False), atol=1e-6)
    # a finished embedding is not computed again; --join checks it and writes the same manifest
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.parquet")}
    assert (
        main(
            [
                "embed",
                str(lines),
                "--from",
                str(pretrained_run),
                "--out",
                str(out),
                "--format",
                "parquet",
                "--shard",
                "0/2",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert "already embedded: 240 rows" in capsys.readouterr().out
    assert main(["embed", "--join", str(out)]) == 0
    assert "joined 2 parts: 240 rows x 64 dims" in capsys.readouterr().out
    assert before == {p.name: p.stat().st_mtime_ns for p in out.glob("*.parquet")}


def _copy_without_part1(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for f in (dst / PART1, dst / "embed.json", dst / ".work" / "part-00001-of-00002.json"):
        f.unlink()
    return dst


@pytest.mark.integration
def test_killed_shard_resumes_and_leaves_the_others(tmp_path, embedded, lines, pretrained_run):
    out = _copy_without_part1(embedded["parquet"], tmp_path / "e")
    part0 = (out / PART0).stat()
    cmd = embed_cmd(lines, pretrained_run, out, "--format", "parquet", "--shard", "1/2", "--block", "4")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    progress = out / ".work" / "part-00001-of-00002" / "progress-0.json"
    deadline = time.time() + 120
    while time.time() < deadline:
        if progress.exists() and json.loads(progress.read_text() or "{}").get("committed", 0) > 0:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            break
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.01)
    else:
        proc.kill()
        pytest.fail("no progress committed in time")
    assert not (out / PART1).exists() and not (out / "embed.json").exists()  # killed: nothing claims to be done
    committed = json.loads(progress.read_text())["committed"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"resumed after {committed} committed rows" in res.stdout and "in 2 Parquet parts" in res.stdout
    after = (out / PART0).stat()
    assert (after.st_ino, after.st_mtime_ns) == (part0.st_ino, part0.st_mtime_ns)  # the other shard untouched
    assert not (out / ".work" / "part-00001-of-00002").exists()
    from cramkit.embeddings.parquet import read_vectors

    assert np.allclose(read_vectors(out)[0], read_vectors(embedded["parquet"])[0], atol=1e-6)


def test_faults_are_one_line(tmp_path, embedded, lines, pretrained_run, capsys):
    src = embedded["parquet"]
    # two processes claiming one shard: the second stops at once, the first's files untouched
    held = _copy_without_part1(src, tmp_path / "held")
    fd = os.open(held / ".work" / "part-00001-of-00002.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, b"4242\n", 0)
        err = fails(
            capsys,
            "embed",
            str(lines),
            "--from",
            str(pretrained_run),
            "--out",
            str(held),
            "--format",
            "parquet",
            "--shard",
            "1/2",
            "--device",
            "cpu",
        )
        assert f"part {PART1} of {held} (shard 1/2) is being embedded by another process (pid 4242" in err
    finally:
        os.close(fd)
    assert not (held / PART1).exists()
    # a shard missing at join
    err = fails(capsys, "embed", "--join", str(held))
    assert f"1 of 2 parts missing ({PART1})" in err and "--shard 1/2" in err
    # Parquet files of another encoder or another dimension in the folder: refused at join and by a shard
    table = pq.read_table(src / PART0)
    meta = json.loads(table.schema.metadata[b"cramkit"])
    for name, change, says in [
        ("other-encoder.parquet", {"encoder_fingerprint": "f" * 32}, "was embedded by another encoder"),
        ("other-dim.parquet", {"dim": 8}, "holds vectors of dimension 8, not 64"),
        ("plain.parquet", None, "is not a part written by `cramkit embed --format parquet`"),
    ]:
        d = tmp_path / name.split(".")[0]
        shutil.copytree(src, d)
        t = table.replace_schema_metadata({b"cramkit": json.dumps(meta | change).encode()} if change else None)
        pq.write_table(t, d / name)
        assert f"{d / name} {says}" in fails(capsys, "embed", "--join", str(d))
        (d / "embed.json").unlink()
        err = fails(
            capsys,
            "embed",
            str(lines),
            "--from",
            str(pretrained_run),
            "--out",
            str(d),
            "--format",
            "parquet",
            "--shard",
            "0/2",
            "--device",
            "cpu",
        )
        assert f"{d / name} {says}" in err
    # a different split in the same folder
    d = tmp_path / "split"
    shutil.copytree(src, d)
    (d / "embed.json").unlink()
    err = fails(
        capsys,
        "embed",
        str(lines),
        "--from",
        str(pretrained_run),
        "--out",
        str(d),
        "--format",
        "parquet",
        "--shard",
        "0/3",
        "--device",
        "cpu",
    )
    assert "belongs to a split into 2 parts, this one into 3" in err
    # bad --shard values, and flags that do not go together
    for bad in ("2/2", "x", "-1/2", "0/0", "1"):
        err = fails(
            capsys,
            "embed",
            str(lines),
            "--from",
            str(pretrained_run),
            "--out",
            str(tmp_path / "b"),
            "--format",
            "parquet",
            f"--shard={bad}",
        )
        assert err.startswith("cramkit: error: --shard")
    assert "--shard needs --format parquet" in fails(
        capsys, "embed", str(lines), "--from", str(pretrained_run), "--out", str(tmp_path / "b"), "--shard", "0/2"
    )
    assert "--join DIR takes no FILE_OR_STORE" in fails(capsys, "embed", str(lines), "--join", str(src))
    assert "no such directory" in fails(capsys, "embed", "--join", str(tmp_path / "nowhere"))
    assert not (tmp_path / "b").exists()


def test_index_build_from_parquet_embeddings(tmp_path, embedded, lines, pretrained_run, capsys):
    idx = tmp_path / "idx"
    assert (
        main(
            [
                "index",
                "build",
                str(embedded["parquet"]),
                "--encoder",
                str(pretrained_run),
                "--out",
                str(idx),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert "indexed 240 chunks" in capsys.readouterr().out
    index = cramkit.index.open(idx)
    rows = lines.read_text(encoding="utf-8").splitlines()
    hit = index.search([rows[17]], k=1)[0][0]
    assert hit["text"] == rows[17] and hit["doc"] == 17 and hit["source"] == str(lines)
    # a crafted manifest that names a part outside its folder is refused before anything is read
    crafted = tmp_path / "crafted"
    shutil.copytree(embedded["parquet"], crafted)
    shutil.copy(crafted / PART0, tmp_path / "outside.parquet")
    m = json.loads((crafted / "embed.json").read_text())
    m["parts"][0]["file"] = "../outside.parquet"
    (crafted / "embed.json").write_text(json.dumps(m))
    err = fails(
        capsys,
        "index",
        "build",
        str(crafted),
        "--encoder",
        str(pretrained_run),
        "--out",
        str(tmp_path / "idx2"),
        "--device",
        "cpu",
    )
    assert "names part '../outside.parquet', which is not a file inside" in err


@pytest.mark.integration
def test_cramkit_embedder_in_ray_data(embedded, lines, pretrained_run):
    """The class in a real local Ray instance (one CPU, one actor), pandas batches (numpy: called directly)."""
    pytest.importorskip("ray.data")
    import ray
    import ray.data

    from cramkit.embeddings import CramkitEmbedder

    rows = lines.read_text(encoding="utf-8").splitlines()[:48]
    want = np.load(embedded["npy"] / "embeddings.npy", allow_pickle=False)[:48]
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}},
    )
    try:
        ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(rows)])
        out = ds.map_batches(
            CramkitEmbedder,
            fn_constructor_kwargs={"model": str(pretrained_run), "device": "cpu", "threads": 1},
            batch_format="pandas",
            batch_size=16,
            compute=ray.data.ActorPoolStrategy(size=1),
        ).take_all()
        got = np.stack([r["vector"] for r in sorted(out, key=lambda r: r["id"])])
        assert got.dtype == np.float32 and np.allclose(got, want, atol=1e-5)
        assert [r["text"] for r in sorted(out, key=lambda r: r["id"])] == rows
    finally:
        ray.shutdown()


def test_cramkit_embedder_called_directly(pretrained_run):
    import pandas as pd

    from cramkit.embeddings import CramkitEmbedder
    from cramkit.errors import CramkitError

    emb = CramkitEmbedder(pretrained_run, device="cpu", text_column="body")
    df = emb(pd.DataFrame({"body": ["a socket timeout", "parse the arguments"], "n": [1, 2]}))
    assert list(df.columns) == ["body", "n", "vector"] and df["vector"][0].shape == (64,)
    d = emb({"body": np.array(["a socket timeout"])})
    assert d["vector"].shape == (1, 64) and np.allclose(d["vector"][0], df["vector"][0], atol=1e-6)
    with pytest.raises(CramkitError, match="no column 'body'"):
        emb({"text": np.array(["x"])})


@pytest.mark.slow
def test_torchrun_parquet_parts_equal_shards(tmp_path, embedded, lines, pretrained_run):
    """Two torchrun processes write the same two parts as --shard 0/2 and --shard 1/2."""
    out = tmp_path / "tr"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "-m",
        "cramkit",
        "embed",
        str(lines),
        "--from",
        str(pretrained_run),
        "--out",
        str(out),
        "--format",
        "parquet",
        "--device",
        "cpu",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    m = json.loads((out / "embed.json").read_text())
    assert m["world_size"] == 2 and [p["file"] for p in m["parts"]] == [PART0, PART1]
    from cramkit.embeddings.parquet import read_vectors

    assert np.allclose(read_vectors(out)[0], read_vectors(embedded["parquet"])[0], atol=1e-6)
