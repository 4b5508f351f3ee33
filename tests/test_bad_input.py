"""Bad input meets the real command: one line on stderr naming the input and the fix, exit 2, no traceback.

Each test reproduces a failure reported in issue 12 (a new user's first hour, a hostile file) through
``python -m cramkit ...`` in a subprocess, as a user would meet it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clirun import cli, one_line
from conftest import TINY_MODEL_SETS

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
TINY = [x for item in TINY_MODEL_SETS for x in ("--set", item)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, builtin_docs) -> Path:
    """A small UTF-8 text corpus (stdlib docstrings, blank-line separated)."""
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("\n\n".join(builtin_docs[:400]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory, corpus, tok_dir) -> Path:
    """A token store made by the real `cramkit data build`."""
    out = tmp_path_factory.mktemp("store")
    proc = cli("data", "build", corpus, "--tokenizer", tok_dir, "--out", out, "--workers", "1", "--quiet")
    assert proc.returncode == 0, proc.stderr
    return out


# ----------------------------------------------------------------------------- 12: training numbers


@pytest.mark.parametrize("setting", ["train.lr=nan", "train.log_every=0"])
def test_training_numbers_are_checked_with_the_key_named(tmp_path, corpus, setting):
    run = tmp_path / "run"
    proc = cli("pretrain", corpus, "--out", run, "--budget", "2steps", *TINY, "--set", setting)
    one_line(proc, setting.split("=")[0])
    assert not run.exists()  # refused before anything was written


@pytest.mark.parametrize(
    "setting",
    [
        "train.lr=-1",
        "train.lr=inf",
        "train.lr=.nan",
        "train.eps=0",
        "train.betas=[0.9,1.5]",
        "train.weight_decay=-0.1",
        "train.grad_clip=-1",
        "train.eval_batches=0",
        "model.dropout=nan",
        "data.mask_rate=inf",
        "tokenizer.vocab_size=1e9",
    ],
)
def test_every_number_is_checked(setting):
    from cramkit.errors import CramkitError
    from cramkit.train.config import resolve_config

    with pytest.raises(CramkitError, match=setting.split("=")[0].replace(".", r"\.")):
        resolve_config("tiny-cpu", [setting])


# ------------------------------------------------------------- 10, 11: sizes that cannot be allocated


def test_vocab_size_is_bounded(tmp_path, corpus):
    one_line(
        cli("tokenizer", "train", corpus, "--vocab-size", "1000000000", "--out", tmp_path / "t"),
        "--vocab-size",
    )
    assert not (tmp_path / "t").exists()


def test_a_model_that_cannot_fit_is_refused_before_allocating(tmp_path, corpus):
    run = tmp_path / "run"
    proc = cli("pretrain", corpus, "--out", run, *TINY, "--set", "model.layers=1e9", timeout=60)
    line = one_line(proc, "model.layers=1000000000", "parameters", "GiB", "this machine has")
    assert "billion" in line
    assert not run.exists()
    from cramkit.errors import CramkitError
    from cramkit.train.config import check_fits, resolve_config

    with pytest.raises(CramkitError, match="model.hidden=4000000"):
        check_fits(resolve_config("tiny-cpu", ["model.hidden=4000000", "model.heads=4"]))
    check_fits(resolve_config("bert-base"))  # a real model on this machine is not refused


def test_memory_estimate_counts_parameters_exactly():
    from cramkit.model.config import config_parameters as count_parameters
    from cramkit.model.heads import MaskedLM
    from cramkit.train.config import estimate_training_bytes, resolve_config

    for preset in ("tiny-cpu", "crammed-bert", "bert-base"):
        cfg = resolve_config(preset, ["model.layers=2", "model.hidden=64", "model.heads=2"])
        m = cfg.model.replace(vocab_size=500, intermediate=128)
        assert count_parameters(m) == sum(p.numel() for p in MaskedLM(m).parameters()), preset
        params, need = estimate_training_bytes(cfg)
        assert need > 16 * params  # weights, gradients, two moments, and the activations on top


# --------------------------------------------------------------------- 9: token ids, store manifest


def test_store_ids_beyond_the_vocabulary(tmp_path, store, tok_dir):
    bad = tmp_path / "bad"
    shutil.copytree(store, bad)
    tokens = np.memmap(bad / "train.bin", dtype=np.uint16, mode="r+")
    tokens[5] = 60000  # beyond the 3000-entry vocabulary (the manifest still matches the tokenizer)
    tokens.flush()
    del tokens
    proc = cli("pretrain", bad, "--out", tmp_path / "run", "--budget", "2steps", *TINY)
    one_line(proc, str(bad / "train"), "token id 60000", "3,000")
    assert not (tmp_path / "run").exists()


def test_store_without_manifest_is_refused_unless_the_tokenizer_is_named(tmp_path, store, tok_dir):
    bare = tmp_path / "bare"
    shutil.copytree(store, bare)
    (bare / "train.json").unlink()
    proc = cli("pretrain", bare, "--out", tmp_path / "run", "--budget", "2steps", *TINY)
    one_line(proc, "no manifest train.json", "--tokenizer")
    # naming the tokenizer is accepted with a warning; its ids are still checked
    tokens = np.memmap(bare / "train.bin", dtype=np.uint16, mode="r+")
    tokens[0] = 3000
    tokens.flush()
    del tokens
    proc = cli("pretrain", bare, "--tokenizer", tok_dir, "--out", tmp_path / "run", "--budget", "2steps", *TINY)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "warning" in proc.stderr and "no manifest" in proc.stderr
    assert "token id 3000" in proc.stderr.strip().splitlines()[-1]


# -------------------------------------------------------------------------- 15: misleading messages


def test_special_files_are_named_for_what_they_are(tmp_path, tok_dir):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.txt"
    loop.symlink_to(loop)
    broken = tmp_path / "broken.txt"
    broken.symlink_to(tmp_path / "gone.txt")
    proc = cli("data", "build", "/dev/null", "--tokenizer", tok_dir, "--out", tmp_path / "s", timeout=60)
    assert "does not exist" not in one_line(proc, "/dev/null", "is a device")
    assert not (tmp_path / "s").exists()
    from cramkit.errors import CramkitError
    from cramkit.text.sources import expand_sources

    for src, needle in ((fifo, "named pipe"), (loop, "symbolic link loop"), (broken, "broken symbolic link")):
        with pytest.raises(CramkitError, match=needle) as exc:
            expand_sources([str(src)])
        assert str(src) in str(exc.value) and "does not exist" not in str(exc.value)


def test_parquet_column_of_integers_names_its_type(tmp_path, tok_dir):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3], "body": ["a b c", "d e", "f"]}), path)
    proc = cli("data", "build", path, "--tokenizer", tok_dir, "--out", tmp_path / "s")
    one_line(proc, "column 'text' holds int64, not text", "--text-field", "body")


def test_malformed_jsonl_row_in_finetune_is_named(tmp_path):
    rows = [json.dumps({"text": f"row {i}", "label": "pos"}) for i in range(10)]
    rows.insert(4, '{"text": "the only negative", "label": "neg"')  # unterminated object
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    proc = cli("finetune", "--from", tmp_path, "--train", path, "--text-a", "text", "--label", "label")
    line = one_line(proc, f"{path}, line 5", "not valid JSON", "--skip-bad-rows")
    assert "two labels" not in line


@pytest.mark.integration  # `cramkit data build` in a private mount namespace with a 64 KiB disk
def test_full_disk_during_data_build(tmp_path, corpus, tok_dir):
    """A 64 KiB tmpfs (in a private mount namespace): the disk fills while the store is written."""
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare to mount a small tmpfs")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("user namespaces are not available here (unshare -rm failed)")
    script = (
        f"mount -t tmpfs -o size=64k tmpfs {tmp_path} && mkdir {tmp_path}/out && "
        f"{sys.executable} -m cramkit data build {corpus} --tokenizer {tok_dir} --out {tmp_path}/out/new "
        f"--workers 1; echo rc=$?; ls -A {tmp_path}/out"
    )
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=ENV, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "rc=2" in proc.stdout, proc.stdout + proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert f"--out {tmp_path}/out/new" in line and "disk is full" in line, line
    assert proc.stdout.strip().splitlines()[-1] == "rc=2"  # `ls` printed nothing: no half-written store


# ------------------------------------------------------------------------- 14: corrupt files, CSVs


@pytest.fixture(scope="module")
def tiny_csv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("csv") / "train.csv"
    rows = [f"this was {'good' if i % 2 else 'bad'} number {i},{'pos' if i % 2 else 'neg'}" for i in range(40)]
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow
def test_finetune_from_a_run_with_corrupt_weights(tmp_path, pretrained_run, tiny_csv):
    run = tmp_path / "run"
    shutil.copytree(pretrained_run, run, symlinks=True)
    weights = sorted(run.glob("checkpoints/step-*/model.safetensors"))[-1]
    data = bytearray(weights.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64  # flipped bytes inside the tensors
    weights.write_bytes(bytes(data))
    args = ("finetune", "--from", run, "--train", tiny_csv, "--text-a", "text", "--label", "label")
    one_line(cli(*args, "--out", tmp_path / "ft", "--no-progress"), "model.safetensors")
    weights.write_bytes(bytes(data[:1000]))  # truncated
    one_line(cli(*args, "--out", tmp_path / "ft", "--no-progress"), "model.safetensors")


def test_finetune_csv_not_utf8_or_binary(tmp_path):
    latin = tmp_path / "latin.csv"
    latin.write_bytes("text,label\ncaf\xe9 good,pos\nbad,neg\n".encode("latin-1"))
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"text,label\n\x00\x01\x02\xff\xfe,pos\n" * 10)
    proc = cli("finetune", "--from", tmp_path, "--train", latin, "--text-a", "text", "--label", "label")
    one_line(proc, str(latin), "not valid UTF-8")
    from cramkit.errors import CramkitError
    from cramkit.tasks.files import task_from_file

    with pytest.raises(CramkitError, match="binary"):
        task_from_file("bin", binary, text_a="text", register=False)


# -------------------------------------------------- 16, 20: pretrain reads what its errors point to


@pytest.mark.slow
def test_pretrain_takes_the_reading_options_its_errors_name(tmp_path, builtin_docs):
    docs = builtin_docs[:150]
    src = tmp_path / "posts.jsonl"
    with open(src, "w", encoding="cp1252", errors="replace") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, "body": f"Caf\u00e9 na\u00efve {d[:300]}"}, ensure_ascii=False) + "\n")
    run = tmp_path / "run"
    base = ("pretrain", src, "--out", run, "--budget", "2steps", "--no-progress", *TINY)
    one_line(cli(*base, "--set", "tokenizer.vocab_size=400"), "not valid UTF-8", "--encoding")
    assert not run.exists()  # the failed attempt left no run directory behind
    one_line(cli(*base, "--encoding", "cp1252"), "no field 'text'", "--text-field")
    assert not run.exists()
    proc = cli(*base, "--encoding", "cp1252", "--text-field", "body", "--set", "tokenizer.vocab_size=8192")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 20: what the corpus gives is said, not silently used
    assert "the corpus yields only" in proc.stdout and "of the 8,192 vocabulary entries" in proc.stdout
    vocab = len((run / "tokenizer" / "vocab.txt").read_text(encoding="utf-8").splitlines())
    assert f"the model uses {vocab:,}" in proc.stdout
    assert json.loads((run / "run.json").read_text())["source_options"] == {
        "encoding": "cp1252",
        "text_field": "body",
    }
    text = (run / "tokenizer" / "vocab.txt").read_text(encoding="utf-8")
    assert "caf\u00e9" in text or "cafe" in text  # decoded as cp1252, not replaced


@pytest.mark.slow
def test_small_corpus_gets_a_validation_split(tmp_path):
    src = tmp_path / "small.txt"
    src.write_text("\n\n".join(f"Short note number {i} about apples and pears." for i in range(300)), encoding="utf-8")
    run = tmp_path / "run"
    args = ("pretrain", src, "--out", run, "--budget", "2steps", "--no-progress", *TINY)
    proc = cli(*args, "--set", "tokenizer.vocab_size=200", "--set", "data.seq_len=64")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "validation split was enlarged" in proc.stdout
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("val_loss") is not None for r in rows), rows[-1]


def test_python_api_takes_the_reading_options(tmp_path):
    import cramkit
    from cramkit.errors import CramkitError

    with pytest.raises(CramkitError, match="unknown encoding 'no-such-codec'"):
        cramkit.pretrain(str(tmp_path), out=tmp_path / "run", encoding="no-such-codec")
    with pytest.raises(CramkitError, match="--doc-split"):
        cramkit.pretrain(str(tmp_path), out=tmp_path / "run", doc_split="sentences")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ 3: paths read from an HF index


def test_hf_index_cannot_name_files_outside_the_model_folder(tmp_path, minilm_dir):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "weights.safetensors").symlink_to(minilm_dir / "model.safetensors")
    model = tmp_path / "models" / "minilm"
    model.mkdir(parents=True)
    for f in minilm_dir.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copyfile(f, model / f.name)
    from safetensors import safe_open

    with safe_open(minilm_dir / "model.safetensors", "pt") as f:
        names = list(f.keys())
    escape = "../../outside/weights.safetensors"
    index = {"metadata": {}, "weight_map": {n: escape for n in names}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    proc = cli("export", f"hf:{model}", "--out", tmp_path / "exported", timeout=120)
    one_line(proc, "model.safetensors.index.json", escape, "outside the model folder")
    assert not (tmp_path / "exported").exists()


# ---------------------------------------------------------------------- 23: an export's tokenizer


@pytest.mark.integration
def test_remote_code_export_tokenizer_loads_without_a_prompt(tmp_path, pretrained_run):
    out = tmp_path / "hf"
    proc = cli("export", pretrained_run, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["model_type"] == "cramkit"  # remote-code format
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "BertTokenizerFast"
    code = (
        "import sys; from transformers import AutoModel, AutoTokenizer, BertTokenizerFast\n"
        f"t = BertTokenizerFast.from_pretrained({str(out)!r}); print(type(t).__name__, t('hello world')['input_ids'])\n"
        f"a = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True); print(type(a).__name__)\n"
        f"m = AutoModel.from_pretrained({str(out)!r}, trust_remote_code=True); print(type(m).__name__)\n"
    )
    check = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert check.returncode == 0, check.stderr
    both = check.stdout + check.stderr
    assert "[y/N]" not in both and "UNEXPECTED" not in both, both
    assert "CramkitModel" in check.stdout and "BertTokenizer" in check.stdout
