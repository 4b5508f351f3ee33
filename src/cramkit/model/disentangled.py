"""DeBERTa-v2/v3's disentangled attention (He et al., 2021), on cramkit's fused attention.

Each attention score adds to the content term ``q_i . k_j`` a content-to-position term ``q_i . P^k_{d(i,j)}`` and a
position-to-content term ``k_j . P^q_{-d(i,j)}``, all three divided by ``sqrt(3 x head_dim)``. ``P`` is one table of
``2 x buckets`` relative position embeddings shared by the layers (normalised once), projected by each layer's own
query and key projections; ``d(i, j)`` is the relative position ``i - j`` in log buckets beyond half the buckets
(:func:`log_buckets`, transformers' ``make_log_bucket_position``).

On scaled dot-product attention: the queries are scaled by ``1/sqrt(3)`` (SDPA divides by ``sqrt(head_dim)``) and
the two position terms join the additive mask. The encoder builds one :class:`Disentangled` per batch
(``Encoder.attention_masks``) and hands it to every block in place of the mask; each attention turns it into its
own bias (:meth:`Disentangled.scores`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

# the content, content-to-position and position-to-content terms: the scores' divisor is sqrt(3 x head_dim)
TERMS = 3


def log_buckets(length: int, buckets: int, max_distance: int, device: torch.device) -> torch.Tensor:
    """``[L, L]`` relative positions ``i - j`` (query i, key j): exact within ``buckets // 2``, beyond it in
    logarithmic buckets up to ``max_distance`` (DeBERTa's ``make_log_bucket_position``)."""
    pos = torch.arange(length, device=device)
    rel = pos[:, None] - pos[None, :]
    mid = buckets // 2
    sign = torch.sign(rel)
    far = torch.where((rel < mid) & (rel > -mid), torch.full_like(rel, mid - 1), rel.abs())
    # (the divisor's log in float32, as transformers computes it: a float64 one moves a few buckets by one)
    scale = torch.log(torch.tensor((max_distance - 1) / mid, device=device))
    log_pos = torch.ceil(torch.log(far / mid) / scale * (mid - 1)) + mid
    return torch.where(far <= mid, rel.to(log_pos.dtype), log_pos * sign).long()


class Disentangled(NamedTuple):
    """What every attention of a batch needs for its position terms: the padding mask (additive, or None), the
    normalised table ``[2 x buckets, hidden]`` and the table rows each (query, key) pair reads ``[L, L]``."""

    mask: torch.Tensor | None
    table: torch.Tensor
    c2p: torch.Tensor  # row of the key-side embedding for query i, key j
    p2c: torch.Tensor  # row of the query-side embedding for key i, query j (transposed after the gather)

    @classmethod
    def build(
        cls, mask: torch.Tensor | None, table: torch.Tensor, length: int, buckets: int, max_distance: int
    ) -> Disentangled:
        rel = log_buckets(length, buckets, max_distance, table.device)
        top = 2 * buckets - 1
        return cls(mask, table, (rel + buckets).clamp(0, top), (buckets - rel).clamp(0, top))

    def scores(
        self, q: torch.Tensor, k: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """For one attention, with queries and keys ``[B, heads, L, d]`` and its fused ``qkv`` projection
        (``weight`` [3 x width, hidden], ``bias``): the queries scaled for SDPA and the additive mask holding both
        position terms (and the padding)."""
        batch, heads, length, head_dim = q.shape
        width = heads * head_dim

        def project(part: int) -> torch.Tensor:  # the table through this layer's query (0) or key (1) projection
            rows = slice(part * width, (part + 1) * width)
            out = F.linear(self.table.to(q.dtype), weight[rows], None if bias is None else bias[rows])
            return out.view(-1, heads, head_dim).transpose(0, 1)  # [heads, 2 x buckets, d]

        pos_q, pos_k = project(0), project(1)
        shape = (batch, heads, length, length)
        c2p = torch.gather(q @ pos_k.transpose(-1, -2), -1, self.c2p.expand(shape))
        p2c = torch.gather(k @ pos_q.transpose(-1, -2), -1, self.p2c.expand(shape)).transpose(-1, -2)
        position = (c2p + p2c) * (TERMS * head_dim) ** -0.5
        mask = position if self.mask is None else position + self.mask.to(position.dtype)
        return q * TERMS**-0.5, mask
