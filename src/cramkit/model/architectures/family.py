"""A family of Hugging Face encoders and what they share: the :class:`Family` spec (config mapping, weight names),
the config fields BERT-like configs have in common, and the model types cramkit does not import."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError

if TYPE_CHECKING:
    import torch

    from cramkit.model.encoder import ModelConfig

# the task classes cramkit reads and writes, by what follows the family's class prefix ("Bert" + "ForMaskedLM")
KIND_SUFFIX = {
    "encoder": "Model",
    "mlm": "ForMaskedLM",
    "classifier": "ForSequenceClassification",
    "multiple_choice": "ForMultipleChoice",
}
# further classes whose checkpoints import (their encoder, and the MLM head where they have one)
READ_SUFFIXES = (*KIND_SUFFIX.values(), "ForPreTraining", "ForTokenClassification", "ForQuestionAnswering")

# the model types cramkit cannot reproduce, with what to do (one line each)
UNSUPPORTED = {
    "deberta": "DeBERTa v1's attention (its relative positions without log buckets; deberta-v2 imports)",
    "albert": "ALBERT's shared layers",
    "xlnet": "XLNet's two-stream attention",
    "longformer": "Longformer's sliding and global attention",
    "bigbird": "BigBird's sparse attention",
    "nomic_bert": "NomicBERT's rotary SwiGLU blocks",
}


@dataclass(frozen=True)
class Family:
    """One family of Hugging Face encoders (BERT, RoBERTa, ...): how its config and weights map onto cramkit's."""

    name: str
    # model_type -> the class-name prefix of that type ("xlm-roberta" -> "XLMRoberta")
    model_types: Mapping[str, str]
    base: str  # the base model's prefix inside a task model's weights ("roberta.")
    # the base model's weights outside its layers: theirs -> ours (Encoder names; "pooler.*" the base's pooler)
    names: Mapping[str, str]
    layer: str  # a layer's prefix, "{i}" its index ("encoder.layer.{i}.")
    qkv: tuple[str, ...]  # a layer's query, key and value modules (none where they are one, as ModernBERT's)
    layer_names: Mapping[str, str]  # a layer's other modules: theirs -> ours
    mlm: Mapping[str, str]  # the masked-LM head's weights (outside the base): theirs -> ours ("head.*")
    classifier: Mapping[
        str, str
    ]  # a sequence classifier's head (outside the base): theirs -> "pooler.*"/"classifier.*"
    config_in: Callable[[dict[str, Any], Path], dict[str, Any]]  # their config.json -> ModelConfig keywords
    config_out: Callable[[ModelConfig], dict[str, Any]]  # ModelConfig -> their config.json's model fields
    pooler_activation: str = "tanh"  # the classifier head's activation
    # where a classifier's pooler sits: "base" (BERT's pooler.dense in the base model) or "head" (RoBERTa's
    # classifier.dense): a multiple-choice model uses the base's pooler in every family
    classifier_pooler: str = "head"
    ignored: tuple[str, ...] = ()  # regexes of weights never needed (buffers, other heads)
    # the task classes (suffixes) it reads and writes; a family whose heads are not cramkit's lists fewer
    read_suffixes: tuple[str, ...] = READ_SUFFIXES
    # tensors that differ in layout beyond their names (ModernBERT's rotary halves, its GLU's order): applied to
    # cramkit's names after import (``adjust_in``) and before export (``adjust_out``)
    adjust_in: Callable[[dict[str, torch.Tensor], ModelConfig], None] | None = None
    adjust_out: Callable[[dict[str, torch.Tensor], ModelConfig], None] | None = None

    def writes(self, kind: str) -> bool:
        """Whether the family has a task class cramkit can write a model of ``kind`` as."""
        return KIND_SUFFIX[kind] in self.read_suffixes

    def class_name(self, model_type: str, kind: str) -> str:
        return self.model_types[model_type] + KIND_SUFFIX[kind]

    # ------------------------------------------------------------------------------------------- import

    def rename(self, raw: Mapping[str, torch.Tensor], root: Path) -> dict[str, torch.Tensor]:
        """Their weights under cramkit's names (``layers.0.attn.qkv.weight``, ``head.*``, ``pooler.*``,
        ``classifier.*``); a CramkitError naming the weights that have no place."""
        import torch

        out: dict[str, torch.Tensor] = {}
        qkv: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
        unknown = []
        layer = re.compile(re.escape(self.layer).replace(r"\{i\}", r"(\d+)") + r"(.+)\.(weight|bias)")
        pooler_in_base = self.classifier_pooler == "base"
        for full, tensor in raw.items():
            name = _legacy(full)
            if name.startswith(self.base):
                name = name[len(self.base) :]
            elif name in self.mlm:
                out[self.mlm[name]] = tensor
                continue
            elif name in self.classifier:
                out[self.classifier[name]] = tensor
                continue
            if name in self.names:
                ours = self.names[name]
                if ours.startswith("pooler.") and not pooler_in_base and "pooler.weight" in out:
                    continue  # the classifier head's own pooler wins over the base's
                out.setdefault(ours, tensor)
            elif m := layer.fullmatch(name):
                i, sub, kind = int(m[1]), m[2], m[3]
                if sub in self.qkv:
                    qkv.setdefault((i, kind), {})[self.qkv.index(sub)] = tensor
                elif sub in self.layer_names:
                    out[f"layers.{i}.{self.layer_names[sub]}.{kind}"] = tensor
                else:
                    unknown.append(full)
            elif not any(re.fullmatch(p, name) for p in self.ignored):
                unknown.append(full)
        for (i, kind), parts in sorted(qkv.items()):
            if len(parts) != 3:
                lacking = [self.qkv[j] for j in range(3) if j not in parts]
                raise CramkitError(f"{root}: layer {i} lacks the attention {kind}s of {', '.join(lacking)}")
            out[f"layers.{i}.attn.qkv.{kind}"] = torch.cat([parts[0], parts[1], parts[2]], dim=0)
        if unknown:
            raise CramkitError(
                f"{root}: weights cramkit cannot place: {', '.join(sorted(unknown)[:5])}"
                f"{' ...' if len(unknown) > 5 else ''}; this is not a plain {self.name} checkpoint"
            )
        return out

    # ------------------------------------------------------------------------------------------- export

    def weights(self, ours: Mapping[str, torch.Tensor], cfg: ModelConfig, kind: str) -> dict[str, torch.Tensor]:
        """cramkit's state (Encoder names, ``head.*``, ``pooler.*``, ``classifier.*``) under this family's names
        for the task class of ``kind`` (encoder, mlm, classifier, multiple_choice)."""
        prefix = "" if kind == "encoder" else self.base
        inverse = {v: k for k, v in self.names.items()}
        layer_inv = {v: k for k, v in self.layer_names.items()}
        head_inv = {v: k for k, v in {**self.mlm}.items()}
        clf_inv = {v: k for k, v in self.classifier.items()}
        pooler_in_base = kind == "multiple_choice" or self.classifier_pooler == "base"
        out: dict[str, torch.Tensor] = {}
        h = cfg.hidden
        for name, tensor in ours.items():
            if m := re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias)", name):
                i, sub, what = int(m[1]), m[2], m[3]
                theirs = prefix + self.layer.format(i=i)
                if sub == "attn.qkv" and self.qkv:
                    for part, t in zip(self.qkv, tensor.split(h, dim=0), strict=True):
                        out[f"{theirs}{part}.{what}"] = t
                else:
                    out[f"{theirs}{layer_inv[sub]}.{what}"] = tensor
            elif name.startswith("head."):
                if kind == "mlm" and name in head_inv:
                    out[head_inv[name]] = tensor
            elif name.startswith("pooler."):
                if kind == "encoder" or pooler_in_base:
                    out[prefix + inverse[name]] = tensor
                else:
                    out[clf_inv[name]] = tensor
            elif name.startswith("classifier."):
                out[name if kind == "multiple_choice" else clf_inv[name]] = tensor
            else:
                out[prefix + inverse[name]] = tensor
        return out


def _legacy(name: str) -> str:
    """TensorFlow-era names (``LayerNorm.gamma``) as today's."""
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def number(hf: Mapping[str, Any], key: str, default: Any, kind: type = int) -> Any:
    """``hf[key]`` as ``kind`` (``default`` when absent); a bad value is the caller's CramkitError."""
    value = hf.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key}={value!r} is not a number")
    return kind(value)


def activation(hf: Mapping[str, Any], key: str, file: Path) -> str:
    """A supported ``hidden_act`` (exact GELU or ReLU), else one line."""
    act = hf.get(key, "gelu")
    if act not in ("gelu", "relu"):
        raise CramkitError(
            f"{file}: {key} {act!r} is not supported (gelu or relu; approximated GELU variants would not match exactly)"
        )
    return str(act)


def common_config_out(cfg: ModelConfig) -> dict[str, Any]:
    """The fields BERT-like configs share (hidden_size, num_hidden_layers, ...)."""
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "intermediate_size": cfg.intermediate,
        "hidden_act": cfg.activation,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "max_position_embeddings": cfg.max_position,
        "initializer_range": cfg.init_std,
        "layer_norm_eps": cfg.norm_eps,
        "pad_token_id": cfg.pad_token_id,
        "tie_word_embeddings": cfg.tie_embeddings,
    }


def common_config_in(hf: Mapping[str, Any]) -> dict[str, Any]:
    """ModelConfig keywords of the fields BERT-like configs share (post-LN, learned positions, biases)."""
    return {
        "vocab_size": number(hf, "vocab_size", 30522),
        "hidden": number(hf, "hidden_size", 768),
        "layers": number(hf, "num_hidden_layers", 12),
        "heads": number(hf, "num_attention_heads", 12),
        "intermediate": number(hf, "intermediate_size", 3072),
        "norm": "layernorm",
        "norm_position": "post",
        "norm_eps": number(hf, "layer_norm_eps", 1e-12, float),
        "bias": True,
        "position": "learned",
        "max_position": number(hf, "max_position_embeddings", 512),
        "embedding_norm": True,
        "final_norm": False,
        "tie_embeddings": bool(hf.get("tie_word_embeddings", True)),
        "head_transform": True,
        "dropout": number(hf, "hidden_dropout_prob", 0.1, float),
        "attention_dropout": number(hf, "attention_probs_dropout_prob", 0.1, float),
        "init_std": number(hf, "initializer_range", 0.02, float),
        "pad_token_id": number(hf, "pad_token_id", 0),
    }


def encoder_problems(hf: Mapping[str, Any]) -> list[str]:
    """What makes a BERT-like config something other than a plain bidirectional encoder."""
    problems = []
    pos = hf.get("position_embedding_type", "absolute")
    if pos not in ("absolute", None):
        problems.append(f"position_embedding_type {pos!r} (only 'absolute' learned positions are supported)")
    if hf.get("is_decoder"):
        problems.append("is_decoder=true (a causal decoder, not a bidirectional encoder)")
    if hf.get("add_cross_attention"):
        problems.append("add_cross_attention=true (cross-attention layers)")
    return problems
