"""An index directory, its layout and its manifest::

    IDX/index.json        the manifest, written last (its presence means the index is complete)
    IDX/encoder/          a copy of the encoder (a model directory): queries are embedded with exactly it
    IDX/data-NNN/         vectors.npy (float32 [n, dim], L2-normalised), faiss.index (none for exact
                          search), chunks.npy, text_offsets.npy, texts.bin, doc_hash.npy
    IDX/.build/, .add/    work in progress (embeddings being written, resumable); never read by ``open``

``index add`` writes a new ``data-NNN`` next to the old one and switches the manifest to it in one atomic
rename, so a crash at any point leaves the previous, complete index. Paths in the manifest must stay inside
IDX; every file opened must be recorded there and is checked against the size recorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cramkit.errors import CramkitError
from cramkit.index import ann
from cramkit.io import BadJson, inside, json_loads, json_text

MANIFEST = "index.json"
FORMAT = "cramkit-index-1"
MODES = ("passages", "retro")
DATA_FILES = ("vectors.npy", "chunks.npy", "text_offsets.npy", "texts.bin", "doc_hash.npy")


def file_sizes(d: Path) -> dict[str, int]:
    """The size of each file of a data folder (what the manifest records)."""
    return {f.name: f.stat().st_size for f in sorted(d.iterdir()) if f.is_file()}


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of the index at ``root``, checked: its format, its fields' types, its mode and kind."""
    file = root / MANIFEST
    if not root.is_dir():
        raise CramkitError(f"{root}: no such index directory; build one with `cramkit index build`")
    if not file.is_file():
        hint = " (an interrupted build: rerun it to resume)" if (root / ".build").exists() else ""
        raise CramkitError(f"{root} is not a finished index: {MANIFEST} is missing{hint}")
    try:
        m = json_loads(json_text(file))
    except BadJson as exc:
        raise CramkitError(f"{file} is {exc}; the index is damaged, rebuild it") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CramkitError(f"{file} is not valid JSON ({exc}); the index is damaged, rebuild it") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise CramkitError(f"{file}: not a cramkit index manifest (format {FORMAT} expected)")
    for name, typ in (
        ("data", str),
        ("count", int),
        ("dim", int),
        ("mode", str),
        ("plan", dict),
        ("encoder", dict),
        ("files", dict),
    ):
        if not isinstance(m.get(name), typ):
            raise CramkitError(f"{file}: field {name!r} is missing or not a {typ.__name__}; rebuild the index")
    if m["mode"] not in MODES or m["plan"].get("kind") not in ann.KINDS[1:]:
        raise CramkitError(f"{file}: unknown mode or index kind; rebuild the index")
    cut = m["encoder"].get("dimensions")
    if cut is not None and (not isinstance(cut, int) or isinstance(cut, bool) or cut != m["dim"]):
        raise CramkitError(f"{file}: encoder.dimensions {cut!r} is not the vectors' size {m['dim']}; rebuild the index")
    prompts = m.get("prompts")
    if prompts is not None and not (
        isinstance(prompts, dict)
        and all(isinstance(prompts.get(s), dict) and isinstance(prompts[s].get("text"), str) for s in prompts)
    ):
        raise CramkitError(f"{file}: field 'prompts' is malformed; rebuild the index")
    return m


def inside_index(root: Path, name: Any, what: str) -> Path:
    """``root / name`` for a ``name`` the manifest gives (``what``), which must stay inside ``root``."""
    if not isinstance(name, str) or not name:
        raise CramkitError(f"{root / MANIFEST}: {what} is not a path name; rebuild the index")
    try:
        return inside(root, name)
    except ValueError:
        raise CramkitError(
            f"{root / MANIFEST}: {what} {name!r} points outside the index directory; refusing to read it"
        ) from None
