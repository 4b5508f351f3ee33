"""The reader of a Hugging Face directory (``hf:DIR``, a hub id, or a directory with config.json): a BERT,
RoBERTa / XLM-R / CamemBERT, DistilBERT, ELECTRA or MPNet model (safetensors only) with its head (masked-LM,
sequence classifier, multiple choice, or none), the pooling, normalisation, length and prompts a
sentence-transformers folder records, and cramkit's own ``model_type: cramkit`` exports (their
``modeling_cramkit.py`` is never run)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.loading.common import check_size, default_max_length, load_weights
from cramkit.model.loaded import LoadedModel
from cramkit.model.pooling import read_pooling, read_st_pooling

if TYPE_CHECKING:  # torch is imported by the functions that need it: `cramkit --help` stays instant
    from torch import nn

# the module config names sentence-transformers has used for its Transformer module, newest first
ST_CONFIG_FILES = (
    "sentence_bert_config.json",
    "sentence_roberta_config.json",
    "sentence_distilbert_config.json",
    "sentence_camembert_config.json",
    "sentence_albert_config.json",
    "sentence_xlm-roberta_config.json",
)


def _st_pooling(root: Path) -> tuple[str | None, bool, int | None]:
    """sentence-transformers' pooling ("mean"/"cls"), whether it normalises, its max_seq_length.

    Both layouts are read: before v5 the pooling is a set of ``pooling_mode_*_tokens`` flags and the
    length ``max_seq_length`` in ``sentence_bert_config.json``; from v5 the pooling is ``pooling_mode``
    (a name) and the length the tokenizer's ``model_max_length`` (``tokenizer_config.json``). A pooling
    cramkit does not compute (max, last token, weighted mean, several at once) is one clear error, never a
    silently different embedding."""
    from cramkit.io import folder_file, read_json

    pooling, normalize, max_len = None, False, None
    modules = folder_file(root, "modules.json")
    if not modules.is_file():
        return pooling, normalize, max_len
    fix = "re-download the sentence-transformers model"
    try:
        for mod in read_json(modules, fix):
            kind = str(mod.get("type", ""))
            if kind.endswith("Pooling"):
                conf = folder_file(root, str(Path(str(mod.get("path", ""))) / "config.json"))
                if conf.is_file():
                    pooling = read_st_pooling(read_json(conf, fix), conf)
            elif kind.endswith("Normalize"):
                normalize = True
        for name in ST_CONFIG_FILES:
            if folder_file(root, name).is_file():
                max_len = int(read_json(root / name, fix).get("max_seq_length") or 0) or None
                break
        tok_conf = folder_file(root, "tokenizer_config.json")
        if max_len is None and tok_conf.is_file():
            value = read_json(tok_conf, fix).get("model_max_length")
            if isinstance(value, int) and 0 < value < 1_000_000:  # transformers writes 1e30 for "no limit"
                max_len = value
    except (ValueError, OSError, TypeError, AttributeError) as exc:
        raise CramkitError(f"{root}: sentence-transformers files are malformed ({exc})") from None
    return pooling, normalize, max_len


def _st_prompts(root: Path) -> dict[str, Any]:
    """``{"prompts": ..., "default_prompt_name": ...}`` of a sentence-transformers folder whose
    ``config_sentence_transformers.json`` names prompts (``query: ``); {} without any. Malformed: one line."""
    from cramkit.io import folder_file, read_json
    from cramkit.model import embedding_prompts

    conf = folder_file(root, "config_sentence_transformers.json")
    if not conf.is_file():
        return {}
    data = read_json(conf, "re-download the sentence-transformers model")
    prompts = data.get("prompts") if isinstance(data, dict) else None
    if not prompts:
        return {}
    default = data.get("default_prompt_name") or None
    embedding_prompts.check(prompts, default, str(conf))
    return {"prompts": dict(prompts), **({"default_prompt_name": default} if default else {})}


def _hf_labels(hf: dict[str, Any], state: dict[str, Any]) -> tuple[str, int, list[str] | None]:
    """(kind, number of outputs, label names in logit order) of a Hugging Face sequence classifier."""
    problem = hf.get("problem_type")
    id2label = hf.get("id2label") or {}
    n = int(hf.get("num_labels") or len(id2label) or state["classifier.weight"].shape[0])
    kind = "regression" if problem == "regression" or n == 1 else "classifier"
    if problem == "multi_label_classification":
        kind = "multilabel"
    labels = None
    if kind != "regression":
        labels = [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(n)]
    return kind, n, labels


def load_hf(name: str, text: str) -> LoadedModel:
    """The model of a Hugging Face directory (``hf:DIR``, or a directory with config.json; ``name``: the
    directory or hub id, ``text``: as given): the architectures of the families cramkit imports
    (``cramkit.model.architectures``), sentence-transformers' pooling and prompts, or cramkit's own
    ``model_type: cramkit`` export."""
    from cramkit.model.architectures import family_of
    from cramkit.model.encoder import Encoder
    from cramkit.model.heads import ClassifierConfig, MaskedLM, MultipleChoice, SequenceClassifier
    from cramkit.model.hf import _read_hf_config, _resolve, load_hf_config, load_hf_encoder_state
    from cramkit.text.tokenizer import load_tokenizer

    root = _resolve(name)
    _, hf = _read_hf_config(root)
    if hf.get("model_type") == "cramkit":  # cramkit export --format hf of a non-BERT architecture
        return _load_cramkit_export(root, hf)
    cfg = load_hf_config(root)
    check_size(cfg, root / "config.json")
    state = load_hf_encoder_state(root, cfg)
    enc_state = {k: v for k, v in state.items() if not k.startswith(("head.", "pooler.", "classifier."))}
    family = family_of(cfg.hf_model_type, root / "config.json")
    arch = (hf.get("architectures") or [family.class_name(cfg.hf_model_type, "encoder")])[0]
    labels = None
    head = None
    model: nn.Module
    if arch.endswith(("ForSequenceClassification", "ForMultipleChoice")) or "classifier.weight" in state:
        dropout = hf.get("classifier_dropout")
        head_cfg = ClassifierConfig(
            pooling="cls",
            pooler_dense=True,
            dropout=float(dropout or cfg.dropout),
            pooler_activation=family.pooler_activation,  # type: ignore[arg-type]  # a family's is one of them
        )
        if arch.endswith("ForMultipleChoice"):
            kind, model = "multiple_choice", MultipleChoice(cfg, head_cfg)
        else:
            kind, n, labels = _hf_labels(hf, state)
            model = SequenceClassifier(cfg, n, head_cfg, multilabel=kind == "multilabel")
        if "classifier.weight" not in state or "pooler.weight" not in state:
            raise CramkitError(f"hf:{root}: a sequence classifier without classifier/pooler weights")
        full = {f"encoder.{k}": v for k, v in enc_state.items()}
        full |= {k: v for k, v in state.items() if k.startswith(("pooler.", "classifier."))}
        load_weights(model, full, f"hf:{root}")
        head = {
            "pooling": "cls",
            "pooler_dense": True,
            "dropout": head_cfg.dropout,
            "pooler_activation": head_cfg.pooler_activation,
        }
    elif any(k.startswith("head.") for k in state) and "head.transform.0.weight" in state:
        kind = "mlm"
        model = MaskedLM(cfg)
        full = {f"encoder.{k}": v for k, v in enc_state.items()}
        full |= {k: v for k, v in state.items() if k.startswith("head.")}
        load_weights(model, full, f"hf:{root}", tied=cfg.tie_embeddings)
    else:
        kind = "encoder"
        model = Encoder(cfg)
        load_weights(model, dict(enc_state), f"hf:{root}")
    if not any((root / f).is_file() for f in ("tokenizer.json", "vocab.txt")):
        raise CramkitError(_no_tokenizer(root))
    pooling, normalize, st_max = _st_pooling(root)
    max_length = default_max_length(cfg)
    if st_max:
        max_length = min(max_length, st_max)
    return LoadedModel(
        model=model,
        kind=kind,
        config=cfg,
        tokenizer=load_tokenizer(root),
        labels=labels,
        max_length=max_length,
        pooling=pooling or (head_cfg.pooling if head else "mean"),  # a classifier's own: its head's
        normalize=normalize,
        with_types=cfg.segment_types,
        head=head,
        extra={"hf_architecture": arch, **({"st_pooling": pooling} if pooling else {}), **_st_prompts(root)},
        weights_file=_single_weights_file(root),
        pooler_state=None
        if isinstance(model, SequenceClassifier) or "pooler.weight" not in state
        else {"weight": state["pooler.weight"], "bias": state["pooler.bias"]},
    )


def _single_weights_file(root: Path) -> Path | None:
    from cramkit.io import folder_file

    file = folder_file(root, "model.safetensors")
    return file if file.is_file() else None


def _load_cramkit_export(root: Path, hf: dict[str, Any]) -> LoadedModel:
    """A Hugging Face directory cramkit wrote with ``model_type: cramkit`` (its architecture has no BERT
    equivalent): the config's fields are ModelConfig's and the weights carry cramkit's own names. Its
    ``modeling_cramkit.py`` is never run."""
    import dataclasses

    from cramkit.config import from_dict
    from cramkit.model.encoder import Encoder, ModelConfig
    from cramkit.model.heads import ClassifierConfig, MaskedLM, SequenceClassifier
    from cramkit.model.hf import _weight_files, read_weights
    from cramkit.text.tokenizer import load_tokenizer

    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    values = dict(hf, tie_embeddings=hf.get("tie_word_embeddings", True))
    cfg = from_dict(ModelConfig, {k: v for k, v in values.items() if k in fields}, f"hf:{root} config.json")
    check_size(cfg, root / "config.json")
    state: dict[str, Any] = {}
    for file in _weight_files(root):
        state.update(read_weights(file))
    arch = (hf.get("architectures") or ["CramkitModel"])[0]
    labels, head, what = None, None, f"hf:{root}"
    if arch == "CramkitForSequenceClassification":
        kind, n, labels = _hf_labels(hf, state)
        head_cfg = ClassifierConfig(
            pooling=read_pooling(hf.get("classifier_pooling", "cls"), f"hf:{root} classifier_pooling"),
            pooler_dense=bool(hf.get("classifier_pooler_dense", True)),
            dropout=cfg.dropout,
        )
        model: nn.Module = SequenceClassifier(cfg, n, head_cfg, multilabel=kind == "multilabel")
        load_weights(model, state, what)
        head = {
            "pooling": head_cfg.pooling,
            "pooler_dense": head_cfg.pooler_dense,
            "dropout": head_cfg.dropout,
        }
    elif arch == "CramkitForMaskedLM":
        kind, model = "mlm", MaskedLM(cfg)
        load_weights(model, state, what, tied=cfg.tie_embeddings)
    else:
        kind, model = "encoder", Encoder(cfg)
        load_weights(model, {k.removeprefix("encoder."): v for k, v in state.items()}, what)
    if not any((root / f).is_file() for f in ("tokenizer.json", "vocab.txt")):
        raise CramkitError(_no_tokenizer(root))
    return LoadedModel(
        model=model,
        kind=kind,
        config=cfg,
        tokenizer=load_tokenizer(root),
        labels=labels,
        max_length=default_max_length(cfg),
        pooling=head_cfg.pooling if head else "mean",
        with_types=cfg.segment_types,
        head=head,
        extra={"hf_architecture": arch, **_st_prompts(root)},
        weights_file=_single_weights_file(root),
    )


def _no_tokenizer(root: Path) -> str:
    """The line for a model folder without tokenizer.json or vocab.txt; a SentencePiece model (DeBERTa-v3's
    spm.model, XLM-R's sentencepiece.bpe.model) is converted once by transformers, not parsed by cramkit."""
    spm = next((p.name for p in sorted(root.glob("*.model")) if p.is_file()), None)
    if spm is None:
        return f"hf:{root}: no tokenizer.json or vocab.txt beside the weights"
    return (
        f"hf:{root}: no tokenizer.json or vocab.txt beside the weights, only the SentencePiece model {spm}; convert "
        'it once with transformers (pip install sentencepiece): python -c "from transformers import AutoTokenizer '
        f"as T; T.from_pretrained('{root}').save_pretrained('{root}')\", which writes tokenizer.json"
    )
