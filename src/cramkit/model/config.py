"""The encoder's architecture as a typed config (:class:`ModelConfig`, the fields of a preset's ``model:``) and the
sizes that follow from it alone: parameters and training FLOPs per token, computed without building the model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from cramkit.errors import CramkitError


@dataclass
class ModelConfig:
    """Architecture of the encoder (see the presets in ``cramkit/presets``)."""

    vocab_size: int = 32768
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    # width of the first MLP projection; with a GLU activation it is split in two halves (value, gate),
    # so the second projection reads ``intermediate // 2`` features (Cramming's convention).
    intermediate: int = 3072
    activation: Literal["gelu", "gelu_glu", "relu", "swiglu"] = "gelu_glu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    # pre: x + f(norm(x)); post: norm(x + f(x)) (original BERT); deepnorm: norm(alpha * x + f(x)) with
    # sub-layer init scaled by beta (DeepNet, arXiv 2203.00555)
    norm_position: Literal["pre", "post", "deepnorm"] = "pre"
    norm_eps: float = 1e-12
    bias: bool = False
    # "none": no absolute positions (DeBERTa-v3: its attention's relative position terms only)
    position: Literal["sinusoidal", "learned", "rope", "none"] = "sinusoidal"
    max_position: int = 512
    rope_base: float = 10000.0
    type_vocab_size: int = 0  # token-type (segment) embeddings; 2 in BERT, 0 = none (Cramming)
    embedding_norm: bool = True
    final_norm: bool = True  # a norm after the last block (pre-LN only; post-LN already ends in one)
    tie_embeddings: bool = True
    head_transform: bool = True  # MLM head: dense + activation + norm before the vocabulary projection
    dropout: float = 0.0
    attention_dropout: float = 0.0
    init_std: float = 0.02
    pad_token_id: int = 0
    # learned positions start at this row of the table (RoBERTa, XLM-R, CamemBERT, MPNet: padding index + 1)
    position_offset: int = 0
    # width of the embeddings when it differs from hidden (ELECTRA): a linear projection to hidden follows them,
    # and the MLM head projects back to it; 0 = hidden
    embedding_size: int = 0
    # MPNet's relative position buckets (T5's scheme): a learned bias per bucket and head, shared by every layer,
    # added to the attention scores; 0 = none
    relative_buckets: int = 0
    relative_max_distance: int = 128
    # DeBERTa-v2/v3's disentangled attention (cramkit.model.disentangled): 2 x disentangled_buckets relative position
    # embeddings, shared by the layers and projected by each one's query and key projections, add content-to-position
    # and position-to-content terms to every score (log buckets beyond half of them, up to
    # disentangled_max_distance); 0 = none
    disentangled_buckets: int = 0
    disentangled_max_distance: int = 512
    # ModernBERT's alternating attention: every global_every-th layer (0, N, 2N, ...) attends to every key, the others
    # only to keys within local_window positions, with rotary base local_rope_base (0: rope_base); 0 = all global
    local_window: int = 0
    global_every: int = 1
    local_rope_base: float = 0.0
    # pre-LN: the first block normalises its input before attention (ModernBERT's does not: its embeddings end in a
    # norm); the MLM decoder's bias where the blocks have none (ModernBERT's decoder_bias)
    first_attention_norm: bool = True
    decoder_bias: bool = False
    # the Hugging Face model_type an imported model came from: `export --format hf` writes it back under it
    # (cramkit.model.architectures); "" = cramkit's own (a BERT-shaped config is written as BERT)
    hf_model_type: str = ""
    gradient_checkpointing: bool = False
    # mixture of experts (cramkit.model.moe): every moe_every-th block's MLP becomes moe_experts experts of its
    # shape, each token going to its moe_top_k; 0 experts = dense
    moe_experts: int = 0
    moe_top_k: int = 1
    moe_every: int = 1  # 1: every block; 2: blocks 2, 4, ... (every other one, as Switch and GShard)
    moe_capacity: float = 1.25  # training: an expert takes capacity * k * tokens / experts assignments; 0 = all
    moe_aux: float = 0.01  # weight of the load-balancing loss (Switch)
    moe_z_loss: float = 0.001  # weight of the router z-loss (ST-MoE)

    def validate(self) -> None:
        for name in ("vocab_size", "hidden", "layers", "heads", "intermediate", "max_position"):
            if getattr(self, name) <= 0:
                raise CramkitError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise CramkitError(f"model.hidden ({self.hidden}) must be divisible by model.heads ({self.heads})")
        if self.activation in ("gelu_glu", "swiglu") and self.intermediate % 2:
            raise CramkitError(f"model.intermediate ({self.intermediate}) must be even with a GLU activation")
        if self.position == "rope" and (self.hidden // self.heads) % 2:
            raise CramkitError("model.position=rope needs an even head dimension (hidden / heads)")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise CramkitError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("position_offset", "embedding_size", "relative_buckets", "disentangled_buckets"):
            if getattr(self, name) < 0:
                raise CramkitError(f"model.{name} must not be negative, got {getattr(self, name)}")
        if self.position_offset and (self.position != "learned" or self.position_offset >= self.max_position):
            raise CramkitError(
                f"model.position_offset={self.position_offset} needs learned positions and fewer rows than "
                f"model.max_position={self.max_position}"
            )
        if self.local_window < 0 or self.global_every < 1 or self.local_rope_base < 0:
            raise CramkitError(
                "model.local_window and model.local_rope_base must not be negative, model.global_every at least 1"
            )
        if self.local_window and self.position != "rope":
            raise CramkitError("model.local_window (local attention layers) needs model.position=rope")
        if self.relative_buckets and (self.relative_buckets < 4 or self.relative_max_distance < 4):
            raise CramkitError("model.relative_buckets and model.relative_max_distance must be at least 4")
        if self.disentangled_buckets and (
            self.disentangled_buckets < 4 or self.disentangled_max_distance <= self.disentangled_buckets // 2 + 1
        ):
            raise CramkitError(
                "model.disentangled_buckets must be at least 4 and model.disentangled_max_distance more than half "
                f"of them plus one (got {self.disentangled_buckets} and {self.disentangled_max_distance})"
            )
        self._validate_moe()

    def _validate_moe(self) -> None:
        for name in ("moe_capacity", "moe_aux", "moe_z_loss"):
            if getattr(self, name) < 0:
                raise CramkitError(f"model.{name} must not be negative, got {getattr(self, name)}")
        if self.moe_experts == 0:
            return
        if self.moe_experts < 2:
            raise CramkitError(
                f"model.moe_experts={self.moe_experts}: a mixture of experts needs at least 2 experts (0 = dense)"
            )
        if not 1 <= self.moe_top_k <= self.moe_experts:
            raise CramkitError(
                f"model.moe_top_k={self.moe_top_k} must be between 1 and model.moe_experts ({self.moe_experts})"
            )
        if self.moe_every < 1:
            raise CramkitError(f"model.moe_every={self.moe_every} must be at least 1 (1 = every block is MoE)")
        if not self.moe_layers:
            raise CramkitError(
                f"model.moe_every={self.moe_every} exceeds model.layers={self.layers}: no block would be MoE"
            )

    def is_local(self, index: int) -> bool:
        """Whether block ``index`` (0-based) sees only keys within ``local_window`` (ModernBERT's local layers)."""
        return self.local_window > 0 and index % self.global_every != 0

    @property
    def pairwise_attention(self) -> bool:
        """Whether attention carries a bias over (query, key) pairs (MPNet's relative positions, local windows): the
        blocks then run on the padded batch, every position's queries computed (no unpadding, no sparse last block)."""
        return bool(self.relative_buckets or self.local_window or self.disentangled_buckets)

    def is_moe(self, index: int) -> bool:
        """Whether block ``index`` (0-based) has a mixture-of-experts MLP: blocks moe_every, 2*moe_every, ..."""
        return self.moe_experts > 0 and self.moe_every > 0 and (index + 1) % self.moe_every == 0

    @property
    def moe_layers(self) -> list[int]:
        return [i for i in range(self.layers) if self.is_moe(i)]

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def embedding_width(self) -> int:
        """The width of the token, position and type embeddings (``hidden`` unless ``embedding_size`` says)."""
        return self.embedding_size or self.hidden

    @property
    def segment_types(self) -> bool:
        """Whether inputs carry segment ids (0 for the first text, 1 for the second): with two or more type rows;
        RoBERTa's single row is added to every token, as with no ids."""
        return self.type_vocab_size > 1

    @property
    def positions(self) -> int:
        """How many positions an input may have: the position table's rows past its offset."""
        return self.max_position - self.position_offset

    @property
    def deepnorm_alpha(self) -> float:
        # encoder-only DeepNet: alpha = (2N)^(1/4), beta = (8N)^(-1/4)
        return (2.0 * self.layers) ** 0.25 if self.norm_position == "deepnorm" else 1.0

    @property
    def deepnorm_beta(self) -> float:
        return (8.0 * self.layers) ** -0.25 if self.norm_position == "deepnorm" else 1.0

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def config_parameters(m: ModelConfig) -> int:
    """Parameters of ``MaskedLM(m)``, computed from the sizes (nothing allocated; exact for our encoder)."""
    h, i, v, e = m.hidden, m.intermediate, m.vocab_size, m.embedding_width
    norm = h * (2 if m.norm == "layernorm" and m.bias else 1)
    enorm = norm // h * e
    b = 1 if m.bias else 0
    glu = m.activation in ("gelu_glu", "swiglu")
    attn = h * 3 * h + 3 * h * b + h * h + h * b
    mlp = h * i + i * b + (i // 2 if glu else i) * h + h * b
    block = attn + mlp + 2 * norm
    moe = len(m.moe_layers) * ((m.moe_experts - 1) * mlp + h * m.moe_experts) if m.moe_experts else 0
    emb = v * e + (m.max_position * e if m.position == "learned" else 1 if m.position == "sinusoidal" else 0)
    emb += m.type_vocab_size * e + (enorm if m.embedding_norm else 0) + (e * h + h if e != h else 0)
    final = norm if m.final_norm and m.norm_position == "pre" else 0
    head = (h * e + e * b + enorm if m.head_transform else 0) + (0 if m.tie_embeddings else v * e)
    head += v * (1 if m.bias or m.decoder_bias else 0)
    first = norm if m.norm_position == "pre" and not m.first_attention_norm else 0  # ModernBERT's first block
    disentangled = 2 * m.disentangled_buckets * h + norm if m.disentangled_buckets else 0  # the table and its norm
    return emb + m.layers * block - first + moe + final + head + m.relative_buckets * m.heads + disentangled


def flops_per_token(cfg: ModelConfig, seq_len: int, predicted_fraction: float = 1.0) -> float:
    """Training FLOPs per input token (forward + backward = 3x forward, 2 FLOPs per MAC).

    Counts the matrix multiplies: the blocks, attention scores and values, and the MLM head only at the
    predicted fraction of positions (sparse prediction). Used for model FLOPs utilisation (MFU). An MoE block
    counts its router and the top-k experts each token goes to (not the capacity's padding).
    """
    h, layers = cfg.hidden, cfg.layers
    mlp_out_in = cfg.intermediate // 2 if cfg.activation in ("gelu_glu", "swiglu") else cfg.intermediate
    mlp = h * cfg.intermediate + mlp_out_in * h
    per_block = 4 * h * h + mlp  # qkv + out + mlp in/out (MACs)
    # an MoE block: the router, and k experts instead of one MLP
    moe = len(cfg.moe_layers) * ((cfg.moe_top_k - 1) * mlp + h * cfg.moe_experts) if cfg.moe_experts else 0
    attention = 2 * seq_len * h  # QK^T and AV (MACs per token per layer)
    # DeBERTa: queries and keys against the 2 x buckets position rows (the terms' gathers are not counted)
    attention += 2 * 2 * cfg.disentangled_buckets * h
    e = cfg.embedding_width
    head = (h * e if cfg.head_transform else 0) + e * cfg.vocab_size
    return 6.0 * (layers * (per_block + attention) + moe + predicted_fraction * head)
