"""Mixtures: rates, the resumable mixture loader, and `cramkit finetune --mixture` through the real CLI,
from a run `cramkit pretrain` made, on real GLUE files; then the one-head-per-task model in load, predict,
export and serve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import cramkit
from clirun import cli
from cramkit.errors import CramkitError
from cramkit.tasks.mixtures import Mixture, mixture_rates, resolve_mixture


def test_rate_rules():
    sizes = [3000, 1000, 100]
    assert mixture_rates("proportional", sizes) == pytest.approx(np.array(sizes) / 4100)
    assert mixture_rates("equal", sizes) == pytest.approx([1 / 3] * 3)
    assert mixture_rates("capped:1000", sizes) == pytest.approx(np.array([1000, 1000, 100]) / 2100)
    t2 = np.sqrt(sizes)
    assert mixture_rates("temperature:2", sizes) == pytest.approx(t2 / t2.sum())
    assert mixture_rates("2,1,1", sizes) == pytest.approx([0.5, 0.25, 0.25])
    mix = Mixture("m", ("glue/mrpc", "glue/cola"), "capped:500")
    assert mix.examples_per_epoch([3668, 8551]) == 1000
    for bad in ("capped", "capped:x", "temperature:0", "1,2,3", "-1,2", "0,0", "sometimes"):
        with pytest.raises(CramkitError, match="--rates"):
            mixture_rates(bad, [10, 20])


def test_resolve_names_tasks_and_mixtures():
    mix = resolve_mixture("glue/mrpc, glue/cola", rates="equal")
    assert mix.tasks == ("glue/mrpc", "glue/cola") and mix.rates == "equal" and mix.name == "mrpc+cola"
    assert resolve_mixture("glue-small").tasks[0] == "glue/mrpc"
    with pytest.raises(CramkitError, match="Did you mean 'glue/mrpc'"):
        resolve_mixture("glue/mrcp,glue/cola")
    with pytest.raises(CramkitError, match="a task is named twice"):
        resolve_mixture("glue/mrpc,glue/mrpc")
    with pytest.raises(CramkitError, match="at least two tasks"):
        resolve_mixture("glue/mrpc")
    with pytest.raises(CramkitError, match="unknown mixture"):
        resolve_mixture("glue-smal")


def test_mixture_loader_draws_by_rate_and_resumes_exactly():
    from cramkit.data.batching import BatchLoader, Encoded
    from cramkit.recipes.multitask import MixtureLoader

    rng = np.random.default_rng(0)

    def encoded(n: int, offset: int) -> Encoded:  # labels offset per task: a batch shows whose rows it holds
        ids = [np.array([1, *rng.integers(5, 50, rng.integers(1, 9)), 2]) for _ in range(n)]
        lengths = np.array([len(x) for x in ids])
        return Encoded(ids, lengths.copy(), lengths, np.arange(n) + offset, np.arange(n), np.zeros(n, bool))

    encs = [encoded(40, 0), encoded(10, 1000)]
    rates = np.array([0.8, 0.2])

    def make():
        loaders = [
            BatchLoader(
                e,
                4,
                2,
                0,
                1,
                seed=3 + i,
                chunk=5,
                pad_id=0,
                with_types=False,
                columns={"labels": torch.from_numpy(e.labels)},
            )
            for i, e in enumerate(encs)
        ]
        return MixtureLoader(loaders, rates, seed=7)

    full = make()
    seq = [(b["task"], b["labels"].tolist()) for b in (next(full) for _ in range(400))]
    tasks = [t for t, _ in seq[::2]]  # two micro-batches per batch
    assert all(t == u for t, u in zip([t for t, _ in seq[::2]], [t for t, _ in seq[1::2]], strict=True))
    share = np.mean(np.array(tasks) == 1)
    assert 0.12 < share < 0.28  # drawn at about its rate of 0.2
    assert all((t == 1) == (lab[0] >= 1000) for t, lab in seq)  # a task's batch carries its own rows
    part = make()
    for _ in range(123):
        next(part)
    state = json.loads(json.dumps(part.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    rest = [(b["task"], b["labels"].tolist()) for b in (next(resumed) for _ in range(400 - 123))]
    assert rest == seq[123:]


@pytest.fixture(scope="module")
def mix_dir(tiny_run: Path, glue_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mix") / "mix"
    r = cli(
        "finetune",
        "--mixture",
        "glue/mrpc,glue/cola",
        "--rates",
        "equal",
        "--from",
        str(tiny_run),
        "--data-dir",
        str(glue_dir),
        "--out",
        str(out),
        "--set",
        "max_train_examples=96",
        "--set",
        "epochs=2",
        "--set",
        "max_length=48",
        "--set",
        "batch_size=8",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    assert "glue/mrpc dev:" in r.stdout and "glue/cola dev:" in r.stdout and "mean of the tasks" in r.stdout
    return out


def test_mixture_trains_both_heads_and_scores_each_task(mix_dir: Path, glue_dir: Path):
    res = json.loads((mix_dir / "results.json").read_text())
    assert set(res["tasks"]) == {"glue/mrpc", "glue/cola"}
    assert res["steps"] == 2 * (192 // 8)  # 2 epochs of the two tasks' 96 examples each, batches of 8
    mrpc, cola = res["tasks"]["glue/mrpc"], res["tasks"]["glue/cola"]
    assert mrpc["rate"] == pytest.approx(0.5) and mrpc["batches"] + cola["batches"] == res["steps"]
    assert 0.3 < mrpc["batches"] / res["steps"] < 0.7
    assert set(mrpc["dev"]["dev"]["metrics"]) == {"f1", "accuracy"} and set(cola["dev"]["dev"]["metrics"]) == {
        "mcc",
        "accuracy",
    }
    n_dev = len((glue_dir / "MRPC" / "dev.tsv").read_text(encoding="utf-8-sig").splitlines()) - 1
    # each head's dev score is what its own model gives: reload the head and score MRPC's dev set again
    m = cramkit.load(mix_dir, task="glue/mrpc")
    assert m.kind == "classifier" and m.task == "glue/mrpc" and m.labels == ["0", "1"]
    whole = cramkit.load(mix_dir)
    assert whole.kind == "multitask"
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    with torch.no_grad():
        a = m.model(ids)[1]
        b = whole.model(ids, task=0)[1]
        c = cramkit.load(mix_dir, task="cola").model(ids)[1]
    assert torch.equal(a, b) and not torch.equal(a, c)
    from cramkit.tasks import get_task

    task = get_task("glue/mrpc", data_dir=glue_dir)
    rows = task.examples("dev")
    assert len(rows) == n_dev
    from cramkit.infer import Engine

    logits = Engine(m, max_length=48).logits([(e.text_a, e.text_b) for e in rows])
    acc = 100 * np.mean(logits.argmax(-1) == np.array([e.label for e in rows]))
    assert acc == pytest.approx(mrpc["dev"]["dev"]["metrics"]["accuracy"], abs=0.5)


def test_rerun_reuses_and_other_settings_refused(mix_dir: Path, tiny_run: Path, glue_dir: Path):
    r = cli(
        "finetune",
        "--mixture",
        "glue/mrpc,glue/cola",
        "--rates",
        "equal",
        "--from",
        str(tiny_run),
        "--data-dir",
        str(glue_dir),
        "--out",
        str(mix_dir),
        "--set",
        "max_train_examples=96",
        "--set",
        "epochs=2",
        "--set",
        "max_length=48",
        "--set",
        "batch_size=8",
        "--no-progress",
    )
    assert r.returncode == 0 and "glue/mrpc dev:" in r.stdout
    r = cli(
        "finetune",
        "--mixture",
        "glue/mrpc,glue/cola",
        "--rates",
        "proportional",
        "--from",
        str(tiny_run),
        "--data-dir",
        str(glue_dir),
        "--out",
        str(mix_dir),
        "--set",
        "max_train_examples=96",
    )
    assert r.returncode == 2 and "other settings" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.integration
def test_predict_export_serve_take_a_task(mix_dir: Path, glue_dir: Path, tmp_path: Path):
    src = glue_dir / "MRPC" / "dev.tsv"
    rows = src.read_text(encoding="utf-8-sig").splitlines()[:21]
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    r = cli("predict", "--from", str(mix_dir), str(tmp_path / "pairs.tsv"))
    assert r.returncode == 2 and "choose one with --task NAME" in r.stderr and "glue/cola" in r.stderr
    r = cli(
        "predict",
        "--from",
        str(mix_dir),
        "--task",
        "glue/mrpc",
        str(tmp_path / "pairs.tsv"),
        "--text-a",
        "#1 String",
        "--text-b",
        "#2 String",
        "--label",
        "Quality",
        "--out",
        str(tmp_path / "p.jsonl"),
    )
    assert r.returncode == 0, r.stderr
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 20 and "metrics: accuracy" in r.stdout
    r = cli("predict", "--from", str(mix_dir), "--task", "glue/rte", str(tmp_path / "pairs.tsv"))
    assert r.returncode == 2 and "has no head for it" in r.stderr
    r = cli("export", str(mix_dir), "--task", "cola", "--out", str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr
    from transformers import AutoModelForSequenceClassification

    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    with torch.no_grad():
        ours = cramkit.load(mix_dir, task="glue/cola").model(ids)[1]
        theirs = hf(input_ids=ids).logits
    assert torch.allclose(ours, theirs, atol=1e-4)

    from serve.test_server import start

    proc, url = start(str(mix_dir))
    try:
        import httpx

        info = httpx.get(f"{url}/info", timeout=30).json()
        assert set(info["models"]) == {"mix-mrpc", "mix-cola"}
        r = httpx.post(f"{url}/predict", json={"model": "mix-cola", "inputs": ["the cat sat on the mat"]}, timeout=30)
        assert r.status_code == 200 and {d["label"] for d in r.json()[0]} == {"0", "1"}
        r = httpx.post(f"{url}/predict", json={"model": "mix-rte", "inputs": ["x"]}, timeout=30)
        assert 400 <= r.status_code < 500
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_bad_mixtures_one_line(tiny_run: Path, glue_dir: Path, tmp_path: Path):
    for args, words in [
        (["--mixture", "glue/mrpc,glue/colla"], "Did you mean 'glue/cola'"),
        (["--mixture", "glue/mrpc,glue/cola", "--rates", "capped:lots"], "--rates"),
        (["--mixture", "glue/mrpc,glue/cola", "--rates", "1,2,3"], "3 weights for 2 tasks"),
        (["--task", "glue/mrpc", "--rates", "equal"], "--rates applies to --mixture"),
        (["--mixture", "glue/mrpc,glue/cola", "--task", "glue/mrpc"], "not both"),
        (["--mixture", "glue/mrpc,glue/cola", "--seeds", "0,1"], "one seed"),
    ]:
        r = cli(
            "finetune",
            *args,
            "--from",
            str(tiny_run),
            "--data-dir",
            str(glue_dir),
            "--out",
            str(tmp_path / "o"),
        )
        assert r.returncode == 2, (args, r.stderr)
        assert words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_crafted_multitask_directory_is_one_line(mix_dir: Path, tmp_path: Path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(mix_dir, bad, ignore=shutil.ignore_patterns("run", "predictions"))
    meta = json.loads((bad / "cramkit-model.json").read_text())
    for tasks in (
        [],
        [{"name": "x", "kind": "classification", "num_labels": 10**9}],
        "heads",
        [{"name": "x", "kind": "python", "num_labels": 2}],
    ):
        meta["extra"]["tasks"] = tasks
        (bad / "cramkit-model.json").write_text(json.dumps(meta))
        with pytest.raises(CramkitError, match="extra.tasks"):
            cramkit.load(bad)


def test_data_dir_per_suite(tmp_path: Path):
    from cramkit.tasks.resolve import data_dir_for

    assert data_dir_for("glue/mrpc", None) is None
    assert data_dir_for("glue/mrpc", ["g"]) == "g"
    given = ["glue=/data/glue", "clue=/data/clue"]
    assert data_dir_for("glue/mrpc", given) == "/data/glue" and data_dir_for("clue/afqmc", given) == "/data/clue"
    assert data_dir_for("superglue/rte", [*given, "/data/other"]) == "/data/other"
    odd = tmp_path / "a=b"  # a folder whose name holds '=' is a folder, not SUITE=DIR
    odd.mkdir()
    assert data_dir_for("glue/mrpc", [str(odd)]) == str(odd)
    with pytest.raises(CramkitError, match="given twice"):
        data_dir_for("glue/mrpc", ["x", "y"])


def test_mixture_reads_each_suite_from_its_folder(tiny_run: Path, glue_dir: Path, tmp_path: Path):
    r = cli(
        "finetune",
        "--mixture",
        "glue/mrpc,glue/cola",
        "--from",
        str(tiny_run),
        "--data-dir",
        f"glue={tmp_path / 'nowhere'}",
        "--out",
        str(tmp_path / "o"),
    )
    assert r.returncode == 2 and "nowhere" in r.stderr and "Traceback" not in r.stderr


def _copa_rows(n: int, start: int, labelled: bool = True) -> list[dict]:
    """COPA rows (SuperGLUE's layout) a tiny model can learn: the right choice repeats the premise's noun."""
    nouns = ["glass", "door", "dog", "car", "lamp", "book"]
    rows = []
    for i in range(start, start + n):
        a, b = nouns[i % len(nouns)], nouns[(i + 1) % len(nouns)]
        right, wrong = f"The {a} moved.", f"The {b} slept."
        first = i % 2 == 0
        row = {
            "premise": f"Someone pushed the {a}.",
            "choice1": right if first else wrong,
            "choice2": wrong if first else right,
            "question": "effect",
            "idx": i - start,
        }
        if labelled:
            row["label"] = 0 if first else 1
        rows.append(row)
    return rows


def test_a_mixture_of_classification_and_multiple_choice(tiny_run: Path, tmp_path: Path):
    """superglue/rte (pairs) with superglue/copa (multiple choice): one encoder, an RTE classifier head and a
    COPA scorer head; each head is its own task's model in load, predict and export."""
    from tasks.test_superglue import _rte_rows, write_superglue

    root = write_superglue(
        tmp_path / "sg",
        {
            "RTE": {
                "train": _rte_rows(32, 0),
                "val": _rte_rows(8, 32),
                "test": _rte_rows(4, 40, labelled=False),
            },
            "COPA": {
                "train": _copa_rows(32, 0),
                "val": _copa_rows(8, 32),
                "test": _copa_rows(4, 40, labelled=False),
            },
        },
    )
    out = tmp_path / "mix"
    r = cli(
        "finetune",
        "--mixture",
        "superglue/rte,superglue/copa",
        "--from",
        str(tiny_run),
        "--data-dir",
        str(root),
        "--out",
        str(out),
        "--set",
        "epochs=2",
        "--set",
        "max_length=32",
        "--set",
        "batch_size=8",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    assert set(res["tasks"]) == {"superglue/rte", "superglue/copa"}
    assert all(0 <= e["dev"]["dev"]["metrics"]["accuracy"] <= 100 for e in res["tasks"].values())
    assert [p.name for p in (out / "predictions").iterdir()] and (
        out / "predictions" / "superglue-copa" / "COPA.jsonl"
    ).is_file()
    copa = cramkit.load(out, task="copa")
    assert copa.kind == "multiple_choice"
    from cramkit.infer import Engine
    from cramkit.tasks import get_task

    rows = get_task("superglue/copa", data_dir=root).examples("dev")
    got = Engine(copa, max_length=32).choose([e.text_a for e in rows], [list(e.choices) for e in rows])
    acc = 100 * np.mean(got.chosen == np.array([e.label for e in rows]))
    assert acc == pytest.approx(res["tasks"]["superglue/copa"]["dev"]["dev"]["metrics"]["accuracy"])
