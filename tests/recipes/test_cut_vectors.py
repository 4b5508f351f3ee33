"""Cut vectors in `cramkit embed` and in indexes (issue 29): a Matryoshka model's leading dimensions,
renormalised, by the rule of Engine.embed (the model's recorded list, else one line naming it); an index holds
them and cuts its queries the same way; its manifest records the size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import cramkit
import cramkit.index
from cramkit.infer import Engine
from infer.models import cli

TEXTS = [
    "The cat sat quietly on the warm mat.",
    "Stocks fell sharply after the report on Monday.",
    "Heavy rain is expected across the region tomorrow.",
    "The new film was praised for its witty script.",
    "He missed the last train and walked home.",
    "A cat purrs when it is content and relaxed.",
]


@pytest.fixture(scope="module")
def matryoshka(tiny_run: Path, glue_dir: Path, tmp_path_factory) -> Path:
    """An embedding model trained (a few steps) with Matryoshka dimensions 32 and 16 of its 64."""
    lines = (glue_dir / "MRPC" / "train.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]
    rows = [line.split("\t") for line in lines if line.startswith("1\t")][:100]
    root = tmp_path_factory.mktemp("mat")
    pairs = root / "pairs.tsv"
    pairs.write_text("s1\ts2\n" + "".join(f"{r[3]}\t{r[4]}\n" for r in rows), encoding="utf-8")
    out = root / "emb"
    proc = cli(
        "finetune",
        *("--from", str(tiny_run), "--objective", "contrastive", "--train", str(pairs), "--text-a", "s1"),
        *("--text-b", "s2", "--out", str(out), "--no-progress", "--budget", "2steps"),
        *("--set", "batch_size=8", "--set", "matryoshka=32,16"),
    )
    assert proc.returncode == 0, proc.stderr
    return out


def test_embed_cuts_the_vectors(matryoshka: Path, tiny_run: Path, tmp_path: Path) -> None:
    eng = Engine(cramkit.load(matryoshka))
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "emb"
    proc = cli("embed", str(docs), "--from", str(matryoshka), "--out", str(out), "--dimensions", "16")
    assert proc.returncode == 0, proc.stderr
    assert "6 rows x 16 dims" in proc.stdout
    vec = np.load(out / "embeddings.npy")
    assert vec.shape == (6, 16)
    assert np.allclose(vec, eng.embed(TEXTS, dimensions=16), atol=1e-5)
    assert np.allclose(np.linalg.norm(vec, axis=1), 1, atol=1e-5)  # renormalised
    rec = json.loads((out / "embed.json").read_text())
    assert rec["dim"] == 16 and rec["dimensions"] == 16
    # the same --out with the whole vectors: another embedding (its key differs), not the cut one reused
    again = cli("embed", str(docs), "--from", str(matryoshka), "--out", str(out))
    assert again.returncode == 2 and "holds finished embeddings" in again.stderr

    parquet = tmp_path / "pq"
    proc = cli("embed", str(docs), "--from", str(matryoshka), "--out", str(parquet), "--format", "parquet")
    assert proc.returncode == 0, proc.stderr
    proc = cli(
        "embed", str(docs), "--from", str(matryoshka), "--out", str(tmp_path / "pq32"), "--format", "parquet",
        "--dimensions", "32",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    from cramkit.embeddings.parquet import read_vectors

    vecs, _ = read_vectors(tmp_path / "pq32")
    assert vecs.shape == (6, 32) and np.allclose(vecs, eng.embed(TEXTS, dimensions=32), atol=1e-5)
    assert json.loads((tmp_path / "pq32" / "embed.json").read_text())["dimensions"] == 32

    for model, size, needle in (
        (matryoshka, "20", "answers 64, 32, 16"),
        (tiny_run, "16", "not trained to be cut"),
    ):
        bad = cli("embed", str(docs), "--from", str(model), "--out", str(tmp_path / "x"), "--dimensions", size)
        assert bad.returncode == 2 and needle in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1


def test_an_index_of_cut_vectors_cuts_its_queries(matryoshka: Path, tmp_path: Path) -> None:
    eng = Engine(cramkit.load(matryoshka))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(TEXTS[:4]) + "\n", encoding="utf-8")
    idx_dir = tmp_path / "idx"
    proc = cli(
        "index", "build", str(corpus), "--encoder", str(matryoshka), "--out", str(idx_dir), "--kind", "flat",
        "--dimensions", "32",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "32-dimension cut vectors" in proc.stdout
    m = json.loads((idx_dir / "index.json").read_text())
    assert m["dim"] == 32 and m["encoder"]["dimensions"] == 32
    idx = cramkit.index.open(idx_dir)
    assert np.asarray(idx.vectors).shape == (4, 32)
    assert np.allclose(np.asarray(idx.vectors), eng.embed(TEXTS[:4], dimensions=32), atol=1e-5)
    assert np.allclose(idx.embed(["a cat on a mat"]), eng.embed(["a cat on a mat"], dimensions=32), atol=1e-5)
    hits = idx.search(["a cat on a mat"], k=4)[0]
    want = eng.embed(TEXTS[:4], dimensions=32) @ eng.embed(["a cat on a mat"], dimensions=32)[0]
    assert [h["text"] for h in hits] == [TEXTS[i] for i in np.argsort(-want)]
    assert [round(h["score"], 4) for h in hits] == [round(float(s), 4) for s in np.sort(want)[::-1]]

    more = tmp_path / "more.txt"  # index add: the new chunks are cut as the index's
    more.write_text("\n\n".join(TEXTS[4:]) + "\n", encoding="utf-8")
    proc = cli("index", "add", str(idx_dir), str(more))
    assert proc.returncode == 0, proc.stderr
    idx = cramkit.index.open(idx_dir)
    assert np.allclose(np.asarray(idx.vectors), eng.embed(TEXTS, dimensions=32), atol=1e-5)
    info = cli("index", "info", str(idx_dir), "--json")
    assert json.loads(info.stdout)["dimensions_cut"] == 32

    # eval retrieval through the index: its queries are cut as its vectors; another size is one line
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)), encoding="utf-8"
    )
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q0", "text": "a cat on a mat"}) + "\n", encoding="utf-8")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n", encoding="utf-8")
    res = cramkit.evaluate_retrieval(matryoshka, beir, None, index=idx_dir, progress=False, device="cpu")
    assert res["dimensions"] == 32
    ok = cli(
        "eval", "retrieval", "--from", str(matryoshka), "--data", str(beir), "--index", str(idx_dir),
        "--out", str(tmp_path / "ev-ok"),
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "ev-ok" / "results.json").read_text())["dimensions"] == 32
    bad = cli(
        "eval", "retrieval", "--from", str(matryoshka), "--data", str(beir), "--index", str(idx_dir),
        "--dimensions", "16", "--out", str(tmp_path / "ev"),
    )  # fmt: skip
    assert bad.returncode == 2 and "holds vectors of 32 dimensions" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1

    bad = cli(
        "index", "build", str(corpus), "--encoder", str(matryoshka), "--out", str(tmp_path / "i2"), "--dimensions", "8"
    )
    assert bad.returncode == 2 and "answers 64, 32, 16" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
