"""The one rule for what a command may write over (:func:`check_out`, :func:`check_out_file`), importable from
``cramkit.io`` as before.

A folder is a command's own only by its manifest: a file cramkit wrote whose content says it is that command's
output (a JSON object with the fields cramkit writes there, or a test the command gives). A file that merely
bears one of the command's names (a user's ``state.json``, ``results.json``, ``metrics.jsonl``) is no proof: a
folder without the manifest that holds one is refused in one line, never written over, ``--overwrite`` or not.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from cramkit.errors import CramkitError

# what proves a folder a command's own, per manifest name (a glob under the folder): the fields its JSON object
# holds, or a test of the file
Proof = Sequence[str] | Callable[[Path], bool]

_MANIFEST_BYTES = 64 << 20  # a manifest read back whole: cramkit's are far smaller
_MOST_MATCHES = 1000  # files looked at per name pattern

# what a training verb (finetune, a mixture, distill, self-training, contrastive, few-shot splits, method auto)
# writes at the top of its --out: a folder no manifest claims is refused when it holds any of these
RUN_OUTPUTS = (
    "results.json",
    "results.md",
    "report.json",
    "report.md",
    "scores.png",
    "loss.png",
    "metrics.jsonl",
    "model.safetensors",
    "cramkit-model.json",
    "best.json",
    "best.safetensors",
    "tokenizer",
    "seeds",
    "run",
    "runs",
    "predictions",
    "submission",
    "labels",
    "cache",
    "teacher",
    "teacher-*",
    "student",
    "round-*",
    "split-*",
    "checkpoints",
    "config.yaml",
)


def read_manifest(path: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None: not a regular file, over 64 MiB, not JSON (nested too deep, an
    integer too long included), not an object. Nothing else is opened (a FIFO there would block)."""
    path = Path(path)
    try:
        if not path.is_file():
            return None
        with open(path, "rb") as f:
            data = f.read(_MANIFEST_BYTES + 1)
    except OSError:
        return None
    if len(data) > _MANIFEST_BYTES:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _matches(out: Path, pattern: str) -> Iterator[Path]:
    """The entries under ``out`` that ``pattern`` names (links included, dangling ones too)."""
    if not glob.has_magic(pattern):
        path = out / pattern
        if path.exists() or path.is_symlink():
            yield path
        return
    yield from islice(out.glob(pattern), _MOST_MATCHES)


def proves(path: Path, proof: Proof) -> bool:
    """Whether the file ``path`` is the manifest ``proof`` describes."""
    if callable(proof):
        return bool(proof(path))
    meta = read_manifest(path)
    return meta is not None and all(field in meta for field in proof)


def proven(out: str | os.PathLike, own: Mapping[str, Proof]) -> str | None:
    """The first manifest under ``out`` that proves it the command's own output (relative POSIX path), or None."""
    out = Path(out)
    for pattern, proof in own.items():
        for path in _matches(out, pattern):
            if proves(path, proof):
                return path.relative_to(out).as_posix()
    return None


def _clash(out: Path, names: Iterable[str]) -> str | None:
    """The first entry under ``out`` that one of ``names`` (globs) names: a file, a link, or a folder with
    something in it (an empty folder replaces nothing)."""
    for pattern in names:
        for path in _matches(out, pattern):
            if path.is_dir() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    if not any(path.iterdir()):
                        continue
                return path.relative_to(out).as_posix() + "/"
            return path.relative_to(out).as_posix()
    return None


# a file or folder that marks a directory as something cramkit made (the first one present names it)
PRODUCTS = (
    ("config.yaml", "a pretraining run"),
    ("checkpoints", "a pretraining run"),
    ("cramkit-model.json", "a model directory"),
    ("cramkit-onnx.json", "an ONNX export"),
    ("cramkit-ct2.json", "a CTranslate2 export"),
    ("cramkit_export.json", "a Hugging Face export"),
    ("config.json", "a Hugging Face model"),
    ("index.json", "an index"),
    ("embed.json", "embeddings"),
    ("finetune.json", "a fine-tuning"),
    ("distill.json", "a distillation"),
    ("neighbours.json", "RETRO neighbours"),
)


def holds(directory: str | os.PathLike) -> str | None:
    """What cramkit product ``directory`` holds ("a pretraining run (config.yaml)"), or None."""
    d = Path(directory)
    return next((f"{what} ({name})" for name, what in PRODUCTS if (d / name).exists()), None)


def _source_path(source: Any) -> Path | None:
    text = str(getattr(source, "source", source) or "")
    path = Path(text[3:] if text.startswith("hf:") else text).expanduser()
    return path.resolve() if text and path.exists() else None


def _refuse_inputs(out: Path, inputs: Iterable[Any], replace: bool) -> None:
    dst = out.expanduser().resolve()
    for source in inputs:
        src = _source_path(source)
        if src is None:
            continue
        if dst == src or src in dst.parents or (replace and dst in src.parents):
            rel = "is" if dst == src else "lies inside" if src in dst.parents else "contains"
            raise CramkitError(
                f"--out {out} {rel} {src}, which this command reads; writing it would destroy the source. "
                "Choose an --out outside it"
            )


def check_out(
    out: str | os.PathLike,
    *,
    inputs: Iterable[Any] = (),
    own: Iterable[str] | Mapping[str, Proof] = (),
    replace: bool = False,
    force: bool = False,
    kin: Iterable[str] = (),
    writes: Iterable[str] = (),
    command: str = "this command",
) -> list[str]:
    """The rule for every command that writes a directory ``out``; a CramkitError naming the fix, else the
    entries of ``out`` that will be removed (only with ``replace`` and ``force``: the caller says so).

    - never into its own input: ``out`` is not, and does not lie inside, any of ``inputs`` (paths, ``hf:DIR``
      or loaded models; with ``replace``, it does not contain one either);
    - never over a file, and never ``.`` or ``/`` when it replaces ``out`` as a whole;
    - ``out`` is the command's own earlier output (which it resumes or replaces) only by its manifest: ``own``
      maps each manifest name (a glob) to the fields its JSON object holds, or to a test (:func:`proves`). A
      folder no manifest claims that holds one of those names, or one of ``writes`` (the names the command
      writes there), is refused: a user's file that bears the name is never written over. (A plain list of
      names: the name is the marker, for the commands that replace their output whole, ``replace``.)
    - never over another product: a directory holding a run, a model, an export, an index... that is not the
      command's own is refused, naming what it holds, ``force`` or not;
    - ``replace`` (the command swaps in a new ``out``): only what the command made before is replaced, what
      its manifest (``own``) lists (:func:`stray_entry`); ``force`` also replaces the output of a kindred
      command (``kin``: another export format's), on the same terms. A directory it did not make, or one
      holding anything its manifest does not list (a user's notes, a model two levels down), is refused,
      ``force`` or not: nothing outside the command's own outputs is ever deleted.
    """
    out = Path(out)
    _refuse_inputs(out, inputs, replace)
    if out.exists() and not out.is_dir():
        raise CramkitError(f"--out {out} is a file; give a directory (the file is kept)")
    if not out.is_dir():
        return []
    dst = out.resolve()
    if replace and (dst == Path.cwd().resolve() or dst == Path(dst.anchor)):
        raise CramkitError(f"--out {out} is the current or root directory; choose a new directory")
    proofs = dict(own) if isinstance(own, Mapping) else None
    names = list(own)
    if not replace:
        _check_unreplaced(out, names, proofs, list(writes), command)
        return []
    mine = next((n for n in names if (out / n).is_file() and (proofs is None or proves(out / n, proofs[n]))), None)
    return _check_replaced(out, mine, kin, force)


def _check_unreplaced(
    out: Path, names: list[str], proofs: dict[str, Proof] | None, writes: list[str], command: str
) -> None:
    """``out`` may be written into (not replaced): it is the command's own (its manifest), or it holds
    nothing the command would write over and no other product."""
    if proofs is None:
        if any((out / name).exists() for name in names):
            return
    elif proven(out, proofs) is not None:
        return
    product = holds(out)
    marker = next((name for name, _ in PRODUCTS if (out / name).exists()), None)
    if product is not None and not (proofs is not None and marker in proofs):  # (its own name: no product)
        raise CramkitError(
            f"--out {out} holds {product}; writing there would replace it. Choose another --out (or delete "
            f"{out} yourself)"
        )
    clash = _clash(out, [*names, *writes]) if proofs is not None else None
    if clash is not None:
        raise CramkitError(
            f"--out {out} holds {out / clash}, which {command} would write over, and no manifest there shows "
            f"that {command} wrote it ({names[0]} of cramkit's is missing); choose another --out (a new or "
            f"empty directory), or move {out / clash} away"
        )


def _check_replaced(out: Path, mine: str | None, kin: Iterable[str], force: bool) -> list[str]:
    """The entries of ``out`` a command that replaces its output whole removes (see :func:`check_out`)."""
    entries = sorted(p.name for p in out.iterdir() if p.name != ".lock")
    if not entries:
        return []
    other = None if mine is not None else next((name for name in kin if (out / name).is_file()), None)
    marker = mine or other
    if marker is None:
        inner = next(
            (f"{name}/, {what}" for name in entries if (out / name).is_dir() and (what := holds(out / name))), None
        )
        what = holds(out) or inner or "other files (" + ", ".join(entries[:5]) + ")"
        raise CramkitError(
            f"--out {out} holds {what}, which this command never replaces, --force or not (it replaces only its "
            "own earlier output, what that output's manifest lists); choose another --out (a new or empty "
            f"directory), or move {out}'s contents away yourself"
        )
    stray = stray_entry(out, marker)
    if stray is not None:
        raise CramkitError(
            f"--out {out} holds {stray}, which the output there ({marker}) did not write; replacing that output "
            f"would delete it, --force or not. Move {stray} out of {out}, or choose another --out"
        )
    if other is None:
        return []
    if not force:
        raise CramkitError(
            f"--out {out} holds {holds(out) or 'another export (' + other + ')'}; pass --force to replace it (only "
            f"what its {other} lists), or choose another --out"
        )
    return entries


# entries beyond this many under an output are not walked: no output of cramkit's holds as many
_MOST_ENTRIES = 100_000


def listing(root: str | os.PathLike) -> list[str]:
    """Every file and folder under ``root`` (links not followed), as sorted relative POSIX paths: what an
    output records in its manifest (``"entries"``) so that a later ``--force``/``--overwrite`` replaces
    exactly that (:func:`stray_entry`)."""
    root = Path(root)
    found = []
    for here, dirs, files in os.walk(root):
        rel = Path(here).relative_to(root)
        found += [(rel / name).as_posix() for name in (*dirs, *files)]
    return sorted(found)


def stray_entry(out: str | os.PathLike, marker: str) -> str | None:
    """The first entry under ``out`` that the output whose manifest is ``out/marker`` did not write (its
    ``"entries"``: :func:`listing`), or None. A manifest without that list (written before it existed)
    vouches for its top-level names: the files its ``"files"`` names, its tokenizer, and the names every
    export writes (:data:`EXPORT_NAMES`)."""
    out = Path(out)
    meta = read_manifest(out / marker) or {}
    listed = meta.get("entries")
    exact = isinstance(listed, list) and all(isinstance(x, str) for x in listed)
    if isinstance(listed, list) and exact:
        own = set(listed)
    else:
        files = meta.get("files")
        own = {marker, *EXPORT_NAMES, *(files if isinstance(files, (dict, list)) else ())}
    seen = 0
    for here, dirs, files in os.walk(out):
        rel = Path(here).relative_to(out)
        for name in sorted((*dirs, *files)):
            path = (rel / name).as_posix()
            seen += 1
            if seen > _MOST_ENTRIES:
                return f"over {_MOST_ENTRIES:,} entries"
            if path == ".lock":
                continue
            top = path.split("/", 1)[0]
            if path not in own and (exact or top not in own):
                return path + ("/" if name in dirs else "")
        if not exact and rel == Path("."):
            dirs[:] = []  # (without a list: the top-level names vouch for what lies under them)
    return None


# what an export writes besides its format's own files (a manifest without "entries" vouches for these names)
EXPORT_NAMES = (
    "tokenizer",
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
    "model.safetensors",
    "modeling_cramkit.py",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling",
    "2_Normalize",
)


def check_out_file(out: str | os.PathLike, *, inputs: Iterable[Any] = ()) -> None:
    """The rule for a command that writes one file ``out``: never a directory (it is never replaced by a
    file), never one of its inputs, never inside an input directory."""
    out = Path(out)
    if out.is_dir():
        raise CramkitError(
            f"--out {out} is a directory; give a file name (e.g. {out / 'predictions.jsonl'}); the directory is kept"
        )
    _refuse_inputs(out, inputs, replace=False)
