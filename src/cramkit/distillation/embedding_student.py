"""An embedding student: fewer of the teacher's own layers, trained to give the teacher's sentence embeddings.

    cramkit distill --teacher hf:all-MiniLM-L6-v2 --student layers:3 --unlabelled sentences.txt --out mini-l3

1. the texts: every line of ``--unlabelled`` (a text file, or a token store's sentences), a seeded held-out
   slice set aside (``held_out``: 5% of them, 20 to 1,000) to score the student on text it never trained on;
2. the teacher's embeddings of every text, as ``cramkit embed`` gives them (its pooling, normalisation, default
   prompt), computed once and cached memory-mapped in ``--cache`` (``embeddings-KEY/teacher-KEY.npy``: resumed
   when interrupted, checked by :mod:`cramkit.readback` when read back);
3. the student: the teacher's encoder with ``N`` of its layers (evenly spaced, the first and the last kept:
   0, 2, 5 of 6; ``--set layer_map=0,2,4`` to choose), its embeddings, final norm, tokenizer, pooling,
   normalisation and prompts; trained through the engine (``train_epochs``: progress with rate and ETA,
   checkpoints, resume) with ``1 - cosine`` to the teacher's vector, also on the leading Matryoshka dimensions
   renormalised (``--set matryoshka=128,64`` or the teacher's own), plus a relative MSE on the raw vectors
   when the teacher's are not normalised (their length then matters);
4. its agreement with the teacher on the held-out texts, untrained (the same layers, before any step) and
   trained: the mean cosine of the two embeddings of each text, and recall@10 (of each text's 10 nearest
   held-out neighbours by the teacher, the share the student finds in its own 10);
5. ``OUT``: a model directory of kind ``encoder`` (``cramkit embed``, ``serve``, ``export``) recording its
   teacher and the layers kept, with ``report.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cramkit.distillation.request import EMBEDDING_STUDENT, student_layers
from cramkit.errors import CramkitError
from cramkit.loading import LoadedModel
from cramkit.train.objectives import ExampleObjective

if TYPE_CHECKING:
    import torch

    from cramkit.distillation.config import DistillConfig

PathLike = str | os.PathLike
SETTINGS_FILE = "distill.json"
RUN = "embedding"  # OUT/runs/embedding: the training's run directory
SERVED_SECONDS = 2.0  # the served speed check's rounds, per thread count (at least 3 rounds each)
SERVED_TEXTS = 256  # ... on the held-out texts, repeated to at least this many
EMBED_BOUND = 1e6  # an embedding value over this in magnitude is no encoder's: the cache is damaged


# ------------------------------------------------------------------------------------------ the student's name


def pick_layers(have: int, want: int, layer_map: list[int], where: str) -> list[int]:
    """The teacher's layers the student keeps: ``layer_map`` when given, else ``want`` evenly spaced from the
    first to the last (0, 2, 5 of 6; 0, 5 of 6; 0 alone for one): the first layer reads the embeddings the
    student keeps, the last writes into the space the teacher's vectors live in."""
    if want >= have:
        raise CramkitError(
            f"--student layers:{want}: the teacher ({where}) has {have} layers; a student keeps fewer: choose "
            f"layers:1 to layers:{have - 1}"
        )
    if layer_map:
        if len(layer_map) != want or any(not 0 <= i < have for i in layer_map) or len(set(layer_map)) != want:
            raise CramkitError(
                f"layer_map={','.join(map(str, layer_map))}: give {want} different layer indices (--student "
                f"layers:{want}) in 0..{have - 1}"
            )
        return sorted(layer_map)
    if want == 1:
        return [0]
    return [round(i * (have - 1) / (want - 1)) for i in range(want)]


# ------------------------------------------------------------------------------------------ building it


def check_embedding_teacher(teacher: LoadedModel) -> Any:
    """The teacher's encoder; one CramkitError line when it has none (a BiLSTM, an export)."""
    enc = teacher.encoder if isinstance(teacher, LoadedModel) else None
    if enc is None or not hasattr(teacher.config, "layers"):
        raise CramkitError(
            f"--teacher {getattr(teacher, 'source', teacher)}: a {getattr(teacher, 'architecture', '?')} model has "
            "no transformer encoder to take layers and embeddings from; give an encoder (a cramkit model or run "
            "directory, or hf:DIR such as all-MiniLM-L6-v2)"
        )
    return enc


def teacher_dims(teacher: LoadedModel, cfg: DistillConfig) -> list[int]:
    """The leading dimensions the loss also scores: ``cfg.matryoshka``, else the teacher's recorded ones (below
    its width, largest first)."""
    from cramkit.recipes.contrastive_config import matryoshka_dims

    hidden = int(teacher.config.hidden)
    if cfg.matryoshka:
        return matryoshka_dims(cfg.matryoshka, hidden)
    own = teacher.extra.get("matryoshka") if isinstance(teacher.extra, dict) else None
    if isinstance(own, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in own):
        return sorted({d for d in own if 0 < d < hidden}, reverse=True)
    return []


def build_embedding_student(
    teacher: LoadedModel, want: int, cfg: DistillConfig, *, max_length: int, dims: list[int]
) -> tuple[LoadedModel, list[int]]:
    """The untrained student: the teacher's encoder with ``want`` of its layers (:func:`pick_layers`), as a
    model of kind ``encoder`` with the teacher's tokenizer, pooling, normalisation and prompts; and the layers
    kept."""

    from cramkit.model.encoder import Encoder

    enc = check_embedding_teacher(teacher)
    tcfg = teacher.config
    picked = pick_layers(int(tcfg.layers), want, list(cfg.layer_map), str(teacher.source))
    is_local = getattr(tcfg, "is_local", None)
    scfg = tcfg.replace(layers=want, dropout=cfg.dropout, attention_dropout=cfg.dropout, gradient_checkpointing=False)
    if callable(is_local) and [is_local(i) for i in picked] != [scfg.is_local(j) for j in range(want)]:
        raise CramkitError(
            f"layers {picked} of {teacher.source} mix local and global attention in another order than a "
            f"{want}-layer model has; choose them with --set layer_map=... (local layers where the student has them)"
        )
    student = Encoder(scfg)
    state = {}
    for name, t in enc.state_dict().items():
        if name.startswith("layers."):
            i, rest = name[len("layers.") :].split(".", 1)
            if int(i) in picked:
                state[f"layers.{picked.index(int(i))}.{rest}"] = t.detach().clone()
        else:
            state[name] = t.detach().clone()
    student.load_state_dict(state, strict=True)
    keep = ("st_pooling", "tokenizer", "prompts", "default_prompt_name", "hf_architecture")
    extra = {k: v for k, v in teacher.extra.items() if k in keep}
    extra |= {
        "distilled_from": str(teacher.source),
        "student": f"{EMBEDDING_STUDENT}{want}",
        "teacher_layers": picked,
        "teacher_layer_count": int(tcfg.layers),
    }
    if dims:
        extra["matryoshka"] = [int(tcfg.hidden), *dims]
    loaded = teacher.as_encoder(student, config=scfg, max_length=max_length, extra=extra)
    return loaded, picked


# ------------------------------------------------------------------------------------------ the teacher's vectors


def texts_key(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def teacher_embeddings(
    teacher: LoadedModel,
    texts: list[str],
    cache: Path,
    *,
    max_length: int,
    device: str = "auto",
    chunk: int = 2048,
    progress: bool = True,
) -> tuple[np.ndarray, dict[str, Any]]:
    """The teacher's embeddings ``[n, hidden]`` of ``texts`` as ``cramkit embed`` gives them (its pooling,
    normalisation and default prompt, not cut), from ``cache`` or computed there in chunks (an interrupted pass
    resumes; the reading back is :func:`cramkit.distillation.teacher.load_cached`'s, checked)."""
    from cramkit.distillation.teacher import _resume_from, load_cached, teacher_key
    from cramkit.infer.engine import Engine
    from cramkit.io import open_memmap, write_json_atomic
    from cramkit.progress import Progress

    engine = Engine(teacher, device=device, max_length=max_length)
    prompt = engine.prompt_text()
    how = json.dumps([teacher_key(teacher, max_length), engine.pooling, bool(engine.normalize), prompt])
    key = hashlib.sha256(f"embeddings:{how}".encode()).hexdigest()[:16]
    root = Path(cache) / f"embeddings-{texts_key(texts)}"
    root.mkdir(parents=True, exist_ok=True)
    n, width = len(texts), int(teacher.config.hidden)
    got = load_cached(root, key, n, width)
    if got is not None:
        return got, {"cached": True, "rows_computed": 0, "seconds": 0.0, "root": str(root)}
    part, state = root / f"teacher-{key}.partial.npy", root / f"teacher-{key}.progress.json"
    start = _resume_from(part, state, n, width)
    arr = np.lib.format.open_memmap(part, mode="r+") if start else open_memmap(part, np.float32, (n, width))
    if not start:
        write_json_atomic(state, {"done": 0, "rows": n})
    t0 = time.perf_counter()
    with Progress("teacher embeddings", n, unit="texts", initial=start, enabled="auto" if progress else False) as bar:
        for s in range(start, n, chunk):
            e = min(n, s + chunk)
            arr[s:e] = engine.embed(texts[s:e])
            arr.flush()
            write_json_atomic(state, {"done": e, "rows": n})
            bar.update(e - s)
    seconds = time.perf_counter() - t0
    del arr
    os.replace(part, root / f"teacher-{key}.npy")
    state.unlink(missing_ok=True)
    got = load_cached(root, key, n, width)
    if got is None:
        raise CramkitError(f"{teacher.source} gave unusable embeddings (NaN or huge values); check its weights")
    return got, {
        "cached": False,
        "resumed_from": start,
        "rows_computed": n - start,
        "seconds": round(seconds, 3),
        "texts_per_s": round((n - start) / max(seconds, 1e-9), 1),
        "root": str(root),
    }


# ------------------------------------------------------------------------------------------ training


def _pooled_class() -> Any:
    from torch import nn

    from cramkit.model.heads import pool_hidden

    class Pooled(nn.Module):
        """The student's encoder and its pooling (the teacher's, which pooled the targets): one vector per text,
        not normalised."""

        def __init__(self, encoder: nn.Module, pooling: str) -> None:
            super().__init__()
            self.encoder, self.pooling = encoder, pooling

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            hidden = self.encoder(input_ids, attention_mask, token_type_ids, unpad=True)
            return pool_hidden(hidden, attention_mask, self.pooling, None).float()

    return Pooled


def embedding_loss(s: torch.Tensor, t: torch.Tensor, dims: list[int], raw: bool) -> torch.Tensor:
    """The mean over the whole vector and each of ``dims`` of ``1 - cosine`` between the student's leading
    dimensions and the teacher's (each renormalised); with ``raw`` (a teacher whose vectors are not normalised)
    plus the MSE of the whole vectors relative to the teacher's mean square."""
    import torch.nn.functional as F

    widths = [s.shape[1], *[d for d in dims if d < s.shape[1]]]
    loss = sum((1.0 - F.cosine_similarity(s[:, :d], t[:, :d], dim=-1)).mean() for d in widths) / len(widths)
    if raw:
        loss = loss + F.mse_loss(s, t) / t.pow(2).mean().clamp_min(1e-12)
    return loss  # type: ignore[return-value]


class EmbeddingObjective(ExampleObjective):
    """The engine's recipe: length-bucketed batches of the training texts with the teacher's vectors, the loss
    of :func:`embedding_loss`."""

    flops_per_token = None

    def __init__(self, student: LoadedModel, enc: Any, targets: np.ndarray, cfg: DistillConfig, dims: list[int]):
        import torch

        self.student, self.enc, self.cfg, self.dims = student, enc, cfg, dims
        self.raw = not student.normalize
        self.columns = {"targets": torch.from_numpy(np.array(targets, dtype=np.float32))}
        self.title = f"distil embeddings ({len(enc):,} texts)"
        self.resume_hint = "rerun the same cramkit distill command to continue"

    def build_model(self) -> Any:
        return _pooled_class()(self.student.model, self.student.pooling)

    def train_loader(self, micro: int, *, rank: int = 0, world: int = 1) -> Any:
        from cramkit.distillation.objective import student_loader

        return student_loader(self, micro, rank, world)

    def loss(self, model: Any, batch: dict, device: Any) -> Any:
        x = {k: (batch[k].to(device) if batch[k] is not None else None) for k in ("input_ids", "attention_mask")}
        types = batch.get("token_type_ids")
        vec = model(x["input_ids"], x["attention_mask"], types.to(device) if types is not None else None)
        return embedding_loss(vec, batch["targets"].to(device), self.dims, self.raw)

    def evaluate(self, model: Any, ctx: Any, precision: str) -> None:
        return None  # the agreement is scored on the finished student, through the engine


def _train(
    student: LoadedModel,
    texts: list[str],
    targets: np.ndarray,
    cfg: DistillConfig,
    dims: list[int],
    run: Path,
    *,
    max_length: int,
    prompt: str,
    progress: bool,
) -> dict[str, Any]:
    """``student.model`` trained in place on ``texts`` against ``targets`` for ``cfg.epochs`` through the engine
    in ``run`` (a killed run resumes from its latest checkpoint); what the training did."""
    import torch

    from cramkit.data.batching import encode_texts
    from cramkit.distillation.objective import train_config
    from cramkit.model import embedding_prompts
    from cramkit.train.epochs import train_epochs

    enc = encode_texts(student.tokenizer, embedding_prompts.prefix(list(texts), prompt), None, max_length)
    objective = EmbeddingObjective(student, enc, targets, cfg, dims)
    steps = max(1, math.ceil(cfg.epochs * len(enc) / cfg.batch_size))
    tcfg = train_config(cfg, steps, cfg.threads, "auto" if progress else False)
    before = torch.get_num_threads()
    try:
        done = train_epochs(objective, tcfg, run, examples=len(enc), batch_size=cfg.batch_size)
    finally:
        torch.set_num_threads(before)
    trained: Any = getattr(done.model, "module", done.model)
    student.model = trained.encoder.eval().to("cpu")
    losses = done.losses
    return {
        "steps": done.steps,
        "epochs": cfg.epochs,
        "texts": len(enc),
        "seconds": round(done.seconds, 2),
        "texts_per_s": round(done.examples_per_s, 1),
        "first_loss": losses[0] if losses else None,
        "last_loss": float(np.mean(losses[-max(1, len(losses) // 10) :])) if losses else None,
    }


# ------------------------------------------------------------------------------------------ agreement


def agreement(student: np.ndarray, teacher: np.ndarray, k: int = 10) -> dict[str, float]:
    """How closely ``student``'s vectors [n, d] follow ``teacher``'s (row i: the same text): the mean cosine of
    each pair, and recall@k: of each text's ``k`` nearest other texts by the teacher's cosine, the share that
    are among its ``k`` nearest by the student's."""
    s = student / np.maximum(np.linalg.norm(student, axis=1, keepdims=True), 1e-12)
    t = teacher / np.maximum(np.linalg.norm(teacher, axis=1, keepdims=True), 1e-12)
    cos = float(np.mean(np.sum(s * t, axis=1)))
    n = len(s)
    k = min(k, n - 1)
    if k < 1:
        return {"mean_cosine": cos, "recall_at_10": float("nan"), "k": 0}
    hits = 0
    for lo in range(0, n, 1024):
        hi = min(n, lo + 1024)
        ss, tt = s[lo:hi] @ s.T, t[lo:hi] @ t.T
        rows = np.arange(hi - lo)
        ss[rows, rows + lo] = -np.inf  # a text is not its own neighbour
        tt[rows, rows + lo] = -np.inf
        top_s = np.argpartition(-ss, k - 1, axis=1)[:, :k]
        top_t = np.argpartition(-tt, k - 1, axis=1)[:, :k]
        hits += sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(top_s, top_t, strict=True))
    return {"mean_cosine": cos, "recall_at_10": hits / (n * k), "k": k}


def _student_vectors(student: LoadedModel, texts: list[str], device: str, max_length: int) -> np.ndarray:
    """The student's embeddings of ``texts`` through the engine, as ``cramkit embed`` will give them."""
    from cramkit.infer.engine import Engine

    return Engine(student, device=device, max_length=max_length).embed(texts)


def held_out_split(n: int, cfg: DistillConfig) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, held-out rows) of ``n`` texts: ``cfg.held_out`` rows (0: 5% of them, 20 to 1,000) drawn
    by the seed; one CramkitError line when too few texts are left to train on."""
    want = cfg.held_out or min(1000, max(20, n // 20))
    if n - want < 2 or n < 4:
        raise CramkitError(
            f"--unlabelled: {n} text(s) is too few to train an embedding student and hold {want} out to score it; "
            "give more lines (a few thousand sentences is a start)"
        )
    order = np.random.default_rng([cfg.seed, 11]).permutation(n)
    return np.sort(order[want:]), np.sort(order[:want])


# ------------------------------------------------------------------------------------------ the recipe


def distill_embeddings(
    teacher: PathLike | LoadedModel,
    texts: list[str],
    student: str,
    cfg: DistillConfig,
    out: PathLike,
    *,
    cache: PathLike | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Distil the embedding ``teacher`` into ``student`` (``layers:N``) on ``texts``; write the student's model
    directory and report.json to ``out``; returns the report (its ``summary``: the one line of agreement)."""
    from cramkit.io import RUN_OUTPUTS, check_out, claim_dir, dir_lock, read_json, write_json_atomic
    from cramkit.loading import MODEL_FILE, load_torch

    t_start = time.perf_counter()
    want = student_layers(student)
    cfg = cfg.resolved(student)
    cfg.validate()
    if cfg.layers and cfg.layers != want:
        raise CramkitError(f"--student {student} and layers={cfg.layers}: give the layers once, as --student layers:N")
    if not texts:
        raise CramkitError("--unlabelled holds no text; give a text file with one text per line")
    out = Path(out)
    check_out(
        out, inputs=[teacher], own={SETTINGS_FILE: ("teacher", "config")}, writes=RUN_OUTPUTS, command="cramkit distill"
    )
    t = teacher if isinstance(teacher, LoadedModel) else load_torch(teacher, purpose="distillation")
    check_embedding_teacher(t)
    max_length = min(cfg.max_length, int(t.max_length))
    dims = teacher_dims(t, cfg)
    st, picked = build_embedding_student(t, want, cfg, max_length=max_length, dims=dims)  # bad layers: said here
    train_rows, held_rows = held_out_split(len(texts), cfg)
    settings = _settings(t, student, texts, cfg, max_length)
    cache = Path(cache) if cache is not None else out / "cache"
    held = [texts[i] for i in held_rows]
    if cfg.export:  # a folder the export may not replace: said now, not after the training
        from cramkit.infer.export import check_target_out

        check_target_out(export_path(out, cfg.export), out)
    out.mkdir(parents=True, exist_ok=True)
    with dir_lock(out, "--out"):
        if (
            claim_dir(out, SETTINGS_FILE, settings, "a distillation")
            and (out / "report.json").is_file()
            and (out / MODEL_FILE).is_file()
        ):
            print(f"cramkit: {out}: distilled earlier with the same settings; its report is kept", file=sys.stderr)
            done = read_json(out / "report.json", f"delete {out} to distil again")
            if cfg.export and not _exported(out, cfg.export):  # the export failed, was stopped or deleted: made now
                done = _serve(done, t, out, held, cfg.export, max_length)
            return done
        vecs, tstats = teacher_embeddings(t, texts, cache, max_length=max_length, device=cfg.device, progress=progress)
        t_held = np.asarray(vecs[held_rows])
        before = agreement(_student_vectors(st, held, cfg.device, max_length), t_held)
        prompt = _prompt(t)
        training = _train(
            st,
            [texts[i] for i in train_rows],
            np.asarray(vecs[train_rows]),
            cfg,
            dims,
            out / "runs" / RUN,
            max_length=max_length,
            prompt=prompt,
            progress=progress,
        )
        after = agreement(_student_vectors(st, held, cfg.device, max_length), t_held)
        (out / "report.json").unlink(missing_ok=True)  # an old report must not describe the new model
        st.save(out)
        report = {
            "teacher": str(t.source),
            "student": student,
            "out": str(out),
            "kind": "embedding",
            "teacher_layers": picked,
            "teacher_layer_count": int(t.config.layers),
            "matryoshka": dims,
            "texts": len(texts),
            "train_texts": len(train_rows),
            "held_out_texts": len(held_rows),
            "agreement": {"untrained": before, "trained": after},
            "parameters": {"teacher": _params(t.model), "student": _params(st.model)},
            "teacher_embeddings": tstats,
            "training": training,
            "config": {k: v for k, v in settings["config"].items()},
            "seconds_total": round(time.perf_counter() - t_start, 1),
        }
        report["summary"] = summary_line(report)
        write_json_atomic(out / "report.json", report)  # the student whole before it is exported
        import shutil

        shutil.rmtree(out / "runs" / RUN / "checkpoints", ignore_errors=True)  # the student is saved
        if cfg.export:  # the student exported to its fastest path here, timed against its teacher in that format
            report = _serve(report, t, out, held, cfg.export, max_length)
        return report


def _exported(out: Path, target: str) -> bool:
    from cramkit import backends

    return backends.kind_of(export_path(out, target)) is not None


def _serve(
    report: dict[str, Any], teacher: LoadedModel, out: Path, texts: list[str], target: str, max_length: int
) -> dict[str, Any]:
    """``report`` with :func:`served`'s record and the summary line that says it, written to OUT/report.json."""
    from cramkit.io import write_json_atomic

    report = {**report, "served": served(teacher, out, texts, target, max_length)}
    report["summary"] = summary_line(report)
    write_json_atomic(out / "report.json", report)
    return report


def summary_line(report: dict[str, Any]) -> str:
    """The one line ``cramkit distill`` ends with: the student's agreement with its teacher on held-out text."""
    a, b = report["agreement"]["trained"], report["agreement"]["untrained"]
    k = a.get("k", 10)
    return (
        f"student ({report['student']}: teacher layers {','.join(map(str, report['teacher_layers']))} of "
        f"{report['teacher_layer_count']}) against its teacher on {report['held_out_texts']:,} held-out texts: "
        f"mean cosine {a['mean_cosine']:.4f} (untrained {b['mean_cosine']:.4f}), neighbour recall@{k} "
        f"{a['recall_at_10']:.3f} (untrained {b['recall_at_10']:.3f})"
        + (f"; {served_words(report['served'])}" if report.get("served") else "")
    )


def export_path(out: Path, target: str) -> Path:
    """Where ``--set export=TARGET`` writes the student's export: beside OUT (an export never lies inside the model
    it was made from), ``OUT-TARGET``."""
    return out.with_name(f"{out.name}-{target}")


def served(teacher: LoadedModel, out: Path, texts: list[str], target: str, max_length: int) -> dict[str, Any]:
    """The student in ``out`` exported to the fastest path on this CPU (``cramkit export OUT --target TARGET``: the
    installed formats raced) into :func:`export_path`; the teacher exported in the same format and quantization to
    a temporary directory; both timed through the engine on ``texts`` (the held-out ones, :func:`_timed`). A teacher
    that cannot be exported so is said in the record (``teacher_error``): the student is served all the same."""
    import tempfile

    from cramkit import backends
    from cramkit.infer import race
    from cramkit.infer.export import export

    where = export(model=out, out=export_path(out, target), target=target, progress=False).path
    texts = (texts * math.ceil(SERVED_TEXTS / max(1, len(texts))))[: max(SERVED_TEXTS, len(texts))]
    b = backends.get(backends.kind_of(where) or "")
    fmt, quantize = b.name, backends.read_manifest(where, b).get("quantize")
    record: dict[str, Any] = {"target": target, "export": str(where), "format": race.label(fmt, quantize)}
    with tempfile.TemporaryDirectory(prefix="cramkit-teacher-") as tmp:
        paths = {"student": where}
        try:
            paths["teacher"] = export(
                model=teacher, out=Path(tmp) / "teacher", format=fmt, quantize=quantize, progress=False
            ).path
        except CramkitError as exc:  # the student is served all the same; the comparison is said missing
            record["teacher_error"] = str(exc)[:300]
        speeds = _timed(paths, texts, max_length)
    return {
        **record,
        "texts": len(texts),
        "texts_per_s": speeds,
        "speedup": {k: round(v["student"] / v["teacher"], 2) for k, v in speeds.items() if "teacher" in v},
    }


def _timed(paths: dict[str, Path], texts: list[str], max_length: int) -> dict[str, dict[str, float]]:
    """Texts/s of each export in ``paths`` through the engine on ``texts``, in interleaved rounds
    (:func:`cramkit.infer.race.rounds`) at one thread and at every core, each its fastest round."""
    from cramkit import backends
    from cramkit.infer import race
    from cramkit.infer.engine import Engine
    from cramkit.runtime import cpu_cores

    def timed(engine: Any) -> Callable[[], float]:
        def call() -> float:
            start = time.perf_counter()
            engine.embed(texts)
            return time.perf_counter() - start

        return call

    speeds: dict[str, dict[str, float]] = {}
    for threads in sorted({1, cpu_cores()}):
        engines = {n: Engine(backends.open_export(p, threads=threads), max_length=max_length) for n, p in paths.items()}
        times = race.rounds({n: timed(e) for n, e in engines.items()}, SERVED_SECONDS, contend=None)  # compared
        speeds[f"{threads} thread{'s' if threads > 1 else ''}"] = {
            n: round(len(texts) / min(v), 1) for n, v in times.items()
        }
    return speeds


def served_words(s: dict[str, Any]) -> str:
    head = f"served as {s['format']} ({s['export']})"
    if not s["speedup"]:
        alone = ", ".join(f"{v['student']:,.0f} texts/s at {k}" for k, v in s["texts_per_s"].items())
        return f"{head}: {alone}; the teacher could not be exported as {s['format']} to compare"
    ratios = ", ".join(f"{x:.2f}x at {k}" for k, x in s["speedup"].items())
    return f"{head}: {ratios} the teacher's texts/s in that format"


def _prompt(teacher: LoadedModel) -> str:
    """The teacher's default embedding prompt ('' without one): the student reads its texts the same way."""
    from cramkit.model import embedding_prompts

    prompts, default = embedding_prompts.recorded(teacher.extra, str(teacher.source))
    return embedding_prompts.resolve(prompts, default, None, str(teacher.source), None)


def _params(model: Any) -> int:
    return int(sum(p.numel() for p in model.parameters()))


def _settings(t: LoadedModel, student: str, texts: list[str], cfg: DistillConfig, max_length: int) -> dict[str, Any]:
    """What ``OUT/distill.json`` records: a rerun on the same ``--out`` with other settings is refused."""
    from dataclasses import asdict

    from cramkit.distillation.teacher import teacher_key

    return {
        "teacher": str(t.source),
        "teacher_weights": teacher_key(t, max_length),
        "student": student,
        "texts": texts_key(texts),
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("workers", "checkpoint_every")},
    }
