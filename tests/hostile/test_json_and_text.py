"""Crafted JSON and text in the files cramkit reads (issue 30, items 2, 4 and 5): links out of an ``hf:``
folder, lone UTF-16 surrogate escapes in input rows, JSON nested 100,000 deep or holding a 5,000-digit
integer. Each is one line naming the file (and the line), never a traceback; the hub cache's links stay."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import cramkit
from cramkit.errors import CramkitError
from test_bad_input import cli, one_line

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "1" * 5000
SURROGATE_ROW = '{"text": "scraped \\ud800 text"}\n'  # a JSON-escaped lone surrogate, as scraped data has


def _copy_hf(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _link_out(folder: Path, name: str, outside: Path) -> None:
    """Move ``folder/name`` outside and leave a symbolic link to it in its place."""
    outside.mkdir(exist_ok=True)
    target = outside / name.replace("/", "_")
    shutil.move(folder / name, target)
    (folder / name).symlink_to(target)


# ------------------------------------------------------------------ 2: one path rule for an hf: folder


HF_FILES = ["config.json", "model.safetensors", "sentence_bert_config.json", "1_Pooling/config.json"]


@pytest.mark.parametrize("name", HF_FILES)
def test_hf_folder_files_linked_outside_are_refused(minilm_dir, tmp_path, name) -> None:
    model = _copy_hf(minilm_dir, tmp_path / "minilm")
    _link_out(model, name, tmp_path / "outside")
    with pytest.raises(CramkitError, match="outside") as err:
        cramkit.load(f"hf:{model}")
    assert name.split("/")[-1] in str(err.value) and "\n" not in str(err.value)


def test_hf_folder_link_is_one_line_from_the_command(minilm_dir, tmp_path) -> None:
    model = _copy_hf(minilm_dir, tmp_path / "minilm")
    _link_out(model, "config.json", tmp_path / "outside")
    rows = tmp_path / "rows.txt"
    rows.write_text("a fine film\n")
    proc = cli("embed", rows, "--from", f"hf:{model}", "--out", tmp_path / "emb")
    one_line(proc, "config.json", "outside")


def test_hub_cache_snapshot_links_to_blobs_are_read(minilm_dir, tmp_path) -> None:
    """The Hugging Face cache layout: snapshots/REV/NAME -> ../../blobs/HASH stays allowed."""
    repo = tmp_path / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2"
    snap = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    for i, f in enumerate(sorted(p for p in minilm_dir.rglob("*") if p.is_file())):
        rel = f.relative_to(minilm_dir)
        shutil.copyfile(f, repo / "blobs" / f"blob{i}")
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).symlink_to(Path("../" * len(rel.parts)) / ".." / "blobs" / f"blob{i}")
    loaded = cramkit.load(f"hf:{snap}")
    assert loaded.pooling == "mean" and loaded.normalize


# ------------------------------------------------------------------ 4: one text rule for lone surrogates


def test_lone_surrogate_in_embed_input_is_one_line_or_replaced(pretrained_run, tmp_path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "a fine film"}\n' + SURROGATE_ROW)
    proc = cli("embed", rows, "--from", pretrained_run, "--out", tmp_path / "emb")
    one_line(proc, f"{rows} line 2", "surrogate", "--errors replace")
    proc = cli("embed", rows, "--from", pretrained_run, "--out", tmp_path / "emb", "--errors", "replace")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "in 1 rows were replaced with U+FFFD" in proc.stderr
    assert json.loads((tmp_path / "emb" / "embed.json").read_text())["rows"] == 2


def test_lone_surrogate_in_pretraining_text_is_one_line(tmp_path, builtin_docs) -> None:
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": d}) + "\n" for d in builtin_docs[:50]) + SURROGATE_ROW)
    proc = cli("pretrain", docs, "--budget", "1steps", "--out", tmp_path / "run")
    one_line(proc, f"{docs} line 51", "surrogate", "--errors replace")
    got = list(cramkit.text.iter_documents([str(docs)], errors="replace"))
    assert got[-1] == "scraped \ufffd text"
    assert list(cramkit.text.iter_documents([str(docs)], errors="ignore"))[-1] == "scraped  text"


def test_lone_surrogate_in_index_build_is_one_line(pretrained_run, tmp_path) -> None:
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"text": "a fine film"}\n' + SURROGATE_ROW)
    proc = cli("index", "build", docs, "--encoder", pretrained_run, "--out", tmp_path / "idx")
    one_line(proc, f"{docs} line 2", "surrogate")


def test_lone_surrogate_in_task_files_is_a_bad_row(tmp_path) -> None:
    from cramkit.tasks import get_task
    from cramkit.tasks.files import task_from_file
    from tasks.test_superglue import _rte_rows

    train = tmp_path / "train.jsonl"
    train.write_text('{"text": "good", "label": "1"}\n{"text": "bad \\udc00", "label": "0"}\n')
    with pytest.raises(CramkitError, match=r"line 2: not text: a lone surrogate.*--skip-bad-rows"):
        task_from_file("sur", train, text_a="text", labels=["0", "1"]).examples("train")
    skipping = task_from_file("sur2", train, text_a="text", labels=["0", "1"], skip_bad_rows=True)
    assert len(skipping.examples("train")) == 1
    # the SuperGLUE reader: the same rule
    rte = tmp_path / "sg" / "RTE"
    rte.mkdir(parents=True)
    rows = [json.dumps(r) for r in _rte_rows(3, 0)]
    rows[1] = rows[1].replace("The ", "The \\ud800 ", 1)
    (rte / "train.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.raises(CramkitError, match=r"train.jsonl, line 2: not text: a lone surrogate"):
        get_task("superglue/rte", data_dir=tmp_path / "sg").examples("train")
    kept = get_task("superglue/rte", data_dir=tmp_path / "sg", skip_bad_rows=True).examples("train")
    assert len(kept) == 2


# ------------------------------------------------------------------ 5: one JSON reader for every file


@pytest.mark.parametrize("content", [DEEP, '{"a": ' + HUGE + "}"], ids=["deep", "huge-int"])
def test_crafted_json_in_model_files_is_one_line(minilm_dir, ft_model, tmp_path, content) -> None:
    for folder, name in (
        (minilm_dir, "config.json"),
        (minilm_dir, "modules.json"),
        (minilm_dir, "sentence_bert_config.json"),
        (minilm_dir, "1_Pooling/config.json"),
        (ft_model, "cramkit-model.json"),
    ):
        bad = _copy_hf(folder, tmp_path / f"{name.replace('/', '_')}-{len(content)}")
        (bad / name).write_text(content)
        src = f"hf:{bad}" if folder == minilm_dir else str(bad)
        with pytest.raises(CramkitError, match="nested too deep|digits") as err:
            cramkit.load(src)
        assert name.split("/")[-1] in str(err.value), err.value


@pytest.mark.parametrize("content", [DEEP, '{"text": ' + HUGE + "}"], ids=["deep", "huge-int"])
def test_crafted_json_rows_are_one_line_naming_the_line(pretrained_run, tmp_path, content) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "a fine film"}\n' + content + "\n")
    proc = cli("embed", rows, "--from", pretrained_run, "--out", tmp_path / "emb")
    one_line(proc, f"{rows} line 2", "not readable JSON")
    with pytest.raises(CramkitError, match=r"line 2: not readable JSON"):
        list(cramkit.text.iter_documents([str(rows)]))


def test_crafted_json_in_task_files_is_one_line(tmp_path) -> None:
    from cramkit.tasks import get_task
    from cramkit.tasks.clue import _read_answers

    boolq = tmp_path / "sg" / "BoolQ"
    boolq.mkdir(parents=True)
    (boolq / "train.jsonl").write_text(DEEP + "\n")
    with pytest.raises(CramkitError, match=r"train.jsonl, line 1: not readable JSON \(nested too deep\)"):
        get_task("superglue/boolq", data_dir=tmp_path / "sg").examples("train")
    answers = tmp_path / "train_answer.json"
    answers.write_text('{"#idiom1#": ' + HUGE + "}")
    with pytest.raises(CramkitError, match="train_answer.json is not readable JSON"):
        _read_answers(answers)
