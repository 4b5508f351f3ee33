"""Prompt-based fine-tuning (PET / LM-BFF) and deep prompts (P-tuning v2), through the real commands: a run
that `cramkit pretrain` made, `cramkit finetune --prompt / --method ptuning`, predict, load, serve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import cramkit
from cramkit.data.prompts import encode_prompts, prompt_spec
from cramkit.errors import CramkitError
from cramkit.text.tokenizer import load_tokenizer
from infer.models import cli

WORDS = "0=bad,1=good"


@pytest.fixture(scope="module")
def minilm_tok(minilm_dir: Path):
    return load_tokenizer(minilm_dir)


def test_a_template_puts_one_mask_per_label_token_and_keeps_the_template_whole(minilm_tok) -> None:
    spec = prompt_spec("{sentence} It was [MASK] .", "0=terrible,1=great", ["0", "1"], minilm_tok)
    assert spec.masks == 1 and spec.fields == {"text_a"}
    long = "word " * 400
    enc = encode_prompts(minilm_tok, spec, ["a fine film", long, "a [MASK] inside"], None, 32)
    mask = minilm_tok.token_to_id("[MASK]")
    for ids in enc.ids:  # exactly the template's mask, never one from the text; the template's tail kept
        assert (ids == mask).sum() == 1 and len(ids) <= 32
        assert [minilm_tok.id_to_token(int(i)) for i in ids[-4:]] == ["was", "[MASK]", ".", "[SEP]"]
    assert enc.truncated.tolist() == [False, True, False]
    assert minilm_tok.token_to_id("[UNK]") in enc.ids[2].tolist()
    pair = prompt_spec("{premise} ? [MASK] , [SEP] {hypothesis}", "yes=yes,no=no", ["yes", "no"], minilm_tok)
    enc = encode_prompts(minilm_tok, pair, ["it rains"], ["it is wet"], 64)
    assert enc.b_start[0] < enc.lengths[0]  # the second segment starts after the template's [SEP]


def test_chinese_label_words_of_two_characters_fill_two_masks(minilm_tok) -> None:
    spec = prompt_spec("这是[MASK]的：{text_a}", "a=中国,b=上下", ["a", "b"], minilm_tok)
    assert spec.masks == 2
    enc = encode_prompts(minilm_tok, spec, ["中国队赢了"], None, 64)
    assert (enc.ids[0] == spec.mask_id).sum() == 2


@pytest.mark.parametrize(
    ("template", "words", "needle"),
    [
        ("{text_a} It was great .", WORDS, "0 [MASK]s"),
        ("{text_a} [MASK] [MASK] .", WORDS, "2 [MASK]s"),
        ("{review} It was [MASK] .", WORDS, "names the field {review}"),
        ("It was [MASK] .", WORDS, "names no field"),
        ("{text_a} It was [MASK] .", "0=bad", "no word for label(s) '1'"),
        ("{text_a} It was [MASK] .", "0=bad,1=good,2=ok", "'2', which the task does not have"),
        ("{text_a} It was [MASK] .", "0=bad,1=qqqzzzxxv", "'qqqzzzxxv'"),
        ("{text_a} It was [MASK] .", "0=bad,1=not good", "the same number of tokens"),
        ("{text_a} It was [MASK] .", "0bad,1=good", "LABEL=WORD"),
    ],
)
def test_bad_templates_and_label_words_are_one_line(minilm_tok, template, words, needle) -> None:
    with pytest.raises(CramkitError) as err:
        prompt_spec(template, words, ["0", "1"], minilm_tok)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(scope="module")
def sst2_files(real_glue_dir: Path, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sst2-prompt")
    lines = (real_glue_dir / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], lines[1:]
    (root / "train.tsv").write_text("\n".join([header, *rows[:48]]) + "\n", encoding="utf-8")
    (root / "dev.tsv").write_text("\n".join([header, *rows[1000:1064]]) + "\n", encoding="utf-8")
    return root / "train.tsv", root / "dev.tsv"


def _finetune(tiny_run: Path, files: tuple[Path, Path], out: Path, *args: str):
    return cli(
        "finetune",
        "--from",
        str(tiny_run),
        "--train",
        str(files[0]),
        "--dev",
        str(files[1]),
        "--text-a",
        "sentence",
        "--out",
        str(out),
        "--set",
        "epochs=2",
        "--set",
        "batch_size=8",
        "--set",
        "min_steps=0",
        "--no-progress",
        *args,
    )


def test_prompt_finetuning_makes_a_model_that_predicts_loads_and_names_onnx_for_ct2(
    tiny_run: Path, sst2_files, tmp_path: Path
) -> None:
    out = tmp_path / "prompt"
    proc = _finetune(tiny_run, sst2_files, out, "--prompt", "{sentence} it was [MASK] .", "--label-words", WORDS)
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["method"] == "prompt" and res["prompt"]["label_words"] == {"0": "bad", "1": "good"}
    model = cramkit.load(out)
    assert model.architecture == "prompt" and model.kind == "classifier" and model.labels == ["0", "1"]
    # the model's dev score is what its own predictions on the dev file give
    pred = tmp_path / "dev.predictions.jsonl"
    proc = cli("predict", "--from", str(out), str(sst2_files[1]), "--out", str(pred))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in pred.read_text().splitlines()]
    assert len(rows) == 64 and all(abs(sum(r["probabilities"].values()) - 1) < 1e-4 for r in rows)
    assert f"accuracy {res['median']['dev']['metrics']['accuracy']:.2f}" in proc.stdout
    # exported to ONNX or HF (tests/infer/test_prompt_exports.py); CTranslate2 has no masked-LM head: one line
    proc = cli("export", str(out), "--format", "ct2", "--out", str(tmp_path / "exp"))
    assert proc.returncode == 2 and "--format onnx" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_prompt_needs_an_mlm_head_and_a_classification_task(minilm_dir: Path, sst2_files, tmp_path: Path) -> None:
    proc = cli(
        "finetune",
        "--from",
        f"hf:{minilm_dir}",
        "--train",
        str(sst2_files[0]),
        "--text-a",
        "sentence",
        "--out",
        str(tmp_path / "x"),
        "--prompt",
        "{sentence} It was [MASK] .",
        "--label-words",
        "0=terrible,1=great",
    )
    assert proc.returncode == 2 and "has no masked-LM head" in proc.stderr and "pretrain" in proc.stderr
    assert not (tmp_path / "x" / "results.json").exists()
    proc = cli(
        "finetune",
        "--from",
        f"hf:{minilm_dir}",
        "--train",
        str(sst2_files[0]),
        "--text-a",
        "sentence",
        "--label",
        "label",
        "--regression",
        "--out",
        str(tmp_path / "y"),
        "--method",
        "prompt",
    )
    assert proc.returncode == 2 and "classification task" in proc.stderr


def test_deep_prompts_store_only_prefixes_and_name_their_base_by_checksum(
    tiny_run: Path, pretrained_run: Path, sst2_files, tmp_path: Path
) -> None:
    out = tmp_path / "pt"
    proc = _finetune(tiny_run, sst2_files, out, "--method", "ptuning", "--prefix-len", "4")
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "results.json").read_text())
    base = cramkit.load(tiny_run)
    total = sum(p.numel() for p in base.encoder.parameters())
    cfg = base.config
    assert (
        res["trainable_parameters"]
        == cfg.layers * 2 * 4 * cfg.hidden + cfg.hidden * cfg.hidden + cfg.hidden + 2 * cfg.hidden + 2
    )
    assert res["trainable_parameters"] < total and res["stored_bytes"] < 4 * total
    assert "parameters trained" in proc.stdout
    # without its base: one line that names it; with another model: refused by checksum
    proc = cli("predict", "--from", str(out), str(sst2_files[1]), "--out", str(tmp_path / "p.jsonl"))
    assert proc.returncode == 2 and f"--base {tiny_run}" in proc.stderr and not (tmp_path / "p.jsonl").exists()
    with pytest.raises(CramkitError, match="checksum differs"):
        cramkit.load(out, base=pretrained_run)
    proc = cli(
        "predict",
        "--from",
        str(out),
        "--base",
        str(tiny_run),
        str(sst2_files[1]),
        "--out",
        str(tmp_path / "p.jsonl"),
    )
    assert proc.returncode == 0, proc.stderr
    assert f"accuracy {res['median']['dev']['metrics']['accuracy']:.2f}" in proc.stdout
    # two tasks' prefixes on one loaded base share its encoder
    a, b = cramkit.load(out, base=base), cramkit.load(out, base=base)
    assert a.encoder is b.encoder is base.encoder
    x = cramkit.load(out, base=tiny_run)
    from cramkit.infer import Engine

    probs = Engine(x).classify(["a good film", "a bad film"]).probs
    assert np.allclose(probs.sum(1), 1, atol=1e-5)


def test_a_prefix_directory_with_crafted_weights_is_one_line(tiny_run: Path, sst2_files, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    out = tmp_path / "pt"
    assert _finetune(tiny_run, sst2_files, out, "--method", "ptuning", "--prefix-len", "2").returncode == 0
    meta = json.loads((out / "cramkit-model.json").read_text())
    import torch

    save_file({"prefix": torch.zeros(1), "evil": torch.zeros(3)}, str(out / "model.safetensors"))
    meta.pop("sha256")
    (out / "cramkit-model.json").write_text(json.dumps(meta))
    with pytest.raises(CramkitError, match="do not fit the deep-prompt model"):
        cramkit.load(out, base=tiny_run)
    meta["extra"]["base"]["prefix_len"] = "4; rm -rf /"
    (out / "cramkit-model.json").write_text(json.dumps(meta))
    with pytest.raises(CramkitError, match="damaged or crafted"):
        cramkit.load(out, base=tiny_run)


@pytest.mark.integration
def test_one_served_base_answers_each_task_with_its_own_prefixes(tiny_run: Path, sst2_files, tmp_path: Path) -> None:
    from cramkit.infer import Engine
    from serve.test_server import start

    dirs = {}
    for name, plen in (("a", 2), ("b", 3)):
        dirs[name] = tmp_path / name
        assert (
            _finetune(tiny_run, sst2_files, dirs[name], "--method", "ptuning", "--prefix-len", str(plen)).returncode
            == 0
        )
    proc = cli("serve", f"a={dirs['a']}", "--port", "0")
    assert proc.returncode == 2 and "--base" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    server, url = start(f"a={dirs['a']}", f"b={dirs['b']}", "--base", str(tiny_run))
    try:
        import httpx

        texts = ["a good , funny film", "the worst movie of the year"]
        base = cramkit.load(tiny_run)
        for name in ("a", "b"):
            r = httpx.post(f"{url}/predict", json={"inputs": [[t] for t in texts], "model": name}, timeout=60)
            assert r.status_code == 200, r.text
            got = np.asarray([[d["score"] for d in sorted(row, key=lambda d: d["label"])] for row in r.json()])
            want = Engine(cramkit.load(dirs[name], base=base)).classify(texts).probs
            assert np.allclose(got, want, atol=1e-5)
        info = httpx.get(f"{url}/info", timeout=10).json()
        assert {"a", "b"} <= set(json.dumps(info).replace('"', " ").split())
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_auto_pooling_is_the_models_own(minilm_dir: Path, tiny_run: Path) -> None:
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.finetune_model import resolve_pooling

    st = resolve_pooling(FinetuneConfig(), cramkit.load(f"hf:{minilm_dir}"))  # sentence-transformers: mean
    assert (st.pooling, st.pooler_dense) == ("mean", False)
    run = resolve_pooling(FinetuneConfig(), cramkit.load(tiny_run))  # Cramming's first token and pooler
    assert (run.pooling, run.pooler_dense) == ("cls", True)
    mine = resolve_pooling(FinetuneConfig(pooling="first"), cramkit.load(f"hf:{minilm_dir}"))
    assert (mine.pooling, mine.pooler_dense) == ("cls", True)  # first: cls's older name


@pytest.mark.integration
def test_minilm_gets_a_head_with_its_encoder_frozen_and_then_takes_a_prompt(
    minilm_dir: Path, sst2_files, tmp_path: Path
) -> None:
    import torch

    corpus = tmp_path / "text.txt"
    lines = sst2_files[0].read_text(encoding="utf-8").splitlines()[1:]
    corpus.write_text("\n\n".join(line.split("\t")[0] for line in lines) + "\n", encoding="utf-8")
    run = tmp_path / "head"
    proc = cli(
        "pretrain",
        str(corpus),
        "--from",
        f"hf:{minilm_dir}",
        "--budget",
        "3steps",
        "--out",
        str(run),
        "--set",
        "train.head_only=true",
        "--set",
        "train.micro_batch=4",
        "--set",
        "train.batch_size=4",
        "--set",
        "data.seq_len=32",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    before, after = cramkit.load(f"hf:{minilm_dir}"), cramkit.load(run)
    for (name, a), (_, b) in zip(before.model.state_dict().items(), after.encoder.state_dict().items(), strict=True):
        assert torch.equal(a, b), name  # the encoder (and its tied embeddings) did not move
    assert after.kind == "mlm"
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.finetune_model import resolve_pooling

    assert resolve_pooling(FinetuneConfig(), after).pooling == "mean"  # the run pools as MiniLM did
    out = tmp_path / "prompt"
    proc = cli(
        "finetune",
        "--from",
        str(run),
        "--train",
        str(sst2_files[0]),
        "--dev",
        str(sst2_files[1]),
        "--text-a",
        "sentence",
        "--out",
        str(out),
        "--prompt",
        "{sentence} It was [MASK] .",
        "--label-words",
        "0=terrible,1=great",
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "results.json").read_text())["method"] == "prompt"
    proc = cli(
        "pretrain",
        str(corpus),
        "--budget",
        "3steps",
        "--out",
        str(tmp_path / "x"),
        "--set",
        "train.head_only=true",
    )
    assert proc.returncode == 2 and "head_only" in proc.stderr


def test_the_prompt_is_scored_before_training(tiny_run: Path, sst2_files, tmp_path: Path) -> None:
    """LM-BFF's zero-shot row: the prompt's score before any step. Fine-tuning a trained prompt model again
    with its own prompt must find, before training, exactly the dev accuracy that model was saved with."""
    first = tmp_path / "prompt"
    proc = _finetune(tiny_run, sst2_files, first, "--prompt", "{sentence} it was [MASK] .", "--label-words", WORDS)
    assert proc.returncode == 0, proc.stderr
    trained = json.loads((first / "results.json").read_text())
    assert trained["zero_shot"]["examples"] == 64 and trained["zero_shot"]["split"] == "dev"
    again = tmp_path / "again"
    proc = cli(
        "finetune",
        *("--from", str(first), "--train", str(sst2_files[0]), "--dev", str(sst2_files[1]), "--text-a", "sentence"),
        *("--out", str(again), "--prompt", "{sentence} it was [MASK] .", "--label-words", WORDS),
        *("--set", "epochs=0.01", "--set", "min_steps=1", "--set", "eval_every=never"),
    )
    assert proc.returncode == 0, proc.stderr
    before = json.loads((again / "results.json").read_text())["zero_shot"]
    assert before["score"] == pytest.approx(trained["median"]["dev"]["metrics"]["accuracy"], abs=1e-6)
    assert f"the prompt before training: accuracy {before['score']:.1f} on 64 dev rows" in proc.stderr


def test_builtin_label_words_fall_back_to_words_the_vocabulary_holds_whole(tiny_run: Path, real_glue_dir: Path) -> None:
    """What a 1,500-piece vocabulary of SST-2's own sentences keeps whole (the real GLUE: on a clone without
    ../shared, the built-in GLUE-shaped text has other words)."""
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.finetune_prompt import resolve_prompt
    from cramkit.tasks.registry import get_task

    glue_dir = real_glue_dir
    task = get_task("glue/sst2", data_dir=glue_dir)
    run = cramkit.load(tiny_run)  # a tokenizer trained on a small corpus cuts "terrible" in two
    assert len(run.tokenizer.encode("terrible", add_special_tokens=False).ids) > 1
    spec = resolve_prompt(task, run, FinetuneConfig(method="prompt"))
    assert spec is not None and spec.label_words == {"0": "bad", "1": "good"}
    with pytest.raises(CramkitError, match="'terrible' 2"):  # the user's own words are never replaced
        resolve_prompt(task, run, FinetuneConfig(method="prompt", label_words="0=terrible,1=great"))
    # a pair task's yes/no fall back on true/false (as "bad"/"good" above); where no built-in choice is whole in
    # the vocabulary (1,500 pieces: "yes" and "false" are cut), one line names them and asks for --label-words
    mrpc = get_task("glue/mrpc", data_dir=glue_dir)
    assert all(len(run.tokenizer.encode(w, add_special_tokens=False).ids) > 1 for w in ("yes", "false"))
    with pytest.raises(CramkitError, match=r"built-in label words \(0=no,1=yes; 0=false,1=true\).*--label-words"):
        resolve_prompt(mrpc, run, FinetuneConfig(method="prompt"))


def test_a_template_in_the_files_own_field_names_loads_back(tiny_run: Path, sst2_files, tmp_path: Path) -> None:
    """`--prompt '{review} ...'` on a file whose column is `review`: the model directory records the template
    in the generic names, so that load, predict and export (which do not know the file's columns) read it."""
    files = []
    for f in sst2_files:
        lines = f.read_text(encoding="utf-8").splitlines()
        renamed = tmp_path / f.name
        renamed.write_text("\n".join([lines[0].replace("sentence", "review"), *lines[1:]]) + "\n", encoding="utf-8")
        files.append(renamed)
    out = tmp_path / "prompt"
    proc = cli(
        "finetune",
        *("--from", str(tiny_run), "--train", str(files[0]), "--dev", str(files[1]), "--text-a", "review"),
        *("--out", str(out), "--prompt", "{review} it was [MASK] .", "--label-words", WORDS),
        *("--set", "epochs=1", "--set", "min_steps=0", "--no-progress"),
    )
    assert proc.returncode == 0, proc.stderr
    model = cramkit.load(out)
    assert model.prompt is not None and model.prompt.meta()["template"] == "{text_a} it was [MASK] ."
    pred = tmp_path / "pred.jsonl"
    proc = cli("predict", "--from", str(out), str(files[1]), "--out", str(pred))
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "results.json").read_text())
    assert f"accuracy {res['median']['dev']['metrics']['accuracy']:.2f}" in proc.stdout
