"""A new user's first task (issue 66, items 13-16): a movie-review CSV with labels ``0``/``1`` (SST-2's own rows),
``--few-shot``, unlabelled texts and a labelled ``--test`` file, through the real command from a run ``cramkit
pretrain`` made. What the run says first, the model it keeps and names, the test file scored, ``predict --from OUT``,
the labels named at training time."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from clirun import cli
from cramkit.errors import CramkitError
from cramkit.progress import parts_left
from cramkit.selftraining.recipe import kept_model

FAST = ["--set", "min_steps=30", "--set", "max_length=48", "--set", "self_train_epochs=0.05", "--no-progress"]


def _sst2_rows(glue_dir: Path) -> list[list[str]]:
    lines = (glue_dir / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[:2] for line in lines]


def _user_files(glue_dir: Path, root: Path) -> dict[str, Path]:
    """reviews.csv (text,label: 0/1), test.csv (labelled), more.csv (texts only; 20 of them labelled rows)."""
    rows = _sst2_rows(glue_dir)
    files = {name: root / f"{name}.csv" for name in ("reviews", "test", "more")}
    for name, part, header in (("reviews", rows[:200], ["text", "label"]), ("test", rows[1000:1100], None)):
        with open(files[name], "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows([header or ["text", "label"], *part])
    with open(files["more"], "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["text"], *([r[0]] for r in rows[:20] + rows[3000:3150])])
    return files


def test_kept_model_keeps_the_student_only_where_the_evidence_says_it_is_better() -> None:
    few = SimpleNamespace(selection_splits=["fewshot_dev"], dev_splits=["fewshot_dev", "dev"])

    def res(sel: float) -> dict:
        return {"median": {"fewshot_dev": {"score": sel}}, "score": sel}

    def answers(only_teacher: int, only_student: int, both: int = 15) -> tuple[np.ndarray, np.ndarray]:
        wrong = 32 - both - only_teacher - only_student
        t = np.array([True] * both + [True] * only_teacher + [False] * only_student + [False] * wrong)
        s = np.array([True] * both + [False] * only_teacher + [True] * only_student + [False] * wrong)
        return t, s

    # the case: 56.25 each on the 32 drawn dev rows (a tie), the kept labels expected 63% right
    kept, why = kept_model(few, res(56.25), res(56.25), answers(3, 3), expected=0.63)
    assert kept == "teacher" and why.startswith("the two tie, nothing says the student is better: on fewshot_dev")
    assert kept_model(few, res(56.25), res(56.25), answers(0, 0))[0] == "teacher"  # the same answers: a tie too
    # the student one row ahead, but its labels expected right less often than the teacher answers the rows
    kept, why = kept_model(few, res(56.25), res(59.38), answers(2, 3, both=16), expected=0.55)
    assert kept == "teacher" and "its pseudo-labels are expected 55% right, under the teacher's 56%" in why
    # labels expected better than the teacher: within chance, the student (MRPC's split where it was 5.9 F1 ahead)
    assert kept_model(few, res(56.25), res(53.12), answers(4, 3, both=14), expected=0.8)[0] == "student"
    # ahead beyond chance decides either way, whatever the estimate
    kept, why = kept_model(few, res(40.62), res(59.38), answers(0, 6, both=13), expected=0.3)
    assert kept == "student" and why.startswith("the student is ahead beyond chance")
    assert kept_model(few, res(59.38), res(40.62), answers(6, 0, both=13), expected=0.99)[0] == "teacher"


def test_the_time_left_over_splits_is_the_splits_left_at_the_measured_mean() -> None:
    assert parts_left(1, 5, [95.0]) == "1 of 5 done in 1m35s; about 6m20s left (1m35s each)"
    assert parts_left(2, 5, [95.0, 105.0]) == "2 of 5 done in 1m45s; about 5m00s left (1m40s each)"


def test_the_new_user_task_says_the_flag_keeps_a_named_model_and_scores_the_test_file(
    tiny_run: Path, glue_dir: Path, tmp_path: Path
) -> None:
    files = _user_files(glue_dir, tmp_path)
    out = tmp_path / "out"
    base = ["finetune", "--from", tiny_run, "--train", files["reviews"], "--text-a", "text", "--label", "label"]
    proc = cli(
        *base, "--few-shot", "8", "--splits", "2", "--unlabelled", files["more"], "--test", files["test"],
        "--out", out, *FAST,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.splitlines()
    # item 14: the first line says the labels are not words, what it costs, and the exact flag for these labels
    assert err[0].startswith("finetune: the labels '0' / '1' of user/reviews are not words: the head starts at random")
    assert "--unlabelled has no prior" in err[0] and '--set "prior=0=It was terrible.,1=It was great."' in err[0]
    assert "--set label_names=0=negative,1=positive" in err[0]
    res = json.loads((out / "results.json").read_text())
    # item 15: the unlabelled rows equal to a labelled or drawn dev row, counted in one line per split (as many
    # rows as the file holds: GLUE's SST-2, or the built-in tasks' shorter one on a clone without ../shared)
    given = len(files["more"].read_text(encoding="utf-8").splitlines()) - 1
    for key in ("0", "1"):
        st = res["fewshot"]["per_split"][key]["self_training"]
        assert st["dropped"] >= 1 and st["unlabelled_rows"] == given - st["dropped"]
        said = f"cramkit: self-training split {key} drops {st['dropped']} of the {given:,} unlabelled rows"
        assert sum(line.startswith(said) for line in err) == 1
    # the --test file: scored by every split and their mean, in results.json, results.md and the summary
    per = [res["fewshot"]["per_split"][k]["test"]["test"]["score"] for k in ("0", "1")]
    assert res["test"]["test"]["score"] == pytest.approx(np.mean(per)) and 0 <= min(per) <= max(per) <= 100
    assert f"test (labelled test file) accuracy {np.mean(per):.2f} ± " in proc.stdout
    md = (out / "results.md").read_text()
    assert "FewCLUE" not in md and "LM-BFF's protocol (--few-shot K)" in md and "(labelled test file)" in md
    # OUT loads as the best split's model, said in one line; predict scores the test file as that split did
    kept = res["model"]
    best = max(("0", "1"), key=lambda k: (res["fewshot"]["per_split"][k]["score"], -int(k)))
    assert kept["split"] == best and f"model: split {best}'s, the best of the 2 splits on dev" in proc.stdout
    assert (out / "model.safetensors").read_bytes() == (out / f"split-{best}" / "model.safetensors").read_bytes()
    pred = cli("predict", "--from", out, files["test"], "--out", tmp_path / "p.jsonl")
    assert pred.returncode == 0, pred.stderr
    accuracy = float(re.search(r"accuracy ([\d.]+)", pred.stdout)[1])  # type: ignore[index]
    assert accuracy == pytest.approx(res["fewshot"]["per_split"][best]["test"]["test"]["score"], abs=0.01)
    # item 13: the last line names the teacher's and the student's scores, which was kept, where the other is
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("self-training: teacher ") and "-> student " in last and "kept: " in last, last
    for key in ("0", "1"):
        st = res["fewshot"]["per_split"][key]["self_training"]
        if st["collapsed"]:  # a teacher of one class (a tiny model may be one): said so, no student to name
            assert st["other"] is None and "collapsed (the teacher's result kept) on split(s) " in last
            continue
        other = "student" if st["kept"] == "teacher" else "teacher"
        assert st["other"] == str(out / f"split-{key}" / other)
        assert f"the {st['kept']} is kept ({st['kept_why']}); the {other} is in {st['other']}" in proc.stderr
        assert f"the {st['kept']} on split(s) " in last and f"{out}/split-S/{other}" in last
    # a few-shot folder written before it held a model: one line naming its split folders
    (out / "cramkit-model.json").unlink()
    pred = cli("predict", "--from", out, files["test"], "--out", tmp_path / "q.jsonl")
    assert pred.returncode == 2 and "Traceback" not in pred.stderr
    assert f"is a few-shot run (cramkit finetune --few-shot) whose models are in its split folders: give one of " \
        f"{out}/split-0, {out}/split-1" in pred.stderr  # fmt: skip


def test_label_names_name_what_the_model_answers(tiny_run: Path, glue_dir: Path, tmp_path: Path) -> None:
    files = _user_files(glue_dir, tmp_path)
    base = ["finetune", "--from", tiny_run, "--train", files["reviews"], "--text-a", "text", "--label", "label"]
    out = tmp_path / "named"
    proc = cli(*base, "--out", out, "--set", "label_names=0=negative,1=positive", *FAST)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "cramkit-model.json").read_text())
    assert meta["labels"] == ["negative", "positive"] and meta["extra"]["label_values"] == ["0", "1"]
    pred = cli("predict", "--from", out, files["test"], "--label", "none", "--out", tmp_path / "p.jsonl")
    assert pred.returncode == 0, pred.stderr
    answers = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert {a["label"] for a in answers} <= {"negative", "positive"} and set(answers[0]["probabilities"]) == {
        "negative",
        "positive",
    }
    # the test file's gold 0/1 scored against the names (mapped by position): the same predictions, with metrics
    scored = cli("predict", "--from", out, files["test"], "--out", tmp_path / "s.jsonl")
    assert scored.returncode == 0, scored.stderr
    gold = [line.rsplit(",", 1)[1] for line in files["test"].read_text().splitlines()[1:]]
    got = [json.loads(line)["label"] for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert got == [a["label"] for a in answers] and "accuracy" in scored.stdout + scored.stderr
    right = sum(g == {"negative": "0", "positive": "1"}[p] for g, p in zip(gold, got, strict=True))
    assert f"{100 * right / len(gold):.2f}" in scored.stdout + scored.stderr
    exported = cli("export", out, "--format", "hf", "--out", tmp_path / "hf")
    assert exported.returncode == 0, exported.stderr
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    # names in the labels' order are taken too; a wrong count, or names that repeat, are one line before training
    for setting, said in (
        ("label_names=bad", "label_names 'bad': 1 names for 2 labels; give one name per label of user/reviews"),
        ("label_names=a,a", "label_names 'a,a': the names must be distinct"),
        ("label_names=0=neg,2=pos", "label_names '0=neg,2=pos' names labels ['0', '2']"),
    ):
        bad = cli(*base, "--out", tmp_path / "bad", "--set", setting, *FAST)
        assert bad.returncode == 2 and said in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert not (tmp_path / "bad").exists()


def test_label_names_that_are_words_describe_the_classes(glue_dir: Path, tmp_path: Path) -> None:
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.label_prior import given_label_names, no_words_line, prior_spec
    from cramkit.tasks.resolve import resolve_task

    files = _user_files(glue_dir, tmp_path)
    task = resolve_task(None, train=files["reviews"], text_a="text", label="label", dev_fraction=0.1)
    assert prior_spec(task, FinetuneConfig(), pair=False)[0] is None  # labels 0/1: no words
    assert no_words_line(task, FinetuneConfig(), pair=False) is not None
    named = FinetuneConfig(label_names="negative,positive")  # in the labels' order
    assert given_label_names(task, named) == ["negative", "positive"]
    spec, _ = prior_spec(task, named, pair=False)
    assert spec is not None and spec.descriptions == {"0": "negative", "1": "positive"}
    assert no_words_line(task, named, pair=False) is None  # the names are words: nothing to say
    own = FinetuneConfig(label_names="0=negative,1=positive", prior="positive=A great film.,negative=A bad film.")
    spec, _ = prior_spec(task, own, pair=False)  # descriptions keyed by the names given
    assert spec is not None and spec.descriptions == {"0": "A bad film.", "1": "A great film."}
    with pytest.raises(CramkitError, match="a prompt model answers its labels through --label-words"):
        given_label_names(task, FinetuneConfig(label_names="a,b", method="prompt", prompt="{text} [MASK] ."))
