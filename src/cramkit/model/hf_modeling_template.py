"""A cramkit encoder as a Hugging Face model, for directories written by ``cramkit export``.

Self-contained: depends on torch and transformers only (not on cramkit), so that

    AutoModel.from_pretrained(DIR, trust_remote_code=True)
    AutoModelForMaskedLM.from_pretrained(DIR, trust_remote_code=True)

load the exported weights anywhere. The math and the parameter names mirror
``cramkit/model/encoder.py`` and ``cramkit/model/heads.py`` exactly: pre-/post-LN or DeepNorm,
LayerNorm or RMSNorm, learned / scaled-sinusoidal / rotary positions, GELU / ReLU / GELU-GLU / SwiGLU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput, SequenceClassifierOutput

_TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5


class CramkitConfig(PretrainedConfig):
    model_type = "cramkit"
    # standard names, so that generic tools (pipelines, sentence-transformers) find the sizes
    attribute_map = {
        "hidden_size": "hidden",
        "num_hidden_layers": "layers",
        "num_attention_heads": "heads",
        "intermediate_size": "intermediate",
        "max_position_embeddings": "max_position",
        "layer_norm_eps": "norm_eps",
        "initializer_range": "init_std",
    }

    def __init__(
        self,
        vocab_size: int = 32768,
        hidden: int = 768,
        layers: int = 12,
        heads: int = 12,
        intermediate: int = 3072,
        activation: str = "gelu_glu",
        norm: str = "layernorm",
        norm_position: str = "pre",
        norm_eps: float = 1e-12,
        bias: bool = False,
        position: str = "sinusoidal",
        max_position: int = 512,
        rope_base: float = 10000.0,
        type_vocab_size: int = 0,
        embedding_norm: bool = True,
        final_norm: bool = True,
        head_transform: bool = True,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        init_std: float = 0.02,
        pad_token_id: int = 0,
        tie_word_embeddings: bool = True,
        **kwargs,
    ) -> None:
        self.vocab_size, self.hidden, self.layers, self.heads = vocab_size, hidden, layers, heads
        self.intermediate, self.activation, self.norm = intermediate, activation, norm
        self.norm_position, self.norm_eps, self.bias = norm_position, norm_eps, bias
        self.position, self.max_position, self.rope_base = position, max_position, rope_base
        self.type_vocab_size, self.embedding_norm, self.final_norm = (
            type_vocab_size,
            embedding_norm,
            final_norm,
        )
        self.head_transform, self.dropout, self.attention_dropout = head_transform, dropout, attention_dropout
        self.init_std = init_std
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def deepnorm_alpha(self) -> float:
        return (2.0 * self.layers) ** 0.25 if self.norm_position == "deepnorm" else 1.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def make_norm(cfg: CramkitConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.hidden, cfg.norm_eps)
    return nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps, bias=cfg.bias)


def activation_fn(name: str) -> nn.Module:
    return nn.ReLU() if name == "relu" else nn.SiLU() if name == "swiglu" else nn.GELU()


def sinusoidal_table(length: int, dim: int, device: torch.device) -> torch.Tensor:
    position = torch.arange(length, dtype=torch.float32, device=device)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, device=device)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table


def apply_rotary(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary position embedding on [B, heads, L, head_dim] (pairs of adjacent features)."""
    length, head_dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=x.device) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float32, device=x.device), inv_freq)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Embeddings(nn.Module):
    def __init__(self, cfg: CramkitConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden)
        if cfg.position == "learned":
            self.position = nn.Embedding(cfg.max_position, cfg.hidden)
        elif cfg.position == "sinusoidal":
            self.position_scale = nn.Parameter(torch.tensor(cfg.hidden**-0.5))
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden) if cfg.type_vocab_size else None
        self.norm = make_norm(cfg) if cfg.embedding_norm else nn.Identity()
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        length = input_ids.shape[1]
        if length > self.cfg.max_position and self.cfg.position != "rope":
            raise ValueError(f"sequence length {length} exceeds max_position={self.cfg.max_position}")
        x = self.word(input_ids)
        if self.cfg.position == "learned":
            x = x + self.position.weight[:length]
        elif self.cfg.position == "sinusoidal":
            x = x + sinusoidal_table(length, self.cfg.hidden, x.device).to(x.dtype) * self.position_scale
        if self.token_type is not None:
            x = x + (self.token_type.weight[0] if token_type_ids is None else self.token_type(token_type_ids))
        return self.dropout(self.norm(x))


class Attention(nn.Module):
    def __init__(self, cfg: CramkitConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=cfg.bias)
        self.out = nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.cfg.heads, self.cfg.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.cfg.position == "rope":
            q, k = apply_rotary(q, self.cfg.rope_base), apply_rotary(k, self.cfg.rope_base)
        p = self.cfg.attention_dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out(y.transpose(1, 2).reshape(batch, length, self.cfg.hidden))


class MLP(nn.Module):
    def __init__(self, cfg: CramkitConfig) -> None:
        super().__init__()
        self.glu = cfg.activation in ("gelu_glu", "swiglu")
        self.fc_in = nn.Linear(cfg.hidden, cfg.intermediate, bias=cfg.bias)
        self.act = activation_fn(cfg.activation)
        self.fc_out = nn.Linear(cfg.intermediate // 2 if self.glu else cfg.intermediate, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc_in(x)
        if self.glu:
            value, gate = h.chunk(2, dim=-1)
            h = value * self.act(gate)
        else:
            h = self.act(h)
        return self.fc_out(h)


class Block(nn.Module):
    def __init__(self, cfg: CramkitConfig) -> None:
        super().__init__()
        self.pre = cfg.norm_position == "pre"
        self.alpha = cfg.deepnorm_alpha
        self.norm_attn = make_norm(cfg)
        self.attn = Attention(cfg)
        self.norm_mlp = make_norm(cfg)
        self.mlp = MLP(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.pre:
            x = x + self.dropout(self.attn(self.norm_attn(x), mask))
            return x + self.dropout(self.mlp(self.norm_mlp(x)))
        x = self.norm_attn(self.alpha * x + self.dropout(self.attn(x, mask)))
        return self.norm_mlp(self.alpha * x + self.dropout(self.mlp(x)))


class CramkitPreTrainedModel(PreTrainedModel):
    config_class = CramkitConfig
    base_model_prefix = "encoder"
    supports_gradient_checkpointing = False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # torch.nn.init (which transformers 5 guards so that loaded weights are never overwritten)
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, (nn.LayerNorm, RMSNorm)):
            if module.weight is not None:
                nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, Embeddings) and hasattr(module, "position_scale"):
            nn.init.constant_(module.position_scale, self.config.hidden**-0.5)


class CramkitModel(CramkitPreTrainedModel):
    """Token ids -> hidden states ``[batch, length, hidden]`` (``last_hidden_state``)."""

    # the encoder of an MLM or classifier export: its head's weights are expected, not a loading problem
    _keys_to_ignore_on_load_unexpected = [r"^head\.", r"^classifier\.", r"^pooler\."]

    def __init__(self, config: CramkitConfig) -> None:
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.layers))
        use_final = config.final_norm and config.norm_position == "pre"
        self.final_norm = make_norm(config) if use_final else nn.Identity()
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word = value

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutput | tuple:
        x = self.embeddings(input_ids, token_type_ids)
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            keep = attention_mask.bool()[:, None, None, :]
            mask = torch.zeros(keep.shape, dtype=x.dtype, device=x.device).masked_fill(~keep, torch.finfo(x.dtype).min)
        states = [x] if output_hidden_states else None
        for block in self.layers:
            x = block(x, mask)
            if states is not None:
                states.append(x)
        x = self.final_norm(x)
        if states is not None:
            states[-1] = x
        if return_dict is False:
            return (x,) if states is None else (x, tuple(states))
        return BaseModelOutput(last_hidden_state=x, hidden_states=tuple(states) if states else None)


class MLMHead(nn.Module):
    def __init__(self, cfg: CramkitConfig) -> None:
        super().__init__()
        if cfg.head_transform:
            self.transform = nn.Sequential(
                nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.bias),
                activation_fn("relu" if cfg.activation == "relu" else "gelu"),
                make_norm(cfg),
            )
        else:
            self.transform = nn.Identity()
        self.decoder = nn.Linear(cfg.hidden, cfg.vocab_size, bias=cfg.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden))


class CramkitForMaskedLM(CramkitPreTrainedModel):
    """Encoder + masked-LM head; ``logits`` are ``[batch, length, vocab]``."""

    if _TRANSFORMERS_5:
        _tied_weights_keys = {"head.decoder.weight": "encoder.embeddings.word.weight"}
    else:
        _tied_weights_keys = ["head.decoder.weight"]

    def __init__(self, config: CramkitConfig) -> None:
        super().__init__(config)
        self.encoder = CramkitModel(config)
        self.head = MLMHead(config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.head.decoder

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.head.decoder = value

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> MaskedLMOutput | tuple:
        out = self.encoder(input_ids, attention_mask, token_type_ids, output_hidden_states=output_hidden_states)
        logits = self.head(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1), ignore_index=-100)
        if return_dict is False:
            return tuple(t for t in (loss, logits, out.hidden_states) if t is not None)
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


class CramkitForSequenceClassification(CramkitPreTrainedModel):
    """Encoder + pooling (first token or mean) + optional dense/tanh pooler + linear classifier.

    ``config.num_labels == 1`` is regression (MSE); ``problem_type == "multi_label_classification"`` uses
    BCE; otherwise cross-entropy. Matches cramkit's ``SequenceClassifier`` parameter for parameter."""

    def __init__(self, config: CramkitConfig) -> None:
        super().__init__(config)
        self.encoder = CramkitModel(config)
        dense = getattr(config, "classifier_pooler_dense", True)
        self.pooler = nn.Linear(config.hidden, config.hidden) if dense else None
        self.classifier = nn.Linear(config.hidden, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput | tuple:
        out = self.encoder(input_ids, attention_mask, token_type_ids, output_hidden_states=output_hidden_states)
        hidden = out.last_hidden_state
        if getattr(self.config, "classifier_pooling", "cls") == "mean":
            if attention_mask is None:
                pooled = hidden.mean(dim=1)
            else:
                w = attention_mask.to(hidden.dtype)[..., None]
                pooled = (hidden * w).sum(1) / w.sum(1).clamp_min(1.0)
        else:
            pooled = hidden[:, 0]
        if self.pooler is not None:
            pooled = torch.tanh(self.pooler(pooled))
        logits = self.classifier(pooled)
        loss = None
        if labels is not None:
            if self.config.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            elif self.config.problem_type == "multi_label_classification":
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels.long())
        if return_dict is False:
            return tuple(t for t in (loss, logits, out.hidden_states) if t is not None)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)
