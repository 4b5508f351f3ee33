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

Exporting goes through the shared template (``cramkit.backends.write_export``); loading through the
shared reader (``open_export``: the manifest, every file a regular file inside the directory with its
SHA-256), after which CTranslate2 is handed the files' bytes (its ``files=`` argument): it never opens a
path of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from cramkit.backends.base import KINDS, LOGIT_KINDS, Backend, ExportedModel, ExportJob, Inputs
from cramkit.errors import CramkitError
from cramkit.model.pooling import POOLINGS, read_head
from cramkit.runtime import PASS_TOKENS

if TYPE_CHECKING:
    from collections.abc import Iterable

    from cramkit.model.encoder import MLP, Block, Encoder
    from cramkit.model.heads import SequenceClassifier
    from cramkit.model.loaded import LoadedModel

MANIFEST = "cramkit-ct2.json"
FORMAT = "cramkit-ct2-1"
MODEL_FILES = ("model.bin", "config.json", "vocabulary.json")
HEAD_FILE = "head.safetensors"
# the kinds with a pooler + linear head (run in numpy); a multiple-choice model's scores each pair row
HEAD_KINDS = LOGIT_KINDS
# padded tokens per pass on a CPU: small ones (runtime.PASS_TOKENS says why)
CPU_BATCH_TOKENS = PASS_TOKENS["ct2-cpu"]


def _ctranslate2() -> Any:
    from cramkit.errors import missing_extra

    try:
        import ctranslate2
    except ImportError as exc:
        raise (missing_extra(exc) or exc) from None
    return ctranslate2


class Ct2Runner:
    """Forward passes of a CTranslate2 export on numpy batches."""

    name = "ct2"

    def __init__(self, model: ExportedModel) -> None:
        self.model = model
        self.encoder, self.head, self.rows = model.handle
        # the Engine's default budget with this runner on a CPU (elsewhere: the device's own)
        on_cpu = str(getattr(self.encoder, "device", "cpu")) == "cpu"
        self.batch_tokens: int | None = CPU_BATCH_TOKENS if on_cpu else None
        # what CTranslate2 computes in on this machine (int8 weights: int8_float32; bfloat16 without
        # bfloat16 instructions: float32)
        self.precision = str(self.encoder.compute_type)
        self.ct2 = _ctranslate2()
        self.workers = int(self.encoder.num_encoders) if on_cpu else 1  # passes CTranslate2 runs at once

    def _hidden(self, x: Inputs) -> tuple[np.ndarray, np.ndarray]:
        """(last hidden states [B, L, H] float32, mask [B, L] float32)."""
        ids = x["input_ids"]
        assert ids is not None
        if ids.size and (int(ids.max()) >= self.rows or int(ids.min()) < 0):  # CTranslate2 does not check
            raise CramkitError(
                f"{self.model.path}: token id {int(ids.max())} is outside the model's embedding table of {self.rows} "
                "rows (the export's tokenizer and model.bin disagree); export the model again"
            )
        mask = x["attention_mask"]
        mask = np.ones(ids.shape, np.float32) if mask is None else mask.astype(np.float32)
        sv = self.ct2.StorageView.from_array
        lengths = sv(mask.sum(1).astype(np.int32))
        # token types: CTranslate2 takes them as Python lists; all zeros (single texts) is its own default
        t = x["token_type_ids"] if self.model.with_types else None
        types = t.tolist() if t is not None and t.any() else None
        out = self.encoder.forward_batch(sv(np.ascontiguousarray(ids, np.int32)), lengths, types)
        return np.asarray(out.last_hidden_state, dtype=np.float32), mask

    @staticmethod
    def _mean(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        # one batched product, [B, 1, L] @ [B, L, H], instead of a masked copy of the hidden states
        summed = (mask[:, None, :] @ hidden)[:, 0]
        return summed / np.maximum(mask.sum(1, keepdims=True), 1.0)

    def pooled(self, x: Inputs) -> tuple[np.ndarray, np.ndarray]:
        hidden, mask = self._hidden(x)
        return self._mean(hidden, mask), np.ascontiguousarray(hidden[:, 0])

    def logits(self, x: Inputs) -> np.ndarray:
        head = self.head
        if head is None:
            raise CramkitError(f"{self.model.path}: this export has no classification head")
        hidden, mask = self._hidden(x)
        pooled = self._mean(hidden, mask) if self.model.manifest["head"]["pooling"] == "mean" else hidden[:, 0]
        if "pooler.weight" in head:
            activation = POOLER_ACTIVATIONS[self.model.manifest["head"].get("activation", "tanh")]
            pooled = activation(pooled @ head["pooler.weight"].T + head["pooler.bias"])
        return (pooled @ head["classifier.weight"].T + head["classifier.bias"]).astype(np.float32)

    def mask_topk(self, x: Inputs, where: np.ndarray, k: int) -> tuple[Any, Any]:
        raise CramkitError(
            f"{self.model.path}: a CTranslate2 export holds the encoder only; fill [MASK]s with the torch "
            "model or an ONNX export (cramkit export --format onnx)"
        )


# ------------------------------------------------------------------------- model.bin, checked before use

# CTranslate2's DataType ids (include/ctranslate2/types.h) and their sizes in bytes
_DTYPE_BYTES = {0: 4, 1: 1, 2: 2, 3: 4, 4: 2, 5: 2}


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU (ELECTRA's classifier), x * Phi(x)."""
    import math

    return x * 0.5 * (1.0 + np.vectorize(math.erf, otypes=[np.float32])(x / math.sqrt(2.0)))


# a classifier head's pooler activation (ClassifierConfig.pooler_activation) in numpy
POOLER_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": _gelu,
}


def model_bin_layout(data: bytes, where: Path) -> dict[str, tuple[tuple[int, ...], int]]:
    """name -> (shape, dtype id) of every variable in a CTranslate2 ``model.bin`` (format 6), read with
    bounds checks: each variable's byte count must be its shape's, and the file must end where the format
    says. CTranslate2 trusts these shapes and does not check the ids it gathers, so a crafted file is refused
    here rather than run (a table with fewer rows than the vocabulary reads past its end)."""
    import struct

    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise CramkitError(f"{where}: ends early (byte {pos}); export the model again")
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += size
        return value

    def text() -> str:
        nonlocal pos
        n = take("<H")
        if n < 1 or pos + n > len(data):
            raise CramkitError(f"{where}: a name runs past the end of the file; export the model again")
        raw = data[pos : pos + n - 1]
        pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CramkitError(f"{where}: a variable name is not UTF-8; export the model again") from None

    version = take("<I")
    if version != 6:
        raise CramkitError(f"{where}: model format {version}, cramkit reads format 6; export the model again")
    text()  # the spec's name
    take("<I")  # its revision
    layout: dict[str, tuple[tuple[int, ...], int]] = {}
    for _ in range(take("<I")):
        name = text()
        shape = tuple(take("<I") for _ in range(take("<B")))
        dtype = take("<B")
        nbytes = take("<I")
        if dtype not in _DTYPE_BYTES or name in layout:
            raise CramkitError(f"{where}: variable {name!r} is malformed; export the model again")
        count = 1
        for d in shape:
            count *= d
        if nbytes != count * _DTYPE_BYTES[dtype] or pos + nbytes > len(data):
            raise CramkitError(
                f"{where}: variable {name!r} of shape {list(shape)} holds {nbytes} bytes; export the model again"
            )
        _refuse_nonfinite(where, name, dtype, memoryview(data)[pos : pos + nbytes], count)
        pos += nbytes
        layout[name] = (shape, dtype)
    for _ in range(take("<I")):
        alias, target = text(), text()
        if target not in layout:
            raise CramkitError(f"{where}: alias {alias!r} names no variable; export the model again")
        layout[alias] = layout[target]
    if pos != len(data):
        raise CramkitError(f"{where}: {len(data) - pos} bytes after the last variable; export the model again")
    return layout


# CTranslate2's floating-point DataType ids and how their bytes read (5, bfloat16: raw 16-bit words)
_FLOAT_DTYPES = {0: "<f4", 4: "<f2", 5: None}


def _refuse_nonfinite(where: Path, name: str, dtype: int, raw: memoryview, count: int) -> None:
    """One line naming ``model.bin`` and the variable when a float variable (a weight table) holds NaN or inf."""
    from cramkit.backends.finite import bf16_faults, refuse_table, weight_faults

    if dtype not in _FLOAT_DTYPES:
        return
    kind = _FLOAT_DTYPES[dtype]
    bad = bf16_faults(raw) if kind is None else weight_faults(np.frombuffer(raw, kind))
    refuse_table(where, name, bad, count)


def check_layout(layout: dict[str, tuple[tuple[int, ...], int]], meta: dict[str, Any], where: Path) -> int:
    """Refuse a ``model.bin`` whose shapes do not fit together (the encoder's width, every projection's input
    and output, biases, norms, the position table's length against ``max_length``, the token-type table);
    returns the vocabulary table's rows (the ids the runner may feed)."""

    def shape(name: str) -> tuple[int, ...]:
        if name not in layout:
            raise CramkitError(f"{where}: no variable {name!r}; export the model again")
        return layout[name][0]

    def bad(name: str, want: Any) -> CramkitError:
        return CramkitError(
            f"{where}: {name} has shape {list(shape(name))}, expected {want}; the file is damaged or crafted, "
            "export the model again"
        )

    table = shape("encoder/embeddings_0/weight")
    if len(table) != 2 or min(table) < 1:
        raise bad("encoder/embeddings_0/weight", "[vocabulary, hidden]")
    rows, hidden = table
    if meta.get("hidden") not in (None, hidden):
        raise CramkitError(
            f"{where}: the encoder is {hidden} wide, the manifest says hidden {meta['hidden']}; the file is damaged "
            "or crafted, export the model again"
        )
    outputs: dict[str, int] = {}
    for name, (dims, _) in layout.items():
        if not name.endswith("/weight") or "/linear_" not in name:
            continue
        scope = name.rsplit("/", 1)[0]
        layer = scope.rsplit("/", 2)[0]
        want: tuple[int, ...]
        if scope.endswith("ffn/linear_1"):
            inner = shape(f"{layer}/ffn/linear_0/weight")[0]
            want = (hidden, inner)
        elif scope.endswith("self_attention/linear_0"):
            want = (3 * hidden, hidden)
        elif scope.endswith("self_attention/linear_1"):
            want = (hidden, hidden)
        elif scope.endswith("ffn/linear_0_noact"):
            want = shape(f"{layer}/ffn/linear_0/weight")
        else:
            want = (dims[0] if dims else -1, hidden)
        if tuple(dims) != tuple(want):
            raise bad(name, list(want))
        outputs[scope] = want[0]
    for name, (dims, _) in layout.items():
        scope, leaf = name.rsplit("/", 1)
        if leaf in ("bias", "weight_scale") and scope in outputs and dims != (outputs[scope],):
            raise bad(name, [outputs[scope]])
        if leaf in ("gamma", "beta") and dims != (hidden,):
            raise bad(name, [hidden])
    positions = layout.get("encoder/position_encodings/encodings")
    if positions is not None and (positions[0][1:] != (hidden,) or positions[0][0] < int(meta["max_length"])):
        raise bad("encoder/position_encodings/encodings", f"[at least max_length {meta['max_length']}, {hidden}]")
    types = layout.get("encoder/embeddings_1/weight")
    if meta.get("with_types") and (types is None or types[0][1:] != (hidden,) or types[0][0] < 2):
        raise CramkitError(f"{where}: the token-type table is missing or too small; export the model again")
    return int(rows)


# ------------------------------------------------------------------------------------------- export


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

    enc = cast("Encoder", loaded.encoder)  # incompatibilities() refused models without one
    cfg = enc.cfg
    act = common_spec.Activation
    activation = {"gelu": act.GELU, "gelu_glu": act.GELU, "relu": act.RELU, "swiglu": act.SWISH}[cfg.activation]
    glu = cfg.activation in ("gelu_glu", "swiglu")
    rope = cfg.position == "rope"
    pre = cfg.norm_position == "pre"
    rms = cfg.norm == "rmsnorm"
    spec_enc = transformer_spec.TransformerEncoderSpec(
        cfg.layers,
        cfg.heads,
        pre_norm=pre,
        no_final_norm=pre and not cfg.final_norm,
        activation=activation,
        num_source_embeddings=2 if cfg.type_vocab_size else 1,
        embeddings_merge=common_spec.EmbeddingsMerge.ADD,
        layernorm_embedding=cfg.embedding_norm,
        ffn_glu=glu,
        rms_norm=rms,
        rotary_dim=0 if rope else None,
        rotary_interleave=True,
        rotary_base=float(cfg.rope_base),
    )
    spec = transformer_spec.TransformerEncoderModelSpec(spec_enc)
    spec.encoder.scale_embeddings = False
    emb = enc.embeddings
    spec.encoder.embeddings[0].weight = _np(emb.word.weight)
    if cfg.type_vocab_size:
        assert emb.token_type is not None  # Embeddings builds it when type_vocab_size > 0
        spec.encoder.embeddings[1].weight = _np(emb.token_type.weight)
    # absolute positions as the table cramkit adds (scaled sinusoid or learned); rotary: a table of zeros
    # (the attention rotates queries and keys), as long as the inputs may be
    if cfg.position == "learned":  # RoBERTa's rows from its offset on: CTranslate2 counts positions from 0
        table = _np(emb.position.weight)[cfg.position_offset :]
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
    blocks = cast("Iterable[Block]", enc.layers)
    for layer, block in zip(spec.encoder.layer, blocks, strict=True):
        attn, ffn = layer.self_attention, layer.ffn
        _linear(attn.linear[0], block.attn.qkv.weight, block.attn.qkv.bias)  # rows: queries, keys, values
        _linear(attn.linear[1], block.attn.out.weight, block.attn.out.bias, scale)
        _norm(attn.layer_norm, block.norm_attn)
        _norm(ffn.layer_norm, block.norm_mlp)
        mlp = cast("MLP", block.mlp)  # (an MoE model is refused before: cramkit.infer.export)
        fc_in = mlp.fc_in
        if glu:  # cramkit: value * act(gate), value the first half; CTranslate2: act(linear_0) * linear_0_noact
            half = fc_in.weight.shape[0] // 2
            bias = fc_in.bias
            _linear(ffn.linear_0, fc_in.weight[half:], None if bias is None else bias[half:])
            _linear(ffn.linear_0_noact, fc_in.weight[:half], None if bias is None else bias[:half])
        else:
            _linear(ffn.linear_0, fc_in.weight, fc_in.bias)
        _linear(ffn.linear_1, mlp.fc_out.weight, mlp.fc_out.bias, scale)
    spec.config.layer_norm_epsilon = float(cfg.norm_eps)
    tok = loaded.tokenizer
    vocab = [tok.id_to_token(i) or f"<unused_{i}>" for i in range(cfg.vocab_size)]
    spec.config.unk_token = "[UNK]" if tok.token_to_id("[UNK]") is not None else vocab[0]
    spec.register_vocabulary(vocab)
    del ct2
    return spec


def _head_tensors(loaded: LoadedModel) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    model = cast("SequenceClassifier", loaded.model)  # incompatibilities() checked its classifier and head_cfg
    tensors = {
        "classifier.weight": _np(model.classifier.weight),
        "classifier.bias": _np(model.classifier.bias),
    }
    pooler = getattr(model, "pooler", None)
    if pooler is not None:
        tensors["pooler.weight"] = _np(pooler.weight)
        tensors["pooler.bias"] = _np(pooler.bias)
    head: dict[str, Any] = {"pooling": model.head_cfg.pooling, "pooler": "pooler.weight" in tensors}
    if model.head_cfg.pooler_activation != "tanh":  # DistilBERT's relu, ELECTRA's gelu (absent: tanh)
        head["activation"] = model.head_cfg.pooler_activation
    return tensors, head


class Ct2Backend(Backend):
    """CTranslate2: transformer encoders (any norm placement, position and activation cramkit has), in
    float32, int8, int8_float32 or bfloat16 weights."""

    name = "ct2"
    title = "CTranslate2"
    marker = MANIFEST
    format = FORMAT
    quantize = ("float32", "int8", "int8_float32", "bfloat16")
    full_precision = ("float32",)
    tolerance = 1e-3  # the largest difference from the torch model a float32 export may show
    exported_kinds = tuple(k for k in KINDS if k not in ("mlm", "multitask"))
    required_files = ("model.bin", "config.json")
    fields = {"quantize": ("int8", "int8_float32", "float32", "bfloat16"), "head": dict, "shape": dict}
    extra = "ct2"

    def available(self) -> None:
        _ctranslate2()

    def incompatibilities(self, loaded: LoadedModel) -> list[str]:
        if loaded.encoder is None:
            return [f"a {loaded.architecture} model has no transformer encoder"]
        cfg = loaded.encoder.cfg
        if cfg.relative_buckets:
            return ["CTranslate2's encoder has no relative position bias (MPNet)"]
        if cfg.disentangled_buckets:
            return ["CTranslate2's encoder has no disentangled attention (DeBERTa)"]
        if cfg.local_window:
            return ["CTranslate2's encoder has no local attention layers (ModernBERT)"]
        if not cfg.first_attention_norm:
            return ["CTranslate2's encoder normalises every block's input (ModernBERT's first block has no norm)"]
        if cfg.embedding_width != cfg.hidden:
            return ["CTranslate2's encoder has no projection after embeddings narrower than its layers (ELECTRA)"]
        if loaded.kind in HEAD_KINDS:
            model = loaded.model
            if not hasattr(model, "classifier") or getattr(model, "head_cfg", None) is None:
                return [f"its {type(model).__name__} head is not a pooler + linear classifier"]
        return []

    def exported_kind(self, loaded: LoadedModel) -> str:
        return "encoder" if loaded.kind == "mlm" else loaded.kind  # a masked-LM model as its encoder

    def write(self, job: ExportJob) -> None:
        from safetensors.numpy import save_file

        loaded, tmp = job.loaded, job.tmp
        cfg = cast("Encoder", loaded.encoder).cfg  # incompatibilities() refused models without one
        job.say(
            f"writing {loaded.source} ({loaded.kind}; {cfg.norm_position}-norm, {cfg.position} positions, "
            f"{cfg.activation}) as a CTranslate2 encoder, {job.quantize} weights"
        )
        spec = _spec(loaded)
        spec.validate()
        spec.optimize(quantization=job.quantize)
        spec.save(str(tmp))
        job.files = [f for f in MODEL_FILES if (tmp / f).is_file()]
        head = None
        if job.manifest["kind"] in HEAD_KINDS:
            tensors, head = _head_tensors(loaded)
            save_file(tensors, str(tmp / HEAD_FILE))
            job.files.append(HEAD_FILE)
        job.manifest.update(
            head=head,
            shape={
                "norm_position": cfg.norm_position,
                "norm": cfg.norm,
                "position": cfg.position,
                "activation": cfg.activation,
                "bias": bool(cfg.bias),
            },
        )

    def validate(self, meta: dict[str, Any], file: Path) -> None:
        if meta["kind"] in HEAD_KINDS:
            head = meta.get("head") or {}
            if HEAD_FILE not in meta["files"] or read_head(head).get("pooling") not in POOLINGS:
                raise CramkitError(f"{file}: a {meta['kind']} export lists {HEAD_FILE} and its head's pooling")
            if head.get("activation", "tanh") not in POOLER_ACTIVATIONS:
                raise CramkitError(
                    f"{file}: the head's activation {head.get('activation')!r} is not one of "
                    f"{', '.join(POOLER_ACTIVATIONS)}; re-export the model"
                )

    def open(self, path: Path, meta: dict[str, Any], files: dict[str, bytes], threads: int | None) -> Any:
        ct2 = _ctranslate2()
        from safetensors import SafetensorError
        from safetensors.numpy import load as load_tensors

        from cramkit.runtime import cpu_cores

        rows = check_layout(model_bin_layout(files["model.bin"], path / "model.bin"), meta, path / "model.bin")
        model_files = {name: data for name, data in files.items() if name in MODEL_FILES}
        level = ct2.get_log_level()
        ct2.set_log_level(logging.ERROR)  # e.g. that bfloat16 weights run as float32 here: info() says so
        try:
            # one thread per forward pass and as many passes at once as threads (the Engine and the server's batcher
            # run them concurrently): on 2 cores 1.15x two-thread passes when quiet, and a neighbour on one core
            # no longer stalls every pass (bench/RESULTS.md, "CTranslate2: one thread per pass")
            workers = int(threads or cpu_cores())
            encoder = ct2.Encoder(str(path), device="cpu", intra_threads=1, inter_threads=workers, files=model_files)
        except Exception as exc:  # a damaged or crafted model file
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
                raise CramkitError(f"{path / HEAD_FILE} is not a safetensors file ({exc}); export it again") from None
            want = {"classifier.weight", "classifier.bias"} | (
                {"pooler.weight", "pooler.bias"} if meta["head"].get("pooler") else set()
            )
            if set(head) != want:
                raise CramkitError(f"{path / HEAD_FILE}: holds {sorted(head)}, expected {sorted(want)}")
            head = {k: v.astype(np.float32) for k, v in head.items()}
            hidden = int(meta.get("hidden") or 0)
            n = len(meta.get("labels") or []) or head["classifier.bias"].shape[0]
            shapes = {
                "classifier.weight": (n, hidden),
                "classifier.bias": (n,),
                "pooler.weight": (hidden, hidden),
                "pooler.bias": (hidden,),
            }
            for k, v in head.items():
                if v.shape != shapes[k]:
                    raise CramkitError(f"{path / HEAD_FILE}: {k} has shape {list(v.shape)}, expected {list(shapes[k])}")
            from cramkit.backends.finite import check_weights

            check_weights(path / HEAD_FILE, sorted(head.items()))
        return encoder, head, rows

    def runner(self, model: ExportedModel) -> Ct2Runner:
        return Ct2Runner(model)

    def versions(self) -> dict[str, str]:
        import platform

        return {"ctranslate2": _ctranslate2().__version__, "python": platform.python_version()}
