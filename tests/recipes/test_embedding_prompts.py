"""Named prompts of an embedding model (issue 29): set by the contrastive stage (E5's "query: " / "passage: "),
recorded in the model, kept by the HF export (sentence-transformers' prompts), read back from a
sentence-transformers folder, and used by Engine.embed, `cramkit embed`, `cramkit index build` and its queries,
`eval retrieval` and the server's /embed and /v1/embeddings (TEI's prompt_name)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

import cramkit
import cramkit.index
from cramkit.errors import CramkitError
from cramkit.infer import Engine
from cramkit.recipes import contrastive_config, contrastive_data
from infer.models import cli

from .conftest import write_mrpc_pairs

PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = ["a fine film", "the market fell sharply", "he went home early"]


@pytest.fixture(scope="module")
def mrpc_pairs(glue_dir: Path, tmp_path_factory) -> Path:
    return write_mrpc_pairs(glue_dir, tmp_path_factory.mktemp("pairs") / "pairs.tsv", 200)


def _train(tiny_run: Path, pairs: Path, out: Path, *more: str):
    return cli(
        "finetune",
        *("--from", str(tiny_run), "--objective", "contrastive", "--train", str(pairs)),
        *("--text-a", "s1", "--text-b", "s2", "--out", str(out), "--no-progress"),
        *("--set", "batch_size=8", "--set", "lr=2e-3", "--budget", "2steps"),
        *more,
    )


@pytest.fixture(scope="module")
def prompted(tiny_run: Path, mrpc_pairs: Path, tmp_path_factory) -> Path:
    """An embedding model trained E5-style: anchors after "query: ", positives after "passage: "; default query."""
    out = tmp_path_factory.mktemp("prompted") / "emb"
    proc = _train(
        tiny_run,
        mrpc_pairs,
        out,
        *("--query-prompt", "query: ", "--passage-prompt", "passage: ", "--default-prompt-name", "query"),
    )
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_stage_puts_the_prompts_before_each_side_and_records_them(prompted: Path, tiny_run: Path) -> None:
    cfg = contrastive_config.config_from({"query_prompt": "query: ", "passage_prompt": "passage: "})
    assert contrastive_data.with_prompts([("a", "b", "c"), ("d", "e", None)], cfg) == [
        ("query: a", "passage: b", "passage: c"),
        ("query: d", "passage: e", None),
    ]
    model = cramkit.load(prompted)
    assert model.extra["prompts"] == PROMPTS and model.extra["default_prompt_name"] == "query"
    meta = json.loads((prompted / "cramkit-model.json").read_text())
    assert meta["extra"]["prompts"] == PROMPTS
    res = json.loads((prompted / "results.json").read_text())
    assert res["prompts"] == PROMPTS and res["config"]["query_prompt"] == "query: "

    eng = Engine(model)
    assert eng.prompts == PROMPTS and eng.default_prompt_name == "query"
    plain = eng.embed(TEXTS, prompt="")  # no prompt at all
    # a named prompt is that text before each input; no name: the default prompt (query)
    assert np.allclose(eng.embed(TEXTS, prompt_name="passage"), eng.embed([f"passage: {t}" for t in TEXTS], prompt=""))
    assert np.allclose(eng.embed(TEXTS), eng.embed([f"query: {t}" for t in TEXTS], prompt=""))
    assert not np.allclose(eng.embed(TEXTS), plain, atol=1e-4)
    with pytest.raises(CramkitError, match="has the prompts 'query', 'passage'"):
        eng.embed(TEXTS, prompt_name="document")
    with pytest.raises(CramkitError, match="has no prompts"):
        Engine(cramkit.load(tiny_run)).embed(TEXTS, prompt_name="query")
    # the prompt's tokens count toward the length limit: a text at the limit loses its end to the prompt
    long = " ".join(["word"] * 400)
    assert eng.embed_truncated([long], prompt_name="passage")[1].all()


def test_embed_index_and_retrieval_use_the_prompts(prompted: Path, tmp_path: Path) -> None:
    eng = Engine(cramkit.load(prompted))
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "emb"
    proc = cli("embed", str(docs), "--from", str(prompted), "--out", str(out), "--prompt-name", "passage")
    assert proc.returncode == 0, proc.stderr
    assert "prompt 'passage'" in proc.stdout
    vec = np.load(out / "embeddings.npy")
    assert np.allclose(vec, eng.embed(TEXTS, prompt_name="passage"), atol=1e-5)
    assert json.loads((out / "embed.json").read_text())["prompt"] == "passage: "
    bad = cli("embed", str(docs), "--from", str(prompted), "--out", str(tmp_path / "x"), "--prompt-name", "doc")
    assert bad.returncode == 2 and "has the prompts 'query', 'passage'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1

    # an index: its chunks get the passage prompt, its queries the query prompt; the manifest says so
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(TEXTS) + "\n", encoding="utf-8")
    idx_dir = tmp_path / "idx"
    proc = cli("index", "build", str(corpus), "--encoder", str(prompted), "--out", str(idx_dir), "--kind", "flat")
    assert proc.returncode == 0, proc.stderr
    assert "prompts: chunks 'passage'" in proc.stderr and "queries 'query'" in proc.stderr
    m = json.loads((idx_dir / "index.json").read_text())
    assert m["prompts"] == {
        "documents": {"name": "passage", "text": "passage: "},
        "queries": {"name": "query", "text": "query: "},
    }
    idx = cramkit.index.open(idx_dir)
    assert np.allclose(np.asarray(idx.vectors), eng.embed(TEXTS, prompt_name="passage"), atol=1e-5)
    assert np.allclose(idx.embed(["a film"]), eng.embed(["a film"], prompt_name="query"), atol=1e-5)
    hits = idx.search(["a fine film"], k=1)
    assert hits[0][0]["text"] == "a fine film"

    # eval retrieval: queries get the query prompt, documents the passage prompt (exact search and the index)
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)), encoding="utf-8"
    )
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q0", "text": "a good film"}) + "\n", encoding="utf-8")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n", encoding="utf-8")
    proc = cli("eval", "retrieval", "--from", str(prompted), "--data", str(beir), "--out", str(tmp_path / "ev"))
    assert proc.returncode == 0, proc.stderr
    assert "prompts: queries query, documents passage" in proc.stdout
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert res["prompts"]["queries"]["text"] == "query: " and res["prompts"]["documents"]["text"] == "passage: "
    assert "prompts: queries 'query'" in (tmp_path / "ev" / "results.md").read_text()


@pytest.mark.integration
def test_the_server_takes_prompt_name(prompted: Path) -> None:
    from serve.test_server import start

    eng = Engine(cramkit.load(prompted))
    server, url = start(str(prompted))
    try:
        r = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "prompt_name": "passage"}, timeout=60)
        assert r.status_code == 200, r.text
        assert np.allclose(np.asarray(r.json()), eng.embed(TEXTS, prompt_name="passage"), atol=1e-5)
        r = httpx.post(f"{url}/embed", json={"inputs": TEXTS}, timeout=60)  # the default prompt: query
        assert np.allclose(np.asarray(r.json()), eng.embed(TEXTS, prompt_name="query"), atol=1e-5)
        r = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS[:1], "prompt_name": "passage"}, timeout=60)
        assert r.status_code == 200, r.text
        got = np.asarray(r.json()["data"][0]["embedding"])
        assert np.allclose(got, eng.embed(TEXTS[:1], prompt_name="passage")[0], atol=1e-5)
        bad = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "prompt_name": "doc"}, timeout=60)
        assert bad.status_code == 422 and "has the prompts 'query', 'passage'" in bad.json()["error"]
        bad = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "prompt_name": 3}, timeout=60)
        assert bad.status_code == 422 and "prompt_name" in bad.text
        tokens = httpx.post(f"{url}/tokenize", json={"inputs": "hi", "prompt_name": "passage"}, timeout=60).json()
        assert "".join(t["text"].removeprefix("##") for t in tokens[0][1:-1]) == "passage:hi"  # what /embed reads
        info = httpx.get(f"{url}/info", timeout=10).json()
        (model,) = info["models"].values()
        assert model["prompts"] == PROMPTS and model["default_prompt_name"] == "query"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_hf_export_keeps_the_prompts_and_sentence_transformers_folders_give_theirs(
    prompted: Path, minilm_dir: Path, tmp_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    exported = cramkit.export(prompted, tmp_path / "hf", progress=False)
    st_conf = json.loads((exported / "config_sentence_transformers.json").read_text())
    assert st_conf["prompts"] == PROMPTS and st_conf["default_prompt_name"] == "query"
    st = SentenceTransformer(str(exported), device="cpu", trust_remote_code=True)
    eng = Engine(cramkit.load(prompted))
    for name in ("query", "passage"):
        assert np.abs(st.encode(TEXTS, prompt_name=name) - eng.embed(TEXTS, prompt_name=name)).max() < 1e-5
    assert np.abs(st.encode(TEXTS) - eng.embed(TEXTS)).max() < 1e-5  # both apply the default prompt
    back = cramkit.load(f"hf:{exported}")
    assert back.extra["prompts"] == PROMPTS and back.extra["default_prompt_name"] == "query"

    # a sentence-transformers model with prompts (as E5 and BGE ship): cramkit reads and applies them
    minilm = tmp_path / "minilm"
    shutil.copytree(minilm_dir, minilm)
    conf = json.loads((minilm / "config_sentence_transformers.json").read_text())
    conf |= {"prompts": {"query": "Represent this query: ", "document": ""}, "default_prompt_name": None}
    (minilm / "config_sentence_transformers.json").write_text(json.dumps(conf))
    ours = Engine(cramkit.load(f"hf:{minilm}"))
    assert ours.prompts == {"query": "Represent this query: ", "document": ""} and ours.default_prompt_name is None
    ref = SentenceTransformer(str(minilm), device="cpu")
    assert np.abs(ours.embed(TEXTS, prompt_name="query") - ref.encode(TEXTS, prompt_name="query")).max() < 1e-5
    assert np.abs(ours.embed(TEXTS) - ref.encode(TEXTS)).max() < 1e-5
    assert ours.retrieval_prompt_name("document") == "document"
    conf["default_prompt_name"] = "nope"  # a crafted file: one line
    (minilm / "config_sentence_transformers.json").write_text(json.dumps(conf))
    with pytest.raises(CramkitError, match="default prompt name 'nope' is not one of its prompts"):
        cramkit.load(f"hf:{minilm}")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--query-prompt", "query: ", "--default-prompt-name", "passage"), "give one of the prompts set (query)"),
        (("--objective", "simcse", "--query-prompt", "q: "), "apply to --objective contrastive"),
    ],
)
def test_bad_prompt_settings_are_one_line(tiny_run: Path, mrpc_pairs: Path, tmp_path: Path, args, needle) -> None:
    more = list(args)
    if "--objective" not in more:
        more = ["--objective", "contrastive", *more]
    proc = cli(
        "finetune",
        *("--from", str(tiny_run), "--train", str(mrpc_pairs), "--text-a", "s1", "--text-b", "s2"),
        *("--out", str(tmp_path / "x"), *more),
    )
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
