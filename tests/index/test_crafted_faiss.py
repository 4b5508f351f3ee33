"""Crafted Faiss files in an index directory (issue 50, case 4): list offsets and sizes past the list file, a
quantizer with more centroids than lists, HNSW links and levels, ids past the vectors. Each was a SIGSEGV in
`cramkit index query` (or an IndexError traceback); each is now one line naming the file, before Faiss reads
a byte of it. Indexes are built by the real command, then their bytes crafted with Faiss itself."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from clirun import cli, cli_process, one_line


@pytest.fixture(scope="module")
def built(tmp_path_factory, pretrained_run) -> dict[str, Path]:
    """1325 chunks of text indexed on disk (IVF, lists in lists.ivfdata) and as an HNSW graph."""
    base = tmp_path_factory.mktemp("crafted-faiss")
    docs = base / "docs.txt"
    docs.write_text("\n".join(f"line {i} about topic {i % 7} and more words" for i in range(2000)) + "\n")
    out = {}
    for name, extra in (("disk", ("--on-disk",)), ("hnsw", ("--kind", "hnsw"))):
        out[name] = base / name
        res = cli("index", "build", docs, "--encoder", pretrained_run, "--out", out[name], "--device", "cpu",
                  "--chunk-tokens", "16", "--overlap", "0", *extra)  # fmt: skip
        assert res.returncode == 0, res.stderr
    return out


def _data(idx: Path) -> Path:
    return idx / json.loads((idx / "index.json").read_text())["data"]


def _lists_table(il) -> np.ndarray:
    """The on-disk lists' (size, capacity, offset) rows, a writable view into Faiss's memory."""
    import faiss

    n = il.lists.size()
    return faiss.rev_swig_ptr(faiss.cast_integer_to_idx_t_ptr(int(il.lists.data().this)), 3 * n).reshape(n, 3)


def _craft(src: Path, dst: Path, change: Callable[[object], None]) -> Path:
    """A copy of the index ``src`` whose faiss.index is read, changed by ``change`` and written back (its size
    recorded in the manifest, as a crafter would)."""
    import faiss

    shutil.copytree(src, dst)
    f = _data(dst) / "faiss.index"
    on_disk = json.loads((dst / "index.json").read_text())["plan"].get("on_disk")
    index = faiss.read_index(str(f), faiss.IO_FLAG_SKIP_IVF_DATA if on_disk else 0)
    change(index)
    faiss.write_index(index, str(f))
    m = json.loads((dst / "index.json").read_text())
    m["files"]["faiss.index"] = f.stat().st_size
    (dst / "index.json").write_text(json.dumps(m))
    return dst


def _ivf_lists(index):
    import faiss

    return faiss.downcast_InvertedLists(faiss.extract_index_ivf(index).invlists)


def _graph(index):
    import faiss

    return faiss.downcast_index(faiss.downcast_index(index).index).hnsw


def _set(a: np.ndarray, at: tuple, value: int) -> None:
    a[at] = value


def _more_centroids(index) -> None:
    import faiss

    q = faiss.downcast_index(faiss.extract_index_ivf(index).quantizer)
    q.add(np.ones((5, q.d), dtype=np.float32))  # list numbers past the lists


def _random_links(index) -> None:
    import faiss

    g = _graph(index)
    nb = faiss.rev_swig_ptr(g.neighbors.data(), g.neighbors.size())
    nb[:] = np.random.default_rng(0).integers(0, index.ntotal, len(nb))  # every id in range, the graph not


def _id_map_past_rows(index) -> None:
    import faiss

    faiss.rev_swig_ptr(faiss.downcast_index(index).id_map.data(), 1)[0] = 10**9


CRAFTS: dict[str, tuple[str, Callable[[object], None], str]] = {
    # every list changed, so that whatever lists a query probes hold the crafted entry
    "list offset 10^12": (
        "disk",
        lambda i: _set(_lists_table(_ivf_lists(i)), (slice(None), 2), 10**12),
        "inverted list 0",
    ),
    "list size 10^9": (
        "disk",
        lambda i: _set(_lists_table(_ivf_lists(i)), (slice(None), slice(0, 2)), 10**9),
        "inverted list 0",
    ),
    "list size past capacity": (
        "disk",
        lambda i: _set(_lists_table(_ivf_lists(i)), (slice(None), 0), 10**9),
        "inverted list 0",
    ),
    "more centroids than lists": ("disk", _more_centroids, "coarse quantizer"),
    "hnsw random links": ("hnsw", _random_links, "HNSW graph"),
    "hnsw max level": ("hnsw", lambda i: setattr(_graph(i), "max_level", 5), "HNSW graph"),
    "hnsw id past the rows": ("hnsw", _id_map_past_rows, "id map"),
}


@pytest.fixture(scope="module")
def crafted(built, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("crafted")
    return {
        name: _craft(built[kind], base / f"c{n}", change) for n, (name, (kind, change, _)) in enumerate(CRAFTS.items())
    }


@pytest.mark.parametrize("name", list(CRAFTS))
def test_crafted_faiss_index_is_refused_when_opened(crafted, name):
    # `index info` opens the index (every check runs) and never searches: safe in-process even if a check went
    proc = cli("index", "info", crafted[name])
    one_line(proc, str(_data(crafted[name]) / "faiss.index"), CRAFTS[name][2], "damaged or crafted")


@pytest.mark.integration
@pytest.mark.parametrize("name", list(CRAFTS))
def test_crafted_faiss_index_query_is_one_line_not_sigsegv(crafted, name):
    # the real query, in a process of its own: a regression is a signal there, not a dead test run
    proc = cli_process("index", "query", crafted[name], "topic 3 and more", "-k", "3")
    one_line(proc, "faiss.index", CRAFTS[name][2], "damaged or crafted")


def test_random_list_bytes_are_refused_not_rescored(built, tmp_path):
    # lists.ivfdata of the right size, random bytes: Faiss returns whatever ids they hold; an id past the vectors
    # is one line (it was an IndexError traceback in re-scoring)
    d = tmp_path / "random"
    shutil.copytree(built["disk"], d)
    f = _data(d) / "lists.ivfdata"
    f.write_bytes(np.random.default_rng(1).bytes(f.stat().st_size))
    one_line(cli("index", "query", d, "topic 3 and more", "-k", "3"), "faiss.index", "beyond its", "rebuild it")


def test_built_indexes_still_answer(built):
    for idx in built.values():
        res = cli("index", "query", idx, "topic 3 and more", "-k", "3", "--json")
        assert res.returncode == 0, res.stderr
        assert len(json.loads(res.stdout)["hits"]) == 3
