"""`cramkit data build --shard i/N` + `cramkit data join`: N processes tokenise disjoint files of the real
web-text corpus into one sharded store, equal to a build by one process; bad joins are one line, exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cramkit.cli import main
from cramkit.data.build import build_store
from cramkit.data.tokenstore import TokenStore

pytestmark = pytest.mark.integration  # two `cramkit data build` processes at once

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def fails(capsys, *args: str) -> str:
    capsys.readouterr()
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("cramkit: error: ") and "Traceback" not in err and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def shards(tmp_path_factory, webtext_dir, minilm_dir) -> Path:
    """Two shards of the six web-text files built by two concurrent `cramkit data build` processes."""
    out = tmp_path_factory.mktemp("sharded") / "store"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cramkit",
                "data",
                "build",
                str(webtext_dir),
                "--tokenizer",
                str(minilm_dir),
                "--out",
                str(out),
                "--shard",
                f"{i}/2",
                "--workers",
                "1",
                "--encoding",
                "auto",
                "--quiet",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for i in range(2)
    ]
    for i, p in enumerate(procs):
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        assert f"shard {i}/2 done" in stdout
    return out


def test_joined_shards_equal_one_build(tmp_path, shards, webtext_dir, minilm_dir, capsys):
    res = subprocess.run(
        [sys.executable, "-m", "cramkit", "data", "join", str(shards)], capture_output=True, text=True, env=ENV
    )
    assert res.returncode == 0, res.stderr
    assert "joined 2 shards" in res.stdout
    joined = TokenStore(shards)
    assert joined.meta["joined_from"] == ["train-00000", "train-00001"]
    files = [json.loads((shards / f"train-0000{i}.json").read_text())["shard"]["files"] for i in range(2)]
    assert [len(f) for f in files] == [3, 3] and sorted(sum(files, [])) == sorted(joined.meta["sources"])
    whole = TokenStore(build_store([str(webtext_dir)], str(minilm_dir), tmp_path / "whole", workers=1, encoding="auto"))
    assert len(joined) == len(whole) and joined.num_tokens == whole.num_tokens
    assert np.array_equal(joined.sizes, whole.sizes) and np.array_equal(joined.tokens[:], whole.tokens[:])
    assert np.array_equal(joined.doc_idx, whole.doc_idx)
    # the manifest's checksums are those of the shards' files; a second join changes nothing
    for name, digest in joined.meta["checksums"].items():
        import hashlib

        assert digest == "sha256:" + hashlib.sha256((shards / name).read_bytes()).hexdigest()
    assert main(["data", "join", str(shards)]) == 0
    # a shard built already is not built again
    assert (
        main(
            [
                "data",
                "build",
                str(webtext_dir),
                "--tokenizer",
                str(minilm_dir),
                "--out",
                str(shards),
                "--shard",
                "1/2",
                "--encoding",
                "auto",
            ]
        )
        == 0
    )
    assert "shard 1/2 is already built" in capsys.readouterr().out


def test_bad_joins(tmp_path, shards, webtext_dir, minilm_dir, capsys):
    def copy(name: str) -> Path:
        d = tmp_path / name
        shutil.copytree(shards, d)
        for f in d.glob("train.*"):
            f.unlink()
        return d

    missing = copy("missing")
    for f in missing.glob("train-00001*"):
        f.unlink()
    err = fails(capsys, "data", "join", str(missing))
    assert "1 of 2 shards of train missing (train-00001.json" in err and "--shard 1/2" in err
    assert not (missing / "train.json").exists()

    other_split = copy("split")
    meta = json.loads((other_split / "train-00001.json").read_text())
    meta["shard"]["count"] = 4
    (other_split / "train-00001.json").write_text(json.dumps(meta))
    assert "is shard 1/4" in fails(capsys, "data", "join", str(other_split))

    dup = copy("dup")
    m0 = json.loads((dup / "train-00000.json").read_text())
    m1 = json.loads((dup / "train-00001.json").read_text())
    m1["shard"]["files"] = m0["shard"]["files"][:1] + m1["shard"]["files"]
    (dup / "train-00001.json").write_text(json.dumps(m1))
    assert "was tokenised by shards 0/2 and 1/2" in fails(capsys, "data", "join", str(dup))

    foreign = copy("foreign")
    meta = json.loads((foreign / "train-00001.json").read_text())
    meta["tokenizer_hash"] = "0" * 32
    (foreign / "train-00001.json").write_text(json.dumps(meta))
    assert "train-00001.json was built with another tokenizer" in fails(capsys, "data", "join", str(foreign))

    outside = copy("outside")  # a shard's manifest that names a file outside the folder: refused, nothing opened
    meta = json.loads((outside / "train-00001.json").read_text())
    meta["shards"] = ["../../etc/passwd"]
    (outside / "train-00001.json").write_text(json.dumps(meta))
    assert "not a plain file name" in fails(capsys, "data", "join", str(outside))
    assert not (outside / "train.json").exists()

    for bad in ("2/2", "x", "1/0"):
        err = fails(
            capsys,
            "data",
            "build",
            str(webtext_dir),
            "--tokenizer",
            str(minilm_dir),
            "--out",
            str(tmp_path / "b"),
            "--shard",
            bad,
        )
        assert "--shard" in err
    err = fails(
        capsys,
        "data",
        "build",
        str(webtext_dir),
        "--tokenizer",
        str(minilm_dir),
        "--out",
        str(tmp_path / "b"),
        "--shard",
        "0/7",
    )
    assert "6 file(s), fewer than the 7 shards" in err
    assert "no such directory" in fails(capsys, "data", "join", str(tmp_path / "nowhere"))
