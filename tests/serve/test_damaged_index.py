"""A served index cut short under the running server, or crafted (issue 50, case 6): the server died of SIGBUS
on the next /search (or SIGSEGV on a crafted on-disk index). Now a crafted index is refused at start in one
line, and a file cut short since it was opened makes /search answer 500 for that index while the server keeps
serving everything else."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clirun import PROCESS_ENV, cli, cli_process, one_line

pytestmark = pytest.mark.integration  # real servers


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory, pretrained_run) -> Path:
    base = tmp_path_factory.mktemp("served")
    docs = base / "docs.txt"
    docs.write_text("\n".join(f"line {i} about topic {i % 7} and more words" for i in range(2000)) + "\n")
    res = cli("index", "build", docs, "--encoder", pretrained_run, "--out", base / "idx", "--on-disk", "--device",
              "cpu", "--chunk-tokens", "16", "--overlap", "0")  # fmt: skip
    assert res.returncode == 0, res.stderr
    return base / "idx"


def _data(idx: Path) -> Path:
    return idx / json.loads((idx / "index.json").read_text())["data"]


class Server:
    def __init__(self, run: Path, index: Path, log: Path) -> None:
        import os

        self.log = log
        with log.open("w") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cramkit", "serve", str(run), "--index", str(index), "--port", "0"],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env={**os.environ, **PROCESS_ENV},
            )
        self.url = ""

    def wait(self) -> str:
        import httpx

        t0 = time.time()
        while not self.url and time.time() - t0 < 120 and self.proc.poll() is None:
            m = re.search(r"serving on (http://\S+)", self.log.read_text())
            self.url = m.group(1) if m else ""
            time.sleep(0.2)
        assert self.url, self.log.read_text()
        for _ in range(100):
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        return self.url

    def search(self) -> object:
        import httpx

        return httpx.post(self.url + "/search", json={"inputs": ["topic 3 and more"], "k": 3}, timeout=60)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through Linux's /proc")
def test_no_thread_reads_the_lists_between_searches(on_disk):
    """Faiss's search of on-disk lists starts threads that page the probed lists in and leaves them running
    when it returns: one still reading when the file was cut killed the server (SIGBUS) past the size check
    made before each search. Every search now joins them before it returns."""
    import numpy as np

    from cramkit.index.search import Index

    index = Index(on_disk)
    q = np.random.default_rng(0).standard_normal((2, index.manifest["dim"])).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    threads = len(list(Path("/proc/self/task").iterdir()))
    for _ in range(3):
        _, ids = index.search_vectors(q, 3)
        assert (ids >= 0).all()
        assert len(list(Path("/proc/self/task").iterdir())) == threads


@pytest.mark.parametrize("victim", ["vectors.npy", "lists.ivfdata"])
def test_a_file_cut_short_under_the_server_is_a_500_not_sigbus(on_disk, pretrained_run, tmp_path, victim):
    import httpx

    idx = tmp_path / "idx"
    shutil.copytree(on_disk, idx)
    server = Server(pretrained_run, idx, tmp_path / "serve.log")
    try:
        server.wait()
        first = server.search()
        assert first.status_code == 200, first.text
        with open(_data(idx) / victim, "r+b") as fh:  # in place: the server's maps now reach past the end
            fh.truncate(200)
        for _ in range(2):  # and it stays refused
            r = server.search()
            assert r.status_code == 500, r.text
            assert victim in r.json()["error"] and "cut short" in r.json()["error"], r.text
        assert server.proc.poll() is None, server.log.read_text()
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        emb = httpx.post(server.url + "/embed", json={"inputs": "still serving"}, timeout=60)
        assert emb.status_code == 200, emb.text
    finally:
        server.stop()
    assert server.proc.returncode not in (-7, -11), server.log.read_text()  # SIGBUS, SIGSEGV


def test_a_crafted_on_disk_index_is_refused_at_start(on_disk, pretrained_run, tmp_path):
    import faiss

    idx = tmp_path / "idx"
    shutil.copytree(on_disk, idx)
    f = _data(idx) / "faiss.index"
    index = faiss.read_index(str(f), faiss.IO_FLAG_SKIP_IVF_DATA)
    il = faiss.downcast_InvertedLists(faiss.extract_index_ivf(index).invlists)
    n = il.lists.size()
    table = faiss.rev_swig_ptr(faiss.cast_integer_to_idx_t_ptr(int(il.lists.data().this)), 3 * n).reshape(n, 3)
    table[:, 2] = 10**12  # every list's offset far past the list file
    faiss.write_index(index, str(f))
    m = json.loads((idx / "index.json").read_text())
    m["files"]["faiss.index"] = f.stat().st_size
    (idx / "index.json").write_text(json.dumps(m))
    proc = cli_process("serve", pretrained_run, "--index", idx, "--port", "0", timeout=120)
    one_line(proc, "faiss.index", "damaged or crafted")
