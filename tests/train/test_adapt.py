"""Starting from what exists, through the real `cramkit pretrain`: continued pretraining of the packaged
all-MiniLM-L6-v2 (--from), vocabulary extension, knowledge inheritance (--inherit), whole-word masking,
and the bad inputs of each. The text is the built-in corpus, so nothing here needs ../shared."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cramkit.train.metrics import read_metrics

pytestmark = pytest.mark.integration  # `cramkit pretrain --from/--inherit` processes, SIGTERM and kill -9

SMALL = [
    "train.micro_batch=4",
    "train.batch_size=4",
    "data.seq_len=64",
    "train.eval_batches=2",
    "train.log_every=1",
    "train.progress=false",
]


STUDENT = ["model.hidden=64", "model.layers=2", "model.heads=2", "model.intermediate=128"]


def pretrain_cli(*args: str, sets: list[str] = SMALL, check: bool = True, env: dict | None = None):
    cmd = [sys.executable, "-m", "cramkit", "pretrain", *args]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    if check:
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("cramkit: error")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, builtin_docs) -> Path:
    """Real English prose (the built-in corpus's docstrings), one document per blank-line block."""
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("\n\n".join(d.replace("\n\n", "\n") for d in builtin_docs[:400]), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def continued(tmp_path_factory, corpus: Path, minilm_dir: Path) -> Path:
    """all-MiniLM-L6-v2 continued for a few steps by the real `cramkit pretrain --from hf:DIR`."""
    run = tmp_path_factory.mktemp("continued") / "run"
    proc = pretrain_cli(str(corpus), "--from", f"hf:{minilm_dir}", "--budget", "6steps", "--out", str(run))
    (run.parent / "log.txt").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return run


def _hidden(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)


def test_continue_keeps_the_model_and_exports_as_plain_bert(continued: Path, minilm_dir: Path, tmp_path: Path):
    import yaml
    from transformers import BertForMaskedLM, BertModel, BertTokenizerFast

    import cramkit

    cfg = yaml.safe_load((continued / "config.yaml").read_text())
    hf_cfg = json.loads((minilm_dir / "config.json").read_text())
    assert cfg["model"]["hidden"] == hf_cfg["hidden_size"] and cfg["model"]["layers"] == hf_cfg["num_hidden_layers"]
    # BERT's masking, as MiniLM's BERT ancestry was trained with; the continue preset's recipe
    assert cfg["data"]["mask_rate"] == 0.15 and cfg["data"]["add_cls"] is True
    assert cfg["train"]["schedule"] == "linear" and json.loads((continued / "run.json").read_text())["from"]
    assert (continued / "loss.png").is_file()

    tok = BertTokenizerFast.from_pretrained(minilm_dir)
    enc = tok(
        ["the parser reads a file and returns its lines", "a [MASK] of the standard library"],
        padding=True,
        return_tensors="pt",
    )
    ours = cramkit.load(continued)
    with torch.no_grad():
        before = BertModel.from_pretrained(minilm_dir).eval()(**enc).last_hidden_state
        after = ours.encoder(enc["input_ids"], enc["attention_mask"].bool(), enc["token_type_ids"])
    # it started from MiniLM's weights (a random encoder is nowhere near), and it trained
    cos = torch.nn.functional.cosine_similarity(before, after, dim=-1)
    assert float(cos.mean()) > 0.9, cos
    assert float((before - after).abs().max()) > 1e-4

    out = tmp_path / "exported"
    proc = subprocess.run(
        [sys.executable, "-m", "cramkit", "export", str(continued), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    hf = BertForMaskedLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "BertForMaskedLM"
    with torch.no_grad():
        want = hf(**enc).logits
        got = ours.model(
            enc["input_ids"],
            attention_mask=enc["attention_mask"].bool(),
            token_type_ids=enc["token_type_ids"],
        ).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def stopped_resumed_equals_uninterrupted(
    tmp_path: Path, args: list[str], sets: list[str], steps: int, sig: int = signal.SIGTERM
) -> None:
    """SIGTERM a run part-way (or SIGKILL it after its first checkpoint), resume it to the end: its curve equals
    an uninterrupted run's, bit for bit (after a kill, the records past the checkpoint are written again)."""
    stopped = tmp_path / "stopped"
    cmd = [
        sys.executable,
        "-m",
        "cramkit",
        "pretrain",
        *args,
        "--budget",
        f"{steps}steps",
        "--out",
        str(stopped),
    ]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as pretrain_cli: the same threads, the same sums
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if sig == signal.SIGKILL and (stopped / "checkpoints" / "step-000004").is_dir():
            break
        if sig != signal.SIGKILL and (stopped / "metrics.jsonl").exists() and len(read_metrics(stopped)) >= 3:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be stopped"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == (-sig if sig == signal.SIGKILL else 128 + sig), err
    flag = "--from" if "--from" in args else "--inherit"
    # resuming with another starting model is refused; then the real resume goes to the end
    other = pretrain_cli("--resume", str(stopped), flag, "hf:elsewhere", sets=[], check=False)
    one_line_error(other, flag, f"resume without {flag}")
    pretrain_cli("--resume", str(stopped), sets=[])
    reference = tmp_path / "reference"
    pretrain_cli(*args, "--budget", f"{steps}steps", "--out", str(reference), sets=sets)
    keys = ("step", "tokens", "loss", "lr", "grad_norm", "val_loss", "inherit_alpha", "start_cosine")
    curve = [{k: r[k] for k in keys if k in r} for r in read_metrics(stopped)]
    assert curve == [{k: r[k] for k in keys if k in r} for r in read_metrics(reference)]
    assert curve[-1]["step"] == steps


def test_continue_keeps_the_pooler_for_finetuning(continued: Path, minilm_dir: Path, tmp_path: Path) -> None:
    """MiniLM's pooler (pooler.dense, which MLM does not train) survives `pretrain --from`: saved once in the
    run with its checksum, said in the log, and where fine-tuning the run starts its classifier's pooler."""
    from safetensors.torch import load_file

    import cramkit
    from cramkit.errors import CramkitError
    from cramkit.io import sha256_file
    from cramkit.loading import POOLER_FILE, load_pooler
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.finetune_model import build_model

    hf = load_file(str(minilm_dir / "model.safetensors"))
    entry = json.loads((continued / "run.json").read_text())["pooler"]
    assert entry["sha256"] == sha256_file(continued / POOLER_FILE) and entry["shape"] == [384, 384]
    log = (continued.parent / "log.txt").read_text()
    assert "its MLM head" not in log and "a fresh MLM head" in log  # MiniLM has no MLM head
    assert f"its pooler (dense 384x384 + tanh, untouched by MLM) in {continued / POOLER_FILE}" in log

    loaded = cramkit.load(continued)
    assert torch.equal(loaded.pooler_state["weight"], hf["pooler.dense.weight"])
    model = build_model(loaded, 2, FinetuneConfig(pooling="first"))  # (auto: MiniLM's mean, no pooler)
    assert torch.equal(model.pooler.weight.detach(), hf["pooler.dense.weight"])
    assert torch.equal(model.pooler.bias.detach(), hf["pooler.dense.bias"])

    # a damaged copy is refused, not silently replaced by a fresh pooler
    damaged = tmp_path / "run"
    damaged.mkdir()
    data = bytearray((continued / POOLER_FILE).read_bytes())
    data[-1] ^= 1
    (damaged / POOLER_FILE).write_bytes(bytes(data))
    with pytest.raises(CramkitError, match="corrupt"):
        load_pooler(damaged, {"pooler": entry}, 384)
    (damaged / POOLER_FILE).unlink()
    with pytest.raises(CramkitError, match="missing"):
        load_pooler(damaged, {"pooler": entry}, 384)
    assert load_pooler(damaged, {}, 384) is None  # a run started from a model without a pooler


def test_continue_resumes_bit_exact_after_sigterm(tmp_path: Path, corpus: Path, minilm_dir: Path) -> None:
    sets = [
        *SMALL,
        "data.seq_len=32",
        "train.micro_batch=2",
        "train.batch_size=2",
        "train.eval_every=5steps",
        "train.checkpoint_every=never",
        "data.masking=whole_word",
        # anchored: a resumed run rebuilds the starting model it is held to from --from's source
        "train.keep_vectors=1",
        "train.l2sp=0.5",
    ]
    stopped_resumed_equals_uninterrupted(tmp_path, [str(corpus), "--from", f"hf:{minilm_dir}"], sets, 16)


def test_anchors_hold_the_continued_model_near_its_start(tmp_path: Path, corpus: Path, pretrained_run: Path) -> None:
    """Every --from run reports its drift (start_cosine: the mean cosine of its pooled vectors of the held-out
    text to the starting model's); train.keep_vectors and train.l2sp each keep it measurably closer."""
    sets = [*SMALL, "train.lr=3e-3", "train.warmup=0", "train.eval_every=4steps", "train.checkpoint_every=never"]
    cos = {}
    for name, extra in (("plain", []), ("keep", ["train.keep_vectors=5"]), ("l2sp", ["train.l2sp=100"])):
        run = tmp_path / name
        args = (str(corpus), "--from", str(pretrained_run), "--budget", "8steps", "--out", str(run))
        proc = pretrain_cli(*args, sets=sets + extra)
        evals = [r["start_cosine"] for r in read_metrics(run) if "start_cosine" in r]
        assert len(evals) == 2 and all(0.0 < c <= 1.0 for c in evals), evals
        cos[name] = evals[-1]
        assert f"drift from {pretrained_run}: mean cosine {cos[name]:.3f}" in proc.stdout, proc.stdout
    assert cos["plain"] < 0.99, cos  # at this rate the plain run moves
    assert cos["keep"] > cos["plain"] + 0.01 and cos["l2sp"] > cos["plain"] + 0.01, cos


def test_inherit_resumes_bit_exact_after_sigterm(tmp_path: Path, corpus: Path, continued: Path) -> None:
    sets = [
        *SMALL,
        *STUDENT,
        "data.seq_len=32",
        "train.micro_batch=2",
        "train.batch_size=2",
        "train.eval_every=5steps",
        "train.checkpoint_every=never",
        "inherit.until=0.9",
    ]
    stopped_resumed_equals_uninterrupted(tmp_path, [str(corpus), "--inherit", str(continued)], sets, 16)


def test_inherit_resumes_bit_exact_after_kill_9(tmp_path: Path, corpus: Path, continued: Path) -> None:
    """kill -9 after the first checkpoint (nothing saved at the end, metrics.jsonl ahead of the checkpoint):
    `--resume` goes on from the checkpoint and ends where an uninterrupted run does (issue 30)."""
    sets = [
        *SMALL,
        *STUDENT,
        "data.seq_len=32",
        "train.micro_batch=2",
        "train.batch_size=2",
        "train.eval_every=5steps",
        "train.checkpoint_every=4steps",
        "inherit.until=0.9",
    ]
    args = [str(corpus), "--inherit", str(continued)]
    stopped_resumed_equals_uninterrupted(tmp_path, args, sets, 40, sig=signal.SIGKILL)


def test_extend_vocab_grows_tokenizer_embeddings_and_export(tmp_path: Path, corpus: Path, minilm_dir: Path) -> None:
    from transformers import BertForMaskedLM, BertTokenizerFast

    import cramkit

    run = tmp_path / "run"
    proc = pretrain_cli(
        str(corpus),
        "--from",
        f"hf:{minilm_dir}",
        "--extend-vocab",
        "25",
        "--budget",
        "2steps",
        "--out",
        str(run),
    )
    ext = json.loads((run / "vocab-extension.json").read_text())
    assert ext["added"] == 25 and ext["split_share_after"] < ext["split_share_before"]
    assert "words split into pieces" in proc.stdout
    base = BertTokenizerFast.from_pretrained(minilm_dir)
    grown = BertTokenizerFast.from_pretrained(run / "tokenizer")
    assert len(grown) == len(base) + 25
    word = ext["words"][0]
    assert len(base.tokenize(word)) > 1 and grown.tokenize(word) == [word]
    assert grown.convert_tokens_to_ids(word) == len(base)
    # the exported model has the grown vocabulary and the same logits as ours
    out = tmp_path / "hf"
    assert (
        subprocess.run(
            [sys.executable, "-m", "cramkit", "export", str(run), "--out", str(out)],
            capture_output=True,
            timeout=300,
        ).returncode
        == 0
    )
    hf = BertForMaskedLM.from_pretrained(out).eval()
    assert hf.config.vocab_size == len(base) + 25
    enc = grown([f"the {word} is here"], return_tensors="pt")
    ours = cramkit.load(run).model
    with torch.no_grad():
        torch.testing.assert_close(
            ours(enc["input_ids"], token_type_ids=enc["token_type_ids"]).logits,
            hf(**enc).logits,
            atol=1e-4,
            rtol=1e-4,
        )


def test_new_embeddings_start_as_the_mean_of_their_pieces(minilm_dir: Path) -> None:
    from collections import Counter

    from cramkit.model.heads import MaskedLM
    from cramkit.recipes.adapt import initial_state, start_from
    from cramkit.text.extend import extend_vocabulary

    start = start_from(f"hf:{minilm_dir}")
    counts = Counter({"tokenizable": 50, "unbelievably": 40, "the": 1000, "zzzqqq": 30})
    tok, ext = extend_vocabulary(start.tokenizer, counts, 2)
    assert ext.words == ["tokenizable", "unbelievably"] and ext.first_id == 30522
    assert tok.encode("tokenizable", add_special_tokens=False).tokens == ["tokenizable"]
    model = MaskedLM(start.config.replace(vocab_size=30524))
    state = initial_state(start, model, ext)
    model.load_state_dict(state)
    emb = start.encoder_state["embeddings.word.weight"]
    torch.testing.assert_close(model.encoder.embeddings.word.weight[30522], emb[ext.pieces[0]].mean(0))
    torch.testing.assert_close(model.encoder.embeddings.word.weight[:30522], emb)
    assert model.head.decoder.weight is model.encoder.embeddings.word.weight  # tied, so it grew too


def test_inherit_decays_then_releases_the_teacher(tmp_path: Path, corpus: Path, continued: Path) -> None:
    run = tmp_path / "student"
    sets = [*SMALL, *STUDENT, "inherit.until=0.5", "inherit.alpha=0.8"]
    proc = pretrain_cli(str(corpus), "--inherit", str(continued), "--budget", "8steps", "--out", str(run), sets=sets)
    assert "knowledge inheritance ended at 50% of the budget" in proc.stdout
    steps = [r for r in read_metrics(run) if "loss" in r]
    alphas = [r.get("inherit_alpha") for r in steps]
    assert alphas[:4] == [0.8, 0.6, 0.4, 0.2] and alphas[4:] == [None] * 4
    assert all(0.0 <= r["teacher_share"] < 1.0 for r in steps[1:4])
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["model"]["hidden"] == 64 and cfg["model"]["vocab_size"] == 30522  # its shape, MiniLM's tokenizer
    assert json.loads((run / "run.json").read_text())["inherit"] == str(continued)


def test_inheritance_loss_and_teacher_init() -> None:
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import MaskedLM
    from cramkit.recipes.adapt import inheritance_kl, teacher_init

    x = torch.randn(5, 11)
    assert float(inheritance_kl(x, x)) == pytest.approx(0.0, abs=1e-6)
    assert float(inheritance_kl(x, torch.randn(5, 11))) > 0.0
    small = ModelConfig(vocab_size=50, hidden=16, layers=2, heads=2, intermediate=32, max_position=16)
    teacher, student = MaskedLM(small), MaskedLM(small.replace(layers=5))
    teacher_init(student, teacher)
    for i in range(5):  # depth grown by repeating the teacher's layers in order
        for a, b in zip(
            student.encoder.layers[i].parameters(), teacher.encoder.layers[i % 2].parameters(), strict=True
        ):
            assert torch.equal(a, b)
    assert torch.equal(student.encoder.embeddings.word.weight, teacher.encoder.embeddings.word.weight)
    with pytest.raises(Exception, match="model.hidden"):
        teacher_init(MaskedLM(small.replace(hidden=32, intermediate=64)), teacher)


def test_whole_word_masking_masks_words_together(minilm_dir: Path, builtin_docs: list[str]) -> None:
    from cramkit.data.mlm import DataConfig, mask_tokens
    from cramkit.text.tokenizer import load_tokenizer, special_ids
    from cramkit.text.words import WordBoundaries

    tok = load_tokenizer(minilm_dir)
    words = WordBoundaries(tok)
    ids = [i for d in builtin_docs[:200] for i in tok.encode(d, add_special_tokens=False).ids]
    rows = np.array(ids[: 64 * 128]).reshape(64, 128)
    start = words.starts(rows)
    cfg = DataConfig(mask_rate=0.15, masking="whole_word")
    kw = dict(seed=3, offsets=np.arange(64), cfg=cfg, special=special_ids(tok), vocab_size=tok.get_vocab_size())
    _, labels = mask_tokens(rows, word_start=start, **kw)
    _, again = mask_tokens(rows, word_start=start, **kw)
    assert np.array_equal(labels, again)  # deterministic
    chosen = labels != -100
    assert 0.12 < chosen.mean() < 0.18  # the expected share is still mask_rate
    # every word (a start and its ## continuations, within a row) is predicted whole or not at all
    word_id = np.cumsum(start, axis=1)
    mixed = 0
    for r in range(64):
        for w in np.unique(word_id[r][word_id[r] > 0]):
            sel = chosen[r][word_id[r] == w]
            mixed += int(sel.any() and not sel.all())
    assert mixed == 0
    assert (chosen & ~start).any()  # continuation pieces are predicted (with their word)


def test_whole_word_masking_of_chinese_uses_jieba(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jieba")
    from cramkit.errors import CramkitError
    from cramkit.text.tokenizer import train_tokenizer
    from cramkit.text.words import WordBoundaries

    text = ["我们在北京大学学习中文。今天天气很好，我们一起去公园散步。"] * 20
    tok = train_tokenizer(text, 200)
    words = WordBoundaries(tok)
    ids = np.array([tok.encode(text[0], add_special_tokens=False).ids])
    start = words.starts(ids)
    chars = [tok.id_to_token(i) for i in ids[0]]
    # 北京大学 is one word: its first character starts it, the other three continue it
    i = chars.index("北")
    assert start[0, i] and not start[0, i + 1 : i + 4].any()
    monkeypatch.setitem(sys.modules, "jieba", None)
    with pytest.raises(CramkitError, match=r"cramkit\[zh\]"):
        WordBoundaries(tok).starts(ids)


def test_bad_inputs_are_one_line_each(
    tmp_path: Path, corpus: Path, minilm_dir: Path, tok_dir: Path, continued: Path
) -> None:
    hf = f"hf:{minilm_dir}"
    cases = [
        (["--from", hf, "--inherit", hf], ["not both"]),
        (["--extend-vocab", "5"], ["--from"]),
        (["--from", hf, "--tokenizer", str(tok_dir)], ["--tokenizer"]),
        (["--inherit", hf], ["no masked-LM head", "--from"]),
        (["--preset", "continue"], ["--from"]),
        (["--from", hf, "--set", "model.layers=3"], ["model.layers", "--inherit"]),
        (["--from", hf, "--set", "train.keep_vectors=-1"], ["train.keep_vectors", "[0, 1e6]"]),
        (["--from", hf, "--set", "train.l2sp=nan"], ["train.l2sp"]),
        (["--set", "train.l2sp=1"], ["train.l2sp", "--from MODEL"]),
    ]
    # an ONNX export and a BiLSTM student have no encoder to continue
    onnx = tmp_path / "onnx"
    onnx.mkdir()
    (onnx / "cramkit-onnx.json").write_text("{}")
    cases.append((["--from", str(onnx)], ["export in the ONNX format"]))
    from cramkit.loading import LoadedModel
    from cramkit.model.students import BiLSTMConfig, BiLSTMStudent
    from cramkit.text.tokenizer import load_tokenizer

    student = tmp_path / "student"
    tok = load_tokenizer(minilm_dir)
    cfg = BiLSTMConfig(vocab_size=tok.get_vocab_size(), embedding_dim=8, lstm_hidden=4, fc_hidden=4)
    LoadedModel(BiLSTMStudent(cfg, 2), "classifier", cfg.__dict__, tok, labels=["0", "1"], architecture="bilstm").save(
        student
    )
    cases.append((["--from", str(student)], ["bilstm", "no transformer encoder"]))
    for i, (flags, needles) in enumerate(cases):
        out = tmp_path / f"out{i}"
        proc = pretrain_cli(str(corpus), *flags, "--budget", "2steps", "--out", str(out), check=False)
        one_line_error(proc, *needles)
        assert not (out / "checkpoints").exists(), flags

    # a token store built with another tokenizer than the model's
    store = tmp_path / "store"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "cramkit",
            "data",
            "build",
            str(corpus),
            "--tokenizer",
            str(tok_dir),
            "--out",
            str(store),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    proc = pretrain_cli(str(store), "--from", hf, "--budget", "2steps", "--out", str(tmp_path / "o"), check=False)
    one_line_error(proc, "another tokenizer", "--from")


def test_a_fresh_head_gets_its_own_learning_rate() -> None:
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import MaskedLM
    from cramkit.train.optim import build_optimizer

    model = MaskedLM(ModelConfig(vocab_size=50, hidden=16, layers=1, heads=2, intermediate=32, max_position=16))
    opt = build_optimizer(model, "adamw", 1e-4, (0.9, 0.98), 1e-6, 0.01, torch.device("cpu"), {"head.": 10.0})
    scaled = {id(p) for g in opt.param_groups if g["lr_scale"] == 10.0 for p in g["params"]}
    head = {id(p) for n, p in model.named_parameters() if n.startswith("head.")}
    assert scaled == head and id(model.head.transform[0].weight) in scaled
    # the tied decoder is the encoder's embedding: it learns at the encoder's rate
    assert id(model.encoder.embeddings.word.weight) not in scaled
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
