"""cramkit index / cramkit embed through the real commands, on real text, with real encoders."""

from __future__ import annotations

import json
import os
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


def fails(capsys, *args: str) -> str:
    """Run the CLI in-process; it must fail with one `cramkit: error:` line, exit 2, no traceback."""
    capsys.readouterr()
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("cramkit: error: ") and "Traceback" not in err, err
    return err


def write_docs(path: Path, docs: list[str]) -> Path:
    path.write_text("\n\n".join(d.replace("\n\n", "\n") for d in docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, builtin_docs) -> Path:
    """60 real documents (standard-library docstrings), blank-line separated."""
    return write_docs(tmp_path_factory.mktemp("corpus") / "docs.txt", builtin_docs[300:360])


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory, corpus, pretrained_run) -> Path:
    out = tmp_path_factory.mktemp("idx") / "flat"
    res = cli(
        "index",
        "build",
        str(corpus),
        "--encoder",
        str(pretrained_run),
        "--out",
        str(out),
        "--chunk-tokens",
        "48",
        "--overlap",
        "8",
        "--device",
        "cpu",
    )
    assert res.returncode == 0, res.stderr
    assert "recall@10 1.000" in res.stdout
    return out


def test_build_query_info(tiny_index, corpus, capsys):
    m = json.loads((tiny_index / "index.json").read_text())
    assert m["plan"]["kind"] == "flat" and m["count"] > 60 and m["dim"] == 64
    assert not (tiny_index / ".build").exists()
    idx = cramkit.index.open(tiny_index)
    # every chunk's text is a verbatim span of the corpus, and chunks overlap by 8 tokens within a document
    text = corpus.read_text(encoding="utf-8")
    assert all(idx.chunks.text(i) in text for i in range(0, len(idx), 7))
    rows = np.asarray(idx.chunks.table)
    same = rows[1:, 0] == rows[:-1, 0]
    assert np.all(rows[1:, 2][same] == rows[:-1, 3][same] - 8)
    # a chunk's own text finds itself first, with cosine 1
    probe = [idx.chunks.text(i) for i in (3, 40)]
    hits = idx.search(probe, k=3)
    assert [h[0]["text"] for h in hits] == probe
    assert hits[0][0]["score"] == pytest.approx(1.0, abs=1e-4)
    assert set(hits[0][0]) >= {"score", "text", "doc", "source", "chunk"} and hits[0][0]["source"] == str(corpus)
    assert idx.encoder_source == str(idx.manifest["encoder"]["source"]) and idx.info()["count"] == len(idx)
    assert main(["index", "query", str(tiny_index), probe[1], "-k", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[0])
    assert len(out["hits"]) == 2 and out["hits"][0]["text"] == probe[1]
    assert main(["index", "info", str(tiny_index)]) == 0
    assert "recall@10" in capsys.readouterr().out


def test_recall_against_numpy(tmp_path, corpus, pretrained_run, tiny_index):
    """HNSW over the same chunks: its measured recall and an independent numpy exact search agree."""
    out = tmp_path / "hnsw"
    assert (
        main(
            [
                "index",
                "build",
                str(corpus),
                "--encoder",
                str(pretrained_run),
                "--out",
                str(out),
                "--chunk-tokens",
                "24",
                "--overlap",
                "0",
                "--kind",
                "hnsw",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    idx = cramkit.index.open(out)
    assert idx.info()["kind"] == "hnsw" and idx.manifest["recall"]["queries"] > 0
    vec = np.load(out / idx.manifest["data"] / "vectors.npy")  # independent copy, not memory-mapped
    assert np.allclose(np.linalg.norm(vec, axis=1), 1.0, atol=1e-4)
    q = idx.embed(["Return a new list of the items.", "socket connection timeout", "parse the arguments"])
    _, got = idx.search_vectors(q, 10)
    truth = np.argsort(-(q @ vec.T), axis=1)[:, :10]
    rec = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got.tolist(), truth.tolist(), strict=True)])
    assert rec >= 0.9


@pytest.mark.parametrize("kind", ["ivfsq8", "ivfpq"])
def test_ivf_recall_synthetic(kind):
    """IVF (8-bit or PQ codes) with exact re-ranking reaches the target on held-out queries; numpy agrees
    on fresh ones."""
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(50, 16)).astype(np.float32)
    proj = rng.normal(size=(16, 32)).astype(np.float32)
    z = centers[rng.integers(0, 50, 12000)] + 0.5 * rng.normal(size=(12000, 16)).astype(np.float32)
    x = z @ proj
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    data, fresh = x[:11000], x[11000:11200]
    plan = ann.plan_index(len(data), 32, 1 << 30, kind)
    index, params, meas = ann.build_and_tune(data, plan, target=0.95, log=lambda s: None)
    assert meas["reached"] and meas["recall_at_10"] >= 0.95 and index.ntotal == len(data)
    assert ann.plan_index(len(data), 32, 1 << 30)["kind"] == "flat"
    assert ann.plan_index(10**6, 384, 4 << 30)["kind"] == "ivfsq8"
    assert ann.plan_index(10**6, 384, 200 << 20)["kind"] == "ivfpq"
    _, got = ann.search(index, data, plan, params, fresh, 10)
    truth = np.argsort(-(fresh @ data.T), axis=1)[:, :10]
    assert ann.recall_at(got, truth, 10) >= 0.9


def test_add(tmp_path, tiny_index, builtin_docs):
    idx_dir = tmp_path / "grow"
    shutil.copytree(tiny_index, idx_dir)
    more = write_docs(tmp_path / "more.txt", builtin_docs[400:410])
    before = json.loads((idx_dir / "index.json").read_text())
    assert main(["index", "add", str(idx_dir), str(more), "--device", "cpu"]) == 0
    after = json.loads((idx_dir / "index.json").read_text())
    assert after["count"] > before["count"] and after["data"] != before["data"]
    assert not (idx_dir / before["data"]).exists() and after["sources"][-1] == str(more)
    idx = cramkit.index.open(idx_dir)
    new = idx.chunks.text(after["count"] - 1)
    assert new in more.read_text(encoding="utf-8")
    hit = idx.search([new], k=1)[0][0]
    assert hit["text"] == new and hit["source"] == str(more) and hit["doc"] >= before["documents"]


# ---------------------------------------------------------------------------------------------- RETRO


@pytest.fixture(scope="module")
def small_store(tmp_path_factory, builtin_docs, tok_dir) -> Path:
    d = tmp_path_factory.mktemp("store")
    src = write_docs(d / "docs.txt", builtin_docs[500:540])
    assert main(["data", "build", str(src), "--tokenizer", str(tok_dir), "--out", str(d / "store"), "--quiet"]) == 0
    return d / "store"


def test_embed_of_a_store_counts_its_rows(tmp_path, small_store, pretrained_run):
    """`cramkit embed` of a token store said "embedded sequences rows x 64 dims": the rows' kind had replaced
    their count in the record."""
    from cramkit.data.tokenstore import TokenStore

    proc = cli("embed", str(small_store), "--from", str(pretrained_run), "--out", str(tmp_path / "e"))
    assert proc.returncode == 0, proc.stderr
    n = len(TokenStore(small_store).sizes)
    assert f"embedded {n} rows x " in proc.stdout, proc.stdout
    record = json.loads((tmp_path / "e" / "embed.json").read_text())
    assert record["rows"] == n and record["rows_kind"] == "sequences"


def test_retro_neighbours(tmp_path, small_store, pretrained_run, capsys):
    from cramkit.data.tokenstore import TokenStore

    out = tmp_path / "retro"
    assert (
        main(
            [
                "index",
                "build",
                str(small_store),
                "--encoder",
                str(pretrained_run),
                "--mode",
                "retro",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    nb_dir = tmp_path / "nb"
    assert main(["index", "neighbours", str(out), "--store", str(small_store), "--out", str(nb_dir), "-k", "2"]) == 0
    store = TokenStore(small_store)
    nb = np.load(nb_dir / "neighbours.npy", allow_pickle=False)
    n_chunks = int(np.sum((np.asarray(store.sizes) + 63) // 64))
    assert nb.dtype == np.int32 and nb.shape == (n_chunks, 2) and (nb >= 0).all()
    # the document of every query chunk, from the store's own index, never equals its neighbours'
    seq_of_chunk = np.repeat(np.arange(len(store)), (np.asarray(store.sizes) + 63) // 64)
    doc_of_seq = np.searchsorted(store.doc_idx, np.arange(len(store)), side="right") - 1
    q_doc = doc_of_seq[seq_of_chunk]
    idx_rows = np.load(out / json.loads((out / "index.json").read_text())["data"] / "chunks.npy")
    assert (idx_rows[nb, 0] != q_doc[:, None]).all()
    # and without the exclusion the nearest chunk would mostly be from the same document: the check is real
    idx = cramkit.index.open(out)
    _, plain = idx.search_vectors(np.asarray(idx.vectors[:200]), 2)
    assert (idx_rows[plain[:, 1], 0] == q_doc[:200]).mean() > 0.2
    # results carry the 64-token continuation: the next chunk of the same sequence, decoded
    i = int(np.flatnonzero(idx_rows[1:, 1] == idx_rows[:-1, 1])[0])  # a chunk followed by one of its sequence
    seq, start = int(idx_rows[i, 1]), int(idx_rows[i, 2])
    hit = idx.search([idx.chunks.text(i)], k=1)[0][0]
    assert hit["chunk"] == i and hit["continuation"] == idx.chunks.text(i + 1)
    tok = idx.engine().loaded.tokenizer
    assert hit["continuation"] == tok.decode(store[seq][start + 64 : start + 128].astype(int).tolist())
    last = int(np.flatnonzero(idx_rows[1:, 1] != idx_rows[:-1, 1])[0])  # the last chunk of a sequence
    assert idx.hit(last, 0.0)["continuation"] == ""


# ----------------------------------------------------------------------------------------- kill, resume


@pytest.mark.integration
def test_a_closed_index_refuses_and_the_interpreter_exits_quietly(tiny_index: Path) -> None:
    """A Python program that searches an index and exits printed "Exception ignored in Rows.__del__ ...
    'NoneType' object has no attribute 'close'" (os.close gone at shutdown): the files close with the index
    (``with``), or at exit before the modules are torn down."""
    from cramkit.index.checks import DamagedIndex

    with cramkit.index.open(tiny_index) as idx:
        hits = idx.search(["topic 3"], k=2)
        assert len(hits[0]) == 2
    try:
        idx.search(["topic 3"], k=2)
        raise AssertionError("a closed index searched")
    except (DamagedIndex, cramkit.CramkitError) as exc:
        assert "closed" in str(exc)
    program = (
        "import cramkit.index, sys\n"
        f"idx = cramkit.index.open({str(tiny_index)!r})\n"
        "print(len(idx.search(['topic 3'], k=2)[0]))\n"  # left open: closed at exit
    )
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "2", proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _kill_when_committed(proc: subprocess.Popen, progress: Path, timeout: float = 120) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if progress.is_file() and json.loads(progress.read_text() or "{}").get("committed", 0) > 0:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return
        if proc.poll() is not None:
            pytest.fail(f"finished before it could be killed: {proc.stderr.read()}")
        time.sleep(0.01)
    proc.kill()
    pytest.fail("no progress committed in time")


@pytest.mark.integration
def test_killed_embed_resumes(tmp_path, builtin_docs, pretrained_run):
    lines = [" ".join(d.split())[:200] for d in builtin_docs[:600]]
    src = tmp_path / "lines.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "emb"
    cmd = [
        sys.executable,
        "-m",
        "cramkit",
        "embed",
        str(src),
        "--from",
        str(pretrained_run),
        "--out",
        str(out),
        "--block",
        "8",
        "--device",
        "cpu",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    _kill_when_committed(proc, out / "progress-0.json")
    assert not (out / "embed.json").exists()  # killed: nothing claims to be finished
    done_before = json.loads((out / "progress-0.json").read_text())["committed"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"resumed after {done_before}" in res.stdout
    emb = np.load(out / "embeddings.npy", allow_pickle=False)
    ids = np.load(out / "ids.npy", allow_pickle=False)
    from cramkit.infer import Engine

    ref = Engine(cramkit.load(str(pretrained_run)), device="cpu").embed(lines)
    assert emb.shape == ref.shape and np.array_equal(ids, np.arange(len(lines)))
    assert np.allclose(emb, ref, atol=1e-5)


@pytest.mark.slow
def test_torchrun_embed_matches_one_process(tmp_path, builtin_docs, pretrained_run):
    """Two torchrun processes share the rows of one memory map; the result equals one process's."""
    src = tmp_path / "lines.txt"
    src.write_text("\n".join(" ".join(d.split())[:200] for d in builtin_docs[:300]) + "\n", encoding="utf-8")
    outs = {}
    for nproc in (1, 2):
        out = tmp_path / f"e{nproc}"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "-m",
            "cramkit",
            "embed",
            str(src),
            "--from",
            str(pretrained_run),
            "--out",
            str(out),
            "--block",
            "32",
            "--device",
            "cpu",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
        assert res.returncode == 0, res.stderr
        assert res.stdout.count("embedded 300 rows") == 1
        outs[nproc] = np.load(out / "embeddings.npy", allow_pickle=False)
        assert json.loads((out / "embed.json").read_text())["world_size"] == nproc
    assert sorted(p.name for p in (tmp_path / "e2").glob("progress-*.json")) == [
        "progress-0.json",
        "progress-1.json",
    ]
    assert np.allclose(outs[1], outs[2], atol=1e-5)


@pytest.mark.slow
def test_killed_build_is_not_an_index_then_resumes(tmp_path, corpus, pretrained_run, capsys):
    out = tmp_path / "idx"
    cmd = [
        sys.executable,
        "-m",
        "cramkit",
        "index",
        "build",
        str(corpus),
        "--encoder",
        str(pretrained_run),
        "--out",
        str(out),
        "--chunk-tokens",
        "32",
        "--overlap",
        "0",
        "--block",
        "8",
        "--device",
        "cpu",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    _kill_when_committed(proc, out / ".build" / "embed" / "progress-0.json")
    assert "interrupted build" in fails(capsys, "index", "info", str(out))
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    m = json.loads((out / "index.json").read_text())
    assert m["build"]["resumed_rows"] > 0 and not (out / ".build").exists()


# ------------------------------------------------------------------------------------------ bad input


def test_bad_inputs(tmp_path, tiny_index, corpus, pretrained_run, capsys):
    q = ["index", "query", str(tiny_index)]
    n = json.loads((tiny_index / "index.json").read_text())["count"]
    assert "larger than the index" in fails(capsys, *q, "hello", "-k", str(n + 1))
    assert "already holds an index" in fails(
        capsys, "index", "build", str(corpus), "--encoder", str(pretrained_run), "--out", str(tiny_index)
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n", encoding="utf-8")
    assert "no text to index" in fails(
        capsys, "index", "build", str(empty), "--encoder", str(pretrained_run), "--out", str(tmp_path / "e")
    )
    assert not (tmp_path / "e" / "index.json").exists()
    assert "needs a token store" in fails(
        capsys,
        "index",
        "build",
        str(corpus),
        "--encoder",
        str(pretrained_run),
        "--mode",
        "retro",
        "--out",
        str(tmp_path / "r"),
    )
    assert "exceeds the encoder's limit" in fails(
        capsys,
        "index",
        "build",
        str(corpus),
        "--encoder",
        str(pretrained_run),
        "--chunk-tokens",
        "100000",
        "--out",
        str(tmp_path / "c"),
    )
    assert "not a finished index" in fails(capsys, *["index", "query", str(tmp_path), "x"])
    # a query longer than the encoder's limit is cut to it, and the CLI says so
    capsys.readouterr()
    assert main([*q, "word " * 2000, "-k", "1"]) == 0
    assert "cut to the encoder's limit" in capsys.readouterr().err


def _copy(src: Path, dst: Path) -> tuple[Path, dict]:
    shutil.copytree(src, dst)
    return dst, json.loads((dst / "index.json").read_text())


def test_damaged_and_crafted_indexes(tmp_path, tiny_index, capsys):
    # truncated vectors
    d, m = _copy(tiny_index, tmp_path / "trunc")
    f = d / m["data"] / "vectors.npy"
    f.write_bytes(f.read_bytes()[:-100])
    assert "truncated" in fails(capsys, "index", "info", str(d))
    # a manifest pointing outside the index directory: data, a file entry, the encoder copy
    for i, (field, value) in enumerate(
        [("data", "../.."), ("files", {"../../../../etc/passwd": 1}), ("encoder", {"dir": "/tmp"})]
    ):
        d, m = _copy(tiny_index, tmp_path / f"crafted{i}")
        if field == "encoder":
            m["encoder"] = {**m["encoder"], **value}
        else:
            m[field] = value
        (d / "index.json").write_text(json.dumps(m))
        assert "outside the index directory" in fails(capsys, "index", "query", str(d), "x")
    # not JSON
    d, m = _copy(tiny_index, tmp_path / "notjson")
    (d / "index.json").write_text("{not json")
    assert "not valid JSON" in fails(capsys, "index", "info", str(d))


def test_symlinked_data_file_left_out_of_the_manifest_is_refused(tmp_path, tiny_index, capsys):
    """texts.bin a symlink to a file outside, index.json's 'files' silent about it, the offsets made to fit:
    the outside file's text must not come back as a hit."""
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-TOKEN-" * 4000)
    d, m = _copy(tiny_index, tmp_path / "link")
    data = d / m["data"]
    offsets = np.load(data / "text_offsets.npy")
    np.save(data / "text_offsets.npy", np.linspace(0, secret.stat().st_size, len(offsets)).astype(np.int64))
    (data / "texts.bin").unlink()
    (data / "texts.bin").symlink_to(secret)
    m["files"].pop("texts.bin")
    (d / "index.json").write_text(json.dumps(m))
    capsys.readouterr()
    code = main(["index", "query", str(d), "secret token", "-k", "3"])
    out, err = capsys.readouterr()
    assert "SECRET-TOKEN" not in out, out
    assert code == 2 and "texts.bin" in err and "Traceback" not in err, out + err
    # recorded but pointing outside: refused as well
    m["files"]["texts.bin"] = secret.stat().st_size
    (d / "index.json").write_text(json.dumps(m))
    assert "outside the index directory" in fails(capsys, "index", "query", str(d), "x")


def test_damaged_faiss_file(tmp_path, small_store, pretrained_run, capsys):
    out = tmp_path / "h"
    assert (
        main(
            [
                "index",
                "build",
                str(small_store),
                "--encoder",
                str(pretrained_run),
                "--kind",
                "hnsw",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    m = json.loads((out / "index.json").read_text())
    f = out / m["data"] / "faiss.index"
    f.write_bytes(b"\x00" * f.stat().st_size)  # same size, garbage
    assert "not a readable Faiss index" in fails(capsys, "index", "info", str(out))


def test_model_without_an_encoder(tmp_path, tok, corpus, capsys):
    """A distilled BiLSTM student has no transformer encoder to take embeddings from."""
    from cramkit.loading import LoadedModel
    from cramkit.model.students import BiLSTMConfig, BiLSTMStudent, bilstm_meta

    cfg = BiLSTMConfig(vocab_size=tok.get_vocab_size(), embedding_dim=8, lstm_hidden=8, fc_hidden=8)
    student = LoadedModel(
        BiLSTMStudent(cfg, 2),
        kind="classifier",
        config=bilstm_meta(cfg),
        tokenizer=tok,
        labels=["a", "b"],
        architecture="bilstm",
    )
    student.save(tmp_path / "student")
    err = fails(
        capsys,
        "index",
        "build",
        str(corpus),
        "--encoder",
        str(tmp_path / "student"),
        "--out",
        str(tmp_path / "i"),
    )
    assert "no transformer encoder" in err
    assert "no transformer encoder" in fails(
        capsys, "embed", str(corpus), "--from", str(tmp_path / "student"), "--out", str(tmp_path / "e")
    )


def test_other_encoder_at_query_time(tiny_index, minilm_dir, capsys):
    err = fails(capsys, "index", "query", str(tiny_index), "hello", "--encoder", f"hf:{minilm_dir}")
    assert "is not the encoder index" in err


# -------------------------------------------------------------------------------------------- quality


@pytest.mark.integration
def test_minilm_mrpc_paraphrases(tmp_path, real_glue_dir, minilm_dir):
    glue_dir = real_glue_dir
    """A few MRPC paraphrase pairs: index the second sentences, query with the first."""
    import csv

    pairs = []
    with open(glue_dir / "MRPC" / "dev.tsv", encoding="utf-8-sig", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            if row["Quality"] == "1":
                pairs.append((row["#1 String"].strip(), row["#2 String"].strip()))
    pairs = pairs[:40]
    src = write_docs(tmp_path / "second.txt", [b for _, b in pairs])
    out = tmp_path / "mrpc"
    assert (
        main(
            [
                "index",
                "build",
                str(src),
                "--encoder",
                f"hf:{minilm_dir}",
                "--out",
                str(out),
                "--doc-split",
                "blank",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    idx = cramkit.index.open(out)
    assert len(idx) == len(pairs)
    hits = idx.search([a for a, _ in pairs], k=10)
    ranks = [next((r for r, h in enumerate(hs, 1) if h["doc"] == i), 99) for i, hs in enumerate(hits)]
    assert np.mean([r == 1 for r in ranks]) >= 0.8
    assert np.mean([r <= 10 for r in ranks]) >= 0.95


# ------------------------------------------------------------------------------------- one request per verb


def _same_line(args: list[str], call) -> str:
    """The command refuses ``args`` with one line, and the Python function ``call`` with the same one."""
    from cramkit.errors import CramkitError

    proc = cli(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("cramkit: error: ")]
    assert len(lines) == 1, proc.stderr
    with pytest.raises(CramkitError) as exc:
        call()
    assert lines[0] == f"cramkit: error: {exc.value}"
    return str(exc.value)


def test_a_route_rule_is_the_same_line_from_both_doors(tmp_path, corpus, tiny_index, pretrained_run):
    """The flags that do not go together are checked in one method of the verb's request, which the command and
    the Python function both call."""
    text, out = tmp_path / "t.txt", tmp_path / "out"
    text.write_text("a line\n", encoding="utf-8")
    said = _same_line(
        ["embed", str(text), "--from", str(pretrained_run), "--out", str(out), "--shard", "0/2"],
        lambda: cramkit.embed(text, pretrained_run, out, shard="0/2"),
    )
    assert "--shard needs --format parquet" in said
    said = _same_line(
        ["index", "build", str(corpus), "--encoder", str(pretrained_run), "--out", str(out), "--on-disk"]
        + ["--kind", "flat"],
        lambda: cramkit.index.build_index(corpus, pretrained_run, out, on_disk=True, kind="flat"),
    )
    assert "flat" in said
    said = _same_line(
        ["index", "export", str(tiny_index), "--to", "lancedb", "--uri", str(out), "--db-index", "ivf"],
        lambda: cramkit.index.export_index(tiny_index, "lancedb", str(out), db_index="ivf"),
    )
    assert "--db-index 'ivf'" in said
    assert not out.exists()


def test_the_verbs_take_a_request_or_its_fields(tmp_path, tiny_index, pretrained_run):
    """``cramkit.embed`` and the index functions take one request (what the command builds) or its fields; a
    table's text column is found when none is named (``--text`` is the earlier name of ``--text-field``)."""
    from cramkit.embeddings import EmbedRequest
    from cramkit.index import InfoRequest, QueryRequest

    rows = tmp_path / "rows.csv"
    rows.write_text("id,sentence\n1,the first line\n2,a second one\n", encoding="utf-8")
    a = cramkit.embed(EmbedRequest(rows, pretrained_run, tmp_path / "a", device="cpu"))
    b = cramkit.embed(rows, pretrained_run, tmp_path / "b", device="cpu")
    res = cli("embed", str(rows), "--from", str(pretrained_run), "--out", str(tmp_path / "c"), "--text", "sentence")
    assert res.returncode == 0, res.stderr
    assert a is not None and b is not None and a["rows"] == b["rows"] == 2
    vectors = [np.load(tmp_path / d / "embeddings.npy") for d in "abc"]
    assert np.array_equal(vectors[0], vectors[1]) and np.array_equal(vectors[0], vectors[2])

    assert cramkit.index.info(InfoRequest(tiny_index)) == cramkit.index.info(tiny_index)
    asked = cramkit.index.query(QueryRequest(tiny_index, ["how are files opened"], k=3))
    assert asked == cramkit.index.query(tiny_index, ["how are files opened"], k=3)
    assert len(asked) == 1 and len(asked[0]["hits"]) == 3 and asked[0]["query"] == "how are files opened"
    res = cli("index", "query", str(tiny_index), "how are files opened", "-k", "3", "--json")
    assert [json.loads(line) for line in res.stdout.splitlines()] == asked
