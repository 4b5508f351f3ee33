"""`cramkit index export` into the real engines that install here: Parquet (pyarrow), LanceDB (embedded) and
Milvus Lite (pymilvus' in-process Milvus, reached through the same gRPC client as a Milvus server). A real
index of real text (standard-library docstrings) embedded by the real all-MiniLM-L6-v2; each target is
queried with the same query vectors and its top 10 compared with cramkit's own (exact) search."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cramkit
from cramkit.cli import main
from cramkit.errors import CramkitError
from cramkit.index import export

from .test_index import cli, fails, write_docs

QUERIES = [
    "Return a new list of the items.",
    "socket connection timeout",
    "parse the command line arguments",
    "read a file line by line",
    "compare two strings ignoring case",
    "the current date and time",
    "raise an exception when the key is missing",
    "encode bytes as base64",
]


@pytest.fixture(scope="module")
def minilm_index(tmp_path_factory, builtin_docs, minilm_dir) -> Path:
    """An exact (flat) index of 12 real documents, embedded with all-MiniLM-L6-v2 through the real CLI."""
    d = tmp_path_factory.mktemp("export")
    corpus = write_docs(d / "docs.txt", builtin_docs[300:312])
    out = d / "docs_idx"
    res = cli("index", "build", str(corpus), "--encoder", f"hf:{minilm_dir}", "--out", str(out), "--device", "cpu")
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def truth(minilm_index) -> tuple[np.ndarray, np.ndarray]:
    """(query vectors, cramkit's top-10 chunk ids) - the search `cramkit index query` runs."""
    idx = cramkit.index.open(minilm_index)
    q = idx.embed(QUERIES)
    hits = idx.search(QUERIES, k=10)
    ids = np.asarray([[h["chunk"] for h in row] for row in hits])
    _, exact = idx.search_vectors(q, 10)
    assert np.array_equal(ids, exact)  # a flat index: its search is the exact search
    return q, ids


def agreement(got: list[list[int]], want: np.ndarray) -> float:
    return float(np.mean([len(set(g) & set(w.tolist())) / len(w) for g, w in zip(got, want, strict=True)]))


def test_parquet(tmp_path, minilm_index, truth, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / "chunks.parquet"
    res = cli("index", "export", str(minilm_index), "--to", "parquet", "--uri", str(out))
    assert res.returncode == 0, res.stderr
    assert "exported" in res.stdout and "vectors/s" in res.stdout
    idx = cramkit.index.open(minilm_index)
    t = pq.read_table(out)
    assert t.schema.names == ["id", "vector", "text", "doc", "source"]  # the embedding shards' schema
    assert t.schema.field("vector").type == pa.list_(pa.float32(), 384)
    assert t.schema.field("id").type == pa.int64() and t.schema.field("doc").type == pa.int64()
    meta = json.loads(t.schema.metadata[b"cramkit"])
    assert meta["metric"] == "ip" and meta["normalized"] and meta["dim"] == 384
    assert t.num_rows == len(idx) and t.column("id").to_pylist() == list(range(len(idx)))
    vec = t.column("vector").combine_chunks().flatten().to_numpy().reshape(-1, 384)
    assert np.array_equal(vec, np.asarray(idx.vectors))
    rows = t.to_pylist()
    for i in (0, len(idx) // 2, len(idx) - 1):
        hit = idx.hit(i, 0.0)
        assert (rows[i]["text"], rows[i]["doc"], rows[i]["source"]) == (hit["text"], hit["doc"], hit["source"])
    q, want = truth
    got = np.argsort(-(q @ vec.T), axis=1, kind="stable")[:, :10]  # what a reader of the file computes
    assert agreement(t.column("id").to_numpy()[got].tolist(), want) == 1.0
    # a directory of part files; an existing target is refused unless --overwrite
    parts = tmp_path / "parts"
    assert main(["index", "export", str(minilm_index), "--to", "parquet", "--uri", str(parts)]) == 0
    assert [p.name for p in parts.iterdir()] == ["part-00000.parquet"]
    assert pq.read_table(parts).num_rows == len(idx)
    err = fails(capsys, "index", "export", str(minilm_index), "--to", "parquet", "--uri", str(out))
    assert "exists" in err and "--overwrite" in err
    before = out.stat().st_mtime_ns
    assert main(["index", "export", str(minilm_index), "--to", "parquet", "--uri", str(out), "--overwrite"]) == 0
    assert out.stat().st_mtime_ns != before and pq.read_table(out).num_rows == len(idx)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_lancedb(tmp_path, minilm_index, truth, capsys, monkeypatch):
    lancedb = pytest.importorskip("lancedb")
    uri = tmp_path / "lance"
    res = cli("index", "export", str(minilm_index), "--to", "lancedb", "--uri", str(uri))
    assert res.returncode == 0, res.stderr
    assert "'docs_idx'" in res.stdout  # the default name: the index directory's
    table = lancedb.connect(str(uri)).open_table("docs_idx")
    assert table.count_rows() == len(cramkit.index.open(minilm_index))
    assert json.loads(table.schema.metadata[b"cramkit"])["metric"] == "ip"
    q, want = truth
    got = [
        table.search(v, vector_column_name="vector").distance_type("dot").limit(10).to_arrow()["id"].to_pylist()
        for v in q
    ]
    assert agreement(got, want) >= 0.9
    err = fails(capsys, "index", "export", str(minilm_index), "--to", "lancedb", "--uri", str(uri))
    assert "exists" in err and "--overwrite" in err
    # an export that fails half-way (the index's text unreadable at the third batch) commits nothing:
    # no table to open, and the next export drops the files it wrote
    real = export.iter_batches

    def failing(idx, rows, *args):
        for i, batch in enumerate(real(idx, rows, *args)):
            if i == 2:
                raise CramkitError(f"{idx.path}: texts.bin is damaged")
            yield batch

    monkeypatch.setattr(export, "iter_batches", failing)
    args = ["index", "export", str(minilm_index), "--to", "lancedb", "--uri", str(uri), "--name", "half"]
    err = fails(capsys, *args, "--batch-rows", "5")
    assert "texts.bin is damaged" in err and "nothing was committed" in err
    with pytest.raises(ValueError):
        lancedb.connect(str(uri)).open_table("half")
    monkeypatch.setattr(export, "iter_batches", real)
    assert main(args) == 0
    assert "interrupted export" in capsys.readouterr().err
    assert lancedb.connect(str(uri)).open_table("half").count_rows() == table.count_rows()
    v1 = table.version
    args = ["index", "export", str(minilm_index), "--to", "lancedb", "--uri", str(uri), "--overwrite"]
    assert main(args) == 0
    table = lancedb.connect(str(uri)).open_table("docs_idx")
    assert table.version > v1 and table.count_rows() == len(cramkit.index.open(minilm_index))


@pytest.mark.integration  # Milvus Lite only in processes of its own (tests/index/milvus_child.py says why)
def test_milvus_lite(tmp_path, minilm_index, truth):
    pytest.importorskip("milvus_lite")
    from clirun import cli_process

    from .milvus_child import milvus

    db = tmp_path / "vectors.db"
    to = ("index", "export", minilm_index, "--to", "milvus", "--uri", db, "--name")
    res = cli_process(*to, "flat")
    assert res.returncode == 0, res.stderr
    res = cli_process(*to, "graph", "--db-index", "hnsw")
    assert res.returncode == 0, res.stderr
    q, want = truth
    np.save(tmp_path / "q.npy", np.asarray(q, dtype=np.float32))
    seen = milvus(
        db,
        """
q = np.load(sys.argv[2])
out = {"collections": sorted(client.list_collections()),
       "metric": client.describe_index("flat", "vector")["metric_type"],
       "graph": client.describe_index("graph", "vector")["index_type"], "rows": {}, "hits": {}}
for name in ("flat", "graph"):
    client.load_collection(name)  # Milvus Lite keeps no load state across processes
    out["rows"][name] = int(client.get_collection_stats(name)["row_count"])
    res = client.search(name, data=[v.tolist() for v in q], limit=10, search_params={"metric_type": "IP"})
    out["hits"][name] = [[h["id"] for h in row] for row in res]
row = client.query("flat", filter="id == 0", output_fields=["text", "doc", "source"])[0]
out["row"] = [row["text"], row["doc"], row["source"]]
""",
        tmp_path / "q.npy",
    )
    n = len(cramkit.index.open(minilm_index))
    assert seen["collections"] == ["flat", "graph"] and seen["metric"] == "IP" and seen["graph"] == "HNSW"
    for name in ("flat", "graph"):
        assert seen["rows"][name] == n
        assert agreement(seen["hits"][name], want) >= 0.9, name
    hit = cramkit.index.open(minilm_index).hit(0, 0.0)
    assert seen["row"] == [hit["text"], hit["doc"], hit["source"]]
    # what a killed export leaves (the partial collection) is dropped by the next one; the target is
    # refused while it exists, replaced with --overwrite
    milvus(db, 'client.create_collection("flat__cramkit_partial", dimension=4)')
    args = ["index", "export", minilm_index, "--to", "milvus", "--uri", db, "--name", "flat"]
    res = cli_process(*args)
    err = res.stderr.strip()
    assert res.returncode == 2 and "exists" in err and "--overwrite" in err and err.count("\n") == 0, err
    res = cli_process(*args, "--overwrite")
    assert res.returncode == 0 and "interrupted export" in res.stderr, res.stderr
    after = milvus(
        db,
        'client.load_collection("flat")\n'
        'out = [sorted(client.list_collections()), int(client.get_collection_stats("flat")["row_count"])]',
    )
    assert after == [["flat", "graph"], n]


@pytest.mark.integration  # pymilvus and Milvus Lite only in processes of their own (tests/index/milvus_child.py)
def test_milvus_faults(tmp_path, minilm_index):
    from clirun import cli_process, one_line

    idx = str(minilm_index)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    to = ("index", "export", idx, "--to", "milvus", "--uri")
    one_line(cli_process(*to, f"http://127.0.0.1:{port}"), "cannot connect to Milvus", "start Milvus")
    one_line(cli_process(*to, tmp_path / "x.db", "--name", "1x"), "--name")
    one_line(cli_process(*to, "milvus.example"), "http://HOST:19530")
    # Milvus Lite not installed (blocked in that process): the line names what to install, nothing is written
    code = "import sys; sys.modules['milvus_lite'] = None; from cramkit.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, *map(str, to), str(tmp_path / "m.db")]
    proc = subprocess.run(argv, capture_output=True, text=True)
    line = one_line(proc, "milvus_lite, which is not installed: pip install")
    assert line and not (tmp_path / "m.db").exists()


def test_faults(tmp_path, minilm_index, capsys, monkeypatch):
    idx = str(minilm_index)
    err = fails(capsys, "index", "export", idx, "--to", "qdrant", "--uri", str(tmp_path / "q"))
    assert "parquet, lancedb, milvus" in err
    err = fails(capsys, "index", "export", idx, "--to", "lancedb", "--uri", str(tmp_path / "l"), "--db-index", "ivf")
    assert "auto, flat, hnsw" in err
    err = fails(capsys, "index", "export", str(tmp_path / "none"), "--to", "parquet", "--uri", str(tmp_path / "p"))
    assert "no such index" in err
    err = fails(capsys, "index", "export", idx, "--to", "parquet", "--uri", str(minilm_index / "in.parquet"))
    assert "inside the index" in err
    # a package that is not installed: the line names what to install
    for module, to, uri in (  # (the modules blocked: pymilvus is never imported in this process)
        ("lancedb", "lancedb", "l"),
        ("pymilvus", "milvus", "m.db"),
    ):
        with monkeypatch.context() as m:
            m.setitem(sys.modules, module, None)
            err = fails(capsys, "index", "export", idx, "--to", to, "--uri", str(tmp_path / uri))
        assert f"{module}, which is not installed: pip install" in err, err
    assert not (tmp_path / "l").exists() and not (tmp_path / "m.db").exists()
