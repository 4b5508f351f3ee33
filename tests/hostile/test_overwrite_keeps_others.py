"""`cramkit embed --overwrite` replaces only what `cramkit embed` wrote (issue 50, case 1): the input file, a
model directory, a user's notes and a Parquet file of their own in --out outlive it, .npy or Parquet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from clirun import cli, one_line


def _others(out: Path) -> dict[Path, bytes]:
    """A user's own things in --out: the input, notes, a folder holding a model, a Parquet table."""
    (out / "model").mkdir(parents=True)
    files = {
        out / "rows.txt": b"a fine film\nanother text here\na third row\n",
        out / "notes.md": b"my notes\n",
        out / "model" / "config.json": b"{}\n",
    }
    for path, data in files.items():
        path.write_bytes(data)
    return files


def test_overwrite_replaces_only_what_embed_wrote(pretrained_run: Path, tok_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    files = _others(out)
    rows = out / "rows.txt"
    assert cli("embed", rows, "--from", pretrained_run, "--out", out).returncode == 0
    first = np.load(out / "embeddings.npy")
    other = tmp_path / "other.txt"  # other inputs: finished embeddings of rows.txt are in the way
    other.write_text("one more text\nand another\n", encoding="utf-8")
    one_line(cli("embed", other, "--from", pretrained_run, "--out", out), "--overwrite")
    proc = cli("embed", other, "--from", pretrained_run, "--out", out, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert np.load(out / "embeddings.npy").shape[0] == 2 and first.shape[0] == 3
    for path, data in files.items():
        assert path.read_bytes() == data, f"{path} was removed or changed by --overwrite"


def test_parquet_overwrite_never_removes_a_users_table(pretrained_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    files = _others(out)
    mine = out / "mine.parquet"
    pq.write_table(pa.table({"text": ["a user's own table"]}), mine)
    proc = cli("embed", out / "rows.txt", "--from", pretrained_run, "--out", out, "--format", "parquet", "--overwrite")
    line = one_line(proc, str(mine), "--overwrite replaces only what cramkit embed wrote")
    assert "Traceback" not in line and mine.is_file()
    for path, data in files.items():
        assert path.read_bytes() == data


def test_index_build_overwrite_removes_only_the_index_it_replaces(pretrained_run: Path, tmp_path: Path) -> None:
    """`index build --overwrite` swaps in the new index and removes the data folder the old manifest named, never
    a user's folder that happens to be called data-something (it removed every data-* folder before)."""
    import json

    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(f"document number {i} about films and books" for i in range(40)) + "\n", "utf-8")
    out = tmp_path / "index"
    assert cli("index", "build", docs, "--encoder", pretrained_run, "--out", out).returncode == 0
    first = json.loads((out / "index.json").read_text())["data"]
    (out / "data-2024").mkdir()
    (out / "data-2024" / "mine.txt").write_text("a user's own data\n")
    proc = cli("index", "build", docs, "--encoder", pretrained_run, "--out", out, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    now = json.loads((out / "index.json").read_text())["data"]
    assert now != first and (out / now).is_dir() and not (out / first).exists()
    assert (out / "data-2024" / "mine.txt").read_text() == "a user's own data\n"
    hits = cli("index", "query", out, "films and books", "-k", "3")
    assert hits.returncode == 0 and "document number" in hits.stdout
