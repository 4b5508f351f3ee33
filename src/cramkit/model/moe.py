"""Mixture-of-experts feed-forward (Switch Transformer, GShard, ST-MoE): a router picks each token's top-k
experts among E feed-forward networks of the dense block's shape.

- The router runs in fp32 (outside autocast): its softmax decides where tokens go.
- Gates: each token's top-k probabilities divided by their sum, the sum not differentiated (so the weights
  sum to 1, and with k=1 the router still learns from the loss, as in Switch). Every expert equal then means
  the dense block's function: what upcycling (:func:`upcycle_state`) starts from.
- Training with ``capacity`` > 0: each expert takes at most ``C = ceil(capacity * k * T / E)`` of a
  micro-batch's T tokens' k assignments, first choices before second ones (GShard's priority), in token order
  within a choice. An assignment past C is dropped: it adds nothing, and a token whose every assignment is
  dropped passes through the block's residual unchanged. The experts run as one batched matmul over an
  [E, C, hidden] buffer, filled and read back by gathers (tokens sorted by expert; no loop over tokens).
- Inference (``eval()``) and ``capacity`` = 0: nothing is dropped; the tokens, sorted by expert, run through
  each expert's slice (a loop over the E experts, whose counts the host reads once per layer).
- Offloaded inference (:func:`offload_experts`, InfMoE's idea): the stacked expert weights leave the module for
  an :class:`ExpertStore`, which brings in only the experts the router picked for the current pass: on a CPU read
  from the model's safetensors file (memory-mapped, per expert), on CUDA copied from pinned host memory on a
  side stream (each expert's copy overlapping the previous experts' compute); an LRU of ``cache`` experts per
  layer stays resident. The outputs are the resident model's (the same experts run on the same rows).
- :class:`MoEStats` of the last forward: the load-balancing loss (Switch: ``E * sum_e f_e * P_e``, 1 when
  balanced), the router z-loss (ST-MoE: mean squared logsumexp of the logits), the fraction of assignments
  dropped and the busiest expert's load over the mean (1 = balanced, E = all on one). The training objective
  adds ``moe_aux * aux + moe_z_loss * z`` of every MoE layer to its loss (:func:`moe_losses`).
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

GLU = ("gelu_glu", "swiglu")


class MoEStats(NamedTuple):
    aux: torch.Tensor  # load-balancing loss (with gradient); 1.0 when balanced
    z: torch.Tensor  # router z-loss (with gradient)
    dropped: torch.Tensor  # fraction of token-expert assignments dropped by the capacity (no gradient)
    load: torch.Tensor  # the busiest expert's assignments over the mean (no gradient)


def _activation(name: str) -> nn.Module:
    return nn.ReLU() if name == "relu" else nn.SiLU() if name == "swiglu" else nn.GELU()


class MoE(nn.Module):
    """``experts`` feed-forward networks (``hidden -> intermediate -> hidden``, GLU as the dense MLP) and a
    router; each token goes to its ``top_k`` experts. Weights are stacked per expert in ``nn.Linear``'s
    layout: ``w_in`` [E, intermediate, hidden], ``w_out`` [E, hidden, intermediate (/2 with a GLU)]."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        experts: int,
        top_k: int,
        capacity: float,
        activation: str = "gelu_glu",
        bias: bool = False,
        aux_weight: float = 0.0,
        z_weight: float = 0.0,
    ) -> None:
        super().__init__()
        self.experts, self.top_k, self.capacity = experts, top_k, capacity
        self.aux_weight, self.z_weight = aux_weight, z_weight  # of the losses moe_losses adds
        self.glu = activation in GLU
        self.act = _activation(activation)
        width = intermediate // 2 if self.glu else intermediate
        self.router = nn.Linear(hidden, experts, bias=False)
        self.w_in = nn.Parameter(torch.empty(experts, intermediate, hidden))
        self.w_out = nn.Parameter(torch.empty(experts, hidden, width))
        self.b_in = nn.Parameter(torch.zeros(experts, intermediate)) if bias else None
        self.b_out = nn.Parameter(torch.zeros(experts, hidden)) if bias else None
        self.stats: MoEStats | None = None
        self.store: ExpertStore | None = None  # offloaded inference: the experts live there (offload_experts)
        # expert parallelism (``cramkit.train.parallel.apply_ep``): this rank holds experts
        # [ep_rank * E / ep_size, (ep_rank + 1) * E / ep_size) of the stacked weights (DTensor shards) and the
        # tokens of every rank routed to them are exchanged by all-to-all; None = every expert here
        self.ep_group: object | None = None
        self.ep_size, self.ep_rank = 1, 0
        for w in (self.w_in, self.w_out):
            nn.init.normal_(w, std=0.02)

    def _ffn(self, h: torch.Tensor) -> torch.Tensor:
        """The activation between the two projections ([..., intermediate] -> [..., width])."""
        if self.glu:
            value, gate = h.chunk(2, dim=-1)
            return value * self.act(gate)
        return self.act(h)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router logits [T, E] (fp32), each token's top-k experts [T, k] and gates [T, k] (summing to 1)."""
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.float(), self.router.weight.float())
        probs = logits.softmax(-1)
        top_p, top_e = probs.topk(self.top_k, dim=-1)
        gates = top_p / top_p.sum(-1, keepdim=True).detach()
        return logits, top_e, gates

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., hidden]: the gated sum of each token's kept experts' outputs."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        e = self.experts
        if x.shape[0] == 0 and self.ep_group is None:  # nothing to route (expert-parallel: still exchange, below)
            zero = x.new_zeros((), dtype=torch.float32)
            self.stats = MoEStats(zero, zero, zero, zero)
            return x.new_zeros(shape)
        logits, top_e, gates = self.route(x)
        # assignments in priority order: every token's first choice, then every token's second, ...
        expert = top_e.t().reshape(-1)  # [k * T]; assignment j is token j % T
        n = expert.numel()
        counts = torch.bincount(expert, minlength=e)
        order = torch.argsort(expert, stable=True)  # sorted by expert, priority kept within one
        starts = counts.cumsum(0) - counts
        if self.ep_group is not None:
            y, dropped = self._expert_parallel(x, expert, counts, order, starts, gates)
        elif self.store is not None:  # offloaded inference: only the picked experts are brought in
            y, dropped = self._all(x, counts, order, gates), logits.new_zeros(())
        elif self.training and self.capacity > 0:
            y, dropped = self._capacity(x, expert, counts, order, starts, gates)
        elif torch.compiler.is_exporting():  # a static graph (ONNX): every expert on every token, weighted
            y, dropped = self._dense(x, top_e, gates), logits.new_zeros(())
        else:
            y, dropped = self._all(x, counts, order, gates), logits.new_zeros(())
        if x.shape[0] == 0:  # (expert-parallel, this rank had no token: it took part in the exchange)
            zero = x.new_zeros((), dtype=torch.float32)
            self.stats = MoEStats(zero, zero, zero, zero)
            return y.reshape(shape)
        probs = logits.softmax(-1)
        share = counts.to(probs.dtype) / max(n, 1)
        aux = e * (share * probs.mean(0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        load = counts.max().to(probs.dtype) / max(n / e, 1e-9)
        self.stats = MoEStats(aux, z, dropped, load.detach())
        return y.reshape(shape)

    def _capacity(
        self,
        x: torch.Tensor,
        expert: torch.Tensor,
        counts: torch.Tensor,
        order: torch.Tensor,
        starts: torch.Tensor,
        gates: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training with a capacity: one batched matmul over [E, C, hidden] (static shapes, no host read)."""
        tokens, hidden = x.shape
        e, n = self.experts, expert.numel()
        cap = max(1, math.ceil(self.capacity * n / e))
        # slot (expert, c) holds the expert's c-th assignment, when it has one: x's row, else a zero row
        pos = starts[:, None] + torch.arange(cap, device=x.device)[None, :]  # [E, C] sorted positions
        filled = torch.arange(cap, device=x.device)[None, :] < counts[:, None]
        assignment = order[pos.clamp(max=n - 1)]
        row = torch.where(filled, assignment % tokens, tokens).reshape(-1)
        padded = torch.cat([x, x.new_zeros(1, hidden)])
        buf = padded[row].view(e, cap, hidden)
        h = torch.bmm(buf, self.w_in.transpose(1, 2))
        if self.b_in is not None:
            h = h + self.b_in[:, None, :].to(h.dtype)
        out = torch.bmm(self._ffn(h), self.w_out.transpose(1, 2))
        if self.b_out is not None:
            out = out + self.b_out[:, None, :].to(out.dtype)
        # each assignment reads its slot back (its rank within the expert below C), or the zero row: dropped
        rank = torch.empty_like(expert)
        rank[order] = torch.arange(n, device=x.device) - starts[expert[order]]
        kept = rank < cap
        slot = torch.where(kept, expert * cap + rank, e * cap)
        out = torch.cat([out.reshape(e * cap, hidden), out.new_zeros(1, hidden)])
        picked = out[slot].view(self.top_k, tokens, hidden)
        y = (picked * gates.t()[..., None].to(picked.dtype)).sum(0)
        dropped = (~kept).float().mean()
        return y, dropped

    def _expert_parallel(
        self,
        x: torch.Tensor,
        expert: torch.Tensor,
        counts: torch.Tensor,
        order: torch.Tensor,
        starts: torch.Tensor,
        gates: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert parallelism: this rank's kept assignments (the capacity applied to its own tokens, as
        :meth:`_capacity` does; all of them in eval) sent to the ranks holding their experts by one all-to-all,
        each expert run on the rows it received from every rank, the outputs returned by a second all-to-all and
        combined with the gates. The all-to-alls are differentiable: an expert's gradient sums every rank's."""
        import torch.distributed as dist
        from torch.distributed._functional_collectives import all_to_all_single, wait_tensor

        tokens, hidden = x.shape
        e, n, group, size = self.experts, expert.numel(), self.ep_group, self.ep_size
        local_e = e // size
        rank = torch.empty_like(expert)
        rank[order] = torch.arange(n, device=x.device) - starts[expert[order]]
        if self.training and self.capacity > 0:
            kept = rank < max(1, math.ceil(self.capacity * n / e))
        else:
            kept = torch.ones_like(expert, dtype=torch.bool)
        sent = order[kept[order]]  # kept assignments, sorted by expert (so by the rank that holds it)
        per_expert = torch.bincount(expert[sent], minlength=e)
        # how many rows each rank sends each of this rank's experts: [size, local_e]
        incoming = torch.empty_like(per_expert)
        dist.all_to_all_single(incoming, per_expert, group=group)
        send_sizes = per_expert.view(size, local_e).sum(1).tolist()
        incoming = incoming.view(size, local_e)
        recv_sizes = incoming.sum(1).tolist()
        rows = x[sent % tokens]
        got = wait_tensor(all_to_all_single(rows, recv_sizes, send_sizes, group))  # type: ignore[arg-type]
        # the received rows, grouped by source rank then expert: regroup by expert, run each, put back
        source_expert = torch.arange(local_e, device=x.device).repeat(size).repeat_interleave(incoming.reshape(-1))
        by_expert = torch.argsort(source_expert, stable=True)
        grouped = got[by_expert]
        # (the trainer scales each rank's loss by the number of ranks, as DDP then averages; an expert's gradient,
        # summed over the ranks by the all-to-all, is averaged here)
        w_in, w_out = _scaled(_local(self.w_in), size), _scaled(_local(self.w_out), size)
        b_in, b_out = _scaled(_local(self.b_in), size), _scaled(_local(self.b_out), size)
        assert w_in is not None and w_out is not None  # (the weights always exist; only the biases may not)
        outs, start = [], 0
        for i, count in enumerate(incoming.sum(0).tolist()):
            part = grouped[start : start + count]
            h = F.linear(part, w_in[i], None if b_in is None else b_in[i])
            outs.append(F.linear(self._ffn(h), w_out[i], None if b_out is None else b_out[i]))
            start += count
        done = torch.cat(outs) if outs else grouped
        back = torch.empty_like(done).index_copy(0, by_expert, done)
        returned = wait_tensor(all_to_all_single(back, send_sizes, recv_sizes, group))  # type: ignore[arg-type]
        # each kept assignment's output (zero for dropped ones), weighted by its gate and summed over the k choices
        out = returned.new_zeros(n, hidden).index_copy(0, sent, returned)
        picked = out.view(self.top_k, tokens, hidden)
        y = (picked * gates.t()[..., None].to(picked.dtype)).sum(0)
        return y, (~kept).float().mean()

    def _dense(self, x: torch.Tensor, top_e: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """No dropping, static shapes (for exporters): all E experts on all tokens (E times the MLP's work),
        each token's output the gated sum of its top-k's."""
        h = torch.einsum("th,eih->eti", x, self.w_in)
        if self.b_in is not None:
            h = h + self.b_in[:, None, :]
        out = torch.einsum("etw,ehw->eth", self._ffn(h), self.w_out)
        if self.b_out is not None:
            out = out + self.b_out[:, None, :]
        weights = torch.zeros(x.shape[0], self.experts, dtype=gates.dtype, device=x.device).scatter(1, top_e, gates)
        return torch.einsum("te,eth->th", weights.to(out.dtype), out)

    @torch.compiler.disable  # data-dependent slices: eager, also inside a compiled block
    def _all(self, x: torch.Tensor, counts: torch.Tensor, order: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """No dropping: the tokens sorted by expert, each expert's slice through it (the counts read once)."""
        tokens, hidden = x.shape
        rows = x[order % tokens]
        outs = []
        start = 0
        sizes = counts.tolist()
        store = self.store
        fetched = store.fetch([i for i, c in enumerate(sizes) if c]) if store is not None else {}
        for i, count in enumerate(sizes):
            if store is not None:
                if not count:  # an expert no token picked is not brought in (it would add no row)
                    continue
                w_in, w_out, b_in, b_out = store.ready(fetched.pop(i))
            else:
                w_in, w_out = self.w_in[i], self.w_out[i]
                b_in = None if self.b_in is None else self.b_in[i]
                b_out = None if self.b_out is None else self.b_out[i]
            part = rows[start : start + count]
            h = F.linear(part, w_in, b_in)
            outs.append(F.linear(self._ffn(h), w_out, b_out))
            start += count
        sorted_out = torch.cat(outs)
        out = torch.empty_like(sorted_out)
        out[order] = sorted_out
        picked = out.view(self.top_k, tokens, hidden)
        return (picked * gates.t()[..., None].to(picked.dtype)).sum(0)


# ------------------------------------------------------------------------------------ offloaded experts

EXPERT_PARAMS = ("w_in", "w_out", "b_in", "b_out")
Expert = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


class ExpertStore:
    """One MoE layer's experts held outside the module; :meth:`fetch` brings in the experts a pass needs.

    file: the safetensors file holding the stacked weights under ``keys`` (param name -> key), read per expert
    through ``safe_open`` (a memory map: only the picked experts' pages are read, and the map is released once
    the pass has used them); or ``host``: the stacked weights in (pinned) host memory, copied to ``device``
    on a side stream. ``cache``: how many experts stay resident (least recently used leaves first; 0: none,
    each pass brings in what it needs). ``reads`` and ``hits`` count the experts brought in and found resident.
    """

    def __init__(
        self,
        *,
        experts: int,
        device: torch.device,
        cache: int,
        file: Path | None = None,
        keys: dict[str, str] | None = None,
        host: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.experts, self.device, self.cache = experts, device, cache
        self.file, self.keys, self.host = file, keys or {}, host or {}
        self.resident: OrderedDict[int, tuple[Expert, Any]] = OrderedDict()
        self.reads = self.hits = 0
        self.lock = threading.Lock()
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        # the file as it is now, held open: a model directory saved again over it (a new file renamed into
        # place) does not change the experts this store serves; read through /proc/self/fd where there is one
        self._fd: int | None = None
        self.path = str(file) if file is not None else ""
        if file is not None and os.path.isdir("/proc/self/fd"):
            self._fd = os.open(file, os.O_RDONLY)
            self.path = f"/proc/self/fd/{self._fd}"
            weakref.finalize(self, os.close, self._fd)  # closed with the store (or at exit)

    def fetch(self, wanted: list[int]) -> dict[int, tuple[Expert, Any]]:
        """Experts ``wanted`` (ids): each with the event its copy records (None: ready now)."""
        with self.lock:
            out: dict[int, tuple[Expert, Any]] = {}
            missing = []
            for i in wanted:
                if i in self.resident:
                    self.resident.move_to_end(i)
                    out[i] = self.resident[i]
                    self.hits += 1
                else:
                    missing.append(i)
            self.reads += len(missing)
            if missing:
                got = self._read(missing) if self.file is not None else self._copy(missing)
                for i, entry in got.items():
                    out[i] = entry
                    if self.cache > 0:
                        self.resident[i] = entry
                        while len(self.resident) > self.cache:
                            self.resident.popitem(last=False)
            return out

    def _read(self, ids: list[int]) -> dict[int, tuple[Expert, Any]]:
        """From the memory-mapped file: zero-copy views of the map for this pass (a copy for the cache, so
        that a resident expert does not keep the map alive)."""
        from safetensors import safe_open

        out: dict[int, tuple[Expert, Any]] = {}
        with safe_open(self.path, framework="pt", device="cpu") as f:
            slices = {name: f.get_slice(key) for name, key in self.keys.items()}
            for i in ids:
                parts = [slices[name][i] if name in slices else None for name in EXPERT_PARAMS]
                if self.cache > 0:
                    parts = [None if p is None else p.clone() for p in parts]
                if self.device.type != "cpu":
                    parts = [None if p is None else p.to(self.device) for p in parts]
                out[i] = (_expert(parts), None)
        return out

    def _copy(self, ids: list[int]) -> dict[int, tuple[Expert, Any]]:
        """From host memory to the device, each expert's copy on the side stream (non-blocking from pinned
        memory) with an event: the compute waits for an expert only when it reaches it."""
        out: dict[int, tuple[Expert, Any]] = {}
        for i in ids:
            if self.stream is None:
                parts = [self.host[n][i].to(self.device) if n in self.host else None for n in EXPERT_PARAMS]
                out[i] = (_expert(parts), None)
                continue
            with torch.cuda.stream(self.stream):
                parts = [
                    self.host[n][i].to(self.device, non_blocking=True) if n in self.host else None
                    for n in EXPERT_PARAMS
                ]
                event = torch.cuda.Event()
                event.record(self.stream)
            out[i] = (_expert(parts), event)
        return out

    def ready(self, entry: tuple[Expert, Any]) -> Expert:
        """An expert's weights once its copy is done (the current stream waits for it; the weights are kept
        from reuse by the side stream's allocator until the current stream is past them)."""
        weights, event = entry
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for w in weights:
                if w is not None:
                    w.record_stream(current)
        return weights


def _expert(parts: list[torch.Tensor | None]) -> Expert:
    w_in, w_out, b_in, b_out = parts
    assert w_in is not None and w_out is not None
    return w_in, w_out, b_in, b_out


def offload_experts(
    model: nn.Module,
    *,
    device: torch.device,
    cache: int,
    file: Path | None = None,
    keys: dict[str, str] | None = None,
) -> list[MoE]:
    """Move the experts of ``model``'s MoE layers out of it into one :class:`ExpertStore` each; the modules keep the
    router and run only the experts each pass picks (inference only). On a CPU ``file`` (a safetensors file)
    and ``keys`` (the module's parameter name, ``encoder.layers.1.mlp.w_in``, -> its key in the file) are
    needed: the experts are read from the file's memory map; on CUDA the experts go to pinned host memory.
    Layers already offloaded are left as they are. Returns the MoE layers."""
    layers = []
    for name, module in model.named_modules():
        if not isinstance(module, MoE):
            continue
        layers.append(module)
        if module.store is not None:
            continue
        params = {p: getattr(module, p) for p in EXPERT_PARAMS if getattr(module, p) is not None}
        if device.type == "cuda":
            host = {p: w.detach().to("cpu").pin_memory() for p, w in params.items()}
            store = ExpertStore(experts=module.experts, device=device, cache=cache, host=host)
        else:
            assert file is not None and keys is not None
            mine = {p: keys[f"{name}.{p}"] for p in params}
            store = ExpertStore(experts=module.experts, device=device, cache=cache, file=file, keys=mine)
        for p in EXPERT_PARAMS:
            setattr(module, p, None)  # the resident copy goes: the store holds the experts now
        module.store = store
    return layers


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's part of an expert-parallel weight (a DTensor shard), or the weight itself."""
    return t.to_local() if t is not None and hasattr(t, "to_local") else t


class _DivideGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, t: torch.Tensor, by: int) -> torch.Tensor:
        ctx.by = by  # type: ignore[attr-defined]
        return t.view_as(t)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad / ctx.by, None  # type: ignore[attr-defined]


def _scaled(t: torch.Tensor | None, by: int) -> torch.Tensor | None:
    """``t`` itself, its gradient divided by ``by``."""
    return None if t is None else _DivideGrad.apply(t, by)


def moe_layers(model: nn.Module) -> list[MoE]:
    """The mixture-of-experts MLPs of ``model`` (through DDP or compile wrappers), in order."""
    return [m for m in model.modules() if isinstance(m, MoE)]


def moe_losses(model: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """After a forward of ``model``: the sum over its MoE layers of ``aux_weight * aux + z_weight * z`` (to add to
    the training loss), and the layers' mean figures [aux, z, dropped, load] (detached, for the metrics);
    (None, None) when the model has no MoE layer that ran."""
    stats = [m.stats for m in moe_layers(model) if m.stats is not None]
    if not stats:
        return None, None
    layers = [m for m in moe_layers(model) if m.stats is not None]
    loss = sum(
        (m.aux_weight * s.aux + m.z_weight * s.z for m, s in zip(layers, stats, strict=True)),
        torch.zeros((), device=stats[0].aux.device),
    )
    figures = torch.stack([torch.stack([s.aux, s.z, s.dropped, s.load]).detach().float() for s in stats]).mean(0)
    return loss, figures


def upcycle_state(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """A dense model's ``state`` in the names of ``model``, an MoE of its shape: each MoE block's dense MLP
    weights (``...mlp.fc_in.weight`` ...) copied into every expert, the router ``model``'s own (fresh) init
    (sparse upcycling, Komatsuzaki et al. 2022). Every expert equal and the gates summing to 1, the upcycled
    model computes the dense one's function until training moves them apart."""
    out = dict(state)
    for name, module in model.named_modules():
        if not isinstance(module, MoE):
            continue
        prefix = f"{name}."
        e = module.experts
        pairs = [("w_in", "fc_in.weight"), ("w_out", "fc_out.weight"), ("b_in", "fc_in.bias"), ("b_out", "fc_out.bias")]
        for mine, dense in pairs:
            w = out.pop(prefix + dense, None)
            if w is not None and getattr(module, mine) is not None:
                out[prefix + mine] = w.detach().unsqueeze(0).repeat(e, *([1] * w.dim())).contiguous()
        out[prefix + "router.weight"] = module.router.weight.detach().clone()
    return out
