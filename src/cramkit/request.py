"""A verb's request: one dataclass declares what the verb takes, once. From it come

- the command line (:func:`add_arguments`: each field's flag, type, choices, metavar and help, its default said
  in the help), read back by :func:`from_args`;
- the Python function (:func:`verb`: ``cramkit.embed(source, model, out, ...)`` takes the request's fields as its
  keywords, or one request);
- the settings file (:func:`write_request`, :func:`read_request`: what ``--print-config`` writes and ``--config``
  and torchrun's workers read: YAML under the verb's name).

A field is declared with :func:`param`::

    @dataclass(kw_only=True)
    class EmbedRequest:
        source: str = param(positional=True, metavar="SOURCE", help="the text file or token store")
        model: str = param(flags=("--from",), metavar="MODEL", help="the encoder")
        block: int = param(1024, metavar="N", help="rows embedded between two commits")
        progress: bool = param(True, flags=("--no-progress",), help="no progress bar")

A ``bool`` field is a switch (``--flag`` sets it; a field that defaults to True is cleared by its flag:
``--no-progress``); ``list[str]`` is a repeatable flag (``--set A --set B``) or, positional, any number of words.
Groups of fields several verbs share are dataclasses too (``kw_only``), mixed into a verb's request. This module
imports nothing heavy: ``cramkit --help`` builds every parser from the declarations.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from cramkit.errors import CramkitError

P = ParamSpec("P")
Q = TypeVar("Q", contravariant=True)
R = TypeVar("R", covariant=True)
T = TypeVar("T")


class Verb(Protocol[Q, P, R]):
    """A verb function: called with one request, or with the request's fields."""

    @overload
    def __call__(self, request: Q, /) -> R: ...
    @overload
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...


@dataclass(frozen=True)
class Flag:
    """How a request field appears on the command line."""

    help: str
    flags: tuple[str, ...] = ()  # default: --the-field-name
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    positional: bool = False
    nargs: str | None = None
    group: str | None = None  # the title of the help's argument group
    required: bool = False
    command_line: bool = True  # False: a Python keyword only (a loaded model, a callback)


def param(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    flags: tuple[str, ...] = (),
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    positional: bool = False,
    nargs: str | None = None,
    group: str | None = None,
    required: bool = False,
    command_line: bool = True,
) -> Any:
    """A request field: its default (a list default is copied per request) and how the command line shows it."""
    flag = Flag(help, flags, metavar, choices, positional, nargs, group, required, command_line)
    meta = {"flag": flag}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=functools.partial(type(default), default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _flag(field: dataclasses.Field) -> Flag | None:
    return field.metadata.get("flag")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _base_type(hint: Any) -> Any:
    """``int | None`` -> int; ``list[str]`` -> list."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        return _base_type(kinds[0]) if kinds else str
    return typing.get_origin(hint) or hint


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def add_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    helps: dict[str, str] | None = None,
    skip: tuple[str, ...] = (),
) -> None:
    """The flags of ``cls``'s fields on ``parser`` (``helps`` replaces a field's help for this verb; ``skip``
    leaves fields out), in declaration order, grouped by their ``group``."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    own = vars(cls).get("__annotations__", {})  # the verb's own fields first, then the groups it mixes in
    for field in sorted(dataclasses.fields(cls), key=lambda f: f.name not in own):
        flag = _flag(field)
        if flag is None or not flag.command_line or field.name in skip:
            continue
        where: Any = parser
        if flag.group:
            where = groups.get(flag.group) or groups.setdefault(flag.group, parser.add_argument_group(flag.group))
        kind, default = _base_type(_hints(cls)[field.name]), _default(field)
        text = (helps or {}).get(field.name, flag.help)
        kw: dict[str, Any] = {"dest": field.name, "help": _with_default(text, default, kind)}
        if flag.metavar:
            kw["metavar"] = flag.metavar
        if flag.choices:
            kw["choices"] = flag.choices
        if kind is bool:  # a switch; one that defaults to None is three-way: --flag, --no-flag or neither
            switch = "store_false" if default else "store_true"
            kw.update(action=argparse.BooleanOptionalAction if default is None else switch, default=default)
            kw.pop("metavar", None)
        elif kind is list:
            kw.update(nargs=flag.nargs or "*", default=default) if flag.positional else kw.update(
                action="append", default=default
            )
        else:
            kw.update(type=kind if kind in (int, float) else str, default=default)
            if flag.nargs:
                kw["nargs"] = flag.nargs
        if flag.positional:
            kw.pop("dest")
            where.add_argument(field.name, **kw)
        else:
            kw["required"] = flag.required
            where.add_argument(*(flag.flags or (f"--{field.name.replace('_', '-')}",)), **kw)


def _with_default(text: str, default: Any, kind: Any) -> str:
    """The help, saying the default where the field has one worth saying (read from the default itself)."""
    if "%(default)" in text or "default" in text or kind in (bool, list) or default in (None, ""):
        return text
    return f"{text} (default: %(default)s)"


def from_args(cls: Callable[..., T], args: argparse.Namespace) -> T:
    """The request the parsed command line gives (a repeatable flag never given is its default)."""
    given: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if _flag(field) is None or not hasattr(args, field.name):
            continue
        value = getattr(args, field.name)
        given[field.name] = _default(field) if value is None and _is_list(cls, field) else value
    return cls(**given)


def _is_list(cls: Any, field: dataclasses.Field) -> bool:
    return _base_type(_hints(cls)[field.name]) is list


def verb(request: Callable[P, Q], *, rest: str | None = None) -> Callable[[Callable[[Q], T]], Verb[Q, P, T]]:
    """A verb function from its request and the function that does the work on one: ``cramkit.embed(...)`` takes
    the request's fields as arguments (its signature is the request's), or one request as it is. ``rest`` names a
    dict field that takes the keywords that are not fields (``cramkit.finetune(run, task=..., lr=2e-5)``: the
    settings)."""
    names = {f.name for f in dataclasses.fields(request)}  # type: ignore[arg-type]

    def wrap(work: Callable[[Q], T]) -> Verb[Q, P, T]:
        @functools.wraps(work)
        def call(*args: Any, **kwargs: Any) -> T:
            if len(args) == 1 and not kwargs and isinstance(args[0], request):  # type: ignore[arg-type]
                return work(args[0])
            if rest is not None:
                extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in names}
                kwargs[rest] = {**kwargs.get(rest, {}), **extra}
            return work(request(*args, **kwargs))

        signature = inspect.signature(request)
        params = [p for p in signature.parameters.values() if p.name != rest]
        if rest is not None:
            params.append(inspect.Parameter(rest, inspect.Parameter.VAR_KEYWORD, annotation=Any))
        call.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=params, return_annotation=inspect.signature(work).return_annotation
        )
        return call

    return wrap


def as_dict(request: Any) -> dict[str, Any]:
    """The request's command-line fields as plain YAML values (paths as text)."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(request):
        flag = _flag(field)
        if flag is None or not flag.command_line:
            continue
        value = getattr(request, field.name)
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        elif isinstance(value, (list, tuple)):
            value = [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
        out[field.name] = value
    return out


def write_request(request: Any, verb_name: str, path: str | os.PathLike | None = None) -> str:
    """The request as YAML under ``verb_name`` (what ``--print-config`` prints); written to ``path`` if given."""
    import yaml

    text = yaml.safe_dump({verb_name: as_dict(request)}, sort_keys=False)
    if path is not None:
        from cramkit.io import write_text_atomic

        write_text_atomic(Path(path), text)
    return text


def read_request(cls: Callable[..., T], path: str | os.PathLike, verb_name: str, **given: Any) -> T:
    """The request a settings file holds (YAML under ``verb_name``, or its fields at the top), ``given`` on top;
    an unknown field or a wrong type is one line naming the file."""
    from cramkit.config import load_yaml

    data = load_yaml(Path(path))
    section = data.get(verb_name, data) if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise CramkitError(f"{path}: expected the fields of {verb_name} (a mapping under '{verb_name}:')")
    known = {f.name: f for f in dataclasses.fields(cls) if _flag(f) is not None}  # type: ignore[arg-type]
    for key, value in section.items():
        if key not in known:
            import difflib

            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f" (fields: {', '.join(known)})"
            raise CramkitError(f"{path}: unknown field '{key}' of {verb_name}{hint}")
        _check_type(cls, known[key], value, path)
    return cls(**{**section, **given})


def _check_type(cls: Any, field: dataclasses.Field, value: Any, path: str | os.PathLike) -> None:
    kind = _base_type(_hints(cls)[field.name])
    if value is None or kind is Any or kind is object:
        return
    ok = (
        isinstance(value, list)
        if kind is list
        else isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    )
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise CramkitError(f"{path}: '{field.name}' must be {kind.__name__}, got {value!r}")


@dataclass(kw_only=True)
class Training:
    """What every training verb takes: settings (``--set KEY=VALUE``), the progress bar, experiment trackers."""

    overrides: list[str] = param(
        [], flags=("--set",), metavar="KEY=VALUE", help="override a setting, e.g. --set lr=1e-3 (repeatable)"
    )
    progress: bool = param(True, flags=("--no-progress",), help="no progress bar")
    report_to: str | list[str] | None = param(
        None,
        metavar="TRACKERS",
        help="also send the training metrics (metrics.jsonl's records) and the configuration to: none (the "
        "default), tensorboard, wandb, mlflow, trackio; several comma-separated. Their files go into the run "
        "directory (RUN/tb, RUN/wandb, RUN/mlruns, RUN/trackio) unless WANDB_DIR, MLFLOW_TRACKING_URI or "
        "TRACKIO_DIR say otherwise",
    )
