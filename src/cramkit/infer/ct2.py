"""CTranslate2 backend: export a transformer encoder to a directory ``ctranslate2.Encoder`` runs, and load it.

``cramkit export MODEL --format ct2 [--quantize int8|int8_float32|float32|bfloat16] --out DIR`` writes::

    DIR/model.bin, DIR/config.json, DIR/vocabulary.json
                            the encoder in CTranslate2's format (its TransformerEncoderSpec, filled from
                            cramkit's weights here, not through transformers); weights stored in the
                            chosen type (default float32; int8: per-row int8 weights, int8 matrix products)
    DIR/head.safetensors    classifiers and regressors: the pooler and classifier weights (float32), run in
                            numpy on the encoder's last hidden states
    DIR/tokenizer/          the model's tokenizer
    DIR/cramkit-ct2.json    what it is (kind, labels, max_length, pooling, ...), every file's SHA-256, the
                            export's check against the torch model on real text; written last

Which encoders: post-LN (BERT, any ``hf:`` import) and cramkit's own pre-LN and DeepNet shapes alike, with
LayerNorm or RMSNorm, with or without biases, learned, scaled-sinusoidal (stored as the table it adds) or
rotary positions, GELU / ReLU / GELU-GLU / SwiGLU; what CTranslate2's encoder spec cannot express (a
student without a transformer encoder) is refused with one line naming ``--format onnx``. Masked-LM models
are exported as their encoder (embeddings only; fill-mask needs ``--format onnx``).

Loading reads the manifest (JSON), refuses any file that is not a regular file inside the directory
(symlinks included), checks every file's SHA-256, then hands CTranslate2 the files' bytes (its ``files=``
argument): it never opens a path of its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cramkit.errors import CramkitError
from cramkit.infer.onnx import ExportedModel
from cramkit.load import CT2_MANIFEST, KINDS, LOGIT_KINDS, directory_kind

if TYPE_CHECKING:
    from cramkit.load import LoadedModel

MANIFEST = CT2_MANIFEST
FORMAT = "cramkit-ct2-1"
QUANTIZE = ("int8", "int8_float32", "float32", "bfloat16")
MODEL_FILES = ("model.bin", "config.json", "vocabulary.json")
HEAD_FILE = "head.safetensors"
# the largest difference from the torch model a float32 export may show (relative to the output's scale)
FP32_TOLERANCE = 1e-3
# the kinds with a pooler + linear head (run in numpy); a multiple-choice model's scores each pair row
HEAD_KINDS = LOGIT_KINDS


def is_ct2_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory written by :func:`export_ct2` (``cramkit.load``'s kinds table)."""
    return directory_kind(path) == "ct2"


def _ctranslate2() -> Any:
    from cramkit.errors import missing_extra

    try:
        import ctranslate2
    except ImportError as exc:
        raise (missing_extra(exc) or exc) from None
    return ctranslate2


@dataclass
class Ct2Model(ExportedModel):
    """An exported model, opened with CTranslate2: what :class:`~cramkit.infer.Engine` needs."""

    path: Path
    manifest: dict[str, Any]
    encoder: Any  # ctranslate2.Encoder
    tokenizer: Any
    head: dict[str, np.ndarray] | None = None  # pooler.weight/bias (optional), classifier.weight/bias


class Ct2Runner:
    """Forward passes of a CTranslate2 export on numpy batches (the engine's backend ``ct2``)."""

    name = "ct2"

    def __init__(self, model: Ct2Model) -> None:
        self.model = model
        # what CTranslate2 computes in on this machine (int8 weights: int8_float32; bfloat16 without
        # bfloat16 instructions: float32)
        self.precision = str(model.encoder.compute_type)
        self.ct2 = _ctranslate2()

    def _hidden(self, x: dict[str, np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
        """(last hidden states [B, L, H] float32, mask [B, L] float32)."""
        ids = x["input_ids"]
        mask = x["attention_mask"]
        mask = np.ones(ids.shape, np.float32) if mask is None else mask.astype(np.float32)
        sv = self.ct2.StorageView.from_array
        lengths = sv(mask.sum(1).astype(np.int32))
        types = None
        if self.model.with_types:
            t = x["token_type_ids"]
            types = (np.zeros_like(ids) if t is None else t).tolist()
        out = self.model.encoder.forward_batch(sv(np.ascontiguousarray(ids, np.int32)), lengths, types)
        return np.asarray(out.last_hidden_state, dtype=np.float32), mask

    @staticmethod
    def _mean(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w = mask[..., None]
        return (hidden * w).sum(1) / np.maximum(w.sum(1), 1.0)

    def pooled(self, x: dict[str, np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
        hidden, mask = self._hidden(x)
        return self._mean(hidden, mask), np.ascontiguousarray(hidden[:, 0])

    def logits(self, x: dict[str, np.ndarray | None]) -> np.ndarray:
        head = self.model.head
        if head is None:
            raise CramkitError(f"{self.model.path}: this export has no classification head")
        hidden, mask = self._hidden(x)
        pooled = (
            self._mean(hidden, mask) if self.model.manifest["head"]["pooling"] == "mean" else hidden[:, 0]
        )
        if "pooler.weight" in head:
            pooled = np.tanh(pooled @ head["pooler.weight"].T + head["pooler.bias"])
        return (pooled @ head["classifier.weight"].T + head["classifier.bias"]).astype(np.float32)

    def mask_topk(self, x: dict[str, np.ndarray | None], where: np.ndarray, k: int) -> tuple[Any, Any]:
        raise CramkitError(
            f"{self.model.path}: a CTranslate2 export holds the encoder only; fill [MASK]s with the torch "
            "model or an ONNX export (cramkit export --format onnx)"
        )


# ------------------------------------------------------------------------------------------- export


def ct2_incompatibilities(loaded: LoadedModel) -> list[str]:
    """Why ``loaded`` cannot be written as a CTranslate2 encoder (empty list: it can)."""
    if loaded.encoder is None:
        return [f"a {loaded.architecture} model has no transformer encoder"]
    if loaded.kind in HEAD_KINDS:
        model = loaded.model
        if not hasattr(model, "classifier") or getattr(model, "head_cfg", None) is None:
            return [f"its {type(model).__name__} head is not a pooler + linear classifier"]
    return []


def _np(t: Any) -> np.ndarray:
    return t.detach().to("cpu").float().numpy().copy()


def _norm(spec: Any, norm: Any) -> None:
    spec.gamma = _np(norm.weight)
    if hasattr(spec, "beta"):  # LayerNorm; bias=False stores zeros
        bias = getattr(norm, "bias", None)
        spec.beta = _np(bias) if bias is not None else np.zeros_like(spec.gamma)


def _linear(spec: Any, weight: Any, bias: Any, scale: float = 1.0) -> None:
    spec.weight = _np(weight) * scale
    if bias is not None:
        spec.bias = _np(bias) * scale


def _spec(loaded: LoadedModel) -> Any:
    """CTranslate2's TransformerEncoderModelSpec filled with ``loaded``'s encoder weights."""
    ct2 = _ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    enc = loaded.encoder
    cfg = enc.cfg
    act = common_spec.Activation
    activation = {"gelu": act.GELU, "gelu_glu": act.GELU, "relu": act.RELU, "swiglu": act.SWISH}[
        cfg.activation
    ]
    glu = cfg.activation in ("gelu_glu", "swiglu")
    rope = cfg.position == "rope"
    pre = cfg.norm_position == "pre"
    rms = cfg.norm == "rmsnorm"
    spec_enc = transformer_spec.TransformerEncoderSpec(
        cfg.layers, cfg.heads, pre_norm=pre, no_final_norm=pre and not cfg.final_norm, activation=activation,
        num_source_embeddings=2 if cfg.type_vocab_size else 1, embeddings_merge=common_spec.EmbeddingsMerge.ADD,
        layernorm_embedding=cfg.embedding_norm, ffn_glu=glu, rms_norm=rms, rotary_dim=0 if rope else None,
        rotary_interleave=True, rotary_base=float(cfg.rope_base),
    )  # fmt: skip
    spec = transformer_spec.TransformerEncoderModelSpec(spec_enc)
    spec.encoder.scale_embeddings = False
    emb = enc.embeddings
    spec.encoder.embeddings[0].weight = _np(emb.word.weight)
    if cfg.type_vocab_size:
        spec.encoder.embeddings[1].weight = _np(emb.token_type.weight)
    # absolute positions as the table cramkit adds (scaled sinusoid or learned); rotary: a table of zeros
    # (the attention rotates queries and keys), as long as the inputs may be
    if cfg.position == "learned":
        table = _np(emb.position.weight)
    elif cfg.position == "sinusoidal":
        table = _np(emb.sinusoid) * float(emb.position_scale.detach())
    else:
        table = np.zeros((max(int(loaded.max_length), 8), cfg.hidden), np.float32)
    spec.encoder.position_encodings.encodings = table
    if cfg.embedding_norm:
        _norm(spec.encoder.layernorm_embedding, emb.norm)
    if pre and cfg.final_norm:
        _norm(spec.encoder.layer_norm, enc.final_norm)
    # DeepNet's norm(alpha * x + f(x)) is norm(x + f(x) / alpha): a norm does not see its input's scale
    scale = 1.0 / float(cfg.deepnorm_alpha)
    for layer, block in zip(spec.encoder.layer, enc.layers, strict=True):
        attn, ffn = layer.self_attention, layer.ffn
        _linear(attn.linear[0], block.attn.qkv.weight, block.attn.qkv.bias)  # rows: queries, keys, values
        _linear(attn.linear[1], block.attn.out.weight, block.attn.out.bias, scale)
        _norm(attn.layer_norm, block.norm_attn)
        _norm(ffn.layer_norm, block.norm_mlp)
        fc_in = block.mlp.fc_in
        if (
            glu
        ):  # cramkit: value * act(gate), value the first half; CTranslate2: act(linear_0) * linear_0_noact
            half = fc_in.weight.shape[0] // 2
            bias = fc_in.bias
            _linear(ffn.linear_0, fc_in.weight[half:], None if bias is None else bias[half:])
            _linear(ffn.linear_0_noact, fc_in.weight[:half], None if bias is None else bias[:half])
        else:
            _linear(ffn.linear_0, fc_in.weight, fc_in.bias)
        _linear(ffn.linear_1, block.mlp.fc_out.weight, block.mlp.fc_out.bias, scale)
    spec.config.layer_norm_epsilon = float(cfg.norm_eps)
    tok = loaded.tokenizer
    vocab = [tok.id_to_token(i) or f"<unused_{i}>" for i in range(cfg.vocab_size)]
    spec.config.unk_token = "[UNK]" if tok.token_to_id("[UNK]") is not None else vocab[0]
    spec.register_vocabulary(vocab)
    del ct2
    return spec


def _head_tensors(loaded: LoadedModel) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    model = loaded.model
    tensors = {
        "classifier.weight": _np(model.classifier.weight),
        "classifier.bias": _np(model.classifier.bias),
    }
    if getattr(model, "pooler", None) is not None:
        tensors["pooler.weight"] = _np(model.pooler.weight)
        tensors["pooler.bias"] = _np(model.pooler.bias)
    pooling = "mean" if model.head_cfg.pooling == "mean" else "first"
    return tensors, {"pooling": pooling, "pooler": "pooler.weight" in tensors}


def export_ct2(
    loaded: LoadedModel,
    out: str | os.PathLike,
    quantize: str | None = None,
    force: bool = False,
    *,
    compare: Callable[[LoadedModel, Ct2Model, list[Any]], dict[str, Any]],
    texts: list[Any] | None = None,
    progress: bool = True,
) -> Path:
    """Export ``loaded`` to a CTranslate2 directory at ``out`` (atomically) and check it against torch.

    quantize: the stored weight type (default float32; int8, int8_float32, bfloat16). compare: the check
    (``cramkit.infer.engine.compare_outputs``). texts: its inputs (default: real text from the built-in
    corpus). A non-empty ``out`` that is not a previous export is refused unless ``force``."""
    quantize = quantize or "float32"
    if quantize not in QUANTIZE:
        raise CramkitError(
            f"quantize must be one of {', '.join(QUANTIZE)} for the ct2 format, got {quantize!r}"
        )
    why = ct2_incompatibilities(loaded)
    if why:
        raise CramkitError(
            f"{loaded.source}: CTranslate2's encoder cannot run this model ({'; '.join(why)}); "
            "export it with --format onnx instead"
        )
    ct2 = _ctranslate2()
    from safetensors.numpy import save_file

    from cramkit.infer.onnx import _worst_relative, check_texts
    from cramkit.io import atomic_path, check_out, sha256_file, write_json_atomic
    from cramkit.text.tokenizer import save_tokenizer

    out = Path(out)
    check_out(out, inputs=[loaded], own=[MANIFEST], replace=True, force=force)

    def say(msg: str) -> None:
        if progress:
            print(f"[ct2] {msg}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    loaded.model.to("cpu").eval()
    texts = texts or check_texts()
    if loaded.kind in HEAD_KINDS and loaded.with_types:
        texts = [*texts, *[(texts[i], texts[i + 1]) for i in range(0, min(len(texts) - 1, 32), 2)]]
    kind = "encoder" if loaded.kind == "mlm" else loaded.kind
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        cfg = loaded.encoder.cfg
        say(f"writing {loaded.source} ({loaded.kind}; {cfg.norm_position}-norm, {cfg.position} positions, "
            f"{cfg.activation}) as a CTranslate2 encoder, {quantize} weights")  # fmt: skip
        spec = _spec(loaded)
        spec.validate()
        spec.optimize(quantization=quantize)
        spec.save(str(tmp))
        files = [f for f in MODEL_FILES if (tmp / f).is_file()]
        head = None
        if kind in HEAD_KINDS:
            tensors, head = _head_tensors(loaded)
            save_file(tensors, str(tmp / HEAD_FILE))
            files.append(HEAD_FILE)
        save_tokenizer(loaded.tokenizer, tmp / "tokenizer")
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "kind": kind,
            "exported_from_kind": loaded.kind,
            "labels": loaded.labels,
            "task": loaded.task,
            "trained_inputs": loaded.extra.get("trained_inputs"),  # single texts, pairs or choices
            "max_length": int(loaded.max_length),
            "pooling": loaded.pooling,
            "normalize": bool(loaded.normalize),
            "with_types": bool(loaded.with_types),
            "pad_id": int(loaded.pad_id),
            "hidden": int(cfg.hidden),
            "architecture": loaded.architecture,
            "shape": {
                "norm_position": cfg.norm_position,
                "norm": cfg.norm,
                "position": cfg.position,
                "activation": cfg.activation,
                "bias": bool(cfg.bias),
            },  # fmt: skip
            "source": str(loaded.source),
            "quantize": quantize,
            "head": head,
            "files": {name: sha256_file(tmp / name) for name in files},
            "tokenizer": "tokenizer",
            "versions": {"ctranslate2": ct2.__version__, "python": platform.python_version()},
        }
        say(f"checking against the torch model on {len(texts)} real texts")
        # a masked-LM model is checked as the encoder it was exported as
        check = compare(dataclasses.replace(loaded, kind=kind), _open(tmp, manifest, threads=None), texts)
        name, worst = _worst_relative(check)
        check["worst_output"], check["worst_relative_diff"] = name, worst
        if quantize == "float32" and worst > FP32_TOLERANCE:
            raise CramkitError(
                f"{loaded.source}: the CTranslate2 export differs from the torch model by {worst:.2e} (relative, "
                f"output {name}) on real text, more than {FP32_TOLERANCE:g}; the export is not kept. Export it "
                "with --format onnx instead, and report the model's architecture"
            )
        manifest["check"] = check
        manifest["seconds"] = round(time.perf_counter() - start, 1)
        write_json_atomic(tmp / MANIFEST, manifest)
    say(f"done in {time.perf_counter() - start:.1f}s: {summary(manifest)}")
    return out


def summary(manifest: dict[str, Any]) -> str:
    """One line: the export's check against torch."""
    from cramkit.infer.onnx import check_summary

    return "; ".join(
        check_summary(manifest["check"], ("cosine_mean_mean", "cosine_mean_min", "label_agreement"))
    )


# --------------------------------------------------------------------------------------------- load


# the manifest's fields read when loading, and their types: a crafted file gets one line, never a traceback
MANIFEST_FIELDS = {"pooling": ("mean", "cls"), "normalize": bool, "with_types": bool, "pad_id": int,
                   "hidden": int, "tokenizer": str, "quantize": QUANTIZE, "head": dict}  # fmt: skip


def _read_manifest(path: Path) -> dict[str, Any]:
    from cramkit.io import check_fields

    file = path / MANIFEST
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CramkitError(f"{file} is not valid JSON ({exc}); export the model again") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CramkitError(f"{file}: not a cramkit CTranslate2 manifest (format {FORMAT} expected)")
    check_fields(meta, MANIFEST_FIELDS, file, "export the model again")
    if meta.get("kind") not in KINDS or meta.get("kind") in ("mlm", "multitask"):
        raise CramkitError(f"{file}: unknown kind {meta.get('kind')!r}; export the model again")
    labels = meta.get("labels")
    if labels is not None and not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
        raise CramkitError(f"{file}: 'labels' must be a list of strings")
    if not isinstance(meta.get("max_length"), int) or meta["max_length"] < 3:
        raise CramkitError(f"{file}: 'max_length' must be an integer of at least 3")
    files = meta.get("files")
    if not isinstance(files, dict) or "model.bin" not in files or "config.json" not in files:
        raise CramkitError(f"{file}: 'files' must list model.bin and config.json with their SHA-256")
    if meta["kind"] in HEAD_KINDS:
        head = meta.get("head") or {}
        if HEAD_FILE not in files or head.get("pooling") not in ("first", "mean"):
            raise CramkitError(f"{file}: a {meta['kind']} export lists {HEAD_FILE} and its head's pooling")
    return meta


def _file_bytes(root: Path, name: Any, want: Any) -> bytes:
    """The bytes of ``root/name``: a regular file inside ``root`` (no link) whose SHA-256 is ``want``."""
    from cramkit.io import inside

    if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", ".."):
        raise CramkitError(
            f"{root / MANIFEST}: file {name!r} points outside the directory; the manifest is not trustworthy"
        )
    if (root / name).is_symlink():
        raise CramkitError(
            f"{root / name} is a symbolic link; a cramkit CTranslate2 export holds plain files only, export it again"
        )
    target = inside(root, name)  # a name without separators, not a link: the directory's own file
    if not target.is_file():
        raise CramkitError(
            f"{root}: {name} is missing; the CTranslate2 export is incomplete, export it again"
        )
    data = target.read_bytes()
    if not isinstance(want, str) or hashlib.sha256(data).hexdigest() != want:
        raise CramkitError(
            f"{target} is corrupt (its SHA-256 differs from the one in {MANIFEST}); export the model again"
        )
    return data


def _open(path: Path, meta: dict[str, Any], threads: int | None) -> Ct2Model:
    ct2 = _ctranslate2()
    from safetensors import SafetensorError
    from safetensors.numpy import load as load_tensors

    from cramkit.io import inside
    from cramkit.runtime import cpu_cores
    from cramkit.text.tokenizer import load_tokenizer

    cores = cpu_cores()
    if threads is not None and not 1 <= threads <= cores:
        raise CramkitError(f"threads must be 1..{cores} (the cores this process may use), got {threads}")
    files = {name: _file_bytes(path, name, want) for name, want in meta["files"].items()}
    model_files = {name: data for name, data in files.items() if name in MODEL_FILES}
    level = ct2.get_log_level()
    ct2.set_log_level(logging.ERROR)  # e.g. that bfloat16 weights run as float32 here: info() says so
    try:
        encoder = ct2.Encoder(str(path), device="cpu", intra_threads=int(threads or cores),
                              files=model_files)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - a damaged or crafted model file
        raise CramkitError(
            f"{path}: CTranslate2 cannot load it ({str(exc)[:200]}); export the model again"
        ) from None
    finally:
        ct2.set_log_level(level)
    head = None
    if meta["kind"] in HEAD_KINDS:
        try:
            head = load_tensors(files[HEAD_FILE])
        except (SafetensorError, ValueError) as exc:
            raise CramkitError(
                f"{path / HEAD_FILE} is not a safetensors file ({exc}); export it again"
            ) from None
        want = {"classifier.weight", "classifier.bias"} | (
            {"pooler.weight", "pooler.bias"} if meta["head"].get("pooler") else set()
        )
        if set(head) != want:
            raise CramkitError(f"{path / HEAD_FILE}: holds {sorted(head)}, expected {sorted(want)}")
        head = {k: v.astype(np.float32) for k, v in head.items()}
        hidden = int(meta.get("hidden") or 0)
        n = len(meta.get("labels") or []) or head["classifier.bias"].shape[0]
        shapes = {"classifier.weight": (n, hidden), "classifier.bias": (n,), "pooler.weight": (hidden, hidden),
                  "pooler.bias": (hidden,)}  # fmt: skip
        for k, v in head.items():
            if v.shape != shapes[k]:
                raise CramkitError(
                    f"{path / HEAD_FILE}: {k} has shape {list(v.shape)}, expected {list(shapes[k])}"
                )
    try:
        tok_dir = inside(path, str(meta.get("tokenizer") or "tokenizer"))
    except ValueError:
        raise CramkitError(f"{path / MANIFEST}: the tokenizer path points outside the directory") from None
    tokenizer = load_tokenizer(tok_dir)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return Ct2Model(path, meta, encoder, tokenizer, head)


def load_ct2(path: str | os.PathLike, *, threads: int | None = None) -> Ct2Model:
    """Open a directory written by :func:`export_ct2` (threads: CTranslate2's ``intra_threads``, default
    every core this process may use)."""
    path = Path(path).expanduser()
    if not (path / MANIFEST).is_file():
        raise CramkitError(f"{path}: no {MANIFEST}; export the model with cramkit export --format ct2")
    return _open(path, _read_manifest(path), threads)
