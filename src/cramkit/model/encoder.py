"""The encoder: a BERT-style transformer whose architectural choices are config fields.

One file a reader can hold in their head (after nanoGPT). Defaults are the Cramming choices
(arXiv 2212.14034): pre-LN with a final norm, no biases, scaled sinusoidal positions, GELU-GLU,
no dropout. The ``bert-base`` preset (post-LN, learned positions, biases, token types) matches
Hugging Face's ``BertModel`` parameter for parameter, so its weights import exactly.
"""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple, overload

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from cramkit.errors import CramkitError
from cramkit.model.config import ModelConfig
from cramkit.model.disentangled import Disentangled
from cramkit.model.moe import MoE


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def make_norm(cfg: ModelConfig, width: int = 0) -> nn.Module:
    """The config's norm over ``width`` features (0: hidden)."""
    if cfg.norm == "rmsnorm":
        return RMSNorm(width or cfg.hidden, cfg.norm_eps)
    return nn.LayerNorm(width or cfg.hidden, eps=cfg.norm_eps, bias=cfg.bias)


def activation_fn(name: str) -> nn.Module:
    return nn.ReLU() if name == "relu" else nn.SiLU() if name == "swiglu" else nn.GELU()


def sinusoidal_table(length: int, dim: int) -> torch.Tensor:
    position = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table


class Rotary(nn.Module):
    """Rotary position embedding (RoPE) applied to queries and keys."""

    # buffers (register_buffer)
    inv_freq: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_position: int, base: float) -> None:
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        angles = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def _table(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of positions 0..n-1: the precomputed table, or (rotary models take inputs longer
        than ``max_position``) computed for this call."""
        if n <= self.cos.shape[0]:
            return self.cos, self.sin
        angles = torch.outer(torch.arange(n, dtype=torch.float32, device=self.inv_freq.device), self.inv_freq)
        return angles.cos(), angles.sin()

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, length: int = 0) -> torch.Tensor:
        """x: [B, heads, L, head_dim] (positions 0..L-1), or [N, heads, head_dim] at ``positions`` [N], each
        below ``length`` (the sequence's length, known on the host: no device read)."""
        if positions is None:
            length = x.shape[-2]
            cos, sin = self._table(length)
            cos, sin = cos[:length], sin[:length]
        else:
            cos, sin = self._table(length)
            cos, sin = cos[positions][:, None], sin[positions][:, None]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Embeddings(nn.Module):
    sinusoid: torch.Tensor  # a buffer (register_buffer), with position="sinusoidal"

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        width = cfg.embedding_width
        self.word = nn.Embedding(cfg.vocab_size, width, padding_idx=None)
        if cfg.position == "learned":
            self.position = nn.Embedding(cfg.max_position, width)
        elif cfg.position == "sinusoidal":
            # "scaled sinusoidal": a fixed table times one learned scalar (Cramming, after FLASH)
            self.register_buffer("sinusoid", sinusoidal_table(cfg.max_position, width), persistent=False)
            self.position_scale = nn.Parameter(torch.tensor(cfg.hidden**-0.5))
        self.token_type = nn.Embedding(cfg.type_vocab_size, width) if cfg.type_vocab_size else None
        self.norm = make_norm(cfg, width) if cfg.embedding_norm else nn.Identity()
        self.dropout = nn.Dropout(cfg.dropout)
        # ELECTRA's embeddings narrower than the blocks: projected to hidden after their norm
        self.project = nn.Linear(width, cfg.hidden) if width != cfg.hidden else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        length = input_ids.shape[1]
        if length > self.cfg.positions and self.cfg.position != "rope":
            raise CramkitError(
                f"sequence length {length} exceeds the model's {self.cfg.positions} positions "
                f"(model.max_position={self.cfg.max_position}); "
                "shorten the inputs or use a model with more positions"
            )
        x = self.word(input_ids)
        if self.cfg.position == "learned":
            offset = self.cfg.position_offset
            x = x + self.position.weight[offset : offset + length]
        elif self.cfg.position == "sinusoidal":
            x = x + self.sinusoid[:length].to(x.dtype) * self.position_scale
        if self.token_type is not None:
            if token_type_ids is None:
                x = x + self.token_type.weight[0]
            else:
                x = x + self.token_type(token_type_ids)
        x = self.dropout(self.norm(x))
        return self.project(x) if self.project is not None else x


def relative_buckets(length: int, buckets: int, max_distance: int, device: torch.device) -> torch.Tensor:
    """[L, L] bucket of each (query, key) offset: T5's bidirectional scheme as MPNet computes it (half the
    buckets per direction, exact below a quarter of them, logarithmic up to ``max_distance``)."""
    pos = torch.arange(length, dtype=torch.long, device=device)
    n = pos[:, None] - pos[None, :]  # query - key
    half = buckets // 2
    out = (n < 0).to(torch.long) * half
    n = n.abs()
    exact = half // 2
    large = exact + (torch.log(n.float().clamp_min(1) / exact) / math.log(max_distance / exact) * (half - exact)).to(
        torch.long
    )
    large = large.clamp_max(half - 1)
    return out + torch.where(n < exact, n, large)


class Selection(NamedTuple):
    """The positions whose block output is needed (sparse prediction), built by ``select_positions``.

    ``flat`` [N]: their indices in the flattened ``[B * L]`` positions, row-major (as ``x[keep]``);
    ``slots`` [N]: their indices in a ``[B * M]`` query layout, M = the largest count in a row;
    ``valid`` [B, M]: which query slots are real (its shape gives B and M).
    """

    flat: torch.Tensor
    slots: torch.Tensor
    valid: torch.Tensor


def select_positions(keep: torch.Tensor) -> Selection:
    """[B, L] bool of wanted positions -> ``Selection`` (each row's queries packed to the left)."""
    counts = keep.sum(1)
    width = int(counts.max())
    rank = keep.long().cumsum(1) - 1  # a position's slot within its row
    flat = keep.reshape(-1).nonzero().squeeze(1)
    row = torch.div(flat, keep.shape[1], rounding_mode="floor")
    slots = row * width + rank.reshape(-1)[flat]
    valid = torch.arange(width, device=keep.device)[None, :] < counts[:, None]
    return Selection(flat, slots, valid)


UNPAD_GROUP = 16  # rows per attention group of an unpadded batch (sorted by length: each padded to its own longest)


class Packing(NamedTuple):
    """An unpadded batch (MosaicBERT's unpadding): the blocks' linear layers, norms and MLP run on its N real
    tokens ``[N, hidden]`` only, attention in groups of rows of similar length, each group padded only to its own
    longest row. ``flat`` [N]: where each real token (row-major in the batch) sits in the groups' concatenated
    ``[rows_g * width_g]`` layouts (a token keeps its column: rotary positions are unchanged); ``groups``: each
    group's (rows, width, additive key mask [rows, 1, 1, width] or None when nothing in it is padded)."""

    flat: torch.Tensor
    groups: tuple[tuple[int, int, torch.Tensor | None], ...]


def pack(attention_mask: torch.Tensor, dtype: torch.dtype, group: int = UNPAD_GROUP) -> tuple[torch.Tensor, Packing]:
    """[B, L] 1/0 mask -> the real tokens' row-major indices in ``[B * L]`` and their ``Packing``."""
    keep = attention_mask.bool()
    batch, length = keep.shape
    src = keep.reshape(-1).nonzero().squeeze(1)
    cols = torch.arange(length, device=keep.device).expand(batch, length)
    width = torch.where(keep, cols + 1, 0).amax(1)  # a row's last real column + 1
    order = torch.argsort(width, stable=True)
    sorted_width = width[order].tolist()
    base = torch.empty(batch, dtype=torch.long, device=keep.device)  # where each row's column 0 sits
    groups, offset = [], 0
    bases: list[int] = []
    for start in range(0, batch, group):
        rows = min(group, batch - start)
        w = max(1, sorted_width[start + rows - 1])
        bases.extend(offset + r * w for r in range(rows))
        groups.append((rows, w))
        offset += rows * w
    base[order] = torch.tensor(bases, dtype=torch.long, device=keep.device)
    flat = base[src // length] + src % length
    real = torch.zeros(offset, dtype=torch.bool, device=keep.device).index_fill(0, flat, True)
    low = torch.finfo(dtype).min
    masks: list[tuple[int, int, torch.Tensor | None]] = []
    for (rows, w), part in zip(groups, real.split([r * w for r, w in groups]), strict=True):
        ok = part.view(rows, 1, 1, w)
        masks.append(
            (
                rows,
                w,
                None if bool(ok.all()) else torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill(~ok, low),
            )
        )
    return src, Packing(flat, tuple(masks))


@overload
def local(t: torch.Tensor) -> torch.Tensor: ...
@overload
def local(t: None) -> None: ...
@overload
def local(t: torch.Tensor | None) -> torch.Tensor | None: ...
def local(t: torch.Tensor | None) -> torch.Tensor | None:
    """The part of a weight this process computes with: the weight itself, or under tensor parallelism
    (``cramkit.train.tensor_parallel.apply_tp``) this rank's shard of it."""
    dtensor = sys.modules.get("torch.distributed.tensor")  # not imported: no DTensor exists (and its import is slow)
    return t.to_local() if dtensor is not None and isinstance(t, dtensor.DTensor) else t


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout: float
) -> torch.Tensor:
    """``F.scaled_dot_product_attention``; in fp32 when training in bf16 on a CPU, where torch's bf16 attention
    backward took 4x fp32's time (bench/RESULTS.md, "The silicon on an AMX Xeon"); projections stay bf16."""
    if q.device.type == "cpu" and q.dtype == torch.bfloat16 and q.requires_grad and torch.is_grad_enabled():
        if mask is not None and mask.is_floating_point():
            mask = mask.float()
        with torch.autocast("cpu", enabled=False):  # autocast would cast them back to bf16
            y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, dropout_p=dropout)
        return y.to(torch.bfloat16)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.heads = cfg.heads  # the heads this process computes (cfg.heads / tp under tensor parallelism)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=cfg.bias)
        self.out = nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.bias)
        base = cfg.local_rope_base if cfg.is_local(index) and cfg.local_rope_base else cfg.rope_base
        self.rotary = Rotary(cfg.head_dim, cfg.max_position, base) if cfg.position == "rope" else None

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        select: Selection | None = None,
        prefix: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """[B, L, hidden] -> [B, L, hidden]; with ``select``, queries (and the output, [N, hidden]) only
        at the selected positions, keys and values at all of them. ``prefix`` [2, P, hidden]: keys and values
        every query also attends to (P-tuning v2's deep prompts; no position). With ``packing``, ``x`` is the
        [N, hidden] real tokens of a padded batch, and so is the output: the projections run on them only."""
        if select is not None:
            if prefix is not None:
                raise ValueError("prefix keys and values with sparse prediction are not supported")
            return self._selected(x, mask, select)
        qkv = F.linear(x, local(self.qkv.weight), local(self.qkv.bias))
        if packing is not None:
            return self._packed(qkv, packing)
        return self.out(self._heads(qkv, mask, prefix))

    def _heads(self, qkv: torch.Tensor, mask: torch.Tensor | None, prefix: torch.Tensor | None = None) -> torch.Tensor:
        """Projections [B, L, 3 * hidden] -> the heads' attention [B, L, hidden] (before the output projection)."""
        batch, length, _ = qkv.shape
        heads, head_dim = self.heads, self.cfg.head_dim
        q, k, v = qkv.view(batch, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        if isinstance(mask, Disentangled):  # DeBERTa: this layer's position terms join the mask
            q, mask = mask.scores(q, k, local(self.qkv.weight), local(self.qkv.bias))
        if prefix is not None:
            k, v, mask = with_prefix(prefix.to(k.dtype), k, v, mask, heads)
        p = self.cfg.attention_dropout if self.training else 0.0
        y = attend(q, k, v, mask, p)
        return y.transpose(1, 2).reshape(batch, length, heads * head_dim)

    def _packed(self, qkv: torch.Tensor, packing: Packing) -> torch.Tensor:
        """Projections [N, 3 * hidden] of the real tokens -> [N, hidden]: attention group by group."""
        sizes = [rows * width for rows, width, _ in packing.groups]
        laid = qkv.new_zeros(sum(sizes), qkv.shape[-1]).index_copy(0, packing.flat, qkv)
        ys = [
            self._heads(part.view(rows, width, -1), mask).reshape(rows * width, -1)
            for (rows, width, mask), part in zip(packing.groups, laid.split(sizes), strict=True)
        ]
        return self.out(torch.cat(ys).index_select(0, packing.flat))

    def _selected(self, x: torch.Tensor, mask: torch.Tensor | None, select: Selection) -> torch.Tensor:
        batch, length, _ = x.shape
        heads, head_dim = self.heads, self.cfg.head_dim
        hidden = heads * head_dim  # this process's part of the width
        w, b = local(self.qkv.weight), local(self.qkv.bias)  # rows: queries, keys, values
        k, v = (
            F.linear(x, w[hidden:], None if b is None else b[hidden:])
            .view(batch, length, 2, heads, head_dim)
            .permute(2, 0, 3, 1, 4)
            .unbind(0)
        )
        xq = x.reshape(-1, x.shape[-1]).index_select(0, select.flat)
        q = F.linear(xq, w[:hidden], None if b is None else b[:hidden]).view(-1, heads, head_dim)
        if self.rotary is not None:
            q, k = self.rotary(q, select.flat % length, length), self.rotary(k)
        width = select.valid.shape[1]  # queries packed per row, padded with zeros (outputs dropped)
        q = q.new_zeros(batch * width, heads, head_dim).index_copy(0, select.slots, q)
        q = q.view(batch, width, heads, head_dim).transpose(1, 2)
        p = self.cfg.attention_dropout if self.training else 0.0
        y = attend(q, k, v, mask, p)
        y = y.transpose(1, 2).reshape(batch * width, hidden).index_select(0, select.slots)
        return self.out(y)


def with_prefix(
    prefix: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Keys and values [B, heads, L, d] with ``prefix`` [2, P, heads * d] in front; the additive mask
    [B, 1, 1, L] (None: nothing padded) grows by P open positions."""
    batch, _, _, head_dim = k.shape
    plen = prefix.shape[1]
    pk, pv = prefix.view(2, plen, heads, head_dim).transpose(1, 2).unsqueeze(1).unbind(0)
    k = torch.cat([pk.expand(batch, -1, -1, -1), k], dim=2)
    v = torch.cat([pv.expand(batch, -1, -1, -1), v], dim=2)
    if mask is not None:
        mask = torch.cat([mask.new_zeros(*mask.shape[:-1], plen), mask], dim=-1)
    return k, v, mask


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.glu = cfg.activation in ("gelu_glu", "swiglu")
        self.fc_in = nn.Linear(cfg.hidden, cfg.intermediate, bias=cfg.bias)
        self.act = activation_fn(cfg.activation)
        self.fc_out = nn.Linear(cfg.intermediate // 2 if self.glu else cfg.intermediate, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, local(self.fc_in.weight), local(self.fc_in.bias))
        if self.glu:
            value, gate = h.chunk(2, dim=-1)
            h = value * self.act(gate)
        else:
            h = self.act(h)
        return self.fc_out(h)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int = 0) -> None:
        """Block ``index`` of the encoder (its MLP a mixture of experts when ``cfg.is_moe(index)``)."""
        super().__init__()
        self.pre = cfg.norm_position == "pre"
        self.alpha = cfg.deepnorm_alpha
        first_plain = index == 0 and self.pre and not cfg.first_attention_norm  # ModernBERT's first block
        self.norm_attn = nn.Identity() if first_plain else make_norm(cfg)
        self.attn = Attention(cfg, index)
        self.norm_mlp = make_norm(cfg)
        self.mlp: MLP | MoE = MLP(cfg) if not cfg.is_moe(index) else moe_mlp(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        select: Selection | None = None,
        prefix: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """[B, L, hidden] -> [B, L, hidden]; with ``select``, only the selected positions' outputs
        ([N, hidden], row-major): keys and values still see every position. ``prefix``: the attention's
        extra keys and values ([2, P, hidden]). ``packing``: ``x`` and the output are an unpadded batch's
        [N, hidden] real tokens."""
        if select is None:
            if self.pre:
                x = x + self.dropout(self._attend(self.norm_attn(x), mask, prefix, packing))
                return x + self.dropout(self.mlp(self.norm_mlp(x)))
            x = self.norm_attn(self.alpha * x + self.dropout(self._attend(x, mask, prefix, packing)))
            return self.norm_mlp(self.alpha * x + self.dropout(self.mlp(x)))
        if prefix is not None:
            raise ValueError("prefix keys and values with sparse prediction are not supported")
        residual = x.reshape(-1, x.shape[-1]).index_select(0, select.flat)
        if self.pre:
            x = residual + self.dropout(self.attn(self.norm_attn(x), mask, select))
            return x + self.dropout(self.mlp(self.norm_mlp(x)))
        x = self.norm_attn(self.alpha * residual + self.dropout(self.attn(x, mask, select)))
        return self.norm_mlp(self.alpha * x + self.dropout(self.mlp(x)))

    def _attend(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        prefix: torch.Tensor | None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        # a prefix or packing only when there is one: an exporter's stand-in attention (cramkit.backends.onnx)
        # takes neither
        if packing is not None:
            return self.attn(x, mask, packing=packing)
        return self.attn(x, mask) if prefix is None else self.attn(x, mask, prefix=prefix)


def moe_mlp(cfg: ModelConfig) -> MoE:
    """The mixture-of-experts MLP of ``cfg``'s shape (``cramkit.model.moe``)."""
    return MoE(
        cfg.hidden,
        cfg.intermediate,
        cfg.moe_experts,
        cfg.moe_top_k,
        cfg.moe_capacity,
        cfg.activation,
        cfg.bias,
        aux_weight=cfg.moe_aux,
        z_weight=cfg.moe_z_loss,
    )


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, L] 1/0 padding mask -> additive [B, 1, 1, L] mask for SDPA."""
    keep = mask.bool()[:, None, None, :]
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)


class Encoder(nn.Module):
    """Token ids -> contextual hidden states ``[batch, length, hidden]``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.layers))
        use_final = cfg.final_norm and cfg.norm_position == "pre"
        self.final_norm = make_norm(cfg) if use_final else nn.Identity()
        # MPNet: one relative position bias per bucket and head, shared by the layers
        self.relative = nn.Embedding(cfg.relative_buckets, cfg.heads) if cfg.relative_buckets else None
        # DeBERTa: relative position embeddings shared by the layers, normalised (cramkit.model.disentangled)
        if cfg.disentangled_buckets:
            self.disentangled = nn.Embedding(2 * cfg.disentangled_buckets, cfg.hidden)
            self.disentangled_norm = make_norm(cfg)

    def attention_masks(self, mask: torch.Tensor | None, dtype: torch.dtype, length: int) -> tuple[Any, Any]:
        """The additive masks of the global and the local layers: ``mask`` (padding, segments; None: nothing) plus
        MPNet's relative position bias [1, heads, L, L] where the model has one (DeBERTa's: a :class:`Disentangled`
        bundle in their place, from which each attention computes its own), and for the local layers the band
        that hides keys beyond ``local_window`` positions (ModernBERT)."""
        cfg = self.cfg
        if cfg.disentangled_buckets:  # one bundle every layer turns into its own bias (Attention._heads)
            table = F.dropout(self.disentangled_norm(self.disentangled.weight), cfg.dropout, self.training)
            bundle = Disentangled.build(mask, table, length, cfg.disentangled_buckets, cfg.disentangled_max_distance)
            return bundle, bundle  # (typed as masks: a block hands it to its attention unread)
        if self.relative is not None:
            buckets = relative_buckets(
                length, cfg.relative_buckets, cfg.relative_max_distance, self.relative.weight.device
            )
            bias = self.relative(buckets).permute(2, 0, 1).unsqueeze(0).to(dtype)  # [1, heads, L, L]
            mask = bias if mask is None else mask + bias
        if not cfg.local_window:
            return mask, mask
        device = self.embeddings.word.weight.device
        pos = torch.arange(length, device=device)
        far = (pos[:, None] - pos[None, :]).abs() > cfg.local_window
        band = torch.zeros(length, length, dtype=dtype, device=device).masked_fill(far, torch.finfo(dtype).min)
        return mask, band if mask is None else mask + band

    def mask_of(self, index: int, masks: tuple[torch.Tensor | None, torch.Tensor | None]) -> torch.Tensor | None:
        """Block ``index``'s mask of :meth:`attention_masks`' pair."""
        return masks[1] if self.cfg.is_local(index) else masks[0]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        select: torch.Tensor | None = None,
        prefix: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
        unpad: bool = False,
    ) -> torch.Tensor:
        """Hidden states ``[B, L, hidden]``; with ``select`` ([B, L] bool, at least one True), only those
        positions' ``[N, hidden]`` (row-major, as ``hidden[select]``), the last block computing its
        queries, MLP and norms only there (sparse prediction: the same values, less work). ``prefix``
        [layers, 2, P, hidden]: keys and values each layer's attention also sees (P-tuning v2). ``segments``
        [B, L] ints: a position attends only to positions of its own segment (the documents of a packed
        sequence). ``unpad``: the blocks' projections, norms and MLP skip the padding, attention runs in groups
        of rows of similar length (``pack``); the same values up to rounding, less work the more is padded. Only
        without ``select``, ``prefix`` and ``segments``; a batch with nothing padded runs as it is."""
        x = self.embeddings(input_ids, token_type_ids)
        mask = _mask_for(attention_mask, x.dtype)
        if self.cfg.pairwise_attention:  # a bias over every (query, key): no unpadding, no sparse last block
            if select is not None:
                return self.forward(input_ids, attention_mask, token_type_ids, None, prefix, segments)[select]
            unpad = False
        if (
            unpad
            and attention_mask is not None
            and mask is not None
            and select is None
            and prefix is None
            and segments is None
        ):
            return self._unpadded(x, attention_mask)
        chosen = select_positions(select) if select is not None else None
        last_mask = mask
        if segments is not None:
            if prefix is not None:
                raise ValueError("document segments with prefix keys and values are not supported")
            mask, last_mask = _segment_masks(segments, mask, chosen, x.dtype)
        masks = (mask, mask)
        if self.cfg.pairwise_attention:
            masks = self.attention_masks(mask, x.dtype, x.shape[1])
        last = len(self.layers) - 1
        for i, block in enumerate(self.layers):
            sel = chosen if i == last else None
            mask = last_mask if i == last and chosen is not None else self.mask_of(i, masks)
            pre = prefix[i] if prefix is not None else None
            x = self._block(block, x, mask, sel, pre)
        return self.final_norm(x)

    def _block(self, block: nn.Module, x: torch.Tensor, *args: Any) -> torch.Tensor:
        """``block(x, *args)``, its activations recomputed in the backward pass under gradient checkpointing."""
        if self.cfg.gradient_checkpointing and self.training:
            return checkpoint(block, x, *args, use_reentrant=False)
        return block(x, *args)

    def _unpadded(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The blocks over the real tokens of ``x`` [B, L, hidden] only (``Packing``); hidden states [B, L,
        hidden], zeros at the padding."""
        batch, length, width = x.shape
        src, packing = pack(attention_mask, x.dtype)
        x = x.reshape(-1, width).index_select(0, src)
        for block in self.layers:
            x = self._block(block, x, None, None, None, packing)
        return x.new_zeros(batch * length, width).index_copy(0, src, self.final_norm(x)).view(batch, length, width)


def _segment_masks(
    segments: torch.Tensor, padding: torch.Tensor | None, chosen: Selection | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive masks keeping attention inside each segment: [B, 1, L, L] for every block, and for the last
    block's queries under sparse prediction [B, 1, M, L] (its M packed query slots; else the same mask);
    ``padding`` ([B, 1, 1, L] or None) added to both."""
    low = torch.finfo(dtype).min
    keys = segments[:, None, None, :]
    full = torch.zeros(keys.shape[0], 1, keys.shape[-1], keys.shape[-1], dtype=dtype, device=segments.device)
    full = full.masked_fill(segments[:, None, :, None] != keys, low)
    last = full
    if chosen is not None:
        batch, width = chosen.valid.shape
        query = segments.new_full((batch * width,), -1).index_copy(0, chosen.slots, segments.reshape(-1)[chosen.flat])
        query = query.view(batch, width)
        # an empty slot (-1) sees every key, so that no query row is all -inf (its output is dropped)
        unseen = (query[:, None, :, None] != keys) & (query[:, None, :, None] >= 0)
        last = torch.zeros(batch, 1, width, keys.shape[-1], dtype=dtype, device=segments.device)
        last = last.masked_fill(unseen, low)
    if padding is not None:
        full, last = full + padding, last + padding
    return full, last


def _mask_for(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if mask is None:
        return None
    if not torch.compiler.is_compiling() and bool(mask.all()):
        return None  # nothing padded: let SDPA take its fastest (flash) path
    return additive_mask(mask, dtype)


def init_weights(module: nn.Module, cfg: ModelConfig) -> None:
    """BERT's init (normal, std init_std), with DeepNet's beta scaling of value/output/MLP weights."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=cfg.init_std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=cfg.init_std)
        elif isinstance(m, MoE):  # its experts' stacked weights (its router is a Linear, initialised above)
            for w in (m.w_in, m.w_out):
                nn.init.normal_(w, std=cfg.init_std)
            for b in (m.b_in, m.b_out):
                if b is not None:
                    nn.init.zeros_(b)
        elif isinstance(m, (nn.LayerNorm, RMSNorm)):
            if m.weight is not None:
                nn.init.ones_(m.weight)
            bias = getattr(m, "bias", None)
            if bias is not None:
                nn.init.zeros_(bias)
    # a second pass: modules() visits Attention/MLP before their Linear children, whose plain init above
    # would otherwise overwrite DeepNet's scaled one
    for m in module.modules():
        if cfg.norm_position == "deepnorm" and isinstance(m, MoE):
            with torch.no_grad():
                for w in (*m.w_in, *m.w_out):  # each expert as its dense MLP's Linear
                    nn.init.xavier_normal_(w, gain=cfg.deepnorm_beta)
        if cfg.norm_position == "deepnorm" and isinstance(m, (Attention, MLP)):
            beta = cfg.deepnorm_beta
            with torch.no_grad():
                if isinstance(m, Attention):
                    nn.init.xavier_normal_(m.qkv.weight[: 2 * cfg.hidden], gain=1.0)
                    nn.init.xavier_normal_(m.qkv.weight[2 * cfg.hidden :], gain=beta)
                    nn.init.xavier_normal_(m.out.weight, gain=beta)
                else:
                    nn.init.xavier_normal_(m.fc_in.weight, gain=beta)
                    nn.init.xavier_normal_(m.fc_out.weight, gain=beta)


def count_parameters(module: nn.Module, *, exclude_embeddings: bool = False) -> int:
    total = sum(p.numel() for p in module.parameters())
    if exclude_embeddings:
        total -= sum(p.numel() for m in module.modules() if isinstance(m, nn.Embedding) for p in m.parameters())
    return total
