"""A folder is a command's own only by its manifest (issue 66, case 1): `embed`, `index neighbours`, `finetune`
and a new pretraining run never write over a user's file that merely bears one of their names (``state.json``,
``ids.npy``, ``neighbours.json``, ``chunks.npy``, ``results.json``, ``metrics.jsonl``), flag or not; their own
earlier output is still resumed or replaced. And `embed --join` that refuses leaves nothing written (case 3)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from clirun import cli, ok, one_line


def _plant(out: Path, files: dict[str, bytes]) -> dict[Path, bytes]:
    out.mkdir(parents=True, exist_ok=True)
    planted = {out / name: data for name, data in files.items()}
    for path, data in planted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return planted


def _unchanged(planted: dict[Path, bytes]) -> None:
    for path, data in planted.items():
        assert path.read_bytes() == data, f"{path} was changed"


def _rows(tmp_path: Path) -> Path:
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\nanother text here\na third row\n", encoding="utf-8")
    return rows


@pytest.mark.parametrize(
    "name, data",
    [
        ("state.json", b'{"mine": "a user\'s state"}\n'),
        ("ids.npy", b"my ids, not numpy\n"),
        ("embeddings.npy", b"my vectors\n"),
        ("embed.json", b'{"note": "my own embed.json"}\n'),
        ("progress-0.json", b'{"committed": 2}\n'),
    ],
)
@pytest.mark.parametrize("flag", [[], ["--overwrite"]])
def test_embed_never_writes_over_a_users_file(pretrained_run, tmp_path, name, data, flag) -> None:
    out = tmp_path / "mine"
    planted = _plant(out, {name: data, "notes.md": b"my notes\n"})
    line = one_line(cli("embed", _rows(tmp_path), "--from", pretrained_run, "--out", out, *flag), str(out), name)
    assert "choose another --out" in line.lower()
    _unchanged(planted)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in planted)


def test_embed_parquet_overwrite_never_removes_a_users_part(pretrained_run, tmp_path) -> None:
    """A file named like a part but without cramkit's metadata is the user's: --overwrite keeps it."""
    import pyarrow as pa

    out = tmp_path / "mine"
    out.mkdir()
    part = out / "part-00000-of-00001.parquet"
    pq.write_table(pa.table({"text": ["a user's own table"]}), part)
    before = part.read_bytes()
    for flag in ([], ["--overwrite"]):
        proc = cli("embed", _rows(tmp_path), "--from", pretrained_run, "--out", out, "--format", "parquet", *flag)
        one_line(proc, str(part))
        assert part.read_bytes() == before


def test_embed_resumes_and_replaces_its_own_output(pretrained_run, tmp_path) -> None:
    rows, out = _rows(tmp_path), tmp_path / "emb"
    ok("embed", rows, "--from", pretrained_run, "--out", out)
    first = np.load(out / "embeddings.npy")
    # killed after its state was recorded, before the vectors: the rerun takes the folder for its own
    (out / "embed.json").unlink()
    (out / "embeddings.npy").unlink()
    ok("embed", rows, "--from", pretrained_run, "--out", out)
    assert np.allclose(np.load(out / "embeddings.npy"), first)
    other = tmp_path / "other.txt"
    other.write_text("one more text\nand another\n", encoding="utf-8")
    one_line(cli("embed", other, "--from", pretrained_run, "--out", out), "--overwrite")
    ok("embed", other, "--from", pretrained_run, "--out", out, "--overwrite")
    assert np.load(out / "embeddings.npy").shape[0] == 2


def test_embed_join_that_refuses_writes_nothing(pretrained_run, tmp_path) -> None:
    """Two parts whose metadata disagree (another pooling in one): --join refuses, and writes no embed.json."""
    rows, out = _rows(tmp_path), tmp_path / "parts"
    for shard in ("0/2", "1/2"):
        ok("embed", rows, "--from", pretrained_run, "--out", out, "--format", "parquet", "--shard", shard)
    (out / "embed.json").unlink()
    part = out / "part-00001-of-00002.parquet"
    table = pq.read_table(part)
    meta = json.loads(table.schema.metadata[b"cramkit"])
    pq.write_table(table.replace_schema_metadata({b"cramkit": json.dumps(meta | {"pooling": "cls"}).encode()}), part)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".lock"}
    one_line(cli("embed", "--join", out), str(part), "pooling")
    assert not (out / "embed.json").exists()
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".lock"} == before


def test_finetune_never_writes_over_a_users_results(pretrained_run, tmp_path) -> None:
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\n" + "".join(f"text number {i}\t{i % 2}\n" for i in range(24)), "utf-8")
    args = ("finetune", "--train", train, "--text-a", "sentence", "--from", pretrained_run, "--no-progress")
    args += ("--set", "epochs=1", "--set", "min_steps=0")
    for name in ("results.json", "metrics.jsonl", "finetune.json"):
        out = tmp_path / f"mine-{name}"
        planted = _plant(out, {name: b'{"my": "own results"}\n'})
        one_line(cli(*args, "--out", out), str(out / name))
        _unchanged(planted)
        assert [p.name for p in out.iterdir()] == [name]


def test_a_new_run_never_writes_over_a_users_metrics(tmp_path) -> None:
    """`pretrain --out DIR`'s folder rule (cramkit.rundir.check_new_run): a user's metrics.jsonl or config.yaml is
    refused; a folder of other files, and a run of cramkit's without checkpoints, are taken."""
    from cramkit.errors import CramkitError
    from cramkit.rundir import check_new_run

    for name in ("metrics.jsonl", "config.yaml", "run.json"):
        out = tmp_path / f"mine-{name}"
        planted = _plant(out, {name: b'{"step": 1, "loss": 2.0}\n'})
        with pytest.raises(CramkitError, match=rf"(?i)holds .*{re.escape(name)}.* choose another --out"):
            check_new_run(out)
        # through the command: refused before anything is read or trained
        line = one_line(cli("pretrain", "--out", out, "--budget", "1steps"), str(out))
        assert "choose another --out" in line.lower()
        _unchanged(planted)
        assert [p.name for p in out.iterdir()] == [name]
    _plant(tmp_path / "notes", {"notes.md": b"mine\n"})
    check_new_run(tmp_path / "notes")
    run = tmp_path / "failed-run"
    _plant(run, {"run.json": b'{"inputs": [], "store": "s", "tokenizer": "tokenizer"}', "metrics.jsonl": b""})
    check_new_run(run)


# ------------------------------------------------------------------------------------------ RETRO neighbours


@pytest.fixture(scope="module")
def retro(tmp_path_factory, builtin_docs, tok_dir, pretrained_run) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("retro-own")
    src = d / "docs.txt"
    src.write_text("\n\n".join(x.replace("\n\n", "\n") for x in builtin_docs[500:540]), encoding="utf-8")
    ok("data", "build", src, "--tokenizer", tok_dir, "--out", d / "store", "--quiet")
    idx = d / "idx"
    ok("index", "build", d / "store", "--encoder", pretrained_run, "--mode", "retro", "--out", idx, "--device", "cpu")
    return {"store": d / "store", "index": idx}


@pytest.mark.parametrize(
    "name, data",
    [
        ("neighbours.json", b'{"my": "neighbours"}\n'),
        ("chunks.npy", b"my chunks\n"),
        ("neighbours.npy", b"mine\n"),
        (".neighbours.progress.json", b"[1, 2]\n"),
    ],
)
def test_neighbours_never_write_over_a_users_file(retro, tmp_path, name, data) -> None:
    out = tmp_path / "mine"
    planted = _plant(out, {name: data})
    proc = cli("index", "neighbours", retro["index"], "--store", retro["store"], "--out", out, "-k", "2")
    one_line(proc, str(out / name))
    _unchanged(planted)
    assert [p.name for p in out.iterdir()] == [name]


def test_neighbours_rerun_replaces_their_own_output(retro, tmp_path) -> None:
    out = tmp_path / "nb"
    args = ("index", "neighbours", retro["index"], "--store", retro["store"], "--out", out, "-k", "2")
    ok(*args)
    first = np.load(out / "neighbours.npy")
    (out / "notes.md").write_text("mine\n")
    ok(*args)
    assert np.array_equal(np.load(out / "neighbours.npy"), first) and (out / "notes.md").read_text() == "mine\n"
