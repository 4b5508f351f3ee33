"""Hugging Face import and export.

Import: a BERT checkpoint (``BertModel``, ``BertForMaskedLM``, ``BertForPreTraining``,
``BertForSequenceClassification``, ...; safetensors) maps parameter for parameter onto our encoder in
its ``bert-base`` shape (post-LN, learned positions, biases, token types): hidden states equal
transformers' within float rounding. Query, key and value are concatenated into our fused ``qkv``.
The door to it is ``cramkit.load("hf:DIR")``, which also reads back our own ``model_type: cramkit`` exports.

Export: a BERT-shaped model becomes a plain ``BertForMaskedLM`` / ``BertModel`` /
``BertForSequenceClassification`` / ``BertForMultipleChoice`` directory that transformers' Auto classes
load with no custom code. Any other architecture (pre-LN,
no biases, sinusoidal or rotary positions, GLU, RMSNorm, DeepNorm) is written with our own parameter
names and a self-contained ``modeling_cramkit.py`` (a copy of ``hf_modeling_template.py``, depending on
torch and transformers only), loadable with ``trust_remote_code=True`` (a multiple-choice model of such an
architecture has no export here: ONNX carries it). Export needs no transformers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from cramkit.errors import CramkitError
from cramkit.io import BadJson, folder_file, json_loads, json_text, read_json
from cramkit.model.architectures import Family, family_of
from cramkit.model.encoder import Encoder, ModelConfig
from cramkit.model.heads import MaskedLM, MultipleChoice, SequenceClassifier
from cramkit.model.pooling import st_pooling_config

TEMPLATE = Path(__file__).with_name("hf_modeling_template.py")
EXPORT_MARKER = "cramkit_export.json"
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
# ModelConfig fields a family's config.json must carry back unchanged for an export under its model_type
_ARCHITECTURE_FIELDS = (
    "vocab_size",
    "hidden",
    "layers",
    "heads",
    "intermediate",
    "activation",
    "norm",
    "norm_position",
    "norm_eps",
    "bias",
    "position",
    "max_position",
    "embedding_norm",
    "final_norm",
    "position_offset",
    "embedding_size",
    "relative_buckets",
    "relative_max_distance",
    "disentangled_buckets",
    "disentangled_max_distance",
    "local_window",
    "global_every",
    "local_rope_base",
    "first_attention_norm",
    "decoder_bias",
    "rope_base",
    "moe_experts",
)


# ----------------------------------------------------------------------------------------------- import


def _read_hf_config(path: str | Path) -> tuple[Path, dict[str, Any]]:
    path = Path(path)
    file = folder_file(path, "config.json") if path.is_dir() else path
    if not file.exists():
        inside = sorted(p.parent.name for p in path.glob("*/config.json")) if path.is_dir() else []
        hint = f" (found one in {path / inside[0]}: give that folder)" if len(inside) == 1 else ""
        raise CramkitError(
            f"{path}: no config.json; give a Hugging Face model directory (config.json + model.safetensors){hint}"
        )
    data = read_json(file, "re-download the checkpoint")
    if not isinstance(data, dict):
        raise CramkitError(f"{file} must hold a JSON object")
    return file, data


def load_hf_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of a Hugging Face checkpoint of a family cramkit imports (BERT, RoBERTa / XLM-R /
    CamemBERT, DistilBERT, ELECTRA, MPNet: ``cramkit.model.architectures``), from its directory or config.json.

    Anything our encoder cannot reproduce exactly raises a CramkitError that says what it is.
    """
    file, hf = _read_hf_config(path)
    model_type = hf.get("model_type")
    family = family_of(model_type, file)
    readable = [family.model_types[str(model_type)] + suffix for suffix in family.read_suffixes]
    bad_arch = [a for a in hf.get("architectures") or [] if a not in readable]
    if bad_arch:
        raise CramkitError(f"{file}: architecture {bad_arch[0]!r} is not supported; supported: {', '.join(readable)}")
    try:
        cfg = ModelConfig(**family.config_in(hf, file), hf_model_type=str(model_type))
    except (TypeError, ValueError) as exc:
        raise CramkitError(f"{file}: a size field has a bad value ({exc})") from None
    try:
        cfg.validate()
    except CramkitError as exc:
        raise CramkitError(f"{file}: {exc}") from None
    return cfg


def _weight_files(root: Path) -> list[Path]:
    single = folder_file(root, "model.safetensors")
    if single.exists():
        return [single]
    index = folder_file(root, "model.safetensors.index.json")
    if index.exists():
        data = read_json(index, "re-download it")
        try:
            shards = sorted(set(data["weight_map"].values()))
        except (KeyError, AttributeError, TypeError) as exc:
            raise CramkitError(f"{index} is not a valid safetensors index ({exc}); re-download it") from None
        return [_shard_path(root, index, s) for s in shards]
    legacy = folder_file(root, "pytorch_model.bin")
    if legacy.exists():
        return [legacy]
    raise CramkitError(
        f"{root}: no model.safetensors (or model.safetensors.index.json, pytorch_model.bin); "
        "give a Hugging Face model directory with its weights"
    )


def _shard_path(root: Path, index: Path, name: object) -> Path:
    """A shard named in the index, which must be a plain file name inside the model folder.

    Checked by name, not by resolving links: a Hugging Face cache snapshot links its files to blobs
    elsewhere, which is fine; a name that climbs out (``../``) or is absolute is not.
    """
    if not isinstance(name, str) or not name:
        raise CramkitError(f"{index}: a shard name is {name!r}, not a file name; re-download the model")
    parts = Path(name).parts
    if Path(name).is_absolute() or ".." in parts or "\\" in name or "\x00" in name:
        raise CramkitError(
            f"{index} names the weight file {name!r}, which lies outside the model folder {root}; the index "
            "is malformed or malicious: re-download the model from a source you trust"
        )
    return folder_file(root, name)


def read_weights(file: Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file (or a legacy .bin, loaded with weights_only=True)."""
    if not file.exists():
        raise CramkitError(f"{file} is missing; re-download the checkpoint")
    if file.suffix == ".bin":
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as exc:  # any unpickling failure is a bad file
            raise CramkitError(
                f"{file} could not be read as plain tensors ({exc}); convert it to safetensors"
            ) from None
        if not isinstance(state, dict):
            raise CramkitError(f"{file} does not hold a state dict of tensors")
        return state
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(file)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CramkitError(
            f"{file} is not a valid safetensors file ({exc}); it is corrupt or truncated: re-download or re-export it"
        ) from None


def load_hf_encoder_state(path: str | Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A Hugging Face checkpoint's weights under our names: Encoder keys (``layers.0.attn.qkv.weight``), plus
    ``head.*`` (MLM head), ``pooler.*`` and ``classifier.*`` when the checkpoint has them."""
    root = Path(path)
    family = family_of(cfg.hf_model_type, root / "config.json")
    raw: dict[str, torch.Tensor] = {}
    for file in _weight_files(root):
        raw.update(read_weights(file))
    out = family.rename(raw, root)
    if cfg.tie_embeddings:
        out.pop("head.decoder.weight", None)  # the word embeddings themselves
    # every encoder parameter present, with the shape our config expects
    with torch.device("meta"):
        expected = Encoder(cfg).state_dict()
    missing = [k for k in expected if k not in out]
    if missing:
        raise CramkitError(
            f"{root}: the checkpoint lacks {len(missing)} encoder weights (e.g. {missing[0]}); "
            "is config.json from the same model as the weights?"
        )
    for k, ref in expected.items():
        if tuple(out[k].shape) != tuple(ref.shape):
            raise CramkitError(
                f"{root}: weight {k} has shape {tuple(out[k].shape)} but config.json implies {tuple(ref.shape)}"
            )
    if family.adjust_in is not None:  # (on tensors of the shapes checked above)
        family.adjust_in(out, cfg)
    return {k: v.float() if v.is_floating_point() else v for k, v in out.items()}


def _resolve(path: str | Path) -> Path:
    """A local directory, or a hub id (``hf:NAME`` or ``org/name``) downloaded to the HF cache."""
    name = str(path)
    if name.startswith("hf:"):
        name = name[3:]
    local = Path(name).expanduser()
    if local.is_dir():
        return local
    if local.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1 or not name:
        raise CramkitError(f"{path}: not a model directory; give a directory with config.json and model.safetensors")
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.utils import LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        raise CramkitError(
            f"{path}: downloading from the Hugging Face hub needs huggingface_hub: pip install 'cramkit[hf]'"
        ) from None
    patterns = ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors"]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns + list(TOKENIZER_FILES)))
    except LocalEntryNotFoundError:  # not cached, and offline or no network
        why = "downloads are off (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else "the hub cannot be reached"
        raise CramkitError(
            f"hf:{name}: not in the local Hugging Face cache and {why}; connect to the network (and unset "
            "HF_HUB_OFFLINE), or download the model where there is one and give its directory"
        ) from None
    except RepositoryNotFoundError:
        raise CramkitError(
            f"hf:{name}: no such model on the Hugging Face hub (or it is private); check the name"
        ) from None
    except Exception as exc:  # gated repo, server error, ...
        first = (str(exc).strip().splitlines() or [""])[0]
        raise CramkitError(
            f"hf:{name}: could not download it from the Hugging Face hub ({type(exc).__name__}: {first}); "
            "check the name and the network, or give a local directory"
        ) from None


# ----------------------------------------------------------------------------------------------- export


def bert_incompatibilities(cfg: ModelConfig) -> list[str]:
    """Why ``cfg`` cannot be written as a plain HF BertModel (empty list: it can)."""
    out = []
    if cfg.norm_position != "post":
        out.append(f"norm_position={cfg.norm_position}")
    if cfg.norm != "layernorm":
        out.append(f"norm={cfg.norm}")
    if not cfg.bias:
        out.append("bias=false")
    if cfg.position != "learned":
        out.append(f"position={cfg.position}")
    if cfg.activation not in ("gelu", "relu"):
        out.append(f"activation={cfg.activation}")
    if not cfg.embedding_norm:
        out.append("embedding_norm=false")
    if not cfg.head_transform:
        out.append("head_transform=false")
    return out


def _parts(model: nn.Module) -> tuple[Encoder, nn.Module | None, SequenceClassifier | None]:
    from cramkit.model.prompting import PromptClassifier

    if isinstance(model, (MaskedLM, PromptClassifier)):  # a prompt model's classifier is its masked-LM head
        return model.encoder, model.head, None
    if isinstance(model, SequenceClassifier):
        return model.encoder, None, model
    if isinstance(model, Encoder):
        return model, None, None
    raise CramkitError(
        f"export_hf: cannot export a {type(model).__name__}; give an Encoder, MaskedLM or SequenceClassifier"
    )


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to("cpu").contiguous().clone()


def _labels_config(num_labels: int | None, labels: list[str] | None = None, multilabel: bool = False) -> dict[str, Any]:
    """config.json's id2label, label2id and problem_type of a classifier with ``num_labels`` outputs."""
    if num_labels is None:
        return {}
    names = labels if labels is not None and len(labels) == num_labels else None
    names = names or [f"LABEL_{i}" for i in range(num_labels)]
    config: dict[str, Any] = {
        "id2label": {str(i): n for i, n in enumerate(names)},
        "label2id": {n: i for i, n in enumerate(names)},
    }
    if num_labels == 1:
        config["problem_type"] = "regression"
    elif multilabel:
        config["problem_type"] = "multi_label_classification"
    return config


def export_family(cfg: ModelConfig) -> tuple[Family, str] | tuple[None, list[str]]:
    """The family and model_type an export writes ``cfg`` under (its own where it was imported, else BERT), or
    None and why it cannot: what a config.json of that type would not carry back unchanged."""
    model_type = cfg.hf_model_type or "bert"
    family = family_of(model_type, Path("config.json"))
    problems = bert_incompatibilities(cfg) if model_type == "bert" and not cfg.hf_model_type else []
    if not problems:
        try:
            back = ModelConfig(**family.config_in(family.config_out(cfg), Path("config.json")))
        except (CramkitError, TypeError, ValueError) as exc:
            return None, [str(exc)]
        if back.type_vocab_size == 1 and cfg.type_vocab_size == 0:
            back = back.replace(type_vocab_size=0)  # a row of zeros is written for a model with no token types
        problems = [
            f"{f}={getattr(cfg, f)}"
            for f in (*_ARCHITECTURE_FIELDS, "type_vocab_size")
            if getattr(back, f) != getattr(cfg, f)
        ]
    return (family, model_type) if not problems else (None, problems)


def _cramkit_config(cfg: ModelConfig, arch: str, dtype: torch.dtype) -> dict[str, Any]:
    fields = dataclasses.asdict(cfg)
    fields.pop("gradient_checkpointing", None)
    fields["tie_word_embeddings"] = fields.pop("tie_embeddings")
    auto_map = {"AutoConfig": "modeling_cramkit.CramkitConfig", "AutoModel": "modeling_cramkit.CramkitModel"}
    if arch == "CramkitForMaskedLM":
        auto_map["AutoModelForMaskedLM"] = "modeling_cramkit.CramkitForMaskedLM"
    if arch == "CramkitForSequenceClassification":
        auto_map["AutoModelForSequenceClassification"] = "modeling_cramkit.CramkitForSequenceClassification"
    return {
        "architectures": [arch],
        "model_type": "cramkit",
        "auto_map": auto_map,
        **fields,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def _write_tokenizer(tokenizer_dir: Path, out: Path, cfg: ModelConfig) -> None:
    """The tokenizer files beside an export: tokenizer_config.json names a class transformers has (BERT's, or for
    another tokenizer the generic one reading tokenizer.json) and the special tokens the tokenizer holds, so that
    AutoTokenizer (given trust_remote_code=True for a remote-code export, whose config.json needs it) loads it
    without remote code."""
    tokenizer_dir = Path(tokenizer_dir)
    if not tokenizer_dir.is_dir():
        raise CramkitError(f"tokenizer directory {tokenizer_dir} does not exist")
    copied = [f for f in TOKENIZER_FILES if (tokenizer_dir / f).exists()]
    if not {"tokenizer.json", "vocab.txt"} & set(copied):
        raise CramkitError(f"{tokenizer_dir}: no tokenizer.json or vocab.txt to export")
    for f in copied:
        shutil.copyfile(folder_file(tokenizer_dir, f), out / f)
    tok_cfg: dict[str, Any] = {}
    if "tokenizer_config.json" in copied:
        try:
            tok_cfg = json_loads(json_text(out / "tokenizer_config.json"))
        except (BadJson, UnicodeDecodeError) as exc:
            raise CramkitError(f"{tokenizer_dir / 'tokenizer_config.json'} is {exc}; re-save the tokenizer") from None
        if not isinstance(tok_cfg, dict):
            tok_cfg = {}
    for key in ("auto_map", "tokenizer_file"):  # never remote code; tokenizer.json sits beside it
        tok_cfg.pop(key, None)
    from cramkit.text.tokenizer import load_tokenizer, special_tokens_map

    # tokenizer.json (else vocab.txt, whose names are BERT's): the special tokens it declares
    bert, specials = special_tokens_map(load_tokenizer(out))
    klass = "BertTokenizerFast" if (tokenizer_dir / "tokenizer.json").exists() else "BertTokenizer"
    if not bert and klass == "BertTokenizerFast":  # RoBERTa's <s> </s> <mask>: the generic class reads tokenizer.json
        klass = "PreTrainedTokenizerFast"
    tok_cfg = {**tok_cfg, "tokenizer_class": klass, "model_max_length": cfg.positions, **specials}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n", encoding="utf-8")


def _write_sentence_transformers(out: Path, st: dict[str, Any], hidden: int, *, trust: bool) -> None:
    """modules.json (Transformer, Pooling, Normalize when the vectors are normalised), 1_Pooling/config.json
    and sentence_bert_config.json: ``SentenceTransformer(DIR)`` gives cramkit's vectors (a cramkit-format
    model: ``SentenceTransformer(DIR, trust_remote_code=True)``)."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if st.get("normalize"):
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out / "2_Normalize").mkdir()
    (out / "1_Pooling").mkdir()
    pooling = st_pooling_config(st["pooling"], hidden)
    bert_cfg: dict[str, Any] = {"max_seq_length": int(st["max_length"]), "do_lower_case": False}
    if trust:  # the Transformer module reads a cramkit-format model through its remote code
        bert_cfg |= {"model_args": {"trust_remote_code": True}, "config_args": {"trust_remote_code": True}}
    files = {
        "modules.json": modules,
        "1_Pooling/config.json": pooling,
        "sentence_bert_config.json": bert_cfg,
        "config_sentence_transformers.json": {
            "similarity_fn_name": "cosine",
            "prompts": dict(st.get("prompts") or {}),
            "default_prompt_name": st.get("default_prompt_name"),
        },
    }
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def export_hf(
    model_or_encoder: nn.Module,
    cfg: ModelConfig,
    out_dir: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    mlm_head: bool = True,
    force: bool = False,
    labels: list[str] | None = None,
    prompt: dict[str, Any] | None = None,
    sentence_transformers: dict[str, Any] | None = None,
    kin: tuple[str, ...] = (),
    pooler_state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a Hugging Face model directory (config.json, model.safetensors, tokenizer files).

    A BERT-shaped ``cfg`` gives plain ``BertForMaskedLM`` / ``BertModel`` /
    ``BertForSequenceClassification``; anything else gives model_type "cramkit" with
    ``modeling_cramkit.py`` (load with ``trust_remote_code=True``). The directory appears atomically;
    a non-empty directory that is not a previous export is refused unless ``force``. prompt: a prompt
    model's template and label words (``PromptSpec.meta()``), recorded in ``cramkit_export.json``.
    sentence_transformers: an embedding model's pooling ("mean" | "cls"), normalize, max_length (and
    matryoshka): the folder is also a sentence-transformers model (modules.json, 1_Pooling, 2_Normalize).
    kin: the manifest files of every export format (an earlier export of any of them may be replaced).
    pooler_state: the base model's pooler (``weight``, ``bias``) an imported checkpoint brought and an encoder keeps
    beside it (``LoadedModel.pooler_state``): written back where the family's base model has one.
    """
    from safetensors.torch import save_file

    from cramkit.io import check_out, listing

    out = Path(out_dir)
    kin = kin or (EXPORT_MARKER,)  # (the caller, above the formats, names theirs: backends.export_markers)
    check_out(out, own=[EXPORT_MARKER], replace=True, force=force, kin=kin)
    enc, head, clf = _parts(model_or_encoder)
    if not mlm_head:
        head = None
    family, model_type, problems = _not_own_type_because(cfg, head, clf)
    fmt = model_type if family is not None else "cramkit"
    if family is not None:
        arch, weights, config = _as_family(family, model_type, enc, head, clf, cfg, labels)
        if arch.endswith("Model") and pooler_state is not None and "pooler.dense.weight" in family.names:
            weights |= {f"pooler.dense.{k}": _t(v) for k, v in pooler_state.items()}
    else:
        arch, weights, config = _as_cramkit(enc, head, clf, cfg, labels)

    with _replaced_atomically(out) as tmp:
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        if fmt == "cramkit":
            shutil.copyfile(TEMPLATE, tmp / "modeling_cramkit.py")
        if tokenizer_dir is not None:
            _write_tokenizer(Path(tokenizer_dir), tmp, cfg)
        marker: dict[str, Any] = {"format": fmt, "architecture": arch, "incompatible_with_bert": problems}
        if prompt is not None:  # transformers knows nothing of it: whoever runs the model applies it
            marker["prompt"] = prompt
        if sentence_transformers is not None:
            _write_sentence_transformers(tmp, sentence_transformers, cfg.hidden, trust=fmt == "cramkit")
            marker["sentence_transformers"] = sentence_transformers
        marker["entries"] = sorted([*listing(tmp), EXPORT_MARKER])  # what a later export replaces: this, no more
        check_out(out, own=[EXPORT_MARKER], replace=True, force=force, kin=kin)  # (added meanwhile?)
        (tmp / EXPORT_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return out


def _not_own_type_because(
    cfg: ModelConfig, head: nn.Module | None, clf: SequenceClassifier | None
) -> tuple[Family | None, str, list[str]]:
    """The family and model_type the model is written under (its own, or BERT), or None and what keeps it from
    them (the cramkit format then carries it); a CramkitError where nothing can: a multiple-choice model of
    another shape, or a model whose architecture the cramkit format does not hold."""
    if head is None:
        cfg = cfg.replace(head_transform=True)  # no MLM head written: its shape does not matter
    family, found = export_family(cfg)
    problems = [] if family is not None else cast("list[str]", found)
    model_type = cast(str, found) if family is not None else ""
    if family is not None and clf is not None:
        activation = clf.head_cfg.pooler_activation
        if not family.writes("classifier"):
            problems = [f"{family.name} has no classifier class with cramkit's head (a pooler and a linear layer)"]
        elif clf.head_cfg.pooling != "cls" or clf.pooler is None or activation != family.pooler_activation:
            problems = [
                f"classifier pooling={clf.head_cfg.pooling} pooler={clf.pooler is not None} activation={activation}"
            ]
    if isinstance(clf, MultipleChoice) and (problems or clf.head_cfg.pooler_activation != "tanh"):
        raise CramkitError(
            "export_hf: this multiple-choice model has no BertForMultipleChoice equivalent "
            f"({', '.join(problems) or 'its pooler activation'}); export it with --format onnx"
        )
    imported_only = (
        cfg.position_offset
        or cfg.embedding_size
        or cfg.pairwise_attention
        or not cfg.first_attention_norm
        or cfg.decoder_bias
    )
    if problems and imported_only:
        raise CramkitError(
            f"export_hf: this {cfg.hf_model_type or 'cramkit'} model cannot be written under its own model_type "
            f"({', '.join(problems)}), and the cramkit format does not hold what its architecture adds to cramkit's "
            "(position offset, embedding projection, relative position bias, local or disentangled attention); export "
            "it with --format onnx"
        )
    return (None if problems else family), model_type, problems


def _as_family(
    family: Family,
    model_type: str,
    enc: Encoder,
    head: nn.Module | None,
    clf: SequenceClassifier | None,
    cfg: ModelConfig,
    labels: list[str] | None,
) -> tuple[str, dict[str, torch.Tensor], dict[str, Any]]:
    """The architecture, weights and config.json of an export under the family's own model_type (BERT,
    RoBERTa, ...): what transformers, sentence-transformers and TEI load with no custom code."""
    dtype = enc.embeddings.word.weight.dtype
    kind = (
        "multiple_choice"
        if isinstance(clf, MultipleChoice)
        else "classifier"
        if clf is not None
        else "mlm"
        if head is not None
        else "encoder"
    )
    ours = {k: _t(v) for k, v in enc.state_dict().items()}
    if not cfg.type_vocab_size and "embeddings.token_type.weight" in family.names.values():
        ours["embeddings.token_type.weight"] = torch.zeros(1, cfg.embedding_width, dtype=dtype)
    if head is not None and clf is None:
        ours |= {f"head.{k}": _t(v) for k, v in head.state_dict().items()}
        if cfg.tie_embeddings:
            ours.pop("head.decoder.weight", None)  # tied to the word embeddings, as transformers writes it
    if clf is not None:
        ours |= {f"classifier.{k}": _t(v) for k, v in clf.classifier.state_dict().items()}
        assert clf.pooler is not None  # _not_own_type_because sent a classifier without one to the cramkit format
        ours |= {f"pooler.{k}": _t(v) for k, v in clf.pooler.state_dict().items()}
    if family.adjust_out is not None:
        family.adjust_out(ours, cfg)
    arch = family.class_name(model_type, kind)
    num_labels = clf.num_labels if clf is not None and kind == "classifier" else None
    config = {
        "architectures": [arch],
        "model_type": model_type,
        **family.config_out(cfg),
        **_labels_config(num_labels, labels, bool(getattr(clf, "multilabel", False))),
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    return arch, family.weights(ours, cfg, kind), config


def _as_cramkit(
    enc: Encoder, head: nn.Module | None, clf: SequenceClassifier | None, cfg: ModelConfig, labels: list[str] | None
) -> tuple[str, dict[str, torch.Tensor], dict[str, Any]]:
    """The architecture, weights (our own names) and config.json of a ``model_type: cramkit`` export."""
    dtype = enc.embeddings.word.weight.dtype
    if clf is not None:
        arch = "CramkitForSequenceClassification"
    else:
        arch = "CramkitForMaskedLM" if head is not None else "CramkitModel"
    weights = {f"encoder.{k}": _t(v) for k, v in enc.state_dict().items()}
    if clf is not None:
        weights |= {f"classifier.{k}": _t(v) for k, v in clf.classifier.state_dict().items()}
        if clf.pooler is not None:
            weights |= {f"pooler.{k}": _t(v) for k, v in clf.pooler.state_dict().items()}
    elif head is not None:
        weights |= {f"head.{k}": _t(v) for k, v in head.state_dict().items()}
        if cfg.tie_embeddings:
            weights.pop("head.decoder.weight", None)
    config = _cramkit_config(cfg, arch, dtype)
    if clf is not None:
        labels_cfg = _labels_config(clf.num_labels, labels, bool(getattr(clf, "multilabel", False)))
        for key in ("id2label", "label2id", "problem_type"):
            if key in labels_cfg:
                config[key] = labels_cfg[key]
        config["classifier_pooling"] = clf.head_cfg.pooling
        config["classifier_pooler_dense"] = clf.pooler is not None
    return arch, weights, config


@contextlib.contextmanager
def _replaced_atomically(out: Path) -> Iterator[Path]:
    """A new temporary directory beside ``out`` to fill; when the block succeeds it becomes ``out`` in one
    rename (an earlier export there removed after), readable by everyone; when it fails it is removed."""
    from cramkit.io import clean_stale

    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; an export is meant to be shared
        yield tmp
        for f in tmp.rglob("*"):
            os.chmod(f, 0o755 if f.is_dir() else 0o644)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
