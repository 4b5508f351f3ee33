"""Every encoder family cramkit imports, checked against transformers' own outputs: a tiny random model of each
(transformers' config classes, no download) as a base model, a masked LM and a sequence classifier; loaded by
``cramkit.load("hf:DIR")`` its hidden states and logits equal transformers' within 1e-5 (fp32); exported back
(``export_hf``) it is the same family's class again in transformers, with the same outputs and the same token ids.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from cramkit.cli import main as cli_main
from cramkit.errors import CramkitError
from cramkit.loading import load
from cramkit.model.hf import export_hf

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")

VOCAB = 120
TOL = 1e-5
SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
# model_type -> (config class, its keywords, tokenizer style)
FAMILIES: dict[str, tuple[str, dict[str, Any], str]] = {
    "bert": ("BertConfig", {**SIZES, "max_position_embeddings": 32}, "bert"),
    "roberta": (
        "RobertaConfig",
        {**SIZES, "max_position_embeddings": 34, "pad_token_id": 1, "type_vocab_size": 1, "layer_norm_eps": 1e-5},
        "roberta",
    ),
    "xlm-roberta": (
        "XLMRobertaConfig",
        {**SIZES, "max_position_embeddings": 34, "pad_token_id": 1, "type_vocab_size": 1, "layer_norm_eps": 1e-5},
        "roberta",
    ),
    "camembert": (
        "CamembertConfig",
        {**SIZES, "max_position_embeddings": 34, "pad_token_id": 1, "type_vocab_size": 1, "layer_norm_eps": 1e-5},
        "roberta",
    ),
    "mpnet": ("MPNetConfig", {**SIZES, "max_position_embeddings": 34, "pad_token_id": 1}, "roberta"),
    "distilbert": (
        "DistilBertConfig",
        {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64, "max_position_embeddings": 32},
        "bert",
    ),
    # embeddings narrower than the blocks: the projection after them, the generator head back to their width
    "electra": ("ElectraConfig", {**SIZES, "embedding_size": 16, "max_position_embeddings": 32}, "bert"),
    # local layers' window (4 positions each side) shorter than the inputs, so that the band shows
    "modernbert": (
        "ModernBertConfig",
        {**SIZES, "num_hidden_layers": 4, "max_position_embeddings": 128, "local_attention": 8, "pad_token_id": 0},
        "bert",
    ),
    # DeBERTa-v3's shape: no absolute positions or token types, disentangled attention with 8 log buckets (exact
    # within 4 positions, logarithmic beyond: the 12-token inputs reach both) up to 16 positions
    "deberta-v2": (
        "DebertaV2Config",
        {
            **SIZES,
            "max_position_embeddings": 32,
            "relative_attention": True,
            "position_buckets": 8,
            "max_relative_positions": 16,
            "pos_att_type": "p2c|c2p",
            "share_att_key": True,
            "norm_rel_ebd": "layer_norm",
            "position_biased_input": False,
            "type_vocab_size": 0,
            "layer_norm_eps": 1e-7,
            "pad_token_id": 0,
        },
        "bert",
    ),
}
AUTO = {
    "encoder": "AutoModel",
    "mlm": "AutoModelForMaskedLM",
    "classifier": "AutoModelForSequenceClassification",
}


def _tokenizer(root: Path, style: str) -> None:
    """A word-level tokenizer.json of VOCAB tokens with BERT's ([CLS] x [SEP]) or RoBERTa's (<s> x </s></s> y
    </s>) special tokens and template, as the family's own tokenizers have them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    if style == "bert":
        special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    else:
        special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    vocab = {t: i for i, t in enumerate(special + [f"w{i}" for i in range(VOCAB - len(special))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=special[1] if style == "bert" else "<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(special)
    if style == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
        )
    else:
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))


def _tiny(root: Path, model_type: str, kind: str, seed: int = 0) -> torch.nn.Module:
    """A tiny transformers model of the family (random weights everywhere, norms and biases too), saved with a
    tokenizer in ``root``."""
    name, kwargs, style = FAMILIES[model_type]
    config = getattr(transformers, name)(vocab_size=VOCAB, num_labels=3, **kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, AUTO[kind]).from_config(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(root, safe_serialization=True)
    _tokenizer(root, style)
    return model


def _inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    return ids, mask


def _theirs(model: torch.nn.Module, kind: str, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return out.last_hidden_state if kind == "encoder" else out.logits


def _ours(model: torch.nn.Module, kind: str, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if kind == "encoder":
            return model(ids, mask)
        if kind == "mlm":
            return model(ids, attention_mask=mask).logits
        return model(ids, mask)[1]


def _close(ours: torch.Tensor, theirs: torch.Tensor, kind: str, mask: torch.Tensor) -> None:
    if kind == "classifier":
        torch.testing.assert_close(ours, theirs, atol=TOL, rtol=0)
    else:  # real (unpadded) positions: padded ones are meaningless in both
        keep = mask.bool()
        torch.testing.assert_close(ours[keep], theirs[keep], atol=TOL if kind == "encoder" else 5e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("model_type", "kind"),
    [(t, k) for t in FAMILIES for k in AUTO if (t, k) != ("modernbert", "classifier")],
)
def test_import_equals_transformers_and_exports_back(model_type: str, kind: str, tmp_path: Path) -> None:
    theirs = _tiny(tmp_path / "model", model_type, kind)
    loaded = load(f"hf:{tmp_path / 'model'}")
    assert loaded.kind == kind and loaded.config.hf_model_type == model_type
    ids, mask = _inputs()
    _close(_ours(loaded.model.eval(), kind, ids, mask), _theirs(theirs, kind, ids, mask), kind, mask)
    if kind == "classifier":
        assert loaded.labels == ["LABEL_0", "LABEL_1", "LABEL_2"]

    # exported back: the same family's class in transformers, the same outputs, the same token ids
    out = export_hf(loaded.model, loaded.config, tmp_path / "export", tokenizer_dir=tmp_path / "model")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == model_type and not (out / "modeling_cramkit.py").exists()
    back = getattr(transformers, AUTO[kind]).from_pretrained(out).eval()
    assert type(back) is type(theirs)
    _close(_theirs(back, kind, ids, mask), _theirs(theirs, kind, ids, mask), kind, mask)
    text = ["w1 w2 w3", "w7"]
    assert transformers.AutoTokenizer.from_pretrained(out)(text)["input_ids"] == [
        e.ids for e in loaded.tokenizer.encode_batch(text)
    ]


@pytest.mark.parametrize("model_type", ["roberta", "mpnet", "electra"])
def test_engine_embeds_and_classifies_as_transformers(model_type: str, tmp_path: Path) -> None:
    """Through the inference engine (its own encoding: the family's special tokens), fp32: the first token's and
    the mean hidden state, and a classifier's probabilities, as transformers computes them."""
    from cramkit.infer import Engine

    texts = ["w1 w2 w3 w4 w5", "w9", ("w3 w4", "w5 w6 w7")]
    theirs = _tiny(tmp_path / "enc", model_type, "encoder")
    loaded = load(f"hf:{tmp_path / 'enc'}")
    engine = Engine(loaded, precision="fp32")
    encoded = [(e.ids, e.type_ids) for e in loaded.tokenizer.encode_batch(texts)]
    got = torch.tensor(engine.embed(texts, pooling="mean", normalize=False))
    for row, (ids, types) in enumerate(encoded):
        x, t = torch.tensor([ids]), torch.tensor([types])
        with torch.no_grad():
            hidden = theirs(input_ids=x, attention_mask=torch.ones_like(x), token_type_ids=t).last_hidden_state
        torch.testing.assert_close(got[row], hidden.mean(1)[0], atol=TOL, rtol=1e-5)

    theirs = _tiny(tmp_path / "clf", model_type, "classifier")
    engine = Engine(load(f"hf:{tmp_path / 'clf'}"), precision="fp32")
    probs = torch.tensor(engine.classify(texts).probs)
    for row, (ids, types) in enumerate(encoded):
        x, t = torch.tensor([ids]), torch.tensor([types])
        with torch.no_grad():
            want = theirs(input_ids=x, attention_mask=torch.ones_like(x), token_type_ids=t).logits.softmax(-1)[0]
        torch.testing.assert_close(probs[row], want, atol=TOL, rtol=1e-5)


def test_mpnet_relative_bias_beyond_the_exact_buckets(tmp_path: Path) -> None:
    """MPNet's logarithmic buckets (offsets past 8) and its positions counted from the padding index: a sequence
    as long as the model takes (32 tokens) equals transformers'."""
    theirs = _tiny(tmp_path / "m", "mpnet", "encoder")
    loaded = load(f"hf:{tmp_path / 'm'}")
    assert loaded.max_length == 32
    ids = torch.randint(5, VOCAB, (2, 32), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    _close(_ours(loaded.model.eval(), "encoder", ids, mask), _theirs(theirs, "encoder", ids, mask), "encoder", mask)


@pytest.mark.parametrize(
    "changes",
    [
        {"position_buckets": 16, "max_relative_positions": 64, "max_position_embeddings": 128},
        # DeBERTa-v2's shape: absolute positions as well, two token types; max_relative_positions from the positions
        {"position_biased_input": True, "type_vocab_size": 2, "max_relative_positions": -1, "position_buckets": 32},
    ],
)
def test_deberta_far_positions_and_absolute_ones(tmp_path: Path, changes: dict[str, Any]) -> None:
    """DeBERTa's log buckets far past the exact ones (distances up to 119 against a 64-position range, which they
    saturate), and the v2 shape with absolute positions added: transformers' hidden states."""
    name, kwargs, style = FAMILIES["deberta-v2"]
    config = transformers.DebertaV2Config(vocab_size=VOCAB, **{**kwargs, **changes})
    torch.manual_seed(0)
    theirs = transformers.AutoModel.from_config(config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.1)
    theirs.save_pretrained(tmp_path / "m", safe_serialization=True)
    _tokenizer(tmp_path / "m", style)
    loaded = load(f"hf:{tmp_path / 'm'}")
    length = min(120, config.max_position_embeddings)
    ids = torch.randint(5, VOCAB, (2, length), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, length // 2 :] = 0
    _close(_ours(loaded.model.eval(), "encoder", ids, mask), _theirs(theirs, "encoder", ids, mask), "encoder", mask)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"model_type": "deberta"}, "model_type 'deberta' is not supported (DeBERTa v1's attention"),
        ({"model_type": "albert"}, "model_type 'albert' is not supported (ALBERT's shared layers"),
        (
            {"model_type": "gpt2"},
            "imports bert, roberta, xlm-roberta, camembert, distilbert, electra, mpnet, modernbert",
        ),
        ({"architectures": ["RobertaForCausalLM"]}, "architecture 'RobertaForCausalLM' is not supported"),
        ({"is_decoder": True}, "is_decoder=true"),
    ],
)
def test_unsupported_families_are_one_line(
    tmp_path: Path, changes: dict[str, Any], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _tiny(tmp_path / "m", "roberta", "encoder")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, **changes}))
    with pytest.raises(CramkitError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load(f"hf:{tmp_path / 'm'}")
    (tmp_path / "texts.txt").write_text("w1 w2\nw3\n")
    capsys.readouterr()
    args = ["embed", "--from", f"hf:{tmp_path / 'm'}", str(tmp_path / "texts.txt"), "--out", str(tmp_path / "e")]
    assert cli_main(args) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0] and ("not supported" in err[0] or "cannot import" in err[0])


def test_fill_mask_finds_the_families_own_mask_token(tmp_path: Path) -> None:
    """An MPNet masked LM's ``<mask>``: the engine fills it, as transformers ranks the vocabulary there."""
    from cramkit.infer import Engine

    theirs = _tiny(tmp_path / "m", "mpnet", "mlm")
    loaded = load(f"hf:{tmp_path / 'm'}")
    engine = Engine(loaded, precision="fp32")
    assert engine.can_fill_mask
    (masks,) = engine.fill_mask(["w3 <mask> w5"], top_k=3)
    ids = torch.tensor([loaded.tokenizer.encode("w3 <mask> w5").ids])
    assert ids[0, 2] == 4  # <mask>
    with torch.no_grad():
        want = theirs(input_ids=ids).logits[0, 2].softmax(-1).topk(3)
    assert [m["id"] for m in masks[0]] == want.indices.tolist()
    assert [m["score"] for m in masks[0]] == pytest.approx(want.values.tolist(), abs=1e-5)


# every format per family: (family, kind) -> formats that run it; the others refuse in one line naming why
FORMATS = [
    ("roberta", "classifier", "onnx"),
    ("roberta", "encoder", "ct2"),  # the position table from its offset
    ("distilbert", "classifier", "ct2"),  # the relu pooler
    ("electra", "classifier", "onnx"),
    ("mpnet", "encoder", "onnx"),  # the relative bias in the plain attention graph
    ("mpnet", "classifier", "openvino"),
    ("modernbert", "encoder", "onnx"),  # the local layers' band and their own rotary base in the graph
    ("modernbert", "encoder", "openvino"),
    ("deberta-v2", "classifier", "onnx"),  # the position terms in the plain attention graph
    ("deberta-v2", "encoder", "openvino"),
]


@pytest.mark.parametrize(("model_type", "kind", "fmt"), FORMATS)
def test_exports_of_each_family_match_torch(model_type: str, kind: str, fmt: str, tmp_path: Path) -> None:
    """The export's own check (its outputs against the torch model's on held-out rows) passes, and the engine
    over the export gives transformers' pooled vectors or probabilities."""
    import cramkit
    from cramkit.infer import Engine

    pytest.importorskip({"onnx": "onnxruntime", "ct2": "ctranslate2", "openvino": "openvino"}[fmt])
    theirs = _tiny(tmp_path / "m", model_type, kind)
    out = cramkit.export(f"hf:{tmp_path / 'm'}", tmp_path / fmt, format=fmt, progress=False)
    engine = Engine(load(out))
    loaded = load(f"hf:{tmp_path / 'm'}")
    texts = ["w1 w2 w3 w4 w5 w6", "w9 w10"]
    for row, e in enumerate(loaded.tokenizer.encode_batch(texts)):
        x = torch.tensor([e.ids])
        with torch.no_grad():
            out_hf = theirs(input_ids=x, attention_mask=torch.ones_like(x))
        if kind == "encoder":
            got = torch.tensor(engine.embed([texts[row]], pooling="cls", normalize=False))[0]
            torch.testing.assert_close(got, out_hf.last_hidden_state[0, 0], atol=2e-3, rtol=1e-3)
        else:
            got = torch.tensor(engine.classify([texts[row]]).probs)[0]
            torch.testing.assert_close(got, out_hf.logits.softmax(-1)[0], atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize(
    ("model_type", "expected"),
    [
        ("mpnet", "no relative position bias"),
        ("electra", "no projection after embeddings"),
        ("modernbert", "no local attention layers"),
        ("deberta-v2", "no disentangled attention"),
    ],
)
def test_what_ctranslate2_cannot_hold_is_one_line(
    model_type: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ctranslate2")
    _tiny(tmp_path / "m", model_type, "encoder")
    capsys.readouterr()
    assert cli_main(["export", f"hf:{tmp_path / 'm'}", "--format", "ct2", "--out", str(tmp_path / "ct2")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "ct2").exists()


def test_a_modernbert_classifier_is_one_line_and_its_encoder_fine_tunes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ModernBERT's classification head (dense + GELU + norm) is not cramkit's: its checkpoint is refused in one
    line naming the classes that import; a classifier fine-tuned from its encoder exports to ONNX, and refuses
    --format hf in one line (the cramkit format does not hold its local attention)."""
    _tiny(tmp_path / "clf", "modernbert", "classifier")
    with pytest.raises(CramkitError, match="supported: ModernBertModel, ModernBertForMaskedLM"):
        load(f"hf:{tmp_path / 'clf'}")
    _tiny(tmp_path / "base", "modernbert", "encoder")
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"w{i} w{i + 1},{i % 2}\n" for i in range(5, 60)))
    out = tmp_path / "ft"
    args = ["finetune", "--from", f"hf:{tmp_path / 'base'}", "--train", str(tmp_path / "train.csv"), "--out", str(out)]
    assert cli_main([*args, "--text-a", "text", "--set", "epochs=1", "--set", "min_steps=0", "--no-progress"]) == 0
    capsys.readouterr()
    assert cli_main(["export", str(out), "--out", str(tmp_path / "hf")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "export it with --format onnx" in err[0], err
    pytest.importorskip("onnxruntime")
    assert cli_main(["export", str(out), "--format", "onnx", "--out", str(tmp_path / "onnx")]) == 0


@pytest.mark.parametrize(
    ("model_type", "changes"),
    [
        ("modernbert", {"global_attn_every_n_layers": 0, "layer_types": None}),
        ("modernbert", {"rope_parameters": "160000"}),
        ("modernbert", {"layer_types": "full_attention"}),
        ("modernbert", {"layer_types": ["full_attention", "full_attention", "sliding_attention", "full_attention"]}),
        ("modernbert", {"local_attention": -8}),
        ("modernbert", {"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}}}),
        ("mpnet", {"relative_attention_num_buckets": 10**12}),
        ("mpnet", {"pad_token_id": 40}),  # positions from 41 on: past the 34-row table
        ("roberta", {"max_position_embeddings": "514"}),
        ("distilbert", {"sinusoidal_pos_embds": True}),
        ("electra", {"embedding_size": 10**9}),
        ("deberta-v2", {"position_buckets": 10**12}),  # a 2 x 10^12-row table: refused before allocating
        ("deberta-v2", {"position_buckets": 8, "max_relative_positions": 3}),  # no log bucket fits
        ("deberta-v2", {"conv_kernel_size": 3}),  # DeBERTa-v2-xlarge's convolution: not imported
        ("deberta-v2", {"pos_att_type": ["c2p"]}),
        ("deberta-v2", {"share_att_key": False}),
        ("deberta-v2", {"pos_att_type": "p2c|c2p", "pooler_hidden_act": "tanh"}),
    ],
)
def test_crafted_family_configs_are_one_line(
    model_type: str, changes: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config.json that is broken or crafted (a zero layer period, a rotary base that is a string, a bucket count
    of 10^12, an embedding a billion wide): one line naming the file, no traceback, nothing allocated for it."""
    _tiny(tmp_path / "m", model_type, "encoder")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config.update(changes)
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    (tmp_path / "texts.txt").write_text("w1 w2\nw3\n")
    capsys.readouterr()
    args = ["embed", "--from", f"hf:{tmp_path / 'm'}", str(tmp_path / "texts.txt"), "--out", str(tmp_path / "e")]
    assert cli_main(args) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0] and str(tmp_path / "m") in err[0], err


def test_a_sentencepiece_only_folder_says_how_to_convert_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """DeBERTa-v3 on the hub ships spm.model, no tokenizer.json: one line naming the file and the conversion."""
    _tiny(tmp_path / "m", "deberta-v2", "encoder")
    (tmp_path / "m" / "tokenizer.json").unlink()
    (tmp_path / "m" / "spm.model").write_bytes(b"\x0a\x05<pad>")  # never parsed by cramkit
    (tmp_path / "texts.txt").write_text("w1 w2\n")
    capsys.readouterr()
    args = ["embed", "--from", f"hf:{tmp_path / 'm'}", str(tmp_path / "texts.txt"), "--out", str(tmp_path / "e")]
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "spm.model" in err[0] and "save_pretrained" in err[0], err
