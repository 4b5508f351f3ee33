"""Files and directories: atomic writes (a temporary name, then a rename), checksums, paths kept inside a
directory, locks, and the one rule for what a command may write over (:func:`check_out`, :func:`check_out_file`).

A crash (or Ctrl-C, or a full disk) while writing never leaves a half-written file under the final name:
the reader sees the old content or the new, never a mix. Files keep the user's umask (0644 under the
usual 022), unlike ``tempfile.mkstemp``'s private 0600.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from cramkit.errors import CramkitError

P = ParamSpec("P")
R = TypeVar("R")


def _umask_mode(base: int) -> int:
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def clean_stale(path: str | os.PathLike) -> None:
    """Remove what a killed process (kill -9: no cleanup ran) left beside ``path``: the temporary names
    ``.NAME.tmp-PID[-...]`` and ``.NAME.old-PID`` that this module's writers use, where PID no longer runs."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(?:tmp|old)-(\d+)(?:-\w*)?")
    try:
        siblings = list(path.parent.iterdir())
    except OSError:
        return
    for p in siblings:
        m = pattern.fullmatch(p.name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            _remove(p)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _umask_mode(0o666))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` (file or directory) to write; on success it replaces
    ``path`` (an old directory there is removed); on any failure it is deleted."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if path.is_dir() and not path.is_symlink() and not tmp.is_dir():
            raise CramkitError(f"{path} is a directory; it is never replaced by a file (it is kept)")
        if path.is_dir() and not path.is_symlink():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        _remove(tmp)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists() or p.is_symlink():
        p.unlink(missing_ok=True)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def inside(root: str | os.PathLike, name: str) -> Path:
    """``root / name`` if it stays inside ``root`` (no absolute path, no ``..``, no escaping link), else
    a ValueError; for names read from files."""
    root_r = Path(root).resolve()
    target = (root_r / name).resolve()
    if Path(name).is_absolute() or (target != root_r and root_r not in target.parents):
        raise ValueError(f"{name!r} points outside {root}")
    return target


def folder_file(root: str | os.PathLike, name: str) -> Path:
    """``root / name``, a file of a model or tokenizer folder, when it stays inside ``root``: the one path
    rule for every file such a folder opens. A name that climbs out (``..``, absolute) or a link that points
    outside is one CramkitError (a config.json linked to ~/.env would be read). The Hugging Face hub cache is
    the exception: a snapshot's files are links to ``../../blobs/``, inside the model's cache folder."""
    root = Path(root)
    base, rel = root.resolve(), name
    if base.parent.name == "snapshots" and (base.parent.parent / "blobs").is_dir():
        base, rel = base.parent.parent, f"snapshots/{base.name}/{name}"
    try:
        inside(base, rel)
    except ValueError:
        raise CramkitError(
            f"{root / name} is a link to (or names) a file outside {root}; refusing to read it (a model folder's "
            "files stay inside it): copy the file into the folder"
        ) from None
    return root / name


@contextlib.contextmanager
def file_lock(lock_path: str | os.PathLike, busy: Callable[[str], str]) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on ``lock_path`` (which records the holder's pid) while the body runs;
    when another process holds it, one CramkitError with ``busy(its pid)``. The lock dies with its process
    (kill -9 included): no stale lock."""
    import fcntl

    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, _umask_mode(0o666))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            raise CramkitError(busy(other)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def dir_lock(directory: str | os.PathLike, what: str = "--out") -> contextlib.AbstractContextManager[None]:
    """An exclusive lock on ``directory`` (``directory/.lock``, :func:`file_lock`): a second cramkit process on
    the same run directory gets one clear error instead of both writing checkpoints and metrics into it."""
    return file_lock(
        Path(directory) / ".lock",
        lambda pid: (
            f"{what} {directory} is in use by another cramkit process (pid {pid}); wait for it to finish "
            "(or stop it), or choose another directory"
        ),
    )


def claim_dir(directory: str | os.PathLike, file_name: str, settings: Any, what: str) -> bool:
    """Record ``settings`` (JSON) in ``directory/file_name``, or check that they equal those recorded there,
    so that a rerun continues the work of the same settings and never mixes another's into it. Returns
    whether they were recorded before; a CramkitError naming the fix when they differ, or when ``directory``
    holds another command's product (:func:`check_out`)."""
    directory = Path(directory)
    check_out(directory, own=(file_name,))
    file = directory / file_name
    if not file.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        write_json_atomic(file, settings)
        return False
    try:
        before = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        before = None
    if before != json.loads(json.dumps(settings)):
        raise CramkitError(
            f"--out {directory} holds {what} with other settings ({file}); choose another --out, or delete "
            f"{directory} to start over"
        )
    return True


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
    own: Iterable[str] = (),
    replace: bool = False,
    force: bool = False,
    kin: Iterable[str] = (),
) -> list[str]:
    """The rule for every command that writes a directory ``out``; a CramkitError naming the fix, else the
    entries of ``out`` that will be removed (only with ``replace`` and ``force``: the caller says so).

    - never into its own input: ``out`` is not, and does not lie inside, any of ``inputs`` (paths, ``hf:DIR``
      or loaded models; with ``replace``, it does not contain one either);
    - never over a file, and never ``.`` or ``/`` when it replaces ``out`` as a whole;
    - never over another product: a directory holding a run, a model, an export, an index... without any of
      ``own`` (the marker files of this command's own earlier output, which it resumes or replaces) is
      refused, naming what it holds, ``force`` or not;
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
    mine = next((name for name in own if (out / name).is_file()), None)
    if not replace:
        if mine is not None or any((out / name).exists() for name in own):
            return []
        product = holds(out)
        if product is None:
            return []
        raise CramkitError(
            f"--out {out} holds {product}; writing there would replace it. Choose another --out (or delete "
            f"{out} yourself)"
        )
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
    try:
        meta = json_loads((out / marker).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, BadJson):
        meta = None
    meta = meta if isinstance(meta, dict) else {}
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


# write errors that are the disk's, not cramkit's: each becomes one line naming the path and the fix
_DISK = {errno.ENOSPC: "no space left on the device", errno.EROFS: "read-only file system"}
if hasattr(errno, "EDQUOT"):
    _DISK[errno.EDQUOT] = "disk quota exceeded"
_SHORT_WRITE = re.compile(r"\b\d+ requested and \d+ written\b")
_DISK_TEXT = ("No space left on device", "Disk quota exceeded", "Read-only file system", "os error 28")


def disk_problem(exc: BaseException) -> str | None:
    """What is wrong when ``exc`` (or an exception it wraps: torch's exporter, safetensors' Rust errors) is
    a full disk, an exceeded quota or a read-only file system; None for any other error."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _DISK:
            return f"{cur.filename}: {_DISK[cur.errno]}" if cur.filename else _DISK[cur.errno]
        text = str(cur)
        if _SHORT_WRITE.search(text):  # numpy's tofile/save on a full disk: no errno, only the counts
            return "no space left on the device (a write came up short)"
        for needle in _DISK_TEXT:
            if needle in text:
                return "no space left on the device" if needle == "os error 28" else needle.lower()
        cur = cur.__cause__ or cur.__context__
    return None


@contextlib.contextmanager
def disk_errors(out: str | os.PathLike) -> Iterator[None]:
    """Turn a full disk, an exceeded quota or a read-only file system met while writing ``out`` into one
    CramkitError (every other error passes unchanged)."""
    try:
        yield
    except CramkitError:
        raise
    except Exception as exc:
        problem = disk_problem(exc)
        if problem is None:
            raise
        raise CramkitError(
            f"cannot write {out}: {problem}; free space there (or choose another --out) and run the command "
            "again: what was finished is kept"
        ) from None


def writes_to(param: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a verb that writes into its argument ``param``: a full disk (or quota, or read-only file system)
    met while it runs is one line naming that output (:func:`disk_errors`), from Python as from the command
    line. The signature is kept (``inspect.signature`` follows ``__wrapped__``)."""
    import functools
    import inspect

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def verb(*args: P.args, **kwargs: P.kwargs) -> R:
            out = sig.bind_partial(*args, **kwargs).arguments.get(param)
            if out is None:
                return fn(*args, **kwargs)
            with disk_errors(out):
                return fn(*args, **kwargs)

        return verb

    return wrap


def open_memmap(path: str | os.PathLike, dtype: Any, shape: tuple[int, ...]) -> Any:
    """A new ``.npy`` file opened as a writable memory map, its blocks allocated for real (posix_fallocate):
    a full disk fails here, at the start, as one CramkitError, never as a SIGBUS when a sparse page is
    first written hours later."""
    import numpy as np

    path = Path(path)
    try:
        mm = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
        with open(path, "r+b") as f:
            try:
                os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
            except OSError as exc:  # (a file system without fallocate: its blocks come as they are written)
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
    except OSError as exc:
        path.unlink(missing_ok=True)
        problem = disk_problem(exc) or exc.strerror or str(exc)
        need = int(np.prod(shape)) * np.dtype(dtype).itemsize
        raise CramkitError(
            f"cannot allocate {path} ({need / 2**20:,.1f} MiB): {problem}; free space there (or choose another "
            "--out) and run the command again"
        ) from None
    return mm


class BadJson(ValueError):
    """Text that is not JSON cramkit can take; the message is the reason alone ("not valid JSON (...)"), for
    the caller to put after the file and line it read and before the fix."""


class LoneSurrogate(BadJson):
    """JSON whose strings hold a lone UTF-16 surrogate escape (``"\\ud800"``): half of a pair, not text."""


# an escaped UTF-16 surrogate: the parsed strings may hold a lone one (only then is the value walked)
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # in a parsed str, a pair is one code point: these are lone
SURROGATE_HINT = "half of a UTF-16 pair, common in scraped data"


def lone_surrogate(value: Any) -> bool:
    """Whether any string in a parsed JSON value (keys included) holds a lone UTF-16 surrogate."""
    stack = [value]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x)
            stack.extend(x.values())
    return False


def _replace_surrogates(value: Any, errors: str) -> Any:
    if isinstance(value, str):
        if not lone_surrogate(value):
            return value
        return _SURROGATE.sub("\ufffd" if errors == "replace" else "", value)
    if isinstance(value, list):
        return [_replace_surrogates(v, errors) for v in value]
    if isinstance(value, dict):
        return {_replace_surrogates(k, errors): _replace_surrogates(v, errors) for k, v in value.items()}
    return value


def json_loads(text: str | bytes) -> Any:
    """``json.loads(text)`` with every failure one :class:`BadJson` naming the reason: not JSON, nested too
    deep (never a RecursionError), an integer over Python's digit limit (never a bare ValueError). Strings
    are kept as they are (names and paths); text to tokenize is read with :func:`json_row`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadJson(f"not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise BadJson("not readable JSON (nested too deep)") from None
    except ValueError as exc:  # json.loads' only other failure: an integer over Python's digit limit
        if "digit" not in str(exc):
            raise BadJson(f"not valid JSON ({str(exc)[:120]})") from None
        raise BadJson(f"not readable JSON (an integer of over {sys.get_int_max_str_digits()} digits)") from None


def json_row(line: str, errors: str = "strict") -> tuple[Any, bool]:
    """A row of a JSON Lines file of text: its value, and whether lone surrogates in its strings were replaced
    or dropped (``errors`` "replace" or "ignore", as the user's ``--errors``); with "strict" they are a
    :class:`LoneSurrogate`. Every other failure is a :class:`BadJson` (see :func:`json_loads`)."""
    value = json_loads(line)
    if not SURROGATE_ESCAPE.search(line) or not lone_surrogate(value):
        return value, False
    if errors == "strict":
        raise LoneSurrogate(f"not text: a lone surrogate escape such as \\ud800 ({SURROGATE_HINT})")
    return replace_surrogates(value, errors), True


def replace_surrogates(value: Any, errors: str = "replace") -> Any:
    """``value`` (parsed JSON) with every lone UTF-16 surrogate in its strings replaced by U+FFFD (``errors``
    "replace") or removed ("ignore")."""
    try:
        return _replace_surrogates(value, errors)
    except RecursionError:
        raise BadJson("not readable JSON (nested too deep)") from None


def read_json(path: str | os.PathLike, fix: str) -> Any:
    """The JSON value in ``path``; one clear line ending in ``fix`` when the file is missing, unreadable or
    not valid JSON (invalid UTF-8, nesting too deep, an integer too long to convert included)."""
    path = Path(path)
    try:
        return json_loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CramkitError(f"{path} is missing; {fix}") from None
    except BadJson as exc:
        raise CramkitError(f"{path} is {exc}; {fix}") from None
    except (ValueError, OSError) as exc:
        raise CramkitError(f"{path} is not valid JSON ({str(exc)[:200]}); {fix}") from None


def read_json_object(path: str | os.PathLike, fix: str) -> dict[str, Any]:
    """The JSON object in ``path`` ({} when there is no such file); one clear line ending in ``fix`` when it
    is not valid JSON or not an object."""
    path = Path(path)
    if not path.is_file():
        return {}
    data = read_json(path, fix)
    if not isinstance(data, dict):
        raise CramkitError(f"{path} does not hold a JSON object; {fix}")
    return data


def check_fields(meta: dict[str, Any], types: dict[str, Any], file: str | os.PathLike, fix: str) -> None:
    """A CramkitError naming the first field of ``meta`` (a manifest read from ``file``) whose value is not of
    its type in ``types`` (a type, a tuple of types, or a tuple of allowed strings); absent fields and nulls
    pass. ``fix`` ends the message ("export the model again")."""
    for name, want in types.items():
        value = meta.get(name)
        if value is None:
            continue
        if isinstance(want, tuple) and all(isinstance(w, str) for w in want):
            ok, what = value in want, "one of " + ", ".join(want)
        else:
            ok = isinstance(value, want) and not (isinstance(value, bool) and want is int)
            what = "a JSON " + {
                int: "integer",
                str: "string",
                bool: "boolean",
                dict: "object",
                list: "array",
            }.get(want, getattr(want, "__name__", str(want)))
        if not ok:
            raise CramkitError(f"{file}: field {name!r} must be {what}, got {json.dumps(value)[:60]}; {fix}")
