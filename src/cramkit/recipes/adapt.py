"""Starting from what exists: continued pretraining (``--from``) and knowledge inheritance (``--inherit``).

``pretrain --from MODEL`` keeps MODEL's tokenizer and architecture and starts from its weights (its MLM
head where it has one; otherwise a fresh head, tied to the embeddings when the model ties them), with
the masking MODEL was trained with (a cramkit run's own settings; BERT's 15%, 80/10/10, [CLS] first for
a Hugging Face model). ``--extend-vocab N`` grows the vocabulary first (:mod:`cramkit.text.extend`): a new
word's embedding (and output bias) starts as the mean of its old pieces'. MODEL's BERT pooler (dense + tanh
over [CLS], e.g. an HF ``BertModel``'s ``pooler.dense``), which masked-LM training neither uses nor trains, is
kept as it is in ``RUN/pooler.safetensors`` (its SHA-256 in ``run.json``): fine-tuning the run starts its
classifier's pooler from it, as fine-tuning MODEL itself would.

``pretrain --inherit TEACHER`` trains a new model of any shape on TEACHER's tokenizer with the loss
``(1 - a) * MLM + a * T^2 * KL(teacher || student)`` over the masked positions, ``a`` falling linearly from
``inherit.alpha`` to 0 at ``inherit.until`` of the budget (Knowledge Inheritance, Qin et al., NAACL 2022);
the teacher's logits are computed on the fly without gradients, and the teacher is released at
``inherit.until``: from there on the run is an ordinary one. ``inherit.init=teacher`` also starts the
student from the teacher where the shapes allow: the same width, and depth grown by repeating the
teacher's layers in order (StackBERT-style).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F

from cramkit.errors import CramkitError
from cramkit.loading import POOLER_FILE
from cramkit.model.heads import IGNORE, MaskedLM
from cramkit.model.moe import upcycle_state
from cramkit.train.objectives import MLMObjective

if TYPE_CHECKING:
    from cramkit.loading import LoadedModel
    from cramkit.model.encoder import Encoder, ModelConfig
    from cramkit.text.extend import Extension
    from cramkit.train.config import RunConfig

# BERT's masking (Devlin et al.): what a Hugging Face model was trained with
BERT_MASKING = {"mask_rate": 0.15, "mask_token_frac": 0.8, "random_token_frac": 0.1, "add_cls": True}
# settings of the model section a continued run may change (everything else is the starting model's)
FREE_MODEL_KEYS = ("dropout", "attention_dropout", "gradient_checkpointing")
# how an MoE model routes and balances (not its weights): a continued or upcycled run may set them
MOE_ROUTING_KEYS = ("moe_top_k", "moe_capacity", "moe_aux", "moe_z_loss")
MASKING_KEYS = ("mask_rate", "mask_token_frac", "random_token_frac", "add_cls", "masking")


@dataclass
class Start:
    """A model to start from: its architecture, weights, tokenizer and the masking it was trained with."""

    source: str
    config: ModelConfig
    encoder_state: dict[str, torch.Tensor]
    head_state: dict[str, torch.Tensor] | None  # the MLM head's, when the model has one
    tokenizer: Any
    masking: dict[str, Any]
    teacher: LoadedModel | None = None  # --inherit: the loaded teacher
    pooler_state: dict[str, torch.Tensor] | None = None  # BERT's pooler ("weight", "bias"), when it has one
    pooling: str | None = None  # a sentence-transformers model's own pooling (mean, cls), kept by the run


def config_dict(cfg: ModelConfig) -> dict[str, Any]:
    """A ModelConfig as the plain dict a preset's ``model:`` section holds."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}


def training_masking(loaded: LoadedModel) -> dict[str, Any]:
    """The masking ``loaded`` was trained with: a cramkit run's own settings, else BERT's."""
    from cramkit.config import load_yaml

    run = loaded.extra.get("run")
    if run:
        data = load_yaml(Path(run) / "config.yaml").get("data") or {}
        return {k: data[k] for k in MASKING_KEYS if k in data} or dict(BERT_MASKING)
    return dict(BERT_MASKING)


def open_model(source: str, flag: str) -> LoadedModel:
    """``cramkit.load(source)`` with the errors said in terms of ``flag`` (--from / --inherit)."""
    from cramkit.loading import load_torch

    try:
        loaded = load_torch(source, purpose=f"{flag} (continued training)")
    except CramkitError as exc:
        raise CramkitError(f"{flag} {source}: {exc}") from None
    if loaded.encoder is None:
        raise CramkitError(
            f"{flag} {source}: a {loaded.architecture} model has no transformer encoder to continue; give a "
            "pretraining run, a fine-tuned encoder's model directory or hf:DIR (a BERT-style model)"
        )
    return loaded


def start_from(source: str) -> Start:
    """What ``pretrain --from source`` starts with."""
    loaded = open_model(source, "--from")
    masking = training_masking(loaded)
    head = None
    if isinstance(loaded.model, MaskedLM):
        head = {k: v.detach().clone() for k, v in loaded.model.head.state_dict().items()}
    enc = {k: v.detach().clone() for k, v in cast("Encoder", loaded.encoder).state_dict().items()}  # open_model: one
    cfg = dataclasses.replace(loaded.config, gradient_checkpointing=False)
    pooler = getattr(loaded.model, "pooler", None)  # a fine-tuned classifier's; else an HF model's / a run's
    pooled = pooler.state_dict() if isinstance(pooler, torch.nn.Linear) else loaded.pooler_state
    pooled = {k: pooled[k].detach().clone() for k in ("weight", "bias")} if pooled else None
    return Start(
        source,
        cfg,
        enc,
        head,
        loaded.tokenizer,
        masking,
        pooler_state=pooled,
        pooling=loaded.extra.get("st_pooling"),
    )


def save_pooler(run: Path, start: Start) -> dict[str, Any] | None:
    """Keep ``start``'s pooler in ``run`` (``POOLER_FILE``); what ``run.json`` records of it (None: none)."""
    from safetensors.torch import save_file

    from cramkit.io import atomic_path, sha256_file

    if start.pooler_state is None:
        return None
    state = {f"pooler.{k}": v.detach().to("cpu", torch.float32).contiguous() for k, v in start.pooler_state.items()}
    with atomic_path(run / POOLER_FILE) as tmp:
        save_file(state, str(tmp), metadata={"from": start.source})
    shape = list(state["pooler.weight"].shape)
    return {
        "file": POOLER_FILE,
        "sha256": sha256_file(run / POOLER_FILE),
        "shape": shape,
        "from": start.source,
    }


def kept_message(start: Start, run: Path) -> str:
    """The line a continued run logs: what it keeps of the model it starts from."""
    head = "its MLM head" if start.head_state is not None else "a fresh MLM head (the model has none)"
    if start.pooler_state is not None:
        h = start.pooler_state["weight"].shape
        pooler = (
            f"its pooler (dense {h[0]}x{h[1]} + tanh, untouched by MLM) in {run / POOLER_FILE}, where "
            "fine-tuning the run starts from it"
        )
    else:
        pooler = "no pooler (the model has none: fine-tuning starts a fresh one)"
    return (
        f"cramkit: --from {start.source}: keeping its tokenizer, architecture and encoder weights, {head}, and {pooler}"
    )


def check_architecture(start: Start, model: ModelConfig, *, upcycle: bool = False) -> None:
    """A continued run keeps the starting model's architecture: only dropout and checkpointing may change (and
    an MoE model's routing: ``MOE_ROUTING_KEYS``); with ``upcycle`` a dense model becomes a mixture of experts."""
    want = dataclasses.asdict(start.config)
    got = dataclasses.asdict(model)
    experts = [k for k in ("moe_experts", "moe_every") if want[k] != got[k]]
    if upcycle:
        if want["moe_experts"]:
            raise CramkitError(
                f"--upcycle turns a dense model into a mixture of experts, but --from {start.source} already has "
                f"{want['moe_experts']} experts; leave --upcycle out"
            )
        if not got["moe_experts"]:
            raise CramkitError("--upcycle needs the number of experts: add --set model.moe_experts=E (E >= 2)")
    elif experts:
        k = experts[0]
        how = (
            "add --upcycle to copy its feed-forward weights into every expert"
            if not want["moe_experts"]
            else "an MoE model keeps its experts; train a new shape with --inherit"
        )
        raise CramkitError(
            f"--from {start.source}: model.{k}={got[k]!r} changes the model's experts (it has {want[k]!r}); {how}"
        )
    free = FREE_MODEL_KEYS + ("vocab_size",) + MOE_ROUTING_KEYS + (("moe_experts", "moe_every") if upcycle else ())
    changed = [k for k in want if k not in free and want[k] != got[k]]
    if changed:
        k = changed[0]
        raise CramkitError(
            f"--from {start.source} keeps that model's architecture, so model.{k} cannot be set ({got[k]!r} vs "
            f"its {want[k]!r}); only model.{', model.'.join(FREE_MODEL_KEYS)} may change. To train a new shape "
            f"from it, use --inherit {start.source}"
        )


def grow_rows(weight: torch.Tensor, rows: int, pieces: list[list[int]]) -> torch.Tensor:
    """``weight``'s first ``rows`` rows (or entries), then one per new word: the mean of its pieces'."""
    old = weight[:rows]
    new = torch.stack([weight[p].float().mean(0).to(weight.dtype) for p in pieces])
    return torch.cat([old, new])


def initial_state(start: Start, model: MaskedLM, extension: Extension | None) -> dict[str, torch.Tensor]:
    """The starting model's weights in ``model``'s names; the embedding (and untied decoder, and output
    bias) grown by the vocabulary extension; a fresh MLM head (``model``'s own init) when it has none."""
    state = {f"encoder.{k}": v for k, v in start.encoder_state.items()}
    fresh = model.state_dict()
    if start.head_state is not None:
        state |= {f"head.{k}": v for k, v in start.head_state.items()}
    else:
        state |= {k: v.detach().clone() for k, v in fresh.items() if k.startswith("head.")}
    word = "encoder.embeddings.word.weight"
    rows = extension.first_id if extension is not None else fresh[word].shape[0]
    for name in (word, "head.decoder.weight", "head.decoder.bias"):
        if name in state and state[name].shape[0] != fresh[name].shape[0]:
            # rows past the tokenizer's vocabulary (padding to a multiple of 64) go; new words come after
            kept = state[name][:rows]
            state[name] = grow_rows(kept, rows, extension.pieces) if extension is not None else kept
    if model.cfg.tie_embeddings:
        state["head.decoder.weight"] = state[word]
    if model.cfg.moe_experts and not start.config.moe_experts:  # --upcycle: each expert a copy of the MLP
        state = upcycle_state(state, model)
    return state


class ContinueObjective(MLMObjective):
    """Masked-LM pretraining that starts from an existing model's weights (``pretrain --from``), optionally
    anchored to that model (``train.keep_vectors``, ``train.l2sp``). The frozen starting encoder is kept
    beside the run (one more copy of the encoder's weights, without gradients or optimizer state), and every
    held-out evaluation reports ``start_cosine``: the mean cosine between the run's and the starting model's
    mean-pooled vectors of the held-out sequences (1: unchanged), the drift."""

    cfg: RunConfig  # always given

    def __init__(
        self,
        cfg: RunConfig,
        data: Any,
        start: Start | None,
        extension: Extension | None,
        *,
        fresh_head: bool,
        source: str | None = None,
    ) -> None:
        super().__init__(cfg, data)
        # start: None when resuming (the weights come from the checkpoint; the anchor from ``source`` again)
        self.start, self.extension = start, extension
        self.source = source if source is not None else (start.source if start is not None else None)
        # a fresh head learns faster than the encoder (a tied decoder's weights are the encoder's embeddings)
        self.lr_scales = {"head.": cfg.train.fresh_head_lr_scale} if fresh_head else None
        self.keep, self.l2sp = float(cfg.train.keep_vectors), float(cfg.train.l2sp)
        self.reference: Encoder | None = None  # the starting encoder, frozen (with an anchor)
        self._pairs: list[tuple[torch.nn.Parameter, torch.Tensor]] = []  # (weight, its starting value) for L2-SP
        if self.anchored:
            check_anchor_parallel(cfg)
        self.track = not cfg.train.head_only  # (a frozen encoder cannot drift)

    @property
    def anchored(self) -> bool:
        return self.keep > 0.0 or self.l2sp > 0.0

    def build_model(self) -> torch.nn.Module:
        model = MaskedLM(self.cfg.model)
        start = self.start
        if start is None and self.track and self.source is not None:  # resumed: the starting model again
            start = start_from(self.source)
        if start is not None:
            state = initial_state(start, model, self.extension)
            if self.start is not None:
                model.load_state_dict(state)
            if self.track:
                self.reference = frozen_encoder(self.cfg.model, state)
            if self.l2sp > 0.0:
                frozen = self.reference.parameters() if self.reference is not None else ()
                self._pairs = list(zip(model.encoder.parameters(), frozen, strict=True))
            self.start = None  # the copy of the weights is no longer needed
        if self.cfg.train.head_only:  # the encoder frozen: no gradient flows past the head
            model.encoder.requires_grad_(False)
        return model

    def _reference_on(self, device: torch.device) -> Encoder:
        ref = cast("Encoder", self.reference)
        if next(ref.parameters()).device != device:
            ref.to(device)  # (in place: the L2-SP pairs follow)
        return ref

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        if self.reference is None or not self.anchored:
            return super().loss(model, batch, device)
        predicted = bool((batch["labels"] != IGNORE).any())
        ids = batch["input_ids"].to(device, non_blocking=True)
        labels = batch["labels"].to(device, non_blocking=True)
        seg = batch.get("segments")
        seg = seg.to(device, non_blocking=True) if seg is not None else None
        out = model(ids, labels, segments=seg, hidden=self.keep > 0.0)
        total = out.loss if predicted else out.logits.sum() * 0.0
        ref = self._reference_on(device)
        if self.keep > 0.0:
            with torch.no_grad():
                target = ref(ids, segments=seg)
            cos = F.cosine_similarity(pooled(out.hidden, seg), pooled(target, seg), dim=-1)
            total = total + self.keep * (1.0 - cos.mean())
        if self.l2sp > 0.0:
            dist = torch.stack([(p.float() - r.float()).pow(2).sum() for p, r in self._pairs if p.requires_grad])
            total = total + 0.5 * self.l2sp * dist.sum()
        return self.with_moe(model, total)

    def evaluate(self, model: torch.nn.Module, ctx: Any, precision: str) -> float | dict[str, float] | None:
        """The held-out MLM loss; with an anchor, also ``start_cosine`` on the same held-out batches."""
        val = super().evaluate(model, ctx, precision)
        if self.reference is None or not isinstance(val, float):
            return val
        from cramkit.runtime import autocast
        from cramkit.train import distributed

        assert self.data is not None  # (the run's data, as in MLMObjective.evaluate)
        ref = self._reference_on(ctx.device)
        tcfg = self.cfg.train
        total = torch.zeros(2, dtype=torch.float64, device=ctx.device)
        with torch.no_grad():
            for batch in self.data.val_batches(tcfg.micro, tcfg.eval_batches, rank=ctx.rank, world=ctx.world):
                ids = batch["input_ids"].to(ctx.device, non_blocking=True)
                seg = batch.get("segments")
                seg = seg.to(ctx.device, non_blocking=True) if seg is not None else None
                with autocast(precision, ctx.device):
                    mine = unwrap(model).encoder(ids, segments=seg)
                    theirs = ref(ids, segments=seg)
                cos = F.cosine_similarity(pooled(mine, seg), pooled(theirs, seg), dim=-1)
                total[0] += cos.double().sum()
                total[1] += cos.numel()
        distributed.all_reduce(total, ctx)
        if not total[1]:
            return val
        return {"val_loss": val, "start_cosine": round(float(total[0] / total[1]), 6)}


def check_anchor_parallel(cfg: RunConfig) -> None:
    """The anchors read whole weights: one process or DDP, not sharded ones."""
    from cramkit.runtime import torchrun

    if cfg.parallel.tp > 1 or (torchrun().world > 1 and cfg.parallel.strategy == "fsdp"):
        raise CramkitError(
            "train.keep_vectors and train.l2sp anchor the run to whole copies of the starting weights: run them "
            "on one device or with parallel.strategy=ddp (not fsdp or tp)"
        )


def frozen_encoder(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> Encoder:
    """An encoder with ``state``'s ``encoder.*`` weights, frozen and in eval mode (no dropout)."""
    from cramkit.model.encoder import Encoder

    enc = Encoder(dataclasses.replace(cfg, gradient_checkpointing=False))
    prefix = "encoder."
    enc.load_state_dict({k[len(prefix) :]: v.detach().clone() for k, v in state.items() if k.startswith(prefix)})
    enc.requires_grad_(False)
    return enc.eval()


def pooled(hidden: torch.Tensor, segments: torch.Tensor | None) -> torch.Tensor:
    """Mean-pooled vectors [N, d] of [B, L, d] hidden states: one per sequence, or one per document of a
    packed sequence when ``segments`` [B, L] (each position's document, from 0) is given."""
    h = hidden.float()
    if segments is None:
        return h.mean(dim=1)
    B, L, d = h.shape
    seg = segments.long()
    n = int(seg.max()) + 1
    index = (torch.arange(B, device=seg.device)[:, None] * n + seg).reshape(-1)
    sums = h.new_zeros(B * n, d).index_add_(0, index, h.reshape(-1, d))
    counts = h.new_zeros(B * n).index_add_(0, index, h.new_ones(B * L))
    present = counts > 0
    return sums[present] / counts[present, None]


def unwrap(model: torch.nn.Module) -> Any:
    """The module under DDP's or torch.compile's wrapper."""
    inner: Any = model
    while hasattr(inner, "module") or hasattr(inner, "_orig_mod"):
        inner = getattr(inner, "module", None) or inner._orig_mod
    return inner


# ------------------------------------------------------------------------------------ inheritance


def open_teacher(source: str) -> LoadedModel:
    """The teacher of ``--inherit``: a masked-LM (its predictions are what the student learns from)."""
    loaded = open_model(source, "--inherit")
    if not isinstance(loaded.model, MaskedLM):
        raise CramkitError(
            f"--inherit {source}: the model has no masked-LM head, so it predicts nothing to inherit (a "
            f"{loaded.kind} model); continue it first, which trains a head: `cramkit pretrain CORPUS --from "
            f"{source} --budget 10m --out RUN`, then --inherit RUN"
        )
    return loaded


def teacher_start(source: str) -> Start:
    """What ``pretrain --inherit source`` starts with: the teacher, its tokenizer and masking."""
    teacher = open_teacher(source)
    cfg = teacher.config
    return Start(source, cfg, {}, None, teacher.tokenizer, training_masking(teacher), teacher=teacher)


def check_fits(begin: Start, cfg: RunConfig, flag: str) -> None:
    """The model started from (``--from``) or learned from (``--inherit``) must read the run's sequences."""
    t = begin.config
    if t.position != "rope" and cfg.data.seq_len > t.positions:
        raise CramkitError(
            f"{flag} {begin.source}: data.seq_len={cfg.data.seq_len} is longer than the model reads "
            f"({t.positions} positions); set data.seq_len={t.positions} or less"
        )


def teacher_init(student: MaskedLM, teacher: MaskedLM) -> None:
    """Start ``student`` from ``teacher``: equal width required; layer i from the teacher's i mod depth."""
    s, t = dataclasses.asdict(student.cfg), dataclasses.asdict(teacher.cfg)
    skip = ("layers", "dropout", "attention_dropout", "gradient_checkpointing", "init_std")
    differ = [k for k in s if k not in skip and s[k] != t[k]]
    if differ:
        k = differ[0]
        raise CramkitError(
            f"inherit.init=teacher copies the teacher's weights, so the student needs its width: model.{k} is "
            f"{s[k]!r}, the teacher's {t[k]!r}; set model.{k}={t[k]} (only model.layers may differ) or "
            "inherit.init=none"
        )
    depth = teacher.cfg.layers
    src = teacher.state_dict()
    state = {}
    for name in student.state_dict():
        if name.startswith("encoder.layers."):
            _, _, i, rest = name.split(".", 3)
            state[name] = src[f"encoder.layers.{int(i) % depth}.{rest}"].detach().clone()
        else:
            state[name] = src[name].detach().clone()
    student.load_state_dict(state)


class InheritObjective(MLMObjective):
    """Masked-LM with knowledge inheritance from a teacher, weighted by the budget spent."""

    def __init__(
        self,
        cfg: RunConfig,
        data: Any,
        teacher_source: str,
        teacher: LoadedModel | None,
        *,
        init: bool = True,
    ) -> None:
        super().__init__(cfg, data)
        self.icfg = cfg.inherit
        self.init_from_teacher = init and cfg.inherit.init == "teacher"  # (a resumed run has its weights)
        self.source = teacher_source
        self._teacher = teacher.model if teacher is not None else None
        self.alpha = 0.0
        self.released = False
        self.teacher_seconds = 0.0
        self._mark: float | None = None  # wall clock at the start of the inheritance phase's first step
        self.resume_hint = "continue with `cramkit pretrain --resume {run}`"

    def build_model(self) -> torch.nn.Module:
        model = super().build_model()
        if self.init_from_teacher:
            teacher = self._teacher if self._teacher is not None else open_teacher(self.source).model
            teacher_init(cast(MaskedLM, model), cast(MaskedLM, teacher))
        return model

    def begin_step(self, fraction: float) -> dict[str, Any] | None:
        until = self.icfg.until
        if self.released or fraction >= until:
            if not self.released:
                self._release(fraction)
            return None
        self.alpha = self.icfg.alpha * (1.0 - fraction / until)
        if self._teacher is None:  # resumed inside the inheritance phase
            self._teacher = open_teacher(self.source).model
        if self._mark is None:
            self._mark = time.perf_counter()
        share = self.teacher_seconds / max(time.perf_counter() - self._mark, 1e-9)
        return {"inherit_alpha": round(self.alpha, 6), "teacher_share": round(share, 4)}

    def _release(self, fraction: float) -> None:
        self.released, self.alpha = True, 0.0
        if self._teacher is not None and self._mark is not None:
            share = self.teacher_seconds / max(time.perf_counter() - self._mark, 1e-9)
            from cramkit.runtime import torchrun

            if torchrun().is_main:
                print(
                    f"cramkit: knowledge inheritance ended at {fraction:.0%} of the budget (inherit.until="
                    f"{self.icfg.until}); the teacher took {share:.1%} of the training time until then; it is "
                    "released and training goes on alone",
                    flush=True,
                )
        self._teacher = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        ids = batch["input_ids"].to(device, non_blocking=True)
        labels = batch["labels"].to(device, non_blocking=True)
        out = model(ids, labels)
        if out.n_predicted == 0:
            return self.with_moe(model, out.logits.sum() * 0.0)
        if self.alpha <= 0.0 or self._teacher is None:
            return self.with_moe(model, out.loss)
        teacher = self._teacher
        if next(teacher.parameters()).device != device:
            # bf16 weights when the step runs in bf16 (the trainer's autocast, as cramkit.runtime decided): half
            # the memory and time
            amp = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
            teacher.to(device=device, dtype=torch.bfloat16 if amp == torch.bfloat16 else None)
        t0 = time.perf_counter()
        with torch.no_grad():
            t_logits = teacher(ids, labels).logits
        if device.type == "cuda":  # (only while inheriting) for the teacher's share of the step time
            torch.cuda.synchronize(device)
        self.teacher_seconds += time.perf_counter() - t0
        loss = (1.0 - self.alpha) * out.loss + self.alpha * inheritance_kl(out.logits, t_logits, self.icfg.temperature)
        return self.with_moe(model, loss)


def inheritance_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(teacher || student) of the softened distributions, mean over positions, times T^2 (Hinton)."""
    t = temperature
    log_s = F.log_softmax(student.float() / t, dim=-1)
    log_t = F.log_softmax(teacher.float() / t, dim=-1)
    return F.kl_div(log_s, log_t, log_target=True, reduction="batchmean") * (t * t)
