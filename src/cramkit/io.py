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
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cramkit.errors import CramkitError
from cramkit.outdir import (  # noqa: F401  (the folder rule's home; importable from here as before)
    EXPORT_NAMES,
    PRODUCTS,
    RUN_OUTPUTS,
    check_out,
    check_out_file,
    holds,
    listing,
    stray_entry,
)


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


def special_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` (followed through links) is there and is neither a regular file nor a directory: a
    character device (/dev/null, /dev/full, a terminal), a FIFO, a socket, a block device. A writer never
    renames over one (it would replace the device with a file): it writes through (:func:`write_through`)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def write_through(path: str | os.PathLike, fill: Callable[[Any], object], binary: bool = False) -> Path:
    """Write to the special file ``path`` (:func:`special_file`) in place: opened and written, never renamed
    over. A character device or FIFO takes the bytes (a FIFO waits for its reader); a block device or a socket
    is refused in one line, as is a full or read-only device (:func:`disk_problem`)."""
    path = Path(path)
    mode = os.stat(path).st_mode
    if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        kind = "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file"
        raise CramkitError(f"{path} is {kind}; cramkit writes only files, character devices and pipes: give a file")
    try:
        with open(path, "wb") if binary else open(path, "w", encoding="utf-8", newline="") as f:
            fill(f)
    except OSError as exc:
        problem = disk_problem(exc)
        if problem is None:
            raise
        raise CramkitError(f"cannot write {path}: {problem}; give another file (it was left as it was)") from None
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same directory (to a device or a
    FIFO: straight through, :func:`write_through`)."""
    path = Path(path)
    if special_file(path):
        return write_through(path, lambda f: f.write(text))
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
    ``path`` (an old directory there is removed); on any failure it is deleted. A device or a FIFO at ``path``
    is never replaced: what was written is copied into it (:func:`write_through`)."""
    path = Path(path)
    if special_file(path):
        with _written_through(path) as tmp:
            yield tmp
        return
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


@contextlib.contextmanager
def _written_through(path: Path) -> Iterator[Path]:
    """A temporary path (in the temporary directory, not beside the device: /dev is no place for it) whose
    bytes go to the special file ``path`` once the body has written them."""
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="cramkit-out-"))
    tmp = where / path.name
    try:
        yield tmp
        if tmp.is_dir():
            raise CramkitError(f"{path} is not a directory; a folder cannot be written to it (it is kept)")
        with open(tmp, "rb") as src:
            write_through(path, lambda f: shutil.copyfileobj(src, f), binary=True)
    finally:
        _remove(where)


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
    fields = ("config",) if isinstance(settings, dict) and "config" in settings else tuple(settings or ())
    check_out(directory, own={file_name: fields})  # the settings file proves the folder this verb's
    file = directory / file_name
    if not file.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        write_json_atomic(file, settings)
        return False
    try:
        before = json_loads(json_text(file))  # bounded in size and depth: the file is read back, untrusted
    except (OSError, UnicodeDecodeError, BadJson):
        before = None
    if before != json.loads(json.dumps(settings)):
        raise CramkitError(
            f"--out {directory} holds {what} with other settings ({file}); choose another --out, or delete "
            f"{directory} to start over"
        )
    return True


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


MAX_JSON_DEPTH = 64  # arrays and objects inside each other: cramkit's own files nest a few levels
MAX_JSON_BYTES = 64 << 20  # a JSON file read back whole (a manifest, a record, a cache): at most 64 MiB
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_JSON_EMPTY_PAIR = re.compile(r"\[\]|\{\}")
_JSON_OPENERS = re.compile(rf"[\[{{]{{{MAX_JSON_DEPTH + 1}}}")


def too_deep(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON ``text`` nests arrays and objects more than ``limit`` deep (strings skipped), found at
    C speed: the brackets alone, the innermost pairs removed ``limit`` times."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    if text.count("[") + text.count("{") <= limit:
        return False
    brackets = _JSON_NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    if limit == MAX_JSON_DEPTH and _JSON_OPENERS.search(brackets):
        return True  # the usual bomb, found in one pass
    for _ in range(limit):
        brackets, n = _JSON_EMPTY_PAIR.subn("", brackets)
        if not brackets or not n:
            return False  # all matched, or what is left is not JSON (json.loads says so)
    return bool(brackets)


def json_loads(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)`` with every failure one :class:`BadJson` naming the reason: not JSON, nested more
    than ``max_depth`` deep (checked first: never a RecursionError, here or in whoever walks the value), an
    integer over Python's digit limit (never a bare ValueError). Strings are kept as they are (names and
    paths); text to tokenize is read with :func:`json_row`."""
    if too_deep(text, max_depth):
        raise BadJson("not readable JSON (nested too deep)")  # over max_depth levels
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


def json_text(path: str | os.PathLike, max_bytes: int = MAX_JSON_BYTES) -> str:
    """The UTF-8 text of JSON file ``path``, refused (:class:`BadJson`) over ``max_bytes`` before it is read:
    ``json_loads(json_text(p))`` in place of ``json_loads(p.read_text())`` (the same errors otherwise)."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise BadJson(f"not readable JSON (over {max_bytes:,} bytes, more than such a file holds)")
    return data.decode("utf-8")


def read_json(path: str | os.PathLike, fix: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in ``path``; one clear line ending in ``fix`` when the file is missing, unreadable, over
    ``max_bytes`` or not valid JSON (invalid UTF-8, nesting too deep, an integer too long to convert included)."""
    path = Path(path)
    try:
        return json_loads(json_text(path, max_bytes))
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
