"""The students of a distillation: a BiLSTM (Tang et al.) or a small encoder, built fresh from the teacher (its
tokenizer, labels, and optionally its token embeddings or its layers), a pretrained run, or at random.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from cramkit.errors import CramkitError
from cramkit.loading import LoadedModel
from cramkit.text.tokenizer import special_id

if TYPE_CHECKING:
    from cramkit.distillation.config import DistillConfig
    from cramkit.model.encoder import Encoder

STUDENTS = ("bilstm", "encoder")


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
            sep_token_id=int(special_id(tok, "sep") or 0),
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
    head = ClassifierConfig(
        pooling=head_src.pooling,
        pooler_dense=head_src.pooler_dense,
        dropout=cfg.dropout,
        pooler_activation=head_src.pooler_activation,
    )
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
        from cramkit.loading import load_torch

        src = load_torch(cfg.init, purpose="a student's init")
        src_enc = src.encoder
        if src_enc is None:
            raise CramkitError(f"init={cfg.init}: a {src.architecture} model has no encoder to start the student from")
        if cfg.hidden and cfg.hidden != src.config.hidden:
            raise CramkitError(
                f"hidden={cfg.hidden} but init={cfg.init} has width {src.config.hidden}; give a run of that width "
                "or drop hidden"
            )
        layers = cfg.layers or src.config.layers  # a pretrained small model: all of it unless layers says
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
        pooling=head.pooling,
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
    if src_enc.relative is not None:  # MPNet's relative position bias, shared by the layers
        dst.relative.load_state_dict(src_enc.relative.state_dict())
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
