"""Multiple choice end to end: pair rows per choice, a shared scorer with a softmax over the choices, through
`cramkit finetune`, `cramkit.load`, `cramkit predict`, `cramkit export` (hf and onnx) and `cramkit serve`.

The COPA-like files are written here in SuperGLUE's COPA layout (premise, choice1, choice2, question, label,
idx); one test fine-tunes on real CHID rows (FewCLUE) with the choices built here from its candidates."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

import cramkit
from cramkit.data.batching import BatchLoader, collate, encode_choices
from cramkit.infer import Engine
from cramkit.model.encoder import ModelConfig
from cramkit.model.heads import MultipleChoice
from infer.models import cli, ok

CAUSES = [
    ("dropped the glass", "The glass broke.", "The glass floated away."),
    ("forgot the keys", "The door stayed locked.", "The door sang a song."),
    ("ate too much", "The stomach hurt.", "The stomach turned blue."),
    ("ran in the rain", "The clothes got wet.", "The clothes got dry."),
    ("studied hard", "The exam went well.", "The exam vanished."),
    ("lit a fire", "The room got warm.", "The room froze."),
]
SUBJECTS = ["The man", "The woman", "The child", "My friend", "The teacher", "The neighbour"]


def copa_rows(n: int, seed: int, labelled: bool = True) -> list[dict]:
    """Rows in SuperGLUE COPA's layout; the right choice is choice1 or choice2 at random."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        act, good, bad = rng.choice(CAUSES)
        label = rng.randrange(2)
        c1, c2 = (good, bad) if label == 0 else (bad, good)
        row = {
            "premise": f"{rng.choice(SUBJECTS)} {act}.",
            "choice1": c1,
            "choice2": c2,
            "question": "effect",
        }
        row |= {"label": label} if labelled else {}
        rows.append(row | {"idx": i})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def copa(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("copa")
    write_jsonl(d / "train.jsonl", copa_rows(40, 0))
    write_jsonl(d / "val.jsonl", copa_rows(12, 1))
    write_jsonl(d / "test.jsonl", copa_rows(7, 2, labelled=False))
    return d


@pytest.fixture(scope="module")
def mc_model(copa: Path, pretrained_run: Path, tmp_path_factory) -> Path:
    """`cramkit finetune` of the tiny pretraining run on the COPA-like files (--choices choice1,choice2)."""
    out = tmp_path_factory.mktemp("mc") / "copa"
    ok(
        "finetune",
        "--from",
        str(pretrained_run),
        "--train",
        str(copa / "train.jsonl"),
        "--dev",
        str(copa / "val.jsonl"),
        "--test",
        str(copa / "test.jsonl"),
        "--text-a",
        "premise",
        "--choices",
        "choice1,choice2",
        "--name",
        "copa",
        "--out",
        str(out),
        "--set",
        "max_length=64",
        "--set",
        "epochs=2",
        "--set",
        "min_steps=0",
        "--no-progress",
    )
    return out


def tiny_scorer(seed: int = 0) -> MultipleChoice:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=64,
        hidden=16,
        layers=1,
        heads=2,
        intermediate=32,
        max_position=32,
        dropout=0.0,
        attention_dropout=0.0,
    )
    return MultipleChoice(cfg).eval()


# ------------------------------------------------------------------------------------------ units


def test_batches_hold_whole_examples_and_padding_choices_count_for_nothing(tok) -> None:
    """Examples of 2..5 choices: every batch carries whole examples (resumable order); the loss over a batch
    of mixed sizes equals the mean of each example's loss alone, and a padding choice gets probability 0."""
    rng = np.random.default_rng(0)
    n = 23
    contexts = [" ".join(["word"] * int(k)) for k in rng.integers(1, 12, n)]
    choices = [[f"choice {j} of {i}" for j in range(int(c))] for i, c in enumerate(rng.integers(2, 6, n))]
    labels = np.asarray([rng.integers(len(c)) for c in choices])
    enc = encode_choices(tok, contexts, choices, 32, labels=labels)
    assert enc.num_choices.tolist() == [len(c) for c in choices] and len(enc.pairs) == sum(map(len, choices))

    def loader() -> BatchLoader:
        return BatchLoader(
            enc,
            8,
            4,
            0,
            1,
            seed=3,
            chunk=2,
            pad_id=0,
            with_types=False,
            columns={"labels": torch.from_numpy(labels)},
        )

    first, seen = loader(), []
    for _ in range(2 * 3):  # one epoch: 3 batches of 8 (the last of 7) in 2 micro-batches each
        b = next(first)
        mask = b["choice_mask"]
        assert mask.shape[0] == len(b["labels"]) and int(mask.sum()) == b["input_ids"].shape[0]
        seen.append(b["labels"])
    assert sum(len(s) for s in seen) == n
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert torch.equal(next(first)["input_ids"], next(resumed)["input_ids"])

    model = tiny_scorer()
    x = collate(enc, np.arange(n), 0, False)
    ids = x["input_ids"] % 64
    loss, grid = model(ids, x["attention_mask"], None, x["choice_mask"], torch.from_numpy(labels))
    assert grid.shape == (n, 5) and bool(torch.isinf(grid[~x["choice_mask"]]).all())
    alone = []
    for i in range(n):
        xi = collate(enc, np.asarray([i]), 0, False)
        li, gi = model(xi["input_ids"] % 64, xi["attention_mask"], None, xi["choice_mask"], torch.tensor([labels[i]]))
        alone.append(li.item())
        torch.testing.assert_close(gi[0], grid[i, : len(choices[i])], atol=1e-5, rtol=1e-5)
    assert abs(loss.item() - float(np.mean(alone))) < 1e-5
    probs = grid.softmax(-1)
    assert bool((probs[~x["choice_mask"]] == 0).all())
    torch.testing.assert_close(probs.sum(-1), torch.ones(n))


# ------------------------------------------------------------------------------------------ fine-tune, predict


def test_finetune_saves_a_multiple_choice_model_that_load_predict_and_the_engine_agree_on(
    mc_model: Path, copa: Path, tmp_path: Path
) -> None:
    res = json.loads((mc_model / "results.json").read_text())
    dev_acc = res["median"]["dev"]["metrics"]["accuracy"]
    assert res["main_metric"] == "accuracy" and res["dev_examples"] == {"dev": 12}
    assert any(abs(dev_acc - 100 * k / 12) < 1e-6 for k in range(13))
    # test predictions: the Task's format (a user task: GLUE's index<TAB>prediction), one chosen index a row
    pred = Path(res["test_predictions"]["files"]["test"]).read_text().splitlines()
    assert pred[0] == "index\tprediction" and [int(r.split("\t")[0]) for r in pred[1:]] == list(range(7))
    assert {r.split("\t")[1] for r in pred[1:]} <= {"0", "1"}

    loaded = cramkit.load(mc_model)
    assert loaded.kind == "multiple_choice" and type(loaded.model) is MultipleChoice and loaded.labels is None
    assert loaded.extra["columns"] == {
        "text_a": "premise",
        "text_b": None,
        "label": "label",
        "choices": ["choice1", "choice2"],
    }

    out = tmp_path / "pred.jsonl"
    text = ok("predict", "--from", str(mc_model), str(copa / "val.jsonl"), "--out", str(out))
    assert f"accuracy {dev_acc:.2f}" in text  # the same model, the same rows: fine-tuning's dev score
    got = [json.loads(line) for line in out.read_text().splitlines()]
    rows = [json.loads(line) for line in (copa / "val.jsonl").read_text().splitlines()]
    engine = Engine(loaded, device="cpu")
    assert engine.choose([], []).chosen.shape == (0,)  # nothing to choose: an empty answer, no error
    chosen = engine.choose([r["premise"] for r in rows], [[r["choice1"], r["choice2"]] for r in rows])
    for g, r, k, p in zip(got, rows, chosen.chosen, chosen.probs, strict=True):
        assert g["label"] == int(k) and g["answer"] == [r["choice1"], r["choice2"]][k]
        assert len(g["probabilities"]) == 2 and abs(sum(g["probabilities"]) - 1) < 1e-5
        np.testing.assert_allclose(g["probabilities"], p, atol=1e-6)

    # a CSV with choice columns; empty cells at a row's end are no choices (3 choices, then 2)
    csv = tmp_path / "rows.csv"
    csv.write_text("premise,a,b,c\nThe man dropped the glass.,It broke.,It flew.,It sang.\nThe dog ran.,Fast.,Slow.,\n")
    ok("predict", "--from", str(mc_model), str(csv), "--choices", "a,b,c", "--out", str(tmp_path / "p.csv"))
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0].split(",") == ["row", "label", "answer", "p_0", "p_1", "p_2"]
    assert lines[2].endswith(",") and lines[1].count(",") == 5  # the second row has no third choice


def test_user_file_bad_rows_are_one_line_each_or_skipped_and_counted(pretrained_run: Path, tmp_path: Path) -> None:
    good = copa_rows(12, 3)
    bad = {
        "label outside its choices": {**good[0], "label": 2},
        "one choice": {**good[1], "choice2": ""},
        "no choice column": {k: v for k, v in good[2].items() if k != "choice2"},
    }
    needles = {
        "label outside its choices": "label 2 is outside the row's 2 choices (0..1)",
        "one choice": "1 choice(s); a multiple-choice row needs at least 2",
        "no choice column": "no value for the choice column 'choice2'",
    }
    base = [
        "finetune",
        "--from",
        str(pretrained_run),
        "--text-a",
        "premise",
        "--choices",
        "choice1,choice2",
        "--set",
        "max_length=32",
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--no-progress",
    ]
    for name, row in bad.items():
        train = write_jsonl(tmp_path / f"{name.replace(' ', '_')}.jsonl", [*good[3:], row])
        proc = cli(*base, "--train", str(train), "--out", str(tmp_path / "out"))
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and needles[name] in lines[0] and f"{train}, line 10" in lines[0], proc.stderr
        assert "--skip-bad-rows" in lines[0]
    train = write_jsonl(tmp_path / "all.jsonl", [*good[3:], *bad.values()])
    dev = write_jsonl(tmp_path / "dev.jsonl", good[:3])
    proc = cli(*base, "--train", str(train), "--dev", str(dev), "--out", str(tmp_path / "skipped"), "--skip-bad-rows")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "skipped" / "results.json").read_text())["skipped_rows"] == {"train": 3}
    # a CSV without the named choice column: one line naming the file and its columns
    csv = tmp_path / "t.csv"
    csv.write_text("premise,choice1,label\nA.,B.,0\n")
    proc = cli(*base, "--train", str(csv), "--out", str(tmp_path / "o2"))
    assert proc.returncode == 2 and "no column 'choice2' (given as a choice)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def chid_rows(path: Path, n: int, window: int = 30) -> list[dict]:
    """FewCLUE CHID rows as a multiple-choice file: the blank and ``window`` characters each side, the blank
    written as four [MASK]s (an idiom has four characters), the 7 candidate idioms as the choices."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        text = row["content"]
        if text.count("#idiom#") != 1:
            continue
        at = text.index("#idiom#")
        context = text[max(0, at - window) : at] + "[MASK]" * 4 + text[at + 7 : at + 7 + window]
        out.append({"id": row["id"], "text": context, "choices": row["candidates"], "label": row["answer"]})
        if len(out) == n:
            break
    return out


def test_finetune_on_real_chid_rows(shared_data: Path, tmp_path: Path) -> None:
    """A tiny model pretrained by `cramkit pretrain` on CHID's own text learns 8 real CHID rows (7 idioms
    each) by heart: the loss falls from ln 7 and it picks every right idiom (chance: 1 in 7)."""
    from conftest import run_pretrain

    chid = shared_data / "fewclue" / "chid"
    if not chid.is_dir():
        pytest.skip(f"needs {chid}")
    run = run_pretrain(
        tmp_path / "run",
        str(chid / "train_few_all.json"),
        "--text-field",
        "content",
        "--set",
        "tokenizer.vocab_size=2000",
    )
    rows = chid_rows(chid / "train_0.json", 8)
    assert len(rows) == 8 and all(len(r["choices"]) == 7 for r in rows)
    train = write_jsonl(tmp_path / "chid.jsonl", rows)
    out = tmp_path / "ft"
    ok(
        "finetune",
        "--from",
        str(run),
        "--train",
        str(train),
        "--dev",
        str(train),
        "--text-a",
        "text",
        "--choices",
        "choices",
        "--out",
        str(out),
        "--set",
        "max_length=64",
        "--set",
        "epochs=15",
        "--set",
        "min_steps=0",
        "--set",
        "lr=3e-3",
        "--set",
        "batch_size=8",
        "--set",
        "dropout=0",
        "--set",
        "attention_dropout=0",
        "--set",
        "warmup=0",
        "--no-progress",
    )
    res = json.loads((out / "results.json").read_text())
    curve = res["seeds"][0]["loss_curve"]
    assert abs(curve[0] - np.log(7)) < 0.05 and curve[-1] < curve[0] - 0.15, curve
    assert res["median"]["dev"]["metrics"]["accuracy"] == 100.0
    chosen = Engine(cramkit.load(out), device="cpu").choose([r["text"] for r in rows], [r["choices"] for r in rows])
    assert chosen.chosen.tolist() == [r["label"] for r in rows]
    assert all(p.shape == (7,) for p in chosen.probs)


# ------------------------------------------------------------------------------------------ export, serve


@pytest.fixture(scope="module")
def mc_onnx(mc_model: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mc-onnx") / "onnx"
    ok("export", str(mc_model), "--format", "onnx", "--out", str(out))
    return out


def val_inputs(copa: Path) -> tuple[list[str], list[list[str]]]:
    rows = [json.loads(line) for line in (copa / "val.jsonl").read_text().splitlines()]
    return [r["premise"] for r in rows], [[r["choice1"], r["choice2"]] for r in rows]


@pytest.mark.integration
def test_onnx_export_scores_the_pairs_as_torch_does(mc_model: Path, mc_onnx: Path, copa: Path, tmp_path: Path) -> None:
    manifest = json.loads((mc_onnx / "cramkit-onnx.json").read_text())
    assert manifest["kind"] == "multiple_choice" and "logits" in manifest["outputs"]
    contexts, choices = val_inputs(copa)
    contexts.append("A context with four choices, one of them long " * 3)
    choices.append(["one", "two", "three " * 20, "four"])
    ref = Engine(cramkit.load(mc_model), device="cpu").choose(contexts, choices)
    got = Engine(mc_onnx).choose(contexts, choices)
    assert got.chosen.tolist() == ref.chosen.tolist() and got.probs[-1].shape == (4,)
    for a, b in zip(ref.scores, got.scores, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
    # `cramkit predict` on the export reads the columns the model was fine-tuned on from its manifest
    text = ok("predict", "--from", str(mc_onnx), str(copa / "val.jsonl"), "--out", str(tmp_path / "p.jsonl"))
    assert "accuracy" in text
    labels = [json.loads(line)["label"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert labels == ref.chosen[:-1].tolist()
    # a crafted manifest's columns (not names) are ignored: the columns are then asked for, in one line
    import shutil

    crafted = shutil.copytree(mc_onnx, tmp_path / "crafted")
    manifest["columns"] = {"text_a": ["premise"], "choices": 5, "label": {"x": 1}}
    (crafted / "cramkit-onnx.json").write_text(json.dumps(manifest))
    proc = cli("predict", "--from", str(crafted), str(copa / "val.jsonl"), "--out", str(tmp_path / "c.jsonl"))
    assert proc.returncode == 2 and "no value for the choice column 'choices'" in proc.stderr, proc.stderr
    assert "--choices COL" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    ok(
        "predict",
        "--from",
        str(crafted),
        str(copa / "val.jsonl"),
        "--text-a",
        "premise",
        "--choices",
        "choice1,choice2",
        "--out",
        str(tmp_path / "c.jsonl"),
    )


def test_ct2_export_scores_the_pairs_as_torch_does(mc_model: Path, copa: Path, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    ok("export", str(mc_model), "--format", "ct2", "--quantize", "float32", "--out", str(out))
    contexts, choices = val_inputs(copa)
    ref = Engine(cramkit.load(mc_model), device="cpu").choose(contexts, choices)
    got = Engine(out).choose(contexts, choices)
    assert got.chosen.tolist() == ref.chosen.tolist()
    for a, b in zip(ref.scores, got.scores, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)


@pytest.mark.integration
def test_hf_export_is_a_bert_for_multiple_choice_with_our_logits(
    minilm_dir: Path, copa: Path, pretrained_run: Path, mc_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForMultipleChoice, BertForMultipleChoice

    ft = tmp_path / "ft"
    ok(
        "finetune",
        "--from",
        f"hf:{minilm_dir}",
        "--train",
        str(copa / "train.jsonl"),
        "--dev",
        str(copa / "val.jsonl"),
        "--text-a",
        "premise",
        "--choices",
        "choice1,choice2",
        "--out",
        str(ft),
        "--set",
        "max_train_examples=4",
        "--set",
        "batch_size=4",
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--set",
        "max_length=64",
        "--set",
        "lr=1e-3",
        "--set",
        "pooling=first",
        "--no-progress",
    )
    out = tmp_path / "hf"
    text = ok("export", str(ft), "--format", "hf", "--out", str(out))
    assert "BertForMultipleChoice" in text and "AutoModelForMultipleChoice" in text
    theirs = AutoModelForMultipleChoice.from_pretrained(out).eval()
    assert type(theirs) is BertForMultipleChoice
    ours = cramkit.load(ft)
    contexts, choices = val_inputs(copa)
    engine = Engine(ours, device="cpu")
    enc = engine.tokenize_choices(contexts, choices)
    width = int(enc.pairs.lengths.max())
    ids = np.zeros((len(enc.pairs), width), dtype=np.int64)
    for i, row in enumerate(enc.pairs.ids):
        ids[i, : len(row)] = row
    pos = np.arange(width)[None, :]
    mask = pos < enc.pairs.lengths[:, None]
    types = (pos >= enc.pairs.b_start[:, None]) & mask

    def shaped(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.int64)).view(len(contexts), 2, width)

    with torch.no_grad():
        logits = theirs(input_ids=shaped(ids), attention_mask=shaped(mask), token_type_ids=shaped(types)).logits
    mine = np.stack(engine.choose(contexts, choices).scores)
    assert float(np.abs(mine).max()) > 1e-3  # a trained head, not zeros
    np.testing.assert_allclose(logits.numpy(), mine, atol=1e-4, rtol=0)
    # read back: cramkit.load("hf:DIR") is a multiple-choice model again
    back = cramkit.load(f"hf:{out}")
    assert back.kind == "multiple_choice"
    np.testing.assert_allclose(np.stack(Engine(back, device="cpu").choose(contexts, choices).scores), mine, atol=1e-4)
    # a multiple-choice model of a non-BERT architecture has no HF equivalent: one line pointing to ONNX
    proc = cli("export", str(mc_model), "--format", "hf", "--out", str(tmp_path / "no"))
    assert (
        proc.returncode == 2 and "no BertForMultipleChoice equivalent" in proc.stderr and "--format onnx" in proc.stderr
    )
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_serve_predicts_choices_and_refuses_malformed_input(mc_model: Path, mc_onnx: Path, copa: Path) -> None:
    from serve.test_server import start

    contexts, choices = val_inputs(copa)
    ref = Engine(cramkit.load(mc_model), device="cpu").choose(contexts[:3], choices[:3])
    proc, url = start(f"mc={mc_model}", f"onnx={mc_onnx}", "--max-choices", "8")
    try:
        http = httpx.Client(base_url=url, timeout=60)

        def good() -> None:
            r = http.post("/predict", json={"text": contexts[0], "choices": choices[0]})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["label"] == int(ref.chosen[0]) and body["answer"] == choices[0][body["label"]]
            np.testing.assert_allclose(body["probabilities"], ref.probs[0], atol=1e-5)

        good()
        for model in ("mc", "onnx"):
            items = [{"text": c, "choices": cs} for c, cs in zip(contexts[:3], choices[:3], strict=True)]
            r = http.post("/predict", json={"inputs": items, "model": model, "raw_scores": True})
            assert r.status_code == 200, r.text
            assert [x["label"] for x in r.json()] == ref.chosen.tolist()
            for x, s in zip(r.json(), ref.scores, strict=True):
                np.testing.assert_allclose(x["scores"], s, atol=1e-4)
        r = http.post("/predict", json={"inputs": {"text": "Which?", "choices": ["a", "b", "c"]}})
        assert r.status_code == 200 and len(r.json()["probabilities"]) == 3
        assert http.get("/info").json()["model_type"] == {"multiple_choice": {"max_choices": 8}}
        bad = [
            ({"text": "no choices"}, 422, "'choices' must be a list of strings"),
            ({"text": "empty", "choices": []}, 422, "0 choice(s); give at least 2"),
            ({"text": "one", "choices": ["a"]}, 422, "1 choice(s)"),
            ({"text": "many", "choices": ["x"] * 9}, 413, "9 choices; the limit is 8"),
            ({"inputs": []}, 422, "empty list"),
            ({"inputs": "a plain text"}, 422, "an object {text, choices}"),
            ({"text": "typed", "choices": ["a", 3]}, 422, "each choice must be a string, not a number"),
            ({"inputs": [{"choices": ["a", "b"]}]}, 422, "inputs[0] must be an object with a 'text' string"),
        ]
        for body, status, needle in bad:
            r = http.post("/predict", json=body)
            assert r.status_code == status and needle in r.json()["error"], (body, r.status_code, r.text)
        good()  # still up, still right
    finally:
        proc.terminate()
        proc.wait(timeout=30)
