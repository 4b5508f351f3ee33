"""Typed configs: dataclasses, YAML presets, dotted ``key=value`` overrides, clear validation errors.

Each layer owns the dataclass of its own settings (``cramkit.model.encoder.ModelConfig``,
``cramkit.data.mlm.DataConfig``, ``cramkit.train.config.TrainConfig``, ...); this module only knows how to
build any dataclass from a nested dict, strictly: an unknown key is an error that lists the valid
ones, a value of the wrong type is an error that names the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import yaml

from cramkit.errors import CramkitError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
PRESET_DIR = Path(__file__).parent / "presets"


def _show(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error line never echoes a whole file's value."""
    text = repr(value) if not isinstance(value, (list, dict)) or len(value) < 64 else f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _suggest(key: str, valid: Iterable[str]) -> str:
    valid = list(valid)
    starts = [v for v in valid if v.startswith(key)] if key else []  # 'tiny': tiny-cpu and tiny-zh alike
    if len(starts) > 1:
        return " (did you mean " + " or ".join(f"'{v}'" for v in starts) + "?)"
    close = starts or difflib.get_close_matches(key, valid, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert ``value`` to the annotated type ``tp`` or raise a CramkitError naming ``where``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except CramkitError as exc:
                errors.append(str(exc))
        raise CramkitError(errors[0] if errors else f"{where}: invalid value {_show(value)}")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise CramkitError(f"{where}: {_show(value)} is not one of {', '.join(repr(a) for a in allowed)}")
        return value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise CramkitError(f"{where}: expected a list, got {_show(value)}")
        (inner, *_) = typing.get_args(tp) or (Any,)
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise CramkitError(f"{where}: expected a mapping, got {_show(value)}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        section = cast("type[DataclassInstance]", tp)  # a type hint: the class
        if isinstance(value, section):
            return value
        if not isinstance(value, Mapping):
            raise CramkitError(f"{where}: expected a section of settings, got {_show(value)}")
        return from_dict(section, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise CramkitError(f"{where}: expected true or false, got {_show(value)}")
    if tp is int:
        if isinstance(value, bool):
            raise CramkitError(f"{where}: expected an integer, got {_show(value)}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                f = float(value)
            except ValueError:
                f = None
            if f is not None and f.is_integer():
                return int(f)
        raise CramkitError(f"{where}: expected an integer, got {_show(value)}")
    if tp is float:
        if isinstance(value, bool):
            raise CramkitError(f"{where}: expected a number, got {_show(value)}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise CramkitError(f"{where}: expected a number, got {_show(value)}") from None
        if not math.isfinite(number):
            raise CramkitError(f"{where}: expected a finite number, got {_show(value)}; give e.g. {where}=1e-3")
        return number
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise CramkitError(f"{where}: expected a string, got {_show(value)}")
    return value


def from_dict(cls: type[T], data: Mapping[str, Any] | None, where: str = "config") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys and bad values raise CramkitError."""
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        raise CramkitError(
            f"unknown setting '{_join(where, key)}'{_suggest(key, fields)}; "
            f"valid settings in '{where}': {', '.join(sorted(fields))}"
        )
    kwargs = {k: _coerce(v, hints[k], _join(where, k)) for k, v in data.items()}
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise CramkitError(f"{where}: {exc}") from None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


def _join(prefix: str, key: str) -> str:
    return key if prefix in ("", "config") else f"{prefix}.{key}"


def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass as plain nested dicts (for YAML/JSON)."""
    return dataclasses.asdict(obj)


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["train.lr=1e-3", "model.layers=4"]`` -> nested dict; values parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise CramkitError(f"--set {item!r}: expected key=value, e.g. --set train.lr=1e-3")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise CramkitError(f"--set {item!r}: the key is empty")
        try:
            value = parse_yaml(raw, f"--set {key[:80]}") if raw.strip() else ""
        except (yaml.YAMLError, _Alias):  # not YAML (an alias included): the text as it is
            value = raw
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise CramkitError(f"--set {item!r}: '{part}' is set both as a value and as a section")
        node[parts[-1]] = value
    return out


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``update`` into a copy of ``base``."""
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


# a settings file (--config, --preset FILE, a run's config.yaml) is small and flat: bounded before anything is built
SETTINGS_BYTES = 1 << 20
SETTINGS_DEPTH = 8  # sections inside each other (a run's config.yaml nests 3)
NUMBER_CHARS = 100  # the longest number a setting takes (Python's int() refuses over 4,300 digits)
KEY_CHARS = 200
ERROR_CHARS = 300  # a YAML parser's message, on one line, cut to this


class _Alias(CramkitError):
    """A YAML anchor or alias: refused in a settings file (one ``&x`` expanded by ``*x`` grows without bound);
    an ``--set`` value holding one is taken as text."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def _scan_yaml(text: str, where: str) -> None:
    """Walk the YAML events of ``text`` (the parser alone: nothing built, no alias expanded) and refuse, in one
    line naming ``where`` and the key, an anchor or alias, nesting deeper than SETTINGS_DEPTH, a key longer than
    KEY_CHARS and a number longer than NUMBER_CHARS. yaml.YAMLError for text that is not YAML."""
    levels: list[list[Any]] = []  # each open mapping ["map", key, awaiting a key] or sequence ["seq", index, None]
    resolver = yaml.resolver.Resolver()

    def here() -> str:
        parts = [f"[{at}]" if kind == "seq" else ("." if i else "") + str(at) for i, (kind, at, _) in enumerate(levels)]
        path = "".join(p for p in parts if p not in ("None", ".None"))
        return f"{where}: {path}" if path else where

    def done() -> None:  # a node ended: its sequence's next item, or its mapping's value or next key
        if levels and levels[-1][0] == "seq":
            levels[-1][1] += 1
        elif levels:
            levels[-1][2] = not levels[-1][2]

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _Alias(f"{here()} uses a YAML anchor or alias (& or *); write each setting out in full")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(levels) >= SETTINGS_DEPTH:
                raise CramkitError(f"{here()} nests over {SETTINGS_DEPTH} levels deep; settings are flat")
            levels.append(["map", None, True] if isinstance(event, yaml.MappingStartEvent) else ["seq", 0, None])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            levels.pop()
            done()
        elif isinstance(event, yaml.ScalarEvent):
            value = event.value
            tag = event.tag if event.tag not in (None, "!") else None
            if tag is None and event.implicit[0]:
                tag = resolver.resolve(yaml.ScalarNode, value, (True, False))
            if str(tag).endswith((":int", ":float")) and len(value) > NUMBER_CHARS:
                raise CramkitError(
                    f"{here()} is a number of {len(value):,} characters; a setting's number has at most {NUMBER_CHARS}"
                )
            if levels and levels[-1][0] == "map" and levels[-1][2]:  # a key
                if len(value) > KEY_CHARS:
                    raise CramkitError(f"{here()} has a key of {len(value):,} characters; no setting has")
                levels[-1][1] = value
            done()


def parse_yaml(text: str | bytes, where: str) -> Any:
    """The YAML value of settings ``text`` (``where`` names it in errors), read safely: UTF-8 text only, then
    :func:`_scan_yaml`'s bounds before anything is built, then ``yaml.safe_load``. Every failure is one
    CramkitError line, except text that is not YAML: yaml.YAMLError (:func:`load_yaml` says it in one line)."""
    if isinstance(text, bytes):
        if text.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise CramkitError(f"{where} is UTF-16 text; save it as UTF-8")
        if b"\x00" in text:
            raise CramkitError(f"{where} is a binary file, not YAML text; give a YAML file of settings (key: value)")
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise CramkitError(f"{where} is not UTF-8 text (byte {exc.start:,}); save it as UTF-8") from None
    _scan_yaml(text, where)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # a value YAML's constructors refuse
        raise CramkitError(f"{where} holds a value that cannot be read ({_one_line(exc)})") from None


def section_file(path: str | os.PathLike, section: str) -> dict[str, Any]:
    """The settings in a verb's settings file ``path``: what its ``--print-config`` writes (``SECTION:`` and the
    fields under it) or the fields alone, read as every settings file is (:func:`load_yaml`: bounded, one line
    when bad). The one reader of that shape, for ``--config FILE`` and the Python verbs' ``config=FILE`` alike."""
    data = load_yaml(Path(path))
    if isinstance(data.get(section), dict) and len(data) == 1:
        return dict(data[section])
    return data


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The settings of the YAML file ``path`` as a nested dict: at most SETTINGS_BYTES, read by
    :func:`parse_yaml`; every failure one line naming the file (and the key)."""
    path = Path(path)
    where = f"config file {path}"
    try:
        with open(path, "rb") as fh:
            raw = fh.read(SETTINGS_BYTES + 1)
    except FileNotFoundError:
        raise CramkitError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise CramkitError(f"{where} cannot be read ({exc.strerror or exc}); give a YAML file of settings") from None
    if len(raw) > SETTINGS_BYTES:
        raise CramkitError(f"{where} is over {SETTINGS_BYTES >> 20} MiB; a settings file is a few lines of key: value")
    try:
        data = parse_yaml(raw, where) or {}
    except yaml.YAMLError as exc:
        raise CramkitError(f"{where} is not valid YAML: {_one_line(exc)}") from None
    if not isinstance(data, dict):
        raise CramkitError(f"config file {path} must hold a mapping of settings at the top level")
    return data


DEFAULT_PRESET = "tiny-cpu"  # the preset of a run given none (tiny-zh for Chinese text: recipes.pretrain)


def start_preset(preset: str | None, from_model: bool = False) -> str:
    """The preset a run starts from: the one given, else ``continue`` when it continues a model, else the default."""
    return preset or ("continue" if from_model else DEFAULT_PRESET)


def load_preset(name: str) -> dict[str, Any]:
    """A preset by name (``tiny-cpu``) or a path to a YAML file, as a nested dict."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        return load_yaml(name)
    path = PRESET_DIR / f"{name}.yaml"
    if not path.exists():
        raise CramkitError(
            f"unknown preset '{name}'{_suggest(name, list_presets())}; "
            f"known presets: {', '.join(list_presets())} (or give a path to a YAML file)"
        )
    return load_yaml(path)
