"""Distillation: a fine-tuned teacher -> a small, fast student (Tang et al. 2019, arXiv 1903.12136).

    report = distill("out/sst2", get_task("glue/sst2", data_dir="glue"), "bilstm", DistillConfig(), "out/st")

1. the transfer set: the training sentences plus edited copies (``cramkit.distill.augment``);
2. the teacher's logits over it, computed once and cached memory-mapped (``cramkit.distill.teacher``);
3. the student trained to match them (MSE on logits by default, as Tang et al.; KL with a temperature;
   a mix with the hard labels by ``alpha``; for an encoder student optionally its last hidden states,
   through a learned projection, against the teacher's);
4. the same student trained on the labels alone (the baseline that shows what distillation bought);
5. dev scores of teacher, student and baseline, parameter counts, examples/s of teacher and student on
   the CPU measured in the same run: ``report.json`` and ``report.md`` beside the student's model
   directory (``cramkit.load`` / ``cramkit predict`` / ``cramkit export``).

Both students train through the engine (``cramkit.distill.objective``: ``train.epochs.train_epochs``), each in its
run directory ``OUT/runs/distilled`` and ``OUT/runs/labels-only`` (checkpoints, metrics.jsonl, loss.png).
The same command run again continues where it stopped: a training killed midway resumes from its latest
checkpoint, a finished one is reused, a finished distillation only prints its report. ``OUT/distill.json``
records the settings; a run with other settings on the same ``--out`` is refused, never mixed in.
Under torchrun (``cramkit distill --nproc N``) rank 0 builds the transfer set and the teacher's logits
(the others wait, then read them from the cache), every rank trains, rank 0 scores and writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from cramkit.errors import CramkitError
from cramkit.io import read_json
from cramkit.load import LoadedModel
from cramkit.train.config import ExampleSettings

if TYPE_CHECKING:
    from cramkit.model.encoder import Encoder

PathLike = str | os.PathLike
STUDENTS = ("bilstm", "encoder")
HEAD_KINDS = ("classifier", "multilabel", "regression")


@dataclass
class DistillConfig(ExampleSettings):
    """Every setting of ``cramkit distill`` (``--set key=value``); 0 means "the student's default"."""

    # transfer set (Tang et al.)
    augment: bool = True
    p_mask: float = 0.1
    p_pos: float = 0.1
    p_ng: float = 0.25
    n_iter: int = 0  # 0: 20 for single sentences, 10 for pairs
    max_ngram: int = 5
    workers: int = 0  # augmentation processes (0: every core)
    max_unlabelled: int = 0  # --unlabelled: at most N texts (0: every line of a file, 100,000 sentences of a store)
    # losses
    loss: Literal["mse", "kl"] = "mse"
    temperature: float = 1.0
    alpha: float = 0.0  # weight of the hard-label loss (on the original examples only)
    hidden_weight: float = 0.0  # encoder student: weight of last-hidden-state matching
    # training
    epochs: float = 0.0  # bilstm 3, encoder 0.5 (of a transfer set ~13-20x the training set)
    lr: float = 0.0  # bilstm 1e-3, encoder 2e-4
    batch_size: int = 0  # bilstm 64, encoder 128
    schedule: Literal["linear", "one-cycle", "constant", "budget-triangle"] = "linear"
    baseline: bool = True  # also train the student on the labels only
    baseline_epochs: float = 0.0  # 0: bilstm 3x the distillation epochs (the labelled set is ~20x smaller), encoder 2
    seed: int = 0
    threads: int = 0  # torch threads while training (0: 1 for the BiLSTM, whose steps are too small to split)
    speed_seconds: float = 2.0
    speed_examples: int = 0  # examples/s: time on the first N dev inputs (0: all), at least speed_seconds
    # bilstm student
    embedding_dim: int = 0  # 0: 128 when init_embeddings (the teacher's, by PCA), else 300
    lstm_hidden: int = 150
    fc_hidden: int = 200
    init_embeddings: bool = True  # start the embedding from the teacher's token embeddings
    # encoder student
    layers: int = 0  # 0: a third of the teacher's (at least 1)
    hidden: int = 0  # 0: the teacher's (or the init run's)
    layer_map: list[int] = field(default_factory=list)  # teacher layers to copy (default evenly spaced)
    init: str = "teacher"  # teacher | random | a pretrained run / model directory / hf:DIR

    def validate(self) -> None:
        if self.temperature <= 0:
            raise CramkitError(f"temperature must be positive, got {self.temperature}")
        if not 0.0 <= self.alpha <= 1.0:
            raise CramkitError(f"alpha is a weight in [0, 1], got {self.alpha}")
        for name in ("epochs", "lr", "batch_size", "hidden_weight", "baseline_epochs", "layers", "hidden"):
            if getattr(self, name) < 0:
                raise CramkitError(f"{name} must be >= 0, got {getattr(self, name)}")
        self.check_shared()

    def augment_config(self):
        from cramkit.distill.augment import AugmentConfig

        return AugmentConfig(self.p_mask, self.p_pos, self.p_ng, self.n_iter, self.max_ngram, self.seed, self.workers)

    def resolved(self, student: str) -> DistillConfig:
        """With the student's defaults filled in."""
        d = asdict(self)
        bil = student == "bilstm"
        # the defaults measured at full scale on SST-2 (bench/RESULTS.md, "Distillation")
        d["epochs"] = self.epochs or (3.0 if bil else 0.5)
        d["lr"] = self.lr or (1e-3 if bil else 2e-4)
        d["batch_size"] = self.batch_size or (64 if bil else 128)
        d["baseline_epochs"] = self.baseline_epochs or (3 * d["epochs"] if bil else 2.0)
        return DistillConfig(**d)


def config_from(overrides: dict[str, Any] | None = None) -> DistillConfig:
    """A DistillConfig from ``--set`` overrides (unknown keys are errors, with a did-you-mean)."""
    from cramkit.config import from_dict

    return from_dict(DistillConfig, overrides or {}, "distill")


# ------------------------------------------------------------------------------------------ checks


def check_teacher(teacher: LoadedModel, task: Any) -> str:
    """The teacher's kind; CramkitError when it has no head or its labels differ from the task's."""
    if teacher.kind not in HEAD_KINDS:
        raise CramkitError(
            f"--teacher {teacher.source}: a {teacher.kind} model has no classification or regression head; "
            "fine-tune it first (cramkit finetune ... --out DIR) and distil DIR"
        )
    if task.is_regression != (teacher.kind == "regression"):
        what = "a regression" if task.is_regression else "a classification"
        raise CramkitError(
            f"--teacher {teacher.source} is a {teacher.kind} model but task {task.name} is {what} task; "
            "use a teacher fine-tuned on this task"
        )
    if not task.is_regression:
        have = list(teacher.labels or [])
        want = [str(x) for x in task.labels]
        names = [str(x) for x in task.label_names] if task.label_names else None
        if have != want and have != names:
            raise CramkitError(
                f"--teacher {teacher.source}: its labels {have} (in logit order) differ from task {task.name}'s "
                f"{want}; distil with a teacher fine-tuned on this task's labels in this order (no silent remap)"
            )
    return teacher.kind


# ------------------------------------------------------------------------------------------ students


def build_student(student: str, teacher: LoadedModel, cfg: DistillConfig, *, pairs: bool) -> LoadedModel:
    """A fresh (untrained) student as a LoadedModel: its model, tokenizer, kind and labels."""
    import torch

    if student not in STUDENTS:
        import difflib

        close = difflib.get_close_matches(student, STUDENTS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise CramkitError(f"--student {student!r}: unknown student{hint}; choose one of {', '.join(STUDENTS)}")
    torch.manual_seed(cfg.seed)
    kind, labels = teacher.kind, teacher.labels
    n = teacher.num_labels or 1
    common: dict[str, Any] = dict(
        kind=kind, labels=labels, task=teacher.task, max_length=min(cfg.max_length, teacher.max_length)
    )
    if student == "bilstm":
        if cfg.hidden_weight > 0:
            raise CramkitError("hidden_weight applies to --student encoder; the BiLSTM matches logits only")
        from cramkit.model.students import BiLSTMConfig, BiLSTMStudent, bilstm_meta

        tok = teacher.tokenizer
        word = _teacher_word_embeddings(teacher) if cfg.init_embeddings else None
        dim = cfg.embedding_dim or (min(128, word.shape[1]) if word is not None else 300)
        if word is not None and dim > word.shape[1]:
            raise CramkitError(
                f"embedding_dim={dim} but the teacher's token embeddings are {word.shape[1]}-d; choose at most "
                f"{word.shape[1]} (fewer keeps their top principal components) or set init_embeddings=false"
            )
        if word is not None and dim < word.shape[1]:
            word = principal_components(word, dim)
        scfg = BiLSTMConfig(
            vocab_size=tok.get_vocab_size(with_added_tokens=True) if word is None else word.shape[0],
            embedding_dim=dim,
            lstm_hidden=cfg.lstm_hidden,
            fc_hidden=cfg.fc_hidden,
            dropout=cfg.dropout,
            pairs=pairs,
            pad_token_id=teacher.pad_id,
            sep_token_id=int(tok.token_to_id("[SEP]")),
        )
        model = BiLSTMStudent(scfg, n, multilabel=kind == "multilabel")
        if word is not None:
            with torch.no_grad():
                model.embedding.weight.copy_(word)
        return LoadedModel(
            model=model,
            config=bilstm_meta(scfg),
            tokenizer=tok,
            architecture="bilstm",
            with_types=False,
            pooling="mean",
            **common,
        )
    return _build_encoder_student(teacher, cfg, n, common)


def _teacher_word_embeddings(teacher: LoadedModel):
    enc = cast("Encoder | None", teacher.encoder)  # LoadedModel.encoder: an Encoder or None
    if enc is None:
        raise CramkitError(
            f"--teacher {teacher.source}: no transformer token embeddings to start the BiLSTM from; "
            "set init_embeddings=false"
        )
    return enc.embeddings.word.weight.detach().clone()


def principal_components(table: Any, dim: int) -> Any:
    """``table`` [V, D] projected on its top ``dim`` principal components, rescaled to the original's
    root-mean-square value: the BiLSTM's embedding starts from what the teacher's token embeddings
    vary along most, at a width the LSTM reads much faster (its input projection dominates its cost)."""
    import torch

    centred = table.double() - table.double().mean(0, keepdim=True)
    _, _, vt = torch.linalg.svd(centred, full_matrices=False)
    out = centred @ vt[:dim].T
    out *= centred.pow(2).mean().sqrt() / out.pow(2).mean().sqrt().clamp_min(1e-12)
    return out.to(table.dtype)


def _pick_layers(have: int, want: int, layer_map: list[int], what: str) -> list[int]:
    if layer_map:
        if len(layer_map) != want or any(not 0 <= i < have for i in layer_map):
            raise CramkitError(
                f"layer_map={layer_map}: give {want} layer indices (layers={want}) in 0..{have - 1} of {what}"
            )
        return list(layer_map)
    if want > have:
        raise CramkitError(
            f"layers={want}: {what} has only {have} layers to start from; choose layers <= {have}, or init=random"
        )
    return [round((i + 1) * have / want) - 1 for i in range(want)]  # evenly spaced, the last one included


def _build_encoder_student(teacher: LoadedModel, cfg: DistillConfig, n: int, common: dict) -> LoadedModel:
    from cramkit.config import to_dict
    from cramkit.model.heads import ClassifierConfig, SequenceClassifier

    tcfg = teacher.config
    enc = teacher.encoder
    if enc is None or not hasattr(tcfg, "layers"):
        raise CramkitError(
            f"--teacher {teacher.source}: a {teacher.architecture} teacher has no encoder configuration to "
            "size an encoder student from; use --student bilstm"
        )
    head_src = getattr(teacher.model, "head_cfg", None) or ClassifierConfig()
    head = ClassifierConfig(pooling=head_src.pooling, pooler_dense=head_src.pooler_dense, dropout=cfg.dropout)
    multilabel = common["kind"] == "multilabel"
    layers = cfg.layers or max(1, tcfg.layers // 3)
    if cfg.init == "teacher":
        if cfg.hidden and cfg.hidden != tcfg.hidden:
            raise CramkitError(
                f"hidden={cfg.hidden} differs from the teacher's width {tcfg.hidden}, so the student cannot start "
                "from the teacher's layers; set init=RUN (a pretrained cramkit run or model directory of width "
                f"{cfg.hidden}), init=random, or drop hidden"
            )
        picked = _pick_layers(tcfg.layers, layers, cfg.layer_map, f"the teacher ({teacher.source})")
        scfg = tcfg.replace(
            layers=layers, dropout=cfg.dropout, attention_dropout=cfg.dropout, gradient_checkpointing=False
        )
        model = SequenceClassifier(scfg, n, head, multilabel=multilabel)
        _copy_encoder(model, teacher.model, enc, picked, with_head=True)
        tok, with_types, extra = (
            teacher.tokenizer,
            teacher.with_types,
            {"init": "teacher", "teacher_layers": picked},
        )
    elif cfg.init == "random":
        hidden = cfg.hidden or tcfg.hidden
        heads = tcfg.heads if hidden % tcfg.heads == 0 else max(1, hidden // 64)
        scfg = tcfg.replace(
            layers=layers,
            hidden=hidden,
            heads=heads,
            intermediate=4 * hidden,
            dropout=cfg.dropout,
            attention_dropout=cfg.dropout,
            gradient_checkpointing=False,
        )
        scfg.validate()
        model = SequenceClassifier(scfg, n, head, multilabel=multilabel)
        tok, with_types, extra = teacher.tokenizer, teacher.with_types, {"init": "random"}
    else:
        from cramkit.load import load_torch

        src = load_torch(cfg.init, purpose="a student's init")
        src_enc = src.encoder
        if src_enc is None:
            raise CramkitError(f"init={cfg.init}: a {src.architecture} model has no encoder to start the student from")
        if cfg.hidden and cfg.hidden != src.config.hidden:
            raise CramkitError(
                f"hidden={cfg.hidden} but init={cfg.init} has width {src.config.hidden}; give a run of that width "
                "or drop hidden"
            )
        picked = _pick_layers(src.config.layers, layers, cfg.layer_map, f"init={cfg.init}")
        scfg = src.config.replace(
            layers=layers, dropout=cfg.dropout, attention_dropout=cfg.dropout, gradient_checkpointing=False
        )
        model = SequenceClassifier(scfg, n, head, multilabel=multilabel)
        _copy_encoder(model, src.model, src_enc, picked, with_head=False)
        tok, with_types, extra = src.tokenizer, src.with_types, {"init": cfg.init, "init_layers": picked}
    return LoadedModel(
        model=model,
        config=scfg,
        tokenizer=tok,
        architecture="encoder",
        with_types=with_types,
        pooling="cls" if head.pooling == "first" else "mean",
        head=to_dict(head),
        extra=extra,
        **common,
    )


def _copy_encoder(model: Any, src_model: Any, src_enc: Any, picked: list[int], *, with_head: bool) -> None:
    """Embeddings, the picked blocks and the final norm of ``src_enc`` into the student (and the pooler and
    classifier of a teacher with the same head)."""
    import torch

    dst = model.encoder
    dst.embeddings.load_state_dict(src_enc.embeddings.state_dict())
    dst.final_norm.load_state_dict(src_enc.final_norm.state_dict())
    for j, i in enumerate(picked):
        dst.layers[j].load_state_dict(src_enc.layers[i].state_dict())
    if with_head:
        for name in ("pooler", "classifier"):
            a, b = getattr(model, name, None), getattr(src_model, name, None)
            if a is not None and b is not None and a.weight.shape == b.weight.shape:
                a.load_state_dict(b.state_dict())
    else:
        pooler = getattr(src_model, "pooler", None)
        if pooler is not None and model.pooler is not None:
            with torch.no_grad():
                model.pooler.load_state_dict(pooler.state_dict())


def parameter_counts(model: Any) -> dict[str, int]:
    from torch import nn

    total = sum(p.numel() for p in model.parameters())
    emb = sum(p.numel() for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters())
    return {"total": int(total), "without_embeddings": int(total - emb)}


# ------------------------------------------------------------------------------------------ training


def _targets(kind: str, labels: list[Any], n: int) -> np.ndarray:
    """Hard labels as the loss wants them: scores (regression), ids (classifier), 0/1 rows (multi-label;
    a task with one label per example gives one-hot rows)."""
    if kind == "regression":
        return np.asarray(labels, dtype=np.float32)
    if kind == "multilabel":
        out = np.zeros((len(labels), n), dtype=np.float32)
        for i, v in enumerate(labels):
            out[i, list(v) if isinstance(v, (list, tuple)) else int(v)] = 1.0
        return out
    return np.asarray(labels, dtype=np.int64)


# ------------------------------------------------------------------------------------------ scoring


def dev_logits(loaded: LoadedModel, a: list[str], b: list[str | None], max_length: int, device: str = "auto"):
    from cramkit.infer.engine import Engine

    eng = Engine(loaded, device=device, max_length=max_length)
    out = eng.logits([x if y is None else (x, y) for x, y in zip(a, b, strict=True)])
    loaded.model.to("cpu")
    return out


def score(task: Any, kind: str, logits: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    preds = logits[:, 0] if kind == "regression" else logits
    metrics = task.compute_metrics(preds, labels)
    return {"metrics": metrics, "score": task.score(metrics)}


def cpu_speed(loaded: LoadedModel, inputs: list[Any], max_length: int, min_seconds: float, threads: int) -> float:
    """Examples per second of ``loaded`` through the Engine on the CPU with ``threads`` torch threads (one
    warm-up pass first)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _speed(loaded, inputs, max_length, min_seconds)
    finally:
        torch.set_num_threads(before)


def _speed(loaded: LoadedModel, inputs: list[Any], max_length: int, min_seconds: float) -> float:
    from cramkit.infer.engine import Engine

    eng = Engine(loaded, device="cpu", max_length=max_length)
    eng.logits(inputs[:64])
    n, t0 = 0, time.perf_counter()
    while True:
        eng.logits(inputs)
        n += len(inputs)
        el = time.perf_counter() - t0
        if el >= min_seconds:
            return n / el


# ------------------------------------------------------------------------------------------ the recipe


def _fingerprint(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, ensure_ascii=False, default=str).encode())
    return h.hexdigest()[:16]


def distill(
    teacher: PathLike | LoadedModel,
    task: Any,
    student: str,
    cfg: DistillConfig | None = None,
    out: PathLike = "distilled",
    *,
    cache: PathLike | None = None,
    unlabelled: list[str] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Distil ``teacher`` into a ``student`` (bilstm | encoder) on ``task``; write the student's model
    directory, report.json and report.md to ``out``; returns the report (under torchrun: on rank 0; {}
    on the others)."""
    import contextlib
    import shutil

    import torch

    from cramkit.data.batching import encode_texts
    from cramkit.distill.augment import MASK, STUDENT_MASK
    from cramkit.distill.objective import train_student
    from cramkit.distill.teacher import teacher_key, teacher_logits
    from cramkit.io import check_out, claim_dir, dir_lock, write_json_atomic, write_text_atomic
    from cramkit.load import MODEL_FILE, load_torch
    from cramkit.train.distributed import broadcast_object, fault_guard, init_distributed, main_first, shutdown

    t_start = time.perf_counter()
    cfg = (cfg or DistillConfig()).resolved(student)
    cfg.validate()
    out = Path(out)
    check_out(out, inputs=[teacher], own=[SETTINGS_FILE])
    if cfg.augment and cfg.p_pos > 0:
        from cramkit.distill.augment import find_tagger

        find_tagger()  # before anything slow: a missing tagger is the first thing said
    t = teacher if isinstance(teacher, LoadedModel) else load_torch(teacher, purpose="distillation")
    kind = check_teacher(t, task)
    train_rows = task.examples(task.train_split)
    if cfg.max_train_examples:
        train_rows = train_rows[: cfg.max_train_examples]
    if not train_rows:
        raise CramkitError(f"task {task.name}: the {task.train_split} split is empty; nothing to distil from")
    if any(r.label is None for r in train_rows):
        raise CramkitError(
            f"task {task.name}: the {task.train_split} split has unlabelled rows; give a labelled training file "
            "(--label COLUMN); extra unlabelled text goes in --unlabelled FILE"
        )
    if not task.dev_splits:
        raise CramkitError(f"task {task.name} has no dev split to score teacher and student on; give --dev")
    dev_rows = task.examples(task.dev_splits[0])
    if not dev_rows or any(r.label is None for r in dev_rows):
        raise CramkitError(
            f"task {task.name}: the {task.dev_splits[0]} split is empty or unlabelled; it cannot be scored"
        )
    pairs = any(r.text_b is not None for r in train_rows)
    max_length = min(cfg.max_length, t.max_length)
    cache = Path(cache) if cache is not None else out / "cache"
    # the student is built first: a config that cannot start from the teacher fails before any work
    st = build_student(student, t, cfg, pairs=pairs)
    base_model = build_student(student, t, cfg, pairs=pairs) if cfg.baseline else None
    if cfg.hidden_weight > 0 and st.tokenizer.get_vocab() != t.tokenizer.get_vocab():
        raise CramkitError("hidden_weight needs the student to share the teacher's tokenizer (init=teacher)")
    a = [r.text_a for r in train_rows]
    b = [r.text_b for r in train_rows]
    y_train = [r.label for r in train_rows]
    settings = {
        "task": task.name,
        "teacher": t.source,
        "teacher_weights": teacher_key(t, max_length),
        "student": student,
        "train": _fingerprint(a, b, y_train, unlabelled or []),
        "dev": _fingerprint([[r.text_a, r.text_b, r.label] for r in dev_rows]),
        # (settings that cannot change the result may change between reruns)
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("workers", "checkpoint_every")},
    }

    ctx = init_distributed(cfg.device)  # under torchrun: rank 0 prepares, scores and writes; all train
    with contextlib.ExitStack() as stack:
        stack.callback(shutdown, ctx)
        if ctx.is_main:
            stack.enter_context(dir_lock(out, "--out"))
        stack.enter_context(fault_guard(ctx))
        with main_first(ctx, "checking --out"):
            done = False
            if ctx.is_main:
                claimed = claim_dir(out, SETTINGS_FILE, settings, "a distillation")
                done = claimed and (out / "report.json").is_file() and (out / MODEL_FILE).is_file()
        if broadcast_object(done, ctx):  # finished earlier with these very settings
            if not ctx.is_main:
                return {}
            print(
                f"cramkit: {out}: distilled earlier with the same settings; its report is kept (delete "
                f"{out} to distil again)",
                file=sys.stderr,
            )
            return read_json(out / "report.json", f"delete {out} to distil again")
        # 1. transfer set and 2. teacher logits, cached (the other ranks read rank 0's)
        with main_first(ctx, "building the transfer set and the teacher's logits"):
            show = progress and ctx.is_main
            transfer = _transfer_set(cfg, cache, a, b, y_train, unlabelled or [], show)
            ta, tb = transfer.rendered(MASK)
            logits, tstats = teacher_logits(
                t, ta, tb, transfer.root, max_length=max_length, device=cfg.device, progress=show
            )

        # 3. the student on the transfer set, 4. the same student on the labels only
        runs = out / "runs"
        sa, sb = transfer.rendered(STUDENT_MASK if student == "bilstm" else MASK)
        enc = encode_texts(st.tokenizer, sa, sb, max_length)
        ylab = _targets(kind, [v if v is not None else 0 for v in transfer.labels], t.num_labels or 1)
        training: dict[str, Any] = {}
        training["distilled"] = train_student(
            st,
            enc,
            np.asarray(logits),
            ylab,
            transfer.orig,
            cfg,
            cfg.epochs,
            runs / RUNS["distilled"],
            teacher=t,
            desc=f"distil {student}",
            progress=progress,
            ctx=ctx,
        )
        training["labels_only"] = None
        if base_model is not None:
            enc0 = encode_texts(base_model.tokenizer, a, b, max_length)
            y0 = _targets(kind, y_train, t.num_labels or 1)
            training["labels_only"] = train_student(
                base_model,
                enc0,
                None,
                y0,
                np.ones(len(a), dtype=bool),
                cfg,
                cfg.baseline_epochs,
                runs / RUNS["labels_only"],
                desc=f"{student} on labels only",
                progress=progress,
                ctx=ctx,
            )
        if not ctx.is_main:
            return {}

        # 5. scores and speed
        regression = kind == "regression"
        da = [r.text_a for r in dev_rows]
        db = [r.text_b for r in dev_rows]
        y_dev = np.asarray([r.label for r in dev_rows], dtype=np.float32 if regression else np.int64)
        scores = {
            "teacher": score(task, kind, dev_logits(t, da, db, max_length, cfg.device), y_dev),
            "student": score(task, kind, dev_logits(st, da, db, max_length, cfg.device), y_dev),
        }
        if base_model is not None:
            scores["labels_only"] = score(task, kind, dev_logits(base_model, da, db, max_length, cfg.device), y_dev)
        inputs = [x if z is None else (x, z) for x, z in zip(da, db, strict=True)]
        if cfg.speed_examples:
            inputs = inputs[: cfg.speed_examples]
        threads = torch.get_num_threads()
        speed, speed1 = {}, {}
        for name, m in (("teacher", t), ("student", st)):
            speed[name] = cpu_speed(m, inputs, max_length, cfg.speed_seconds, threads)
            speed1[name] = cpu_speed(m, inputs, max_length, cfg.speed_seconds, 1) if threads > 1 else speed[name]

        # 6. the student's model directory, then the report
        st.extra |= {"distilled_from": t.source, "student": student, "transfer_rows": len(transfer)}
        st.task = task.name
        for name in ("report.json", "report.md"):  # an old report must not describe the new model
            (out / name).unlink(missing_ok=True)
        st.save(out)
        report = {
            "task": task.name,
            "teacher": t.source,
            "student": student,
            "out": str(out),
            "kind": kind,
            "main_metric": task.main_metric,
            "dev_split": task.dev_splits[0],
            "dev_examples": len(dev_rows),
            "scores": scores,
            "parameters": {"teacher": parameter_counts(t.model), "student": parameter_counts(st.model)},
            "cpu_examples_per_s": {k: round(v, 1) for k, v in speed.items()},
            "speedup": round(speed["student"] / speed["teacher"], 2),
            "cpu_examples_per_s_1_thread": {k: round(v, 1) for k, v in speed1.items()},
            "speedup_1_thread": round(speed1["student"] / speed1["teacher"], 2),
            "cpu_threads": threads,
            "transfer_set": {k: v for k, v in transfer.manifest.items() if k != "config"}
            | {"root": str(transfer.root)},
            "teacher_logits": tstats,
            "training": training,
            "config": asdict(cfg),
            "seconds_total": round(time.perf_counter() - t_start, 1),
        }
        write_json_atomic(out / "report.json", report)
        write_text_atomic(out / "report.md", report_md(report))
        for name in RUNS.values():  # the student is saved: the trainings' checkpoints are no longer needed
            shutil.rmtree(runs / name / "checkpoints", ignore_errors=True)
        return report


SETTINGS_FILE = "distill.json"
RUNS = {"distilled": "distilled", "labels_only": "labels-only"}  # report key -> run directory in OUT/runs


def _transfer_set(cfg: DistillConfig, cache: Path, a: list, b: list, y: list, unlabelled: list[str], progress: bool):
    """The transfer set: the training examples and their edited copies (Tang et al.), then the
    unlabelled texts; cached under ``cache`` by a fingerprint of its inputs."""
    from cramkit.distill.augment import MANIFEST, TransferSet, build_transfer

    acfg = cfg.augment_config()
    if cfg.augment:
        key = _fingerprint(asdict(acfg) | {"workers": 0}, a, b, y, unlabelled)
        root = cache / f"transfer-{key}"
        cached = (root / MANIFEST).is_file()
        ts = build_transfer(root, a, b, y, acfg, unlabelled=unlabelled, progress=progress)
        ts.manifest = {**ts.manifest, "cached": cached}
        return ts
    key = _fingerprint("plain", a, b, y, unlabelled)
    extra = [x for x in unlabelled if x and x.strip()]
    root = cache / f"transfer-{key}"
    root.mkdir(parents=True, exist_ok=True)
    return TransferSet(
        root,
        a + extra,
        b + [None] * len(extra),
        y + [None] * len(extra),
        np.asarray([True] * len(a) + [False] * len(extra)),
        {"rows": len(a) + len(extra), "originals": len(a), "copies": 0, "unlabelled": len(extra)},
    )


def report_md(r: dict[str, Any]) -> str:
    s = r["scores"]
    m = r["main_metric"]
    p = r["parameters"]
    sp = r["cpu_examples_per_s"]

    def row(name: str, key: str, params: dict | None, speed: float | None) -> str:
        if key not in s:
            return ""
        ps = (
            f"{params['total'] / 1e6:.2f}M ({params['without_embeddings'] / 1e6:.2f}M w/o embeddings)" if params else ""
        )
        return f"| {name} | {s[key]['score']:.2f} | {ps} | {f'{speed:,.0f}' if speed else ''} |\n"

    ts = r["transfer_set"]
    lines = [
        f"# Distillation: {r['task']} -> {r['student']}\n\n",
        f"Teacher `{r['teacher']}`; student `{r['out']}`. Dev split `{r['dev_split']}` ({r['dev_examples']} examples), "
        f"{m} x100. Examples/s: `cramkit.infer.Engine` on the CPU ({r['cpu_threads']} threads), same run.\n\n",
        f"| model | dev {m} | parameters | CPU examples/s |\n|---|---:|---:|---:|\n",
        row("teacher", "teacher", p["teacher"], sp["teacher"]),
        row(f"{r['student']} student (distilled)", "student", p["student"], sp["student"]),
        row(f"{r['student']} on labels only", "labels_only", p["student"], None),
        f"\nStudent/teacher speed: **{r['speedup']}x** with {r['cpu_threads']} threads "
        f"({r['cpu_examples_per_s_1_thread']['teacher']:,.0f} vs {r['cpu_examples_per_s_1_thread']['student']:,.0f} "
        f"examples/s with 1 thread: {r['speedup_1_thread']}x); student score "
        f"{s['student']['score'] - s['teacher']['score']:+.2f} vs the teacher",
    ]
    if "labels_only" in s:
        lines.append(f", {s['student']['score'] - s['labels_only']['score']:+.2f} vs labels only")
    lines.append(
        f".\n\nTransfer set: {ts['rows']:,} examples ({ts['originals']:,} originals, {ts.get('copies', 0):,} "
        f"augmented copies, {ts.get('unlabelled', 0):,} unlabelled)"
    )
    if ts.get("examples_per_s"):
        lines.append(f"; augmentation {ts['examples_per_s']:,.0f} examples/s on {ts.get('workers')} processes")
        spent = ts.get("seconds_tagging", 0) + ts.get("seconds_augmenting", 0)
        if ts.get("cached"):
            lines.append(" (built by an earlier run, reused)")
        elif r["seconds_total"] > 0:
            lines.append(f", {spent:.0f} s = {100 * spent / r['seconds_total']:.1f}% of the total time")
    lines.append(f". Total time {r['seconds_total']:.0f} s.\n")
    return "".join(lines)
