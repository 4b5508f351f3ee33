"""CLUE and FewCLUE: the readers on the real FewCLUE files, CLUE's layout written from their rows, FewCLUE's
protocol through `cramkit eval clue` and `cramkit finetune`, the submission files read back, bad input."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from cramkit.cli import main
from cramkit.errors import CramkitError
from cramkit.tasks import get_suite, get_task
from recipes.test_finetune import make_tiny_run

FEWCLUE_PRESENT = ("eprstmt", "csldcp", "iflytek", "ocnli", "csl", "cluewsc", "chid")


@pytest.fixture(scope="module")
def fewclue(shared_data: Path) -> Path:
    from conftest import _need

    return _need(shared_data / "fewclue")


@pytest.fixture(scope="module")
def zh_run(fewclue: Path, tmp_path_factory) -> Path:
    """A tiny run pretrained (10 steps) on EPRSTMT's unlabelled reviews: a Chinese vocabulary."""
    sentences = [r["sentence"] for r in _lines(fewclue / "eprstmt" / "unlabeled.json")[:3000]]
    return make_tiny_run(tmp_path_factory.mktemp("zh") / "run", sentences)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------------------------ readers


def test_every_fewclue_task_reads_with_its_counts_labels_and_fields(fewclue: Path) -> None:
    tasks = {t.name: t for t in get_suite("clue").tasks(fewclue)}
    assert set(tasks) == {f"clue/{k}" for k in FEWCLUE_PRESENT}
    few = [t.name.split("/")[1] for t in get_suite("fewclue").tasks(fewclue)]  # in FewCLUE's own order
    assert few == ["eprstmt", "csldcp", "iflytek", "ocnli", "chid", "csl", "cluewsc"]
    for name, task in tasks.items():
        folder = fewclue / name.split("/")[1]
        assert task.train_split == "train_few_all" and task.dev_splits == ["dev_few_all", "test_public"]
        # FewCLUE reports test_public; the dev split (not the test) picks between runs
        assert task.scored_splits == ["test_public"] and task.selection_splits == ["dev_few_all"]
        for split in ("train_0", "dev_3", "train_few_all", "dev_few_all", "test_public", "test"):
            rows = _lines(folder / f"{split}.json")
            examples = task.examples(split)
            assert len(examples) == len(rows) and task.skipped[split] == 0, (name, split)
            labelled = split != "test"
            assert all((e.label is not None) == labelled for e in examples), (name, split)
            if split == "test":  # the submission is keyed by the file's own ids
                assert [e.idx for e in examples] == [r.get("id", r.get("idx")) for r in rows]
            elif task.is_multiple_choice:
                assert [e.label for e in examples] == [r["answer"] for r in rows]
            else:
                assert [task.labels[e.label] for e in examples] == [str(r["label"]) for r in rows]
    eprstmt, csl, wsc, chid = (tasks[f"clue/{k}"] for k in ("eprstmt", "csl", "cluewsc", "chid"))
    assert eprstmt.labels == ["Negative", "Positive"] and tasks["clue/csldcp"].num_labels == 67
    assert tasks["clue/iflytek"].labels == [str(i) for i in range(119)]
    assert tasks["clue/ocnli"].labels == ["entailment", "neutral", "contradiction"]
    row = _lines(fewclue / "csl" / "train_0.json")[0]
    first = csl.examples("train_0")[0]
    assert first.text_a == " ".join(row["keyword"]) and first.text_b == row["abst"].strip()
    row = _lines(fewclue / "cluewsc" / "train_0.json")[0]  # 树叶 at 22, 他 at 30
    text, t = row["text"], row["target"]
    assert wsc.examples("train_0")[0].text_a == (
        text[: t["span1_index"]]
        + "_树叶_"
        + text[t["span1_index"] + 2 : t["span2_index"]]
        + "[他]"
        + text[t["span2_index"] + 1 :]
    )
    assert chid.kind == "multiple_choice" and chid.labels is None
    for e in chid.examples("test_public"):
        assert len(e.choices) == 7 and 0 <= e.label < 7 and e.text_a.count("[MASK]") == 1
        assert len(e.text_a) <= 2 * 48 + len("[MASK]") and "#idiom" not in e.text_a


@pytest.fixture()
def clue_layout(fewclue: Path, tmp_path: Path) -> Path:
    """CLUE's layout (train.json, dev.json, test.json; CHID's passages with #idiomN# and answer files),
    written from FewCLUE rows, with rows a CLUE download has: NLI rows labelled '-', TNEWS' label_desc."""
    root = tmp_path / "clue"
    for key in ("ocnli", "cluewsc", "csl"):
        for split, src in (("train", "train_0"), ("dev", "dev_0"), ("test", "test")):
            _write(root / key / f"{split}.json", _lines(fewclue / key / f"{src}.json")[:20])
    with open(root / "ocnli" / "train.json", "a", encoding="utf-8") as f:
        f.write(json.dumps({"sentence1": "一", "sentence2": "二", "label": "-", "id": 99}) + "\n")
    reviews = _lines(fewclue / "eprstmt" / "train_0.json")
    tnews = [
        {"label": "10" + str(2 * (i % 2)), "label_desc": "news_x", "sentence": r["sentence"], "keywords": ""}
        for i, r in enumerate(reviews)
    ]
    _write(root / "tnews" / "train.json", tnews)
    _write(root / "tnews" / "dev.json", tnews[:8])
    _write(root / "tnews" / "test.json", [{"id": i, "sentence": r["sentence"]} for i, r in enumerate(tnews[:5])])
    # CHID as CLUE ships it: passages with numbered blanks, answers in a separate file
    few = _lines(fewclue / "chid" / "train_0.json")[:6]
    for split, rows in (("train", few[:3]), ("dev", few[3:]), ("test", few[3:])):
        answers, passages = {}, []
        for j, r in enumerate(rows):
            tag = f"#idiom{100 * (split == 'test') + j:06d}#"
            passages.append(r["content"].replace("#idiom#", tag))
            answers[tag] = r["answer"]
        _write(root / "chid" / f"{split}.json", [{"candidates": few[0]["candidates"], "content": passages}])
        if split != "test":
            (root / "chid" / f"{split}_answer.json").write_text(json.dumps(answers), encoding="utf-8")
    return root


def test_clue_layout_is_read_from_train_dev_test(clue_layout: Path) -> None:
    tasks = {t.name: t for t in get_suite("clue").tasks(clue_layout)}
    assert set(tasks) == {"clue/ocnli", "clue/cluewsc", "clue/csl", "clue/tnews", "clue/chid"}
    ocnli = tasks["clue/ocnli"]
    assert ocnli.train_split == "train" and ocnli.dev_splits == ["dev"] and ocnli.test_splits == ["test"]
    assert len(ocnli.examples("train")) == 20 and ocnli.skipped["train"] == 1  # the '-' row: skipped, counted
    assert ocnli.leaderboard_file("test") == "ocnli_50k_predict.json"
    assert tasks["clue/cluewsc"].leaderboard_file("test") == "cluewsc11_predict.json"
    tnews = tasks["clue/tnews"]  # its 15 string labels (105 and 111 unused), named as in label_desc
    assert tnews.labels == [
        "100",
        "101",
        "102",
        "103",
        "104",
        "106",
        "107",
        "108",
        "109",
        "110",
        "112",
        "113",
        "114",
        "115",
        "116",
    ]
    assert tnews.label_names[:3] == ["news_story", "news_culture", "news_entertainment"]
    assert {tnews.labels[e.label] for e in tnews.examples("train")} == {"100", "102"}
    assert tnews.leaderboard_file("test") == "tnews11_predict.json"
    chid = tasks["clue/chid"]
    train = chid.examples("train")
    assert [e.idx for e in train] == [0, 1, 2] and all(e.text_a.count("[MASK]") == 1 for e in train)
    assert [e.label for e in chid.examples("dev")] == [
        r for r in json.loads((clue_layout / "chid" / "dev_answer.json").read_text()).values()
    ]
    test = chid.examples("test")
    assert all(e.label is None for e in test) and [e.idx for e in test] == [100, 101, 102]
    # CLUE's CHID submission: one object {"#idiomN#": answer}; FewCLUE's: {"id", "answer"} lines
    path = chid.write_predictions("test", [(100, 2), (101, 0), (102, 6)], clue_layout / "sub")
    assert path.name == "chid11_predict.json"
    assert json.loads(path.read_text()) == {"#idiom000100#": 2, "#idiom000101#": 0, "#idiom000102#": 6}
    with pytest.raises(CramkitError, match="predict every example"):
        chid.write_predictions("test", [(100, 2)], clue_layout / "sub")


# ------------------------------------------------------------------------------------------------ bad input


def _one_task(tmp_path: Path, key: str, rows: list[dict], split: str = "train") -> Path:
    _write(tmp_path / "d" / key / f"{split}.json", rows)
    return tmp_path / "d"


@pytest.mark.parametrize(
    ("key", "row", "message"),
    [
        (
            "cluewsc",
            {
                "text": "他说她来了",
                "label": "true",
                "target": {"span1_index": 1, "span1_text": "她", "span2_index": 0, "span2_text": "他"},
            },
            "span1_text '她' is not at span1_index 1",
        ),
        (
            "chid",
            {"id": 0, "candidates": ["一心一意", "三心二意"], "content": "#idiom# 与 #idiom#", "answer": 0},
            "2 #idiom# blanks",
        ),
        ("eprstmt", {"id": 0, "sentence": "还行", "label": "Neutral"}, "label 'Neutral' is not one of"),
        ("eprstmt", {"id": 0, "text": "还行", "label": "Positive"}, "no field 'sentence'"),
    ],
)
def test_bad_rows_stop_with_the_line_or_are_skipped_and_counted(
    tmp_path: Path, key: str, row: dict, message: str, capsys
) -> None:
    good = {
        "cluewsc": {
            "text": "他说她来了",
            "label": "false",
            "target": {"span1_index": 2, "span1_text": "她", "span2_index": 0, "span2_text": "他"},
        },
        "chid": {"id": 1, "candidates": ["一心一意", "三心二意"], "content": "他做事#idiom#", "answer": 0},
        "eprstmt": {"id": 1, "sentence": "很好", "label": "Positive"},
    }[key]
    root = _one_task(tmp_path, key, [good, row, good])
    argv = ["finetune", "--task", f"clue/{key}", "--data-dir", str(root), "--from", str(tmp_path)]
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and message in err and "train.json, line 2" in err and "--skip-bad-rows" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    task = get_task(f"clue/{key}", data_dir=root, skip_bad_rows=True)
    assert len(task.examples("train")) == 2 and task.skipped["train"] == 1


def test_a_file_that_is_not_json_lines(tmp_path: Path, capsys) -> None:
    (tmp_path / "d" / "afqmc").mkdir(parents=True)
    (tmp_path / "d" / "afqmc" / "train.json").write_text("sentence1\tsentence2\tlabel\n一\t二\t0\n", encoding="utf-8")
    argv = ["finetune", "--task", "clue/afqmc", "--data-dir", str(tmp_path / "d"), "--from", str(tmp_path)]
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and "train.json, line 1: not valid JSON" in err and "JSON Lines" in err
    assert "Traceback" not in err
    row = {"sentence1": "双十一花呗提额在哪", "sentence2": "里可以提花呗额度", "label": "0"}
    (tmp_path / "d" / "afqmc" / "train.json").write_bytes(json.dumps(row, ensure_ascii=False).encode("gbk"))
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and "is not UTF-8 text" in err and "Traceback" not in err


def test_chid_passage_whose_blanks_lack_answers(tmp_path: Path) -> None:
    root = tmp_path / "d"
    _write(
        root / "chid" / "train.json",
        [{"candidates": ["一心一意", "三心二意"], "content": ["甲#idiom000001#乙#idiom000002#"]}],
    )
    with pytest.raises(CramkitError, match="train_answer.json, which does not exist"):
        get_task("clue/chid", data_dir=root).examples("train")
    (root / "chid" / "train_answer.json").write_text('{"#idiom000001#": 1}', encoding="utf-8")
    with pytest.raises(CramkitError, match="passage 0 has 2 #idiomN# blanks but 1 of them have an answer"):
        get_task("clue/chid", data_dir=root).examples("train")
    (root / "chid" / "train_answer.json").write_text('{"#idiom000001#": 1, "#idiom000002#": 0}', encoding="utf-8")
    rows = get_task("clue/chid", data_dir=root).examples("train")  # one row per blank, the other one hidden
    assert [(e.text_a, e.label, e.idx) for e in rows] == [
        ("甲[MASK]乙[UNK]", 1, 1),
        ("甲[UNK]乙[MASK]", 0, 2),
    ]


def test_unknown_task_and_suite_names(tmp_path: Path, capsys) -> None:
    rc, _, err = _run(["finetune", "--task", "clue/eprstm", "--from", str(tmp_path)], capsys)
    assert rc == 2 and "Did you mean 'clue/eprstmt'?" in err
    rc, _, err = _run(["eval", "clue", "--from", str(tmp_path), "--tasks", "eprstm"], capsys)
    assert rc == 2 and "unknown CLUE task(s) eprstm" in err and "did you mean 'eprstmt'?" in err
    rc, _, err = _run(["eval", "cleu", "--from", str(tmp_path)], capsys)
    assert rc == 2 and "unknown suite 'cleu'. Did you mean 'clue'?" in err
    rc, out, _ = _run(["eval", "fewclue", "--help"], capsys)  # the suite's own help: its tasks, its data
    assert rc == 0 and out.startswith("usage: cramkit eval fewclue") and "tasks eprstmt, csldcp, tnews" in out
    rc, _, err = _run(["eval", "clue", "--from", str(tmp_path), "--fewshot-splits", "0-x"], capsys)
    assert rc == 2 and "--fewshot-splits '0-x'" in err


def test_fewclue_split_missing_for_the_asked_k(fewclue: Path, zh_run: Path, tmp_path: Path, capsys) -> None:
    root = tmp_path / "few"
    shutil.copytree(
        fewclue / "eprstmt", root / "eprstmt", ignore=shutil.ignore_patterns("unlabeled.json", "train_1.json")
    )
    out = tmp_path / "o"
    argv = [
        "finetune",
        "--task",
        "clue/eprstmt",
        "--data-dir",
        str(root),
        "--from",
        str(zh_run),
        "--fewshot-splits",
        "0-1",
        "--out",
        str(out),
    ]
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and "FewCLUE split 1 needs" in err and "train_1.json" in err and "Traceback" not in err
    assert not out.exists()  # nothing trained, nothing written
    rc, _, err = _run(
        [
            "eval",
            "clue",
            "--from",
            str(zh_run),
            "--data-dir",
            str(root),
            "--out",
            str(out),
            "--fewshot-splits",
            "0,1",
        ],
        capsys,
    )
    assert rc == 2 and "train_1.json" in err and not out.exists()


# ------------------------------------------------------------------------------------------------ protocol


def _submission_ids_cover_test(file: Path, test: Path, labels: set[str]) -> None:
    """The independent check: one JSON object a line, {"id", "label"}, the ids exactly those of test.json."""
    rows = [json.loads(line) for line in file.read_text(encoding="utf-8").split("\n") if line]
    assert all(set(r) == {"id", "label"} and r["label"] in labels for r in rows)
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in _lines(test))


@pytest.mark.integration
def test_fewclue_protocol_through_eval_clue(fewclue: Path, zh_run: Path, tmp_path: Path) -> None:
    root = tmp_path / "few"
    for key in ("eprstmt", "cluewsc"):  # cluewsc is present but not asked for
        shutil.copytree(fewclue / key, root / key, ignore=shutil.ignore_patterns("unlabeled.json"))
    out = tmp_path / "eval"
    cmd = [
        sys.executable,
        "-m",
        "cramkit",
        "eval",
        "clue",
        "--from",
        str(zh_run),
        "--data-dir",
        str(root),
        "--tasks",
        "eprstmt",
        "--fewshot-splits",
        "0-1",
        "--out",
        str(out),
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--set",
        "max_length=64",
        "--no-progress",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["suite"] == "clue" and list(res["tasks"]) == ["clue/eprstmt"] and res["skipped"] == {}
    few = res["tasks"]["clue/eprstmt"]["fewshot"]
    assert few["splits"] == ["0", "1"]
    per = [json.loads((out / "eprstmt" / f"split-{k}" / "results.json").read_text()) for k in "01"]
    scores = [p["median"]["test_public"]["metrics"]["accuracy"] for p in per]
    assert [p["score"] for p in per] == scores  # a run's score is test_public's, not its mean with dev_K's
    assert [few["per_split"][k]["score"] for k in "01"] == scores
    assert few["mean"] == pytest.approx(statistics.mean(scores)) and few["std"] == pytest.approx(
        statistics.stdev(scores)
    )
    assert res["average"] == pytest.approx(few["mean"]) and res["entries"] == {
        "clue/eprstmt": {"accuracy": pytest.approx(few["mean"])}
    }
    assert [p["train_examples"] for p in per] == [32, 32] and [p["dev_examples"]["test_public"] for p in per] == [
        610,
        610,
    ]
    table = (out / "results.md").read_text()
    assert "split 1: train_1 -> test_public" in table and f"{few['mean']:.2f} ± {few['std']:.2f}" in table
    assert "CLUE average (partial)" in table and "# CLUE results" in proc.stdout
    assert (out / "scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (out / "submission").iterdir()) == [
        "eprstmt_predict_0.json",
        "eprstmt_predict_1.json",
    ]
    for k in "01":
        _submission_ids_cover_test(
            out / "submission" / f"eprstmt_predict_{k}.json",
            root / "eprstmt" / "test.json",
            {"Positive", "Negative"},
        )


def test_fewclue_protocol_through_finetune(fewclue: Path, zh_run: Path, tmp_path: Path, capsys) -> None:
    root = tmp_path / "few"
    shutil.copytree(fewclue / "eprstmt", root / "eprstmt", ignore=shutil.ignore_patterns("unlabeled.json"))
    out = tmp_path / "ft"
    argv = [
        "finetune",
        "--task",
        "clue/eprstmt",
        "--data-dir",
        str(root),
        "--from",
        str(zh_run),
        "--fewshot-splits",
        "1,few_all",
        "--out",
        str(out),
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
    few = res["fewshot"]
    assert few["splits"] == ["1", "few_all"] and res["train_examples"] == {"1": 32, "few_all": 160}
    assert (
        "clue/eprstmt split few_all: test_public accuracy" in stdout
        and f"{few['mean']:.2f} ± {few['std']:.2f}" in stdout
    )
    for k in ("1", "few_all"):
        assert (out / f"split-{k}" / "model.safetensors").is_file()  # each split's model: predict/export it
    names = sorted(p.name for p in (out / "submission").iterdir())
    assert names == ["eprstmt_predict_1.json", "eprstmt_predict_all.json"]
    _submission_ids_cover_test(out / "submission" / names[1], root / "eprstmt" / "test.json", {"Positive", "Negative"})
    assert "split few_all" in (out / "results.md").read_text() and (out / "scores.png").is_file()
    first = (out / "results.json").read_text()
    rc, _, err = _run(argv, capsys)  # the same command again (after an interruption): finished splits reused
    assert rc == 0 and "seed 0" not in err and (out / "results.json").read_text() == first


def test_fewshot_splits_on_the_clue_layout(clue_layout: Path, tmp_path: Path, capsys) -> None:
    argv = [
        "finetune",
        "--task",
        "clue/ocnli",
        "--data-dir",
        str(clue_layout),
        "--from",
        str(tmp_path),
        "--fewshot-splits",
        "0",
    ]
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and "needs FewCLUE's layout" in err
    argv = ["eval", "clue", "--data-dir", str(clue_layout), "--from", str(tmp_path), "--fewshot-splits", "0"]
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and "no task to run" in err and "FewCLUE's layout" in err


def test_eval_clue_on_the_clue_layout(clue_layout: Path, zh_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "eval"
    argv = [
        "eval",
        "clue",
        "--from",
        str(zh_run),
        "--data-dir",
        str(clue_layout),
        "--out",
        str(out),
        "--tasks",
        "ocnli,cluewsc",
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
    assert list(res["tasks"]) == ["clue/ocnli", "clue/cluewsc"] and set(res["entries"]) == set(res["tasks"])
    accs = [res["entries"][t]["accuracy"] for t in res["tasks"]]
    assert res["average"] == pytest.approx(sum(accs) / 2) and "glue_average" not in res
    assert json.loads((out / "ocnli" / "results.json").read_text())["skipped_rows"] == {"train": 1}  # the '-'
    assert sorted(res["submission"]) == ["cluewsc11_predict.json", "ocnli_50k_predict.json"]
    for name, key in (("cluewsc11_predict.json", "cluewsc"), ("ocnli_50k_predict.json", "ocnli")):
        labels = {"true", "false"} if key == "cluewsc" else {"entailment", "neutral", "contradiction"}
        _submission_ids_cover_test(out / "submission" / name, clue_layout / key / "test.json", labels)
    assert "CLUE average (partial)" in stdout and "| clue/ocnli | dev |" in stdout
