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
        raise CramkitError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise CramkitError(f"{where}: {value!r} is not one of {', '.join(repr(a) for a in allowed)}")
        return value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise CramkitError(f"{where}: expected a list, got {value!r}")
        (inner, *_) = typing.get_args(tp) or (Any,)
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise CramkitError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        section = cast("type[DataclassInstance]", tp)  # a type hint: the class
        if isinstance(value, section):
            return value
        if not isinstance(value, Mapping):
            raise CramkitError(f"{where}: expected a section of settings, got {value!r}")
        return from_dict(section, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise CramkitError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise CramkitError(f"{where}: expected an integer, got {value!r}")
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
        raise CramkitError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise CramkitError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise CramkitError(f"{where}: expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise CramkitError(f"{where}: expected a finite number, got {value!r}; give e.g. {where}=1e-3")
        return number
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise CramkitError(f"{where}: expected a string, got {value!r}")
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
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
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


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CramkitError(f"config file {path} does not exist") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise CramkitError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise CramkitError(f"config file {path} must hold a mapping of settings at the top level")
    return data


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
