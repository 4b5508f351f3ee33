"""GLUE: the real CoLA / SST-2 / MRPC files, and the other six tasks from fixtures in their official layouts."""

from __future__ import annotations

import sys
import types
from collections import Counter
from pathlib import Path

import pytest

from cramkit.errors import CramkitError
from cramkit.tasks import get_task
from cramkit.tasks import glue as glue_mod

# ---------------------------------------------------------------------------------------------------
# Real files: counts and labels counted here independently of the reader


def _rows(path: Path, header: bool) -> list[list[str]]:
    text = path.read_text(encoding="utf-8-sig")
    rows = [line.split("\t") for line in text.split("\n") if line.strip()]
    return rows[1:] if header else rows


REAL = {
    # task: {split: (file, header, label column, expected rows)}
    "glue/cola": {"train": ("CoLA/train.tsv", False, 1, 8551), "dev": ("CoLA/dev.tsv", False, 1, 1043)},
    "glue/sst2": {"train": ("SST-2/train.tsv", True, 1, 67349), "dev": ("SST-2/dev.tsv", True, 1, 872)},
    "glue/mrpc": {"train": ("MRPC/train.tsv", True, 0, 3668), "dev": ("MRPC/dev.tsv", True, 0, 408)},
}
# label distributions of the official files (label "1" first)
KNOWN_LABELS = {
    ("glue/cola", "train"): (6023, 2528),
    ("glue/cola", "dev"): (721, 322),
    ("glue/sst2", "train"): (37569, 29780),
    ("glue/sst2", "dev"): (444, 428),
    ("glue/mrpc", "train"): (2474, 1194),
    ("glue/mrpc", "dev"): (279, 129),
}
TEST_ROWS = {
    "glue/cola": ("CoLA/test.tsv", 1063),
    "glue/sst2": ("SST-2/test.tsv", 1821),
    "glue/mrpc": ("MRPC/test.tsv", 1725),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_train_dev_counts_and_labels(real_glue_dir, name):
    task = get_task(name, data_dir=real_glue_dir)
    assert task.labels == ["0", "1"] and task.num_labels == 2 and not task.is_regression
    for split, (fname, header, label_col, n_expected) in REAL[name].items():
        rows = _rows(real_glue_dir / fname, header)
        assert len(rows) == n_expected
        examples = task.examples(split)
        assert len(examples) == n_expected
        assert task.skipped[split] == 0
        gold = Counter(r[label_col] for r in rows)
        got = Counter(task.labels[e.label] for e in examples)
        assert got == gold
        assert (got["1"], got["0"]) == KNOWN_LABELS[(name, split)]
        assert all(e.text_a and e.label in (0, 1) for e in examples)
        assert all((e.text_b is not None) == (name == "glue/mrpc") for e in examples)


def test_real_texts_keep_quotes(real_glue_dir):
    """MRPC sentences contain unbalanced quotes: they must stay text (no CSV quoting)."""
    train = get_task("glue/mrpc", data_dir=real_glue_dir).examples("train")
    assert train[0].text_a.startswith('Amrozi accused his brother , whom he called " the witness "')
    dev = get_task("glue/mrpc", data_dir=real_glue_dir).examples("dev")
    assert dev[0].text_b == '" The foodservice pie business does not fit our long-term growth strategy .'
    cola = get_task("glue/cola", data_dir=real_glue_dir).examples("train")
    assert cola[0].text_a == "Our friends won't buy this analysis, let alone the next one we propose."


@pytest.mark.parametrize("name", sorted(TEST_ROWS))
def test_real_test_splits_unlabelled_with_indices(real_glue_dir, name, tmp_path):
    fname, n = TEST_ROWS[name]
    rows = _rows(real_glue_dir / fname, header=True)
    assert len(rows) == n
    task = get_task(name, data_dir=real_glue_dir)
    test = task.examples("test")
    assert len(test) == n
    assert all(e.label is None for e in test)
    assert [e.idx for e in test] == [int(r[0]) for r in rows]
    # leaderboard file: header, one row per test example, 0/1 labels, the leaderboard's file name
    preds = [(e.idx, e.idx % 2) for e in test]
    out = task.write_predictions("test", preds, tmp_path)
    assert out.name == {"glue/cola": "CoLA.tsv", "glue/sst2": "SST-2.tsv", "glue/mrpc": "MRPC.tsv"}[name]
    lines = out.read_text().splitlines()
    assert lines[0] == "index\tprediction"
    assert lines[1:4] == ["0\t0", "1\t1", "2\t0"]
    assert len(lines) == n + 1
    with pytest.raises(CramkitError, match=f"cover {n - 1} indices but the split has {n}"):
        task.write_predictions("test", preds[1:], tmp_path / "partial")
    assert not (tmp_path / "partial").exists() or not any((tmp_path / "partial").iterdir())


def test_glue_tasks_of_present_folders(glue_dir):
    assert [t.name for t in glue_mod.glue_tasks(glue_dir)] == ["glue/cola", "glue/sst2", "glue/mrpc"]


def test_data_dir_from_env_and_task_folder(glue_dir, monkeypatch):
    monkeypatch.setenv("CRAMKIT_GLUE_DIR", str(glue_dir))
    assert len(get_task("glue/mrpc").examples("dev")) == 408
    # --data-dir pointing at the task folder itself also works
    assert len(get_task("glue/mrpc", data_dir=glue_dir / "MRPC").examples("dev")) == 408


# ---------------------------------------------------------------------------------------------------
# The six tasks we have no data for: fixtures in their official layouts

MNLI_TRAIN_HEAD = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label"
)
MNLI_DEV_HEAD = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label"
)
MNLI_TEST_HEAD = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"
)
STSB_HEAD = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"


def _mnli_row(i, s1, s2, labels):
    parse = f"( ( {s1} ) )\t( ( {s2} ) )\t(ROOT (S {s1}))\t(ROOT (S {s2}))"
    return "\t".join([str(i), f"{31193 + i}", f"{31193 + i}n", "government", parse, s1, s2, *labels])


def _write(root: Path, rel: str, lines: list[str]) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")


def make_glue_fixture(root: Path) -> Path:
    """STS-B, QQP, MNLI, QNLI, RTE, WNLI and the diagnostic set, with the official headers and columns."""
    _write(
        root,
        "STS-B/train.tsv",
        [
            STSB_HEAD + "\tscore",
            "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\tAn air plane is taking off.\t5.000",
            "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man is playing a large flute.\tA man is playing a flute.\t3.800",
            '2\tmain-news\theadlines\t2013\t0010\tnone\tnone\t"Obama" says no.\tObama says "no\t1.250',
        ],
    )
    _write(
        root,
        "STS-B/dev.tsv",
        [
            STSB_HEAD + "\tscore",
            "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man with a hard hat is dancing.\tA man wearing a hard hat is dancing.\t5.000",
            "1\tmain-captions\tMSRvid\t2012test\t0002\tnone\tnone\tA young child is riding a horse.\tA child is riding a horse.\t4.750",
        ],
    )
    _write(
        root,
        "STS-B/test.tsv",
        [
            STSB_HEAD,
            "0\tmain-captions\tMSRvid\t2012test\t0024\tnone\tnone\tA girl is styling her hair.\tA girl is brushing her hair.",
            "1\tmain-captions\tMSRvid\t2012test\t0033\tnone\tnone\tA group of men play soccer.\tMen are playing soccer.",
        ],
    )
    qqp = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
    _write(
        root,
        "QQP/train.tsv",
        [
            qqp,
            "133273\t213221\t213222\tHow is the life of a math student?\tWhich level of prepration is enough for the exam jlpt5?\t0",
            '402555\t536040\t536041\tHow do I control my "horny" emotions?\tHow do you control your horniness?\t1',
            # a row broken by a stray newline inside a question, as in the original release
            "360472\t364011\t490273\tWhat causes stool color to change to yellow?",
            "\tWhat can cause stool to come out as little balls?\t0",
            "150662\t155721\t7256\tWhat can one do after MBBS?\tWhat do i do after my MBBS ?\t1",
        ],
    )
    _write(
        root,
        "QQP/dev.tsv",
        [
            qqp,
            "201359\t303345\t303346\tWhy are African-Americans so beautiful?\tWhy are hispanics so beautiful?\t0",
            "263843\t69383\t380476\tI want to pursue PhD in Computer Science about social network,what is the open problem in social networks?\tI handle social media for a non-profit. Should I start going to social media networking events? Are there any good ones in the bay area?\t0",
        ],
    )
    _write(
        root,
        "QQP/test.tsv",
        [
            "id\tquestion1\tquestion2",
            "0\tWhy am I mentally very lonely? How can I solve it?\tFind the remainder when [math]23^{24}[/math] is divided by 24,23?",
            "1\tWhich one dissolve in water quikly sugar, salt, methane and carbon di oxide?\tWhich fish would survive in salt water?",
        ],
    )
    _write(
        root,
        "MNLI/train.tsv",
        [
            MNLI_TRAIN_HEAD,
            _mnli_row(
                0,
                "Conceptually cream skimming has two basic dimensions - product and geography.",
                "Product and geography are what make cream skimming work.",
                ["neutral", "neutral"],
            ),
            _mnli_row(
                1,
                "you know during the season and i guess at at your level uh you lose them",
                "You lose the things to the following level if the people recall.",
                ["entailment", "entailment"],
            ),
            _mnli_row(
                2,
                "One of our number will carry out your instructions minutely.",
                "A member of my team will execute your orders with immense precision.",
                ["entailment", "entailment"],
            ),
            _mnli_row(
                3,
                "How do you know? All this is their information again.",
                "This information belongs to them.",
                ["contradiction", "contradiction"],
            ),
        ],
    )
    for name, n in (("dev_matched", 3), ("dev_mismatched", 2)):
        rows = [
            _mnli_row(
                i,
                f"Premise {name} {i}.",
                f"Hypothesis {i}.",
                ["neutral"] * 5 + [["neutral", "contradiction", "entailment"][i % 3]],
            )
            for i in range(n)
        ]
        _write(root, f"MNLI/{name}.tsv", [MNLI_DEV_HEAD, *rows])
    for name, n in (("test_matched", 3), ("test_mismatched", 4)):
        _write(
            root,
            f"MNLI/{name}.tsv",
            [MNLI_TEST_HEAD, *[_mnli_row(i, f"P {name} {i}.", f"H {i}.", []) for i in range(n)]],
        )
    _write(
        root,
        "QNLI/train.tsv",
        [
            "index\tquestion\tsentence\tlabel",
            "0\tWhen did the third Digimon series begin?\tUnlike the two seasons before it and most of the seasons that followed, Digimon Tamers takes a darker and more realistic approach.\tnot_entailment",
            "1\tWhich missile batteries often have individual launchers several kilometres from one another?\tWhen MANPADS is operated by specialists, batteries may have several dozen teams deploying separately in small sections.\tnot_entailment",
            "2\tWhat two things does Popper argue Tarski's theory involves?\tHe bases this interpretation on the fact that these are both theories.\tentailment",
        ],
    )
    _write(
        root,
        "QNLI/dev.tsv",
        [
            "index\tquestion\tsentence\tlabel",
            "0\tWhat came into force after the new constitution was herald?\tAs of that day, the new constitution heralding the Second Republic came into force.\tentailment",
        ],
    )
    _write(
        root,
        "QNLI/test.tsv",
        [
            "index\tquestion\tsentence",
            "0\tWhat organization is devoted to Jihad against Israel?\tFor some decades prior to the First Palestine Intifada...",
        ],
    )
    for task, labels in (("RTE", ["not_entailment", "entailment"]), ("WNLI", ["1", "0"])):
        _write(
            root,
            f"{task}/train.tsv",
            [
                "index\tsentence1\tsentence2\tlabel",
                *[f"{i}\t{task} premise number {i}.\t{task} hypothesis {i}.\t{labels[i % 2]}" for i in range(4)],
            ],
        )
        _write(
            root,
            f"{task}/dev.tsv",
            ["index\tsentence1\tsentence2\tlabel", f"0\tDev premise.\tDev hypothesis.\t{labels[0]}"],
        )
        _write(
            root,
            f"{task}/test.tsv",
            [
                "index\tsentence1\tsentence2",
                *[f"{i}\tTest premise {i}.\tTest hypothesis {i}." for i in range(3)],
            ],
        )
    _write(
        root,
        "diagnostic/diagnostic.tsv",
        [
            "index\tsentence1\tsentence2",
            "0\tThe cat sat on the mat.\tThe cat did not sit on the mat.",
            "1\tThe cat did not sit on the mat.\tThe cat sat on the mat.",
        ],
    )
    return root


@pytest.fixture
def fake_glue(tmp_path) -> Path:
    return make_glue_fixture(tmp_path / "glue_data")


def test_stsb(fake_glue, tmp_path):
    t = get_task("glue/stsb", data_dir=fake_glue)
    assert t.is_regression and t.num_labels == 1 and t.labels is None
    assert t.metrics == ["pearson", "spearman"] and t.main_metric == "spearman"
    train = t.examples("train")
    assert [e.label for e in train] == [5.0, 3.8, 1.25]
    assert (train[2].text_a, train[2].text_b) == ('"Obama" says no.', 'Obama says "no')
    assert [e.idx for e in t.examples("test")] == [0, 1] and t.examples("test")[1].label is None
    out = t.write_predictions("test", [(1, 5.61234), (0, 2.0)], tmp_path / "sub")
    assert out.name == "STS-B.tsv"
    assert out.read_text() == "index\tprediction\n0\t2.000\n1\t5.612\n"


def test_qqp_tolerates_the_broken_rows_of_its_train_file(fake_glue, tmp_path):
    t = get_task("glue/qqp", data_dir=fake_glue)
    train = t.examples("train")
    assert [e.idx for e in train] == [133273, 402555, 150662]  # ids from the 'id' column
    assert [e.label for e in train] == [0, 1, 1]
    assert train[1].text_a == 'How do I control my "horny" emotions?'
    assert t.skipped["train"] == 2  # both halves of the broken row
    assert t.metrics == ["f1", "accuracy"] and t.main_metric == "f1"
    test = t.examples("test")
    assert [(e.idx, e.label) for e in test] == [(0, None), (1, None)]
    assert "[math]23^{24}[/math]" in test[0].text_b
    out = t.write_predictions("test", [(0, 1), (1, 0)], tmp_path)
    assert (out.name, out.read_text()) == ("QQP.tsv", "index\tprediction\n0\t1\n1\t0\n")


def test_mnli_all_five_splits(fake_glue, tmp_path):
    t = get_task("glue/mnli", data_dir=fake_glue)
    assert t.labels == ["entailment", "neutral", "contradiction"] and t.num_labels == 3
    assert t.dev_splits == ["dev_matched", "dev_mismatched"]
    assert t.test_splits == ["test_matched", "test_mismatched"]
    train = t.examples("train")
    assert [t.labels[e.label] for e in train] == ["neutral", "entailment", "entailment", "contradiction"]
    assert train[0].text_a.startswith("Conceptually cream skimming") and train[0].text_b.startswith("Product and")
    dm = t.examples("dev_matched")
    assert [t.labels[e.label] for e in dm] == [
        "neutral",
        "contradiction",
        "entailment",
    ]  # gold_label, not label1
    assert len(t.examples("dev_mismatched")) == 2
    tm, tmm = t.examples("test_matched"), t.examples("test_mismatched")
    assert (len(tm), len(tmm)) == (3, 4) and all(e.label is None for e in tm + tmm)
    m = t.write_predictions("test_matched", [(e.idx, e.idx % 3) for e in tm], tmp_path)
    mm = t.write_predictions("test_mismatched", [(e.idx, "neutral") for e in tmm], tmp_path)
    assert m.name == "MNLI-m.tsv" and mm.name == "MNLI-mm.tsv"
    assert m.read_text().splitlines() == [
        "index\tprediction",
        "0\tentailment",
        "1\tneutral",
        "2\tcontradiction",
    ]
    assert mm.read_text().splitlines()[1:] == ["0\tneutral", "1\tneutral", "2\tneutral", "3\tneutral"]
    with pytest.raises(CramkitError, match="has no split 'dev'.*dev_matched"):
        t.examples("dev")


@pytest.mark.parametrize(
    ("name", "labels", "board"),
    [
        ("glue/qnli", ["entailment", "not_entailment"], "QNLI.tsv"),
        ("glue/rte", ["entailment", "not_entailment"], "RTE.tsv"),
        ("glue/wnli", ["0", "1"], "WNLI.tsv"),
    ],
)
def test_pair_tasks(fake_glue, tmp_path, name, labels, board):
    t = get_task(name, data_dir=fake_glue)
    assert t.labels == labels and t.metrics == ["accuracy"]
    train = t.examples("train")
    assert all(e.text_b for e in train) and {e.label for e in train} <= {0, 1}
    if name != "glue/qnli":
        file_labels = [
            line.split("\t")[-1] for line in (fake_glue / board[:-4] / "train.tsv").read_text().splitlines()[1:]
        ]
        assert [t.labels[e.label] for e in train] == file_labels
    test = t.examples("test")
    out = t.write_predictions("test", [(e.idx, 1) for e in test], tmp_path)
    assert out.name == board
    assert out.read_text().splitlines()[1] == f"0\t{labels[1]}"


def test_ax_diagnostic(fake_glue, tmp_path):
    t = get_task("glue/ax", data_dir=fake_glue)
    assert list(t.splits) == ["test"] and t.labels == ["entailment", "neutral", "contradiction"]
    out = t.write_predictions("test", [(0, 2), (1, 0)], tmp_path)
    assert (out.name, out.read_text()) == ("AX.tsv", "index\tprediction\n0\tcontradiction\n1\tentailment\n")


def test_glue_tasks_over_all_nine(fake_glue):
    for task in ("CoLA", "SST-2", "MRPC"):  # add the three real-data tasks as tiny fixtures
        (fake_glue / task).mkdir()
    (fake_glue / "CoLA/train.tsv").write_text("gj04\t1\t\tA fine sentence.\ngj04\t0\t*\tSentence bad a.\n")
    (fake_glue / "SST-2/train.tsv").write_text("sentence\tlabel\ngood film \t1\n")
    (fake_glue / "MRPC/train.tsv").write_text("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA .\tB .\n")
    tasks = glue_mod.glue_tasks(fake_glue)
    assert [t.name.split("/")[1] for t in tasks] == glue_mod.GLUE_TASKS
    sizes = {"cola": 2, "sst2": 1, "mrpc": 1, "stsb": 3, "qqp": 3, "mnli": 4, "qnli": 3, "rte": 4, "wnli": 4}
    assert {t.name.split("/")[1]: len(t.examples("train")) for t in tasks} == sizes


def test_wrong_column_count_names_file_and_line(fake_glue):
    path = fake_glue / "RTE/train.tsv"
    lines = path.read_text().splitlines()
    lines.insert(3, "9\tonly two columns")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        CramkitError,
        match=r"RTE/train.tsv, line 4: expected 4 tab-separated columns, found 2.*--skip-bad-rows",
    ) as e:
        get_task("glue/rte", data_dir=fake_glue).examples("train")
    assert "Traceback" not in str(e.value)
    t = get_task("glue/rte", data_dir=fake_glue, skip_bad_rows=True)
    assert len(t.examples("train")) == 4 and t.skipped == {"train": 1}


def test_label_outside_the_set(fake_glue):
    path = fake_glue / "QNLI/dev.tsv"
    path.write_text(path.read_text() + "1\tA question?\tA sentence.\tmaybe\n")
    with pytest.raises(
        CramkitError,
        match=r"QNLI/dev.tsv, line 3: label 'maybe' is not one of \['entailment', 'not_entailment'\]",
    ):
        get_task("glue/qnli", data_dir=fake_glue).examples("dev")
    t = get_task("glue/qnli", data_dir=fake_glue, skip_bad_rows=True)
    assert len(t.examples("dev")) == 1 and t.skipped["dev"] == 1
    stsb = fake_glue / "STS-B/dev.tsv"
    stsb.write_text(stsb.read_text() + "2\tg\tf\ty\t0\tnone\tnone\tA.\tB.\tabc\n")
    with pytest.raises(CramkitError, match=r"STS-B/dev.tsv, line 4: score 'abc' is not a number"):
        get_task("glue/stsb", data_dir=fake_glue).examples("dev")


def test_headerless_cola_bad_rows(tmp_path):
    cola = tmp_path / "CoLA"
    cola.mkdir()
    (cola / "train.tsv").write_text("gj04\t1\t\tGood one.\ngj04\t2\t\tLabel two.\ngj04\t0\tFour columns missing\n")
    with pytest.raises(CramkitError, match="train.tsv, line 2: label '2'"):
        get_task("glue/cola", data_dir=tmp_path).examples("train")
    t = get_task("glue/cola", data_dir=tmp_path, skip_bad_rows=True)
    assert [e.text_a for e in t.examples("train")] == ["Good one."] and t.skipped["train"] == 2


def test_qqp_dev_broken_row_is_an_error(fake_glue):
    path = fake_glue / "QQP/dev.tsv"
    path.write_text(path.read_text() + "5\t6\t7\tWhat is\n")
    with pytest.raises(CramkitError, match="QQP/dev.tsv, line 4: expected 6"):
        get_task("glue/qqp", data_dir=fake_glue).examples("dev")


def test_missing_split_file_and_folder(fake_glue, monkeypatch):
    (fake_glue / "RTE/test.tsv").unlink()
    t = get_task("glue/rte", data_dir=fake_glue)
    assert len(t.examples("train")) == 4
    with pytest.raises(CramkitError, match=r"needs the file .*RTE/test.tsv, which does not exist"):
        t.examples("test")
    with pytest.raises(CramkitError, match=r"has no split 'validation'.*train, dev, test"):
        t.examples("validation")
    monkeypatch.setattr(glue_mod, "_datasets_available", lambda: False)
    with pytest.raises(CramkitError, match=r"no folder .*nowhere/CoLA.*`datasets`.*train.tsv, dev.tsv, test.tsv"):
        get_task("glue/cola", data_dir=fake_glue / "nowhere")
    with pytest.raises(CramkitError, match=r"none of the GLUE task folders .* is in .*nowhere"):
        glue_mod.glue_tasks(fake_glue / "nowhere")


def test_wrong_layout_header(tmp_path):
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE/train.tsv").write_text("premise\thypothesis\tlabel\nA.\tB.\tentailment\n")
    with pytest.raises(CramkitError, match="has no column 'sentence1' .*premise, hypothesis, label"):
        get_task("glue/rte", data_dir=tmp_path).examples("train")


def test_unknown_task_suggests(fake_glue):
    with pytest.raises(
        CramkitError, match=r"unknown task 'glue/sst-2'\. Did you mean 'glue/sst2'\?.*glue/cola.*glue/wnli"
    ):
        get_task("glue/sst-2")
    with pytest.raises(CramkitError, match="Did you mean 'glue/rte'"):
        get_task("rte")


# ---------------------------------------------------------------------------------------------------
# The hub path (a stand-in `datasets` module: the real one is optional and the tests are offline)


def test_hub_fallback(tmp_path, monkeypatch):
    calls = []

    def load_dataset(path, name, split):
        calls.append((path, name, split))
        if split == "train":
            raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)")
        rows = [{"premise": "P.", "hypothesis": "H.", "label": 2, "idx": 0}]
        if split.startswith("test"):
            rows = [{"premise": "P.", "hypothesis": "H.", "label": -1, "idx": 5}]
        return rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(glue_mod, "_datasets_available", lambda: True)
    t = get_task("glue/mnli", data_dir=tmp_path)
    assert t.examples("dev_mismatched")[0].label == 2  # "contradiction" in the hub's order as in ours
    assert t.examples("test_matched")[0] == glue_mod.Example("P.", "H.", None, 5)
    assert ("nyu-mll/glue", "mnli", "validation_mismatched") in calls
    with pytest.raises(
        CramkitError,
        match=r"no folder .*MNLI, and loading hf:nyu-mll/glue/mnli\[train\].*failed.*Provide the official GLUE files in",
    ):
        t.examples("train")


def test_stray_tab_in_last_text_field_keeps_label_last(tmp_path):
    # a tab inside sentence2 gives 11 fields; the score is still the last one (as HF's processor reads it)
    hdr = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    row = "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane.\tAn air\tplane.\t4.500"
    _write(tmp_path, "STS-B/train.tsv", [hdr, row])
    (ex,) = get_task("glue/stsb", data_dir=tmp_path).examples("train")
    assert (ex.text_a, ex.text_b, ex.label) == ("A plane.", "An air\tplane.", 4.5)
