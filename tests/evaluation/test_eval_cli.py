"""`cramkit eval glue` and `cramkit finetune` from the command line: outputs and clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cramkit.cli import main
from recipes.test_finetune import sst2_sentences


def _head(src: Path, dst: Path, n: int) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(src.read_text(encoding="utf-8").splitlines(keepends=True)[:n]), encoding="utf-8")


@pytest.fixture(scope="module")
def small_glue(glue_dir: Path, tmp_path_factory) -> Path:
    """The real CoLA, SST-2 and MRPC files, cut to their first rows (official layout, quirks kept)."""
    root = tmp_path_factory.mktemp("glue")
    for task in ("CoLA", "SST-2", "MRPC"):
        for split, n in (("train", 161), ("dev", 81), ("test", 41)):
            _head(glue_dir / task / f"{split}.tsv", root / task / f"{split}.tsv", n)
    return root


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_eval_glue_writes_results_table_and_chart(tiny_run: Path, small_glue: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "eval"
    argv = ["eval", "glue", "--from", str(tiny_run), "--data-dir", str(small_glue), "--out", str(out)]
    rc, stdout, _ = _run(
        [*argv, "--set", "epochs=1", "--set", "min_steps=0", "--set", "max_length=64", "--no-progress"],
        capsys,
    )
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["tasks"]) == {"glue/cola", "glue/sst2", "glue/mrpc"}
    assert set(res["skipped"]) == {"glue/stsb", "glue/qqp", "glue/mnli", "glue/qnli", "glue/rte", "glue/wnli"}
    main_scores = [
        res["entries"]["glue/cola"]["mcc"],
        res["entries"]["glue/sst2"]["accuracy"],
        res["entries"]["glue/mrpc"]["f1"],
    ]
    assert res["glue_average"] == pytest.approx(sum(main_scores) / 3)
    table = (out / "results.md").read_text()
    for name in ("glue/cola", "glue/sst2", "glue/mrpc", "GLUE average", "glue/rte"):
        assert name in table
    assert f"{res['glue_average']:.2f}" in table and "GLUE average" in stdout
    assert (out / "scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for task, file in (("cola", "CoLA.tsv"), ("sst2", "SST-2.tsv"), ("mrpc", "MRPC.tsv")):
        rows = (out / task / "predictions" / file).read_text().splitlines()
        assert rows[0] == "index\tprediction" and len(rows) == 41


def test_finetune_user_task_from_csv(tiny_run: Path, tmp_path: Path, capsys) -> None:
    import csv

    rows = [
        ("a truly wonderful film", "pos"),
        ("dull and lifeless", "neg"),
        ("great fun", "pos"),
        ("awful", "neg"),
    ] * 10
    for split in ("train", "dev"):
        with open(tmp_path / f"{split}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["review", "stars"])
            w.writerows(rows)
    out = tmp_path / "out"
    argv = [
        "finetune",
        "--from",
        str(tiny_run),
        "--train",
        str(tmp_path / "train.csv"),
        "--dev",
        str(tmp_path / "dev.csv"),
        "--text-a",
        "review",
        "--label",
        "stars",
        "--out",
        str(out),
        "--set",
        "epochs=2",
        "--set",
        "min_steps=0",
        "--no-progress",
    ]
    rc, stdout, _ = _run(argv, capsys)
    assert rc == 0 and "user/train dev: accuracy" in stdout
    res = json.loads((out / "results.json").read_text())
    assert res["train_examples"] == 40 and res["median"]["dev"]["metrics"]["accuracy"] >= 50.0


def test_unknown_task_lists_known_ones(tiny_run: Path, capsys) -> None:
    rc, _, err = _run(["finetune", "--task", "glue/sst3", "--from", str(tiny_run)], capsys)
    assert rc == 2 and "unknown task 'glue/sst3'" in err and "glue/sst2" in err and "glue/mnli" in err
    assert "Traceback" not in err


def test_missing_source_path(small_glue: Path, tmp_path: Path, capsys) -> None:
    argv = [
        "finetune",
        "--task",
        "glue/sst2",
        "--data-dir",
        str(small_glue),
        "--from",
        str(tmp_path / "nope"),
    ]
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and "no such directory" in err and str(tmp_path / "nope") in err


def test_missing_split_names_the_file(tiny_run: Path, small_glue: Path, tmp_path: Path, capsys) -> None:
    root = tmp_path / "glue"
    _head(small_glue / "SST-2" / "train.tsv", root / "SST-2" / "train.tsv", 50)  # no dev.tsv
    argv = [
        "finetune",
        "--task",
        "glue/sst2",
        "--data-dir",
        str(root),
        "--from",
        str(tiny_run),
        "--out",
        str(tmp_path / "o"),
    ]
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and "dev.tsv" in err and "does not exist" in err
    assert not (tmp_path / "o").exists()  # nothing trained, nothing written


def test_vocab_mismatch_from_the_command_line(
    minilm_dir: Path, tiny_run: Path, small_glue: Path, tmp_path: Path, capsys
) -> None:
    # a HF directory whose tokenizer is not the model's own (the tiny run's)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("config.json", "model.safetensors"):  # copies: a link out of the directory is refused
        shutil.copy(minilm_dir / name, mixed / name)
    shutil.copy(tiny_run / "tokenizer" / "tokenizer.json", mixed / "tokenizer.json")
    argv = ["finetune", "--task", "glue/sst2", "--data-dir", str(small_glue), "--from", f"hf:{mixed}"]
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and "different vocabularies" in err and "30522" in err
    assert "Traceback" not in err


def test_bad_setting_is_named(tiny_run: Path, small_glue: Path, capsys) -> None:
    argv = [
        "finetune",
        "--task",
        "glue/sst2",
        "--data-dir",
        str(small_glue),
        "--from",
        str(tiny_run),
        "--set",
        "lr=fast",
    ]
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and "finetune.lr" in err


def _tsv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n", encoding="utf-8")


@pytest.mark.integration
def test_eval_mnli_both_dev_sets_ax_and_stsb_regression(glue_dir: Path, tiny_run: Path, tmp_path: Path) -> None:
    """Tasks whose data we lack, from small files in the official layout: MNLI (two dev sets, two test
    files, and the AX diagnostic predicted by the MNLI model) and STS-B (regression)."""
    from cramkit.recipes.evaluate import evaluate_suite
    from cramkit.recipes.finetune_config import FinetuneConfig

    sents = sst2_sentences(glue_dir, 400)
    labels = ["entailment", "neutral", "contradiction"]
    root = tmp_path / "glue"
    head = ["index", "genre", "sentence1", "sentence2", "gold_label"]
    pairs = [[str(i), "fiction", sents[i], sents[i + 1], labels[i % 3]] for i in range(0, 240, 2)]
    _tsv(root / "MNLI" / "train.tsv", head, pairs[:80])
    _tsv(root / "MNLI" / "dev_matched.tsv", head, pairs[80:100])
    _tsv(root / "MNLI" / "dev_mismatched.tsv", head, pairs[100:120])
    for name in ("test_matched", "test_mismatched"):
        _tsv(root / "MNLI" / f"{name}.tsv", head[:4], [p[:4] for p in pairs[:15]])
    _tsv(
        root / "diagnostic" / "diagnostic.tsv",
        ["index", "sentence1", "sentence2"],
        [[str(i), sents[i], sents[i + 7]] for i in range(12)],
    )
    shead = ["index", "genre", "sentence1", "sentence2", "score"]
    sts = [[str(i), "news", sents[i], sents[i + 3], f"{(i * 7) % 51 / 10:.1f}"] for i in range(120)]
    _tsv(root / "STS-B" / "train.tsv", shead, sts[:80])
    _tsv(root / "STS-B" / "dev.tsv", shead, sts[80:])
    _tsv(root / "STS-B" / "test.tsv", shead[:4], [r[:4] for r in sts[:10]])

    cfg = FinetuneConfig(epochs=1, max_length=64, seeds=[0, 1], min_steps=0)
    res = evaluate_suite("glue", tiny_run, root, tmp_path / "out", cfg, progress=False)
    assert set(res["tasks"]) == {"glue/mnli", "glue/stsb"}
    assert set(res["entries"]) == {"glue/mnli:dev_matched", "glue/mnli:dev_mismatched", "glue/stsb"}
    e = res["entries"]
    expected = (
        e["glue/mnli:dev_matched"]["accuracy"] + e["glue/mnli:dev_mismatched"]["accuracy"] + e["glue/stsb"]["spearman"]
    ) / 3
    assert res["glue_average"] == pytest.approx(expected)
    pred = tmp_path / "out" / "mnli" / "predictions"
    for file, n in (("MNLI-m.tsv", 15), ("MNLI-mm.tsv", 15), ("AX.tsv", 12)):
        rows = (pred / file).read_text().splitlines()
        assert len(rows) == n + 1 and {r.split("\t")[1] for r in rows[1:]} <= set(labels)
    sts_rows = (tmp_path / "out" / "stsb" / "predictions" / "STS-B.tsv").read_text().splitlines()[1:]
    assert len(sts_rows) == 10 and all(float(r.split("\t")[1]) == float(r.split("\t")[1]) for r in sts_rows)
    assert "dev_mismatched" in (tmp_path / "out" / "results.md").read_text()


def test_finetune_glue_task_with_seeds(tiny_run: Path, small_glue: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "sst2"
    argv = [
        "finetune",
        "--task",
        "glue/sst2",
        "--from",
        str(tiny_run / "checkpoints" / "step-000010"),
        "--data-dir",
        str(small_glue),
        "--out",
        str(out),
        "--seeds",
        "0,1,2",
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--set",
        "finetune.max_length=64",
        "--no-progress",
    ]
    rc, stdout, _ = _run(argv, capsys)
    assert rc == 0 and "glue/sst2 dev: accuracy" in stdout and "(median of 3 seeds: " in stdout
    res = json.loads((out / "results.json").read_text())
    assert [r["seed"] for r in res["seeds"]] == [0, 1, 2] and res["config"]["max_length"] == 64
    accs = sorted(r["dev"]["dev"]["metrics"]["accuracy"] for r in res["seeds"])
    assert res["median"]["dev"]["metrics"]["accuracy"] == accs[1]
    assert res["test_predictions"]["seed"] in (0, 1, 2)
    assert len((out / "predictions" / "SST-2.tsv").read_text().splitlines()) == 41


def test_bad_row_stops_or_is_skipped(tiny_run: Path, small_glue: Path, tmp_path: Path, capsys) -> None:
    root = tmp_path / "glue"
    for split in ("train", "dev"):
        _head(small_glue / "SST-2" / f"{split}.tsv", root / "SST-2" / f"{split}.tsv", 81)
    with open(root / "SST-2" / "train.tsv", "a", encoding="utf-8") as f:
        f.write("a row\twith three\tcolumns\n")
    argv = [
        "finetune",
        "--task",
        "glue/sst2",
        "--data-dir",
        str(root),
        "--from",
        str(tiny_run),
        "--out",
        str(tmp_path / "o"),
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--no-progress",
    ]
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and "train.tsv, line 82" in err and "--skip-bad-rows" in err
    rc, _, err = _run([*argv, "--skip-bad-rows"], capsys)
    assert rc == 0 and '"train": 1' in err
    assert json.loads((tmp_path / "o" / "results.json").read_text())["skipped_rows"] == {"train": 1}


def test_eval_tasks_filter_missing_split_and_resume(tiny_run: Path, small_glue: Path, tmp_path: Path, capsys) -> None:
    import shutil

    data = tmp_path / "glue"
    shutil.copytree(small_glue, data)
    (data / "MRPC" / "train.tsv").unlink()  # a task folder with dev/test only: skipped with a note
    out = tmp_path / "eval"
    argv = [
        "eval",
        "glue",
        "--from",
        str(tiny_run),
        "--data-dir",
        str(data),
        "--out",
        str(out),
        "--tasks",
        "sst2,mrpc",
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--set",
        "max_length=64",
        "--no-progress",
    ]
    rc, stdout, err = _run(argv, capsys)
    assert rc == 0, err
    res = json.loads((out / "results.json").read_text())
    assert list(res["tasks"]) == ["glue/sst2"]
    assert res["skipped"] == {"glue/mrpc": "no train split in --data-dir"}
    assert "[1/1] glue/sst2" in err and "partial" in stdout and "x100" in stdout
    first = (out / "sst2" / "results.json").read_text()
    rc, _, err = _run(argv, capsys)  # a rerun (after an interruption) reuses finished tasks
    assert rc == 0 and "already done" in err and (out / "sst2" / "results.json").read_text() == first
    rc, _, err = _run([*argv[:-7], "--tasks", "nope"], capsys)
    assert rc == 2 and "unknown GLUE task" in err


@pytest.mark.integration
def test_finetune_killed_midway_resumes_to_the_same_result(tiny_run: Path, small_glue: Path, tmp_path: Path) -> None:
    """`cramkit finetune --out` killed (SIGKILL) after a checkpoint: the same command resumes the seed from
    its checkpoint, keeps the finished seed, and ends with what an uninterrupted run gives, bit for bit."""
    import os
    import signal
    import subprocess
    import sys
    import time

    def argv(out: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "cramkit",
            "finetune",
            "--task",
            "glue/sst2",
            "--data-dir",
            str(small_glue),
            "--from",
            str(tiny_run),
            "--out",
            str(out),
            "--seeds",
            "0,1",
            "--no-progress",
            "--set",
            "epochs=3",
            "--set",
            "min_steps=0",
            "--set",
            "checkpoint_every=4steps",
            "--set",
            "batch_size=8",
        ]

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed = tmp_path / "killed"
    proc = subprocess.Popen(argv(killed), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    seed1 = killed / "seeds" / "seed-1" / "checkpoints"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not (seed1 / "latest").is_file():
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (killed / "seeds" / "seed-0" / "result.json").is_file()  # seed 0 finished before the kill
    resumed = subprocess.run(argv(killed), capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming" in resumed.stderr and "seed-1" in resumed.stderr
    straight = subprocess.run(argv(tmp_path / "straight"), capture_output=True, text=True, env=env, timeout=300)
    assert straight.returncode == 0, straight.stderr[-2000:]
    a = json.loads((killed / "results.json").read_text())
    b = json.loads((tmp_path / "straight" / "results.json").read_text())
    for key in ("median", "kept_seed", "score"):
        assert a[key] == b[key], key
    assert [s["loss_curve"] for s in a["seeds"]] == [s["loss_curve"] for s in b["seeds"]]
    # the seeds' checkpoints are gone once the kept model is saved; it loads and matches
    assert not (killed / "seeds" / "seed-1" / "checkpoints").exists()
    from safetensors.torch import load_file

    wa, wb = load_file(killed / "model.safetensors"), load_file(tmp_path / "straight" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)
    # a different setting on the same --out is refused, not mixed in
    other = subprocess.run(argv(killed)[:-2] + ["--set", "batch_size=4"], capture_output=True, text=True, env=env)
    assert other.returncode == 2 and "other settings" in other.stderr and "Traceback" not in other.stderr
