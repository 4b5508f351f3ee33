"""A new user's first hours (issue 22): CLUE's .json files, text options on every verb that reads text,
the flag a user mistyped, hub ids, the [UNK] rate before fine-tuning, predict's label column and the
smaller edges of the tour. Through the real commands, on the real FewCLUE data where it matters."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clirun import cli

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}


def one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The single error line of a failed command; it must contain every needle."""
    err = proc.stderr.strip()
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("cramkit: error:"), err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in: {lines[0]}"
    return lines[0]


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


@pytest.fixture(scope="session")
def iflytek(shared_data: Path) -> Path:
    path = shared_data / "fewclue" / "iflytek"
    if not path.is_dir():
        pytest.skip(f"needs FewCLUE at {path}")
    return path


# ------------------------------------------------------------------ 1. JSON Lines in a .json file


def test_clue_json_is_read_as_json_lines(tmp_path, iflytek):
    train = iflytek / "train_0.json"
    rows = [json.loads(line) for line in train.read_text(encoding="utf-8").splitlines() if line.strip()]
    res = ok(
        cli(
            "tokenizer",
            "train",
            train,
            "--text-field",
            "sentence",
            "--vocab-size",
            "3000",
            "--out",
            tmp_path / "tok",
        )
    )
    assert f"from {len(rows)} documents" in res.stdout
    vocab = set((tmp_path / "tok" / "vocab.txt").read_text(encoding="utf-8").split())
    assert not vocab & {"sentence", "label_des", "keywords"}, "the JSON field names were read as text"
    # without --text-field: the default field `text` is missing, and the error lists the fields there are
    one_line(cli("tokenizer", "train", train, "--out", tmp_path / "t2"), "no field 'text'", "sentence")
    # data build reads it the same way: one document per row
    res = ok(
        cli(
            "data",
            "build",
            train,
            "--text-field",
            "sentence",
            "--tokenizer",
            tmp_path / "tok",
            "--out",
            tmp_path / "store",
            "--quiet",
        )
    )
    assert f"{len(rows):,} documents" in res.stdout


def test_json_that_is_not_json_lines_and_fields_on_plain_text(tmp_path):
    from cramkit.text.sources import iter_documents

    (tmp_path / "array.json").write_text('[{"text": "a b c"}, {"text": "d e f"}]\n', encoding="utf-8")
    one_line(
        cli("tokenizer", "train", tmp_path / "array.json", "--out", tmp_path / "t"),
        "array.json",
        "JSON array",
    )
    (tmp_path / "pretty.json").write_text('{\n  "text": "a b c"\n}\n', encoding="utf-8")
    one_line(cli("pretrain", tmp_path / "pretty.json", "--out", tmp_path / "run"), "pretty.json", "not JSON Lines")
    (tmp_path / "plain.txt").write_text("some words here\n", encoding="utf-8")
    one_line(
        cli("tokenizer", "train", tmp_path / "plain.txt", "--text-field", "sentence", "--out", tmp_path / "t"),
        "--text-field sentence",
        "plain.txt",
        "no fields",
    )
    # in a directory, .json files that hold JSON Lines are read, other .json files (configs) skipped
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "rows.json").write_text('{"text": "first row"}\n{"text": "second row"}\n', encoding="utf-8")
    (corpus / "config.json").write_text('{\n  "vocab": 3\n}\n', encoding="utf-8")
    assert list(iter_documents([str(corpus)])) == ["first row", "second row"]


# ------------------------------------------------------------------ 2. reading options everywhere


def test_every_text_verb_takes_the_reading_options():
    for verb in (
        ["tokenizer", "train"],
        ["data", "build"],
        ["pretrain"],
        ["index", "build"],
        ["index", "add"],
        ["embed"],
    ):
        out = ok(cli(*verb, "--help")).stdout
        for flag in ("--encoding", "--errors", "--text-field"):
            assert flag in out, f"cramkit {' '.join(verb)} lacks {flag}"
        assert "reading text:" in out


@pytest.mark.integration
def test_latin1_corpus_is_indexed_and_embedded(tmp_path, minilm_dir):
    latin = tmp_path / "latin.txt"
    text = "Le café est très bon.\n\nUne crème brûlée à Noël.\n\nLe garçon mange.\n"
    latin.write_bytes(text.encode("latin-1"))
    one_line(
        cli("index", "build", latin, "--encoder", minilm_dir, "--out", tmp_path / "i0", "--device", "cpu"),
        "latin.txt",
        "not valid UTF-8",
        "--encoding",
    )
    res = ok(
        cli(
            "index",
            "build",
            latin,
            "--encoder",
            minilm_dir,
            "--out",
            tmp_path / "idx",
            "--device",
            "cpu",
            "--encoding",
            "latin-1",
        )
    )
    assert "3 documents" in res.stdout
    info = ok(cli("index", "info", tmp_path / "idx")).stdout
    assert "exact search" in info and "0 held-out" not in info  # a flat index: nothing was measured
    res = ok(cli("index", "query", tmp_path / "idx", "crème brûlée", "-k", "1", "--json"))
    assert "crème brûlée" in json.loads(res.stdout)["hits"][0]["text"]
    more = tmp_path / "more.txt"
    more.write_bytes("Der Bär schläft.\n".encode("cp1252"))
    one_line(cli("index", "add", tmp_path / "idx", more, "--device", "cpu"), "more.txt", "--encoding")
    res = ok(cli("index", "add", tmp_path / "idx", more, "--device", "cpu", "--encoding", "cp1252"))
    assert "holds 4 chunks" in res.stdout
    one_line(
        cli("embed", latin, "--from", minilm_dir, "--out", tmp_path / "e0", "--device", "cpu"),
        "latin.txt",
        "--encoding",
    )
    ok(
        cli(
            "embed",
            latin,
            "--from",
            minilm_dir,
            "--out",
            tmp_path / "emb",
            "--device",
            "cpu",
            "--encoding",
            "latin-1",
        )
    )
    assert json.loads((tmp_path / "emb" / "embed.json").read_text())["rows"] == 3


# ------------------------------------------------------------------ 3. the flag the user typed


@pytest.mark.parametrize(
    "argv, typed, meant",
    [
        (["tokenizer", "train", "x.txt", "--vocab-sz", "8000", "--out", "t"], "--vocab-sz", "--vocab-size"),
        (
            ["data", "build", "x.txt", "--tokenizer", "t", "--out", "s", "--wrokers", "2"],
            "--wrokers",
            "--workers",
        ),
        (["data", "inspect", "s", "--smaples", "2"], "--smaples", "--samples"),
        (
            ["index", "build", "x.txt", "--encoder", "m", "--out", "i", "--chunk-size", "64"],
            "--chunk-size",
            "--chunk-tokens",
        ),
        (["index", "add", "i", "x.txt", "--blok", "8"], "--blok", "--block"),
        (["index", "query", "i", "text", "--jsn"], "--jsn", "--json"),
    ],
)
def test_unknown_flag_of_a_two_level_verb_is_the_one_typed(argv, typed, meant):
    one_line(cli(*argv), f"unknown option {typed}; did you mean {meant}?")


# ------------------------------------------------------------------ 4. hub ids, 5. [UNK] rate


def hub_cache(root: Path, repo: str, model_dir: Path) -> Path:
    """A Hugging Face hub cache (the layout huggingface_hub writes) holding ``model_dir`` as ``repo``."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    entry = root / f"models--{repo.replace('/', '--')}"
    snap = entry / "snapshots" / commit
    snap.mkdir(parents=True)
    (entry / "blobs").mkdir()
    for f in model_dir.iterdir():
        if f.is_file():  # as huggingface_hub lays it out: the file in blobs/, a relative link in the snapshot
            blob = entry / "blobs" / hashlib.sha256(f.name.encode()).hexdigest()
            shutil.copy(f, blob)
            (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(commit)
    return root


def test_hub_id_offline_is_one_line_about_the_network_for_every_verb(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("text,label\ngood film,1\nbad film,0\n", encoding="utf-8")
    for argv in (
        ["finetune", "--from", "hf:no-org/no-model", "--train", data, "--dev", data, "--text-a", "text"],
        ["eval", "glue", "--from", "hf:no-org/no-model", "--data-dir", tmp_path],
        [
            "distill",
            "--teacher",
            "hf:no-org/no-model",
            "--student",
            "bilstm",
            "--train",
            data,
            "--dev",
            data,
            "--text-a",
            "text",
            "--out",
            tmp_path / "s",
        ],
        ["predict", "--from", "hf:no-org/no-model", data],
        ["embed", data, "--from", "hf:no-org/no-model", "--out", tmp_path / "e"],
    ):
        line = one_line(cli(*argv), "hf:no-org/no-model", "not in the local Hugging Face cache", "HF_HUB_OFFLINE")
        assert "no such directory" not in line


@pytest.fixture(scope="module")
def iflytek_model(tmp_path_factory, iflytek, minilm_dir) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """all-MiniLM-L6-v2 as hf:test-org/minilm from a local hub cache (offline), fine-tuned for one short
    epoch on 32 rows of FewCLUE's IFLYTEK (Chinese app descriptions) with the label column label_des:
    (the finetune process, the model directory, the data file)."""
    tmp = tmp_path_factory.mktemp("iflytek")
    data = tmp / "iflytek32.json"
    lines = (iflytek / "train_0.json").read_text(encoding="utf-8").splitlines()[:32]
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cache = hub_cache(tmp / "hub", "test-org/minilm", minilm_dir)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cramkit",
            "finetune",
            "--from",
            "hf:test-org/minilm",
            "--train",
            str(data),
            "--dev",
            str(data),
            "--text-a",
            "sentence",
            "--label",
            "label_des",
            "--set",
            "epochs=1",
            "--set",
            "min_steps=0",
            "--set",
            "max_length=32",
            "--no-progress",
            "--out",
            str(tmp / "ft"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**ENV, "HF_HUB_CACHE": str(cache)},
    )
    assert proc.returncode == 0, proc.stderr
    return proc, tmp / "ft", data


def test_chinese_task_on_an_english_vocabulary_warns_before_training(iflytek_model):
    """finetune --from hf:ORG/NAME (from the hub cache), and the [UNK] warning before training."""
    proc = iflytek_model[0]
    warning = next(line for line in proc.stderr.splitlines() if line.startswith("warning:"))
    rate = float(warning.split("%")[0].split()[-1])
    assert rate > 20, warning
    assert "[UNK]" in warning and "hf:test-org/minilm" in warning and "cramkit pretrain --from" in warning
    assert "user/iflytek32 dev: accuracy" in proc.stdout  # it trained and scored


# ------------------------------------------------------------------ 7. predict's label column


def test_predict_scores_the_column_the_model_was_trained_on(iflytek_model, tmp_path):
    _, model, data = iflytek_model
    res = ok(cli("predict", "--from", model, data, "--out", tmp_path / "p.jsonl", "--keep-text"))
    assert "metrics: accuracy" in res.stdout  # label_des, without --label
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text(encoding="utf-8").splitlines()]
    first = json.loads(data.read_text(encoding="utf-8").splitlines()[0])
    assert rows[0]["sentence"] == first["sentence"] and rows[0]["label"] in rows[0]["probabilities"]
    ok(cli("predict", "--from", model, data, "--out", tmp_path / "q.jsonl"))
    assert "sentence" not in (tmp_path / "q.jsonl").read_text(encoding="utf-8").splitlines()[0]


def test_predict_checks_the_label_column_before_predicting(iflytek_model, tmp_path):
    _, model, data = iflytek_model
    out = tmp_path / "p.jsonl"
    line = one_line(
        cli("predict", "--from", model, data, "--out", out, "--label", "label"),
        "column 'label'",
        "the model does not know",
        "--label none",
    )
    assert "its labels:" in line
    assert not out.exists()
    one_line(cli("predict", "--from", model, data, "--out", out, "--label", "stars"), "no column 'stars'")
    res = ok(cli("predict", "--from", model, data, "--out", out, "--label", "none"))
    assert "metrics" not in res.stdout and out.is_file()


def test_unk_rate_of_english_text_on_an_english_vocabulary(minilm_dir, capsys):
    from cramkit.loading import load
    from cramkit.text.coverage import unk_rate, unk_report

    tok = load(minilm_dir).tokenizer
    english = ["The film was a delight from start to finish.", "A dull, lifeless remake."] * 10
    rate, pieces = unk_rate(tok, english)
    assert rate == 0.0 and pieces > 100
    assert unk_report(tok, english, "m", verbose=False) == 0.0
    assert capsys.readouterr().err == ""
    assert unk_rate(tok, ["物流很快，早上下单，下午就到了。"])[0] > 0.5


# ------------------------------------------------------------------ 8. the smaller edges


def test_tokenizer_and_store_are_not_overwritten_silently(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\n\nthe dog sat on the log\n" * 20, encoding="utf-8")
    tok = tmp_path / "tok"
    ok(cli("tokenizer", "train", corpus, "--vocab-size", "200", "--out", tok))
    before = (tok / "vocab.txt").read_bytes()
    one_line(cli("tokenizer", "train", corpus, "--vocab-size", "150", "--out", tok), "already holds", "--force")
    assert (tok / "vocab.txt").read_bytes() == before
    ok(cli("tokenizer", "train", corpus, "--vocab-size", "150", "--out", tok, "--force"))
    ok(cli("data", "build", corpus, "--tokenizer", tok, "--out", tmp_path / "s", "--quiet"))
    one_line(cli("data", "build", corpus, "--tokenizer", tok, "--out", tmp_path / "s"), "train.bin", "--force")
    ok(cli("data", "build", corpus, "--tokenizer", tok, "--out", tmp_path / "s", "--name", "other", "--quiet"))
    ok(cli("data", "build", corpus, "--tokenizer", tok, "--out", tmp_path / "s", "--force", "--quiet"))


def test_help_names_every_preset_and_every_option() -> None:
    import argparse

    from cramkit.cli import build_parser
    from cramkit.config import list_presets

    missing = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*words, name])
            elif action.option_strings and action.help is None:
                missing.append(f"cramkit {' '.join(words)} {action.option_strings[0]}")

    walk(build_parser(), [])
    assert not missing, f"options without a help text: {missing}"
    out = re.sub(r"-\n\s+", "-", ok(cli("pretrain", "--help")).stdout)  # argparse wraps lines at hyphens
    assert all(preset in out for preset in list_presets()) and "bert-lamb" in out
    out = ok(cli("eval", "glue", "--help")).stdout
    assert out.startswith("usage: cramkit eval glue") and "--data-dir" in out


def test_nproc_with_a_mistyped_setting_fails_once_before_torchrun(tmp_path):
    one_line(
        cli("pretrain", "--nproc", "2", "--set", "parallel.tpx=2", "--out", tmp_path / "r"),
        "unknown setting 'parallel.tpx'",
    )
    assert not (tmp_path / "r").exists()
    one_line(
        cli("finetune", "--nproc", "2", "--from", tmp_path, "--set", "epocs=2", "--out", tmp_path / "f"),
        "unknown setting",
        "epochs",
    )


@pytest.mark.integration
def test_onnx_export_says_when_fusions_were_skipped(pretrained_run, tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    import onnxruntime.transformers.optimizer as optimizer

    from cramkit.backends import write_export
    from cramkit.infer.engine import compare_outputs
    from cramkit.loading import load

    def broken(*args, **kwargs):
        raise IndexError("list index out of range")

    monkeypatch.setattr(optimizer, "optimize_model", broken)
    out = write_export(
        "onnx",
        load(pretrained_run),
        tmp_path / "onnx",
        texts=["a short text", "another one"],
        compare=compare_outputs,
    )
    err = capsys.readouterr().err
    manifest = json.loads((out / "cramkit-onnx.json").read_text(encoding="utf-8"))
    assert manifest["fusions"]["skipped"].startswith("IndexError")
    assert "applying" not in err and "no fusions applied (IndexError: list index out of range)" in err
