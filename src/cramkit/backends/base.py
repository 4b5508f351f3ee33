"""What every export format shares: the model an export opens into, the export job, the backend's base
class, the check texts and the one manifest reader (see ``cramkit.backends``)."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cramkit.errors import CramkitError
from cramkit.model.pooling import POOLINGS

if TYPE_CHECKING:  # numpy too: `import cramkit` stays light
    import numpy as np

    from cramkit.data.prompts import PromptSpec
    from cramkit.model.loaded import LoadedModel

Inputs = dict[str, "np.ndarray | None"]
# what a model is for (its head), in a model directory and in an export alike
KINDS = ("mlm", "classifier", "multilabel", "regression", "multiple_choice", "encoder", "multitask")
# the kinds whose model ends in a pooled head with logits (a multiple-choice model's: one score per pair row)
LOGIT_KINDS = ("classifier", "multilabel", "regression", "multiple_choice")


class Runner(Protocol):
    """Forward passes on numpy batches (``input_ids``, ``attention_mask``, ``token_type_ids``): what
    :class:`~cramkit.infer.Engine` calls. ``cramkit.model.forward.TorchRunner`` is the torch one."""

    name: str
    precision: str

    def pooled(self, x: Inputs) -> tuple[np.ndarray, np.ndarray]:
        """(mean over real tokens, first token) of the last hidden states, float32 [batch, hidden]."""
        ...

    def logits(self, x: Inputs) -> np.ndarray:
        """The head's output [batch, labels] (a multiple-choice model: [pairs, 1])."""
        ...

    def mask_topk(self, x: Inputs, where: np.ndarray, k: int) -> tuple[Any, Any]:
        """(probabilities, token ids) [n, k] of the k likeliest tokens at the positions ``where``."""
        ...


@dataclass
class ExportedModel:
    """An export directory opened by its backend: what its manifest says, its tokenizer, and the runtime's
    handle on its files (an ONNX Runtime session, a CTranslate2 encoder, ...)."""

    path: Path
    manifest: dict[str, Any]
    tokenizer: Any
    backend: Backend
    handle: Any
    files: dict[str, str] = field(default_factory=dict)  # name -> SHA-256, as checked when opened
    # an export of a prompt model: its template and label words (the manifest's "prompt", checked when opened)
    prompt: PromptSpec | None = None

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])

    @property
    def labels(self) -> list[str] | None:
        return self.manifest.get("labels")

    @property
    def task(self) -> str | None:
        return self.manifest.get("task")

    @property
    def max_length(self) -> int:
        return int(self.manifest["max_length"])

    @property
    def pooling(self) -> str:
        return self.manifest.get("pooling") or "mean"

    @property
    def normalize(self) -> bool:
        return bool(self.manifest.get("normalize"))

    @property
    def with_types(self) -> bool:
        return bool(self.manifest.get("with_types"))

    @property
    def pad_id(self) -> int:
        return int(self.manifest.get("pad_id") or 0)

    @property
    def hidden(self) -> int | None:
        return self.manifest.get("hidden")

    @property
    def source(self) -> str:
        return str(self.path)

    @property
    def architecture(self) -> str:
        return str(self.manifest.get("architecture") or "encoder")

    @property
    def extra(self) -> dict[str, Any]:
        """What training recorded and the export kept: the columns and inputs it was fine-tuned on, the
        Matryoshka dimensions and named prompts of an embedding model."""
        keys = ("columns", "trained_inputs", "matryoshka", "prompts", "default_prompt_name")
        return {k: self.manifest[k] for k in keys if self.manifest.get(k) is not None}

    @property
    def can_embed(self) -> bool:
        outputs = self.manifest.get("outputs")  # an ONNX export of a student holds logits only
        return self.backend.embeds and (not isinstance(outputs, list) or "mean" in outputs)

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def fingerprint(self) -> str:
        """A digest of the exported weights (the files' SHA-256): embeddings made with them are reusable."""
        return hashlib.sha256(json.dumps(sorted(self.files.items())).encode()).hexdigest()

    def save(self, out: str | os.PathLike) -> Path:
        """Copy the export to ``out`` (its listed files, its tokenizer, the manifest last)."""
        import shutil

        from cramkit.io import write_json_atomic
        from cramkit.text.tokenizer import save_tokenizer

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / self.backend.marker).unlink(missing_ok=True)
        for name in self.files:
            shutil.copyfile(self.path / name, out / name)
        save_tokenizer(self.tokenizer, out / "tokenizer")
        write_json_atomic(out / self.backend.marker, {**self.manifest, "tokenizer": "tokenizer"})
        return out

    def runner(self, device: Any = None, precision: str = "auto") -> Runner:
        if device not in (None, "auto", "cpu") and str(device) != "cpu":
            raise CramkitError(f"{self.path}: a {self.backend.title} export runs on the CPU; drop --device {device}")
        return self.backend.runner(self)


@dataclass
class ExportJob:
    """One export in progress: what :meth:`Backend.write` works with. ``tmp`` becomes ``out`` once the
    manifest is written; ``manifest`` holds the shared fields, a format adds its own; ``files`` names what
    the format wrote (their SHA-256 is taken by :meth:`check`)."""

    loaded: LoadedModel
    tmp: Path
    quantize: str | None
    texts: list[Any]
    manifest: dict[str, Any]
    backend: Backend
    compare: Callable[[Any, Any, list[Any]], dict[str, Any]]
    progress: bool = True
    options: dict[str, Any] = field(default_factory=dict)  # the format's own (Backend.options)
    files: list[str] = field(default_factory=list)
    checked: dict[str, Any] | None = None

    def say(self, msg: str) -> None:
        if self.progress:
            print(f"[{self.backend.name}] {msg}", file=sys.stderr, flush=True)

    def check(self) -> dict[str, Any]:
        """Record the files' SHA-256, open the directory as it stands and compare it with the torch model on
        the job's texts: the largest differences (``worst_output``, ``worst_relative_diff``), cosines, label
        agreement. A format may call it more than once (e.g. to fall back to a safer quantization); the
        last check is the one kept."""
        from cramkit.io import sha256_file

        self.manifest["files"] = {name: sha256_file(self.tmp / name) for name in self.files}
        self.say(f"checking against the torch model on {len(self.texts)} real texts")
        opened = open_dir(self.tmp, self.manifest, self.backend, threads=None)
        reference = dataclasses.replace(self.loaded, kind=self.manifest["kind"])
        check = self.compare(reference, opened, self.texts)
        check["worst_output"], check["worst_relative_diff"] = worst_relative(check)
        self.checked = check
        return check


class Backend:
    """One export format and its runtime. A subclass sets the class attributes and implements
    :meth:`write`, :meth:`open` and :meth:`runner`; :func:`write_export` and :func:`open_export` do the rest."""

    name: str = ""  # the --format / --backend name, and the directory kind cramkit.load reports
    title: str = ""  # in messages: "ONNX", "CTranslate2"
    marker: str = ""  # the manifest's file name: its presence marks a complete export directory
    format: str = ""  # the manifest's "format" value, with its version
    quantize: tuple[str | None, ...] = (None,)  # accepted --quantize values; the first is the default
    full_precision: tuple[str | None, ...] = (None,)  # the values held to ``tolerance``
    tolerance: float | None = 1e-3  # largest relative difference from torch at full precision (None: no limit)
    embeds: bool = True  # whether its runner gives pooled embeddings
    exported_kinds: tuple[str, ...] = KINDS  # the kinds a manifest may declare
    required_files: tuple[str, ...] = ()  # must be listed in the manifest's "files"
    fields: dict[str, Any] = {}  # the format's own manifest fields and their types (io.check_fields)
    options: tuple[str, ...] = ()  # the keyword options its write takes (write_export(..., NAME=VALUE))
    extra: str | None = None  # the pyproject extra that installs its runtime
    # whether it holds prompt models (the MLM head at the template's masks) and deep-prompt models (per-layer
    # prefix keys and values): write_export refuses them, in one line naming --format onnx, where it does not
    prompts: bool = False

    def check_quantize(self, quantize: str | None) -> str | None:
        """``quantize`` or the format's default; one line naming the values it takes, else."""
        quantize = quantize or self.quantize[0]
        if quantize not in self.quantize:
            allowed = ", ".join(q or "none" for q in self.quantize)
            raise CramkitError(f"quantize must be one of {allowed} for the {self.name} format, got {quantize!r}")
        return quantize

    def incompatibilities(self, loaded: LoadedModel) -> list[str]:
        """Why ``loaded`` cannot be written in this format (empty: it can)."""
        return []

    def exported_kind(self, loaded: LoadedModel) -> str:
        """The kind the export is (and is checked as): ``loaded.kind`` unless the format keeps less."""
        return loaded.kind

    def write(self, job: ExportJob) -> None:
        """Write the format's files into ``job.tmp``, name them in ``job.files``, add the format's manifest
        fields; call ``job.check()`` where the format decides on the result (else the template checks once)."""
        raise NotImplementedError

    def validate(self, meta: dict[str, Any], file: Path) -> None:
        """The format's own checks of a manifest read from ``file`` (after the shared ones)."""

    def open(self, path: Path, meta: dict[str, Any], files: dict[str, bytes], threads: int | None) -> Any:
        """The runtime's handle on the export, made from the files' bytes (never from a path)."""
        raise NotImplementedError

    def runner(self, model: ExportedModel) -> Runner:
        raise NotImplementedError

    def check_model(self, model: ExportedModel) -> None:
        """The format's check of an opened export against its manifest and tokenizer, run on every load
        (max_length, labels, hidden size against what the files hold): one CramkitError naming the file and
        the fix, never a runtime's traceback on the first request."""

    def versions(self) -> dict[str, str]:
        return {"python": platform.python_version()}

    def summary(self, manifest: dict[str, Any]) -> str:
        """One line: the export's check against torch."""
        keys = ("cosine_mean_mean", "cosine_mean_min", "label_agreement", "fill_mask_top1_agreement")
        return "; ".join(check_summary(manifest["check"], keys))

    def available(self) -> None:
        """A CramkitError naming the extra to install when the runtime is missing."""


# ----------------------------------------------------------------------------------------------- export


def check_texts(n: int = 96) -> list[str]:
    """Real text of mixed length for an export's check: pieces of the built-in corpus (stdlib docstrings)."""
    from cramkit.text.sources import iter_documents

    texts: list[str] = []
    sizes = itertools.cycle([3, 8, 14, 25, 40, 70, 120, 300])
    for doc in itertools.islice(iter_documents(), 400):
        words = doc.split()
        size = next(sizes)
        if len(words) >= min(size, 3):
            texts.append(" ".join(words[:size]))
        if len(texts) >= n:
            break
    return texts


def worst_relative(check: dict[str, Any]) -> tuple[str, float]:
    """The output that differs most from torch's, and by how much relative to its scale."""
    worst, name = 0.0, ""
    for key, value in check.items():
        if key.startswith("max_abs_diff_") and not key.endswith("_prob"):
            out = key.removeprefix("max_abs_diff_")
            rel = value / max(1.0, check.get(f"scale_{out}", 1.0))
            if rel >= worst:
                worst, name = rel, out
    return name, worst


def check_summary(check: dict[str, Any], keys: Sequence[str]) -> list[str]:
    """An export's check against torch, in words: the largest difference, then ``keys`` present in it."""
    parts = [f"largest difference {check['worst_relative_diff']:.2e} ({check['worst_output']})"]
    return parts + [f"{key} {check[key]:.4f}" for key in keys if key in check]


# ------------------------------------------------------------------------------------------------- load

# the manifest fields every format shares and their types: a crafted file gets one line, never a traceback
SHARED_FIELDS = {
    "pooling": POOLINGS,
    "normalize": bool,
    "with_types": bool,
    "pad_id": int,
    "hidden": int,
    "tokenizer": str,
    "max_length": int,
    "files": dict,
    "columns": dict,
    "trained_inputs": ("single", "pairs", "choices"),
    "prompt": dict,
    "base": dict,
}


# the longest input an export's manifest may claim: beyond any position table cramkit writes, and what a
# check on load (one forward pass of this many tokens, see Backend.check_model) may cost
MAX_EXPORT_LENGTH = 8192


def read_manifest(path: Path, backend: Backend) -> dict[str, Any]:
    """The manifest of the export at ``path``, its fields checked: one line naming the file, else."""
    from cramkit.io import check_fields, read_json

    file = path / backend.marker
    meta = read_json(file, "export the model again")
    if not isinstance(meta, dict) or meta.get("format") != backend.format:
        raise CramkitError(f"{file}: not a cramkit {backend.title} manifest (format {backend.format} expected)")
    check_fields(meta, {**SHARED_FIELDS, **backend.fields}, file, "export the model again")
    if meta.get("kind") not in backend.exported_kinds:
        raise CramkitError(f"{file}: unknown kind {meta.get('kind')!r}; export the model again")
    labels = meta.get("labels")
    if labels is not None and not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
        raise CramkitError(f"{file}: 'labels' must be a list of strings")
    if not isinstance(meta.get("max_length"), int) or not 3 <= meta["max_length"] <= MAX_EXPORT_LENGTH:
        raise CramkitError(
            f"{file}: 'max_length' must be an integer from 3 to {MAX_EXPORT_LENGTH} (the longest input an encoder "
            f"cramkit exports takes), got {json.dumps(meta.get('max_length'))[:40]}; export the model again"
        )
    files = meta.get("files")
    if not isinstance(files, dict) or any(name not in files for name in backend.required_files):
        raise CramkitError(
            f"{file}: 'files' must list {', '.join(backend.required_files) or 'its files'} with their SHA-256"
        )
    backend.validate(meta, file)
    return meta


def file_bytes(root: Path, name: Any, want: Any, backend: Backend) -> bytes:
    """The bytes of ``root/name``: a regular file right inside ``root`` (no link, no separator in its name)
    whose SHA-256 is ``want``."""
    from cramkit.io import inside

    marker = root / backend.marker
    if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", ".."):
        raise CramkitError(f"{marker}: file {name!r} points outside the directory; the manifest is not trustworthy")
    if (root / name).is_symlink():
        raise CramkitError(
            f"{root / name} is a symbolic link; a cramkit {backend.title} export holds plain files only, "
            "export it again"
        )
    target = inside(root, name)
    if not target.is_file():
        raise CramkitError(f"{root}: {name} is missing; the {backend.title} export is incomplete, export it again")
    data = target.read_bytes()
    if not isinstance(want, str) or hashlib.sha256(data).hexdigest() != want:
        raise CramkitError(
            f"{target} is corrupt (its SHA-256 differs from the one in {backend.marker}); export the model again"
        )
    return data


def open_dir(path: Path, meta: dict[str, Any], backend: Backend, threads: int | None) -> ExportedModel:
    from cramkit.io import inside
    from cramkit.runtime import cpu_cores
    from cramkit.text.tokenizer import load_tokenizer

    cores = cpu_cores()
    if threads is not None and not 1 <= threads <= cores:
        raise CramkitError(f"threads must be 1..{cores} (the cores this process may use), got {threads}")
    backend.available()
    files = {name: file_bytes(path, name, want, backend) for name, want in meta["files"].items()}
    handle = backend.open(path, meta, files, threads)
    try:
        tok_dir = inside(path, str(meta.get("tokenizer") or "tokenizer"))
    except ValueError:
        raise CramkitError(f"{path / backend.marker}: the tokenizer path points outside the directory") from None
    tokenizer = load_tokenizer(tok_dir)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    pad = meta.get("pad_id") or 0
    if not 0 <= pad < tokenizer.get_vocab_size():  # fed to the runtime as an id: it must be in the table
        raise CramkitError(
            f"{path / backend.marker}: pad_id {pad} is outside the tokenizer's {tokenizer.get_vocab_size()} ids; "
            "export the model again"
        )
    prompt = None
    if meta.get("prompt") is not None:  # a prompt model's export: its inputs go through the template
        from cramkit.data.prompts import prompt_from_meta

        marker = path / backend.marker
        if meta["kind"] != "classifier":
            raise CramkitError(f"{marker}: a prompt is recorded for a {meta['kind']} model; export the model again")
        prompt = prompt_from_meta(meta["prompt"], meta.get("labels"), tokenizer, marker, "export the model again")
    model = ExportedModel(path, meta, tokenizer, backend, handle, dict(meta["files"]), prompt)
    backend.check_model(model)
    return model
