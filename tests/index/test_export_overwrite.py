"""`cramkit index export` onto what is already there (issue 50, case 15): `--overwrite` replaces only an earlier
export of its own (a Parquet file or part files with cramkit's metadata, a LanceDB table with it, a Milvus
collection of its fields), never a user's Parquet, table or collection, never the current directory; Milvus Lite onto a
file that is not a database is one line of cramkit's, not the library's logged traceback before it, and the
file is kept."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clirun import cli, cli_process, one_line

from .test_index import write_docs


@pytest.fixture(scope="module")
def small_index(tmp_path_factory, builtin_docs, pretrained_run) -> Path:
    d = tmp_path_factory.mktemp("export-overwrite")
    corpus = write_docs(d / "docs.txt", builtin_docs[300:320])
    out = d / "idx"
    args = ("--chunk-tokens", "48", "--device", "cpu")
    proc = cli("index", "build", corpus, "--encoder", pretrained_run, "--out", out, *args)
    assert proc.returncode == 0, proc.stderr
    return out


def _export(index: Path, *args: object, cwd: Path | None = None):
    return cli("index", "export", index, "--to", "parquet", *args, cwd=cwd)


def test_parquet_overwrite_in_the_current_directory_is_one_line(small_index: Path, tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), here / "a.parquet")  # a folder of only Parquet files
    for uri in (".", "./", str(here), ".."):
        one_line(_export(small_index, "--uri", uri, "--overwrite", cwd=here), "current directory")
    assert pq.read_table(here / "a.parquet").num_rows == 2


def test_parquet_overwrite_replaces_only_an_earlier_export(small_index: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.parquet"  # a user's own table, not an export
    pq.write_table(pa.table({"x": [1, 2, 3]}), mine)
    one_line(_export(small_index, "--uri", mine, "--overwrite"), str(mine), "did not write", "is kept")
    assert pq.read_table(mine).num_rows == 3
    folder = tmp_path / "parts"
    assert _export(small_index, "--uri", folder).returncode == 0
    assert _export(small_index, "--uri", folder, "--overwrite").returncode == 0  # its own parts: replaced
    pq.write_table(pa.table({"x": [1]}), folder / "notes.parquet")
    one_line(_export(small_index, "--uri", folder, "--overwrite"), "notes.parquet", "did not write")
    (folder / "notes.parquet").unlink()
    (folder / "part-00007.parquet").write_bytes(b"\0" * 64)  # a part's name, not a part of an export
    one_line(_export(small_index, "--uri", folder, "--overwrite"), "part-00007.parquet", "did not write")
    assert (folder / "part-00007.parquet").read_bytes() == b"\0" * 64 and (folder / "part-00000.parquet").is_file()
    single = tmp_path / "rows.parquet"
    assert _export(small_index, "--uri", single).returncode == 0
    assert _export(small_index, "--uri", single, "--overwrite").returncode == 0
    assert pq.read_table(single).num_rows == pq.read_table(folder / "part-00000.parquet").num_rows


@pytest.mark.integration  # Milvus Lite only in processes of its own (tests/index/milvus_child.py says why)
def test_milvus_lite_onto_a_file_that_is_not_a_database(small_index: Path, tmp_path: Path) -> None:
    pytest.importorskip("milvus_lite")
    bad = tmp_path / "notes.db"
    bad.write_bytes(b"not a database\n")
    proc = cli_process("index", "export", small_index, "--to", "milvus", "--uri", bad)
    # what Milvus Lite and pymilvus log (a 13-line traceback on a terminal) is kept from it: one line of cramkit's
    line = one_line(proc, str(bad), "Milvus Lite cannot open it", "is kept")
    assert "File exists" in line and not proc.stdout.strip()
    assert bad.read_bytes() == b"not a database\n"


def test_lancedb_overwrite_replaces_only_an_earlier_export(small_index: Path, tmp_path: Path) -> None:
    """A user's own LanceDB table of the name given is never replaced by --overwrite."""
    lancedb = pytest.importorskip("lancedb")
    lance = tmp_path / "lance"
    lancedb.connect(str(lance)).create_table("mine", data=pa.table({"x": [1, 2, 3]}))
    args = ("index", "export", small_index, "--to", "lancedb", "--uri", lance, "--name")
    one_line(cli(*args, "mine", "--overwrite"), "'mine'", "not an export", "is kept")
    assert lancedb.connect(str(lance)).open_table("mine").count_rows() == 3
    assert cli(*args, "ours").returncode == 0 and cli(*args, "ours", "--overwrite").returncode == 0


@pytest.mark.integration  # Milvus Lite only in processes of its own (tests/index/milvus_child.py says why)
def test_milvus_overwrite_replaces_only_an_earlier_export(small_index: Path, tmp_path: Path) -> None:
    """A user's own Milvus collection of the name given is never replaced by --overwrite."""
    pytest.importorskip("milvus_lite")
    from .milvus_child import milvus

    db = tmp_path / "m.db"
    milvus(db, 'client.create_collection("mine", dimension=4)')
    args = ("index", "export", small_index, "--to", "milvus", "--uri", db, "--name")
    one_line(cli_process(*args, "mine", "--overwrite"), "'mine'", "not an export", "is kept")
    assert "mine" in milvus(db, "out = client.list_collections()")
    assert cli_process(*args, "ours").returncode == 0 and cli_process(*args, "ours", "--overwrite").returncode == 0
    assert sorted(milvus(db, "out = client.list_collections()")) == ["mine", "ours"]
