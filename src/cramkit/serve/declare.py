"""Request bodies declared once: the body's reading and its OpenAPI schema both derive from one declaration.

A body is a frozen dataclass (a :class:`Body`) whose fields are made by :func:`declare` from a :class:`Spec`,
which knows how to read its field from the JSON object (each wrong value a one-line 4xx, the text-embeddings-
inference shape of error) and how to describe it in JSON Schema::

    @dataclass(frozen=True)
    class FillMaskRequest(Body):
        inputs: Inputs = declare(Texts())
        top_k: int = declare(Integer(5, 1, 100))

``FillMaskRequest.parse(body, ctx)`` reads the fields in the order declared (the first wrong one is the
answer, as a hand-written reader would) and ``FillMaskRequest.openapi()`` is the route's ``requestBody``:
the properties, their types, defaults and bounds, and the required ones. A field's key in the body is its
name. Specs that depend on the model (its prompts, its Matryoshka dimensions, whether it picks among choices)
read it from the :class:`Context`.

Pydantic is not used for the reading: it collects a missing field's error and goes on to the next, coerces
("yes" is true in lax mode), and its error lists would have to be translated back into these lines.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from cramkit.errors import CramkitError
from cramkit.infer.engine import MIN_CHOICES
from cramkit.io import SURROGATE_ESCAPE, lone_surrogate
from cramkit.serve.guard import Limits, invalid

SPEC = "cramkit.serve.spec"  # a field's metadata key for its Spec
B = TypeVar("B", bound="Body")


@dataclass(frozen=True)
class Context:
    """What a body is read against: the server's limits, and the model the request picked (its engine and
    name; None for /search, which reads no model)."""

    limits: Limits
    engine: Any = None
    name: str = ""


def describe(x: Any) -> str:
    """A JSON value's kind, as an error line names it: "a number", "a list", "null"."""
    return {
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
    }.get(type(x), "null" if x is None else type(x).__name__)


async def read_json(request: Any) -> dict:
    """The request's body as a JSON object: 400 for bytes that are not UTF-8 JSON Python can take as text (a
    lone surrogate escape, nesting too deep, an integer of thousands of digits), 422 for JSON that is not an
    object. Read once per request (a route that hands the request to another's handler, as POST / does, reads
    the same object)."""
    state = getattr(request, "state", None)
    known = getattr(state, "cramkit_body", None)
    if isinstance(known, dict):
        return known
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(f"the body is not valid UTF-8 (byte {exc.start}); send UTF-8 JSON", 400) from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid(f"the body is not valid JSON ({exc.msg} at position {exc.pos})", 400) from None
    except RecursionError:
        raise invalid("the body's JSON nests too deep to read; send flat JSON", 400) from None
    except ValueError:  # the only other failure of json.loads: an integer over Python's digit limit
        raise invalid(
            f"the body holds an integer of over {sys.get_int_max_str_digits()} digits; send ordinary numbers", 400
        ) from None
    if SURROGATE_ESCAPE.search(text) and lone_surrogate(body):
        raise invalid(
            "the body holds a lone UTF-16 surrogate escape (such as \\ud800), which is not text; send valid Unicode",
            400,
        )
    if not isinstance(body, dict):
        raise invalid(f"the body must be a JSON object, not {type(body).__name__}")
    if state is not None:
        state.cramkit_body = body
    return body


# ------------------------------------------------------------------------------------------ the body


def declare(spec: Spec) -> Any:
    """A body's field, read and described by ``spec``."""
    return dataclasses.field(metadata={SPEC: spec})


class Body:
    """A request body: a frozen dataclass whose fields are made by :func:`declare` (see the module's docstring)."""

    @classmethod
    def specs(cls) -> list[tuple[str, Spec]]:
        """(key, spec) per field, in the order declared."""
        return [(f.name, f.metadata[SPEC]) for f in dataclasses.fields(cast(Any, cls))]

    @classmethod
    def parse(cls: type[B], body: dict[str, Any], ctx: Context) -> B:
        """The body read field by field in the order declared (the first wrong field is the ApiError), then
        :meth:`check`."""
        out: B = cast(Any, cls)(**{key: spec.read(body, key, ctx) for key, spec in cls.specs()})
        out.check(ctx)
        return out

    def check(self, ctx: Context) -> None:
        """What a body checks once every field is read (a field against a limit after the others, say)."""

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The JSON Schema of the body: an object of the declared fields."""
        specs = cls.specs()
        return {
            "type": "object",
            "properties": {key: spec.schema() for key, spec in specs},
            "required": [key for key, spec in specs if spec.required],
        }

    @classmethod
    def openapi(cls) -> dict[str, Any]:
        """The route's OpenAPI ``requestBody`` (FastAPI's ``openapi_extra``)."""
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": cls.schema()}}}}


# ------------------------------------------------------------------------------------------ what a field is


class Spec:
    """How one field is read from a body and described in its schema."""

    required = False
    description: str | None = None

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> Any:
        raise NotImplementedError

    def shape(self) -> dict[str, Any]:
        """The field's JSON Schema, without its description."""
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        return {**self.shape(), **({"description": self.description} if self.description else {})}


@dataclass(frozen=True)
class Inputs:
    """A request's inputs: the texts (or (text, text) pairs), and whether the body gave one, unlisted (an
    answer for one input is not wrapped in a list)."""

    items: list[Any]
    single: bool


@dataclass(frozen=True)
class Texts(Spec):
    """A string or a list of them, each within the limits (``pairs``: a [text, text] pair, or a list of
    strings and pairs, as TEI's /predict reads them)."""

    pairs: bool = False
    description: str | None = None
    required = True

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> Inputs:
        x = body.get(key)
        two = isinstance(x, list) and len(x) == 2 and all(isinstance(s, str) for s in x)
        single = isinstance(x, str) or (self.pairs and two)
        if self.pairs and two and ctx.engine.trained_inputs == "single":
            raise invalid(
                f"model {ctx.name} was fine-tuned on single texts, and a flat list of two strings is one text pair "
                '(TEI\'s convention): send [["first"], ["second"]] for two texts, or [["text", "text b"]] for a pair'
            )
        return Inputs(self._items(body, key, ctx.limits), single)

    def _items(self, body: dict[str, Any], key: str, limits: Limits) -> list[Any]:
        if key not in body:
            raise invalid(f"missing field '{key}': give a string or a list of strings")
        x = body[key]
        if isinstance(x, str):
            items: list[Any] = [x]
        elif isinstance(x, list):
            if not x:
                raise invalid(f"'{key}' is an empty list; give at least one input", error_type="Empty")
            if self.pairs and len(x) == 2 and all(isinstance(s, str) for s in x):
                items = [(x[0], x[1])]  # TEI: ["a", "b"] is one pair
            else:
                items = x
        else:
            raise invalid(f"'{key}' must be a string or a list of strings, not {describe(x)}")
        if len(items) > limits.max_inputs:
            raise invalid(
                f"{len(items)} inputs in one request; the limit is {limits.max_inputs}: split the request", 413
            )
        out: list[Any] = []
        for i, it in enumerate(items):
            if isinstance(it, str):
                out.append(it)
            elif (
                self.pairs
                and isinstance(it, (list, tuple))
                and 1 <= len(it) <= 2
                and all(isinstance(s, str) for s in it)
            ):
                out.append(it[0] if len(it) == 1 else (it[0], it[1]))
            else:
                want = "a string or a [text, text] pair" if self.pairs else "a string"
                raise invalid(f"{key}[{i}] is {describe(it)}; each input must be {want}")
            chars = len(it) if isinstance(it, str) else sum(len(s) for s in it)
            if chars > limits.max_input_chars:
                raise invalid(
                    f"{key}[{i}] has {chars} characters; the limit is {limits.max_input_chars} per input", 413
                )
        return out

    def shape(self) -> dict[str, Any]:
        item: dict[str, Any] = {"type": "string"}
        if self.pairs:
            pair = {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2}
            item = {"oneOf": [item, pair]}
        return {"oneOf": [{"type": "string"}, {"type": "array", "items": item, "minItems": 1}]}


@dataclass(frozen=True)
class ChoiceInputs:
    """A multiple-choice request's inputs: per input its context and its choices; ``single``: one object."""

    single: bool
    contexts: list[str]
    choices: list[list[str]]


@dataclass(frozen=True)
class Choices(Spec):
    """``{"text": context, "choices": [choice, ...]}`` or a list of them; the body itself when it has no
    ``inputs`` but a ``text`` or ``choices``."""

    description: str | None = None
    required = True

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> ChoiceInputs:
        limits = ctx.limits
        x = body.get(key, body if "text" in body or "choices" in body else None)
        if x is None:
            raise invalid(
                f'missing field \'{key}\': give {{"text": context, "choices": [choice, ...]}} or a list of them'
            )
        single = isinstance(x, dict)
        items = [x] if single else x
        if not isinstance(items, list):
            raise invalid(f"'{key}' must be an object {{text, choices}} or a list of them, not {describe(x)}")
        if not items:
            raise invalid(f"'{key}' is an empty list; give at least one input", error_type="Empty")
        if len(items) > limits.max_inputs:
            raise invalid(
                f"{len(items)} inputs in one request; the limit is {limits.max_inputs}: split the request", 413
            )
        contexts: list[str] = []
        choices: list[list[str]] = []
        for i, it in enumerate(items):
            where = "the input" if single else f"{key}[{i}]"
            contexts.append(self._context(it, where))
            choices.append(self._choices(it, where, limits))
        rows = sum(len(c) for c in choices)
        if rows > limits.max_inputs:
            raise invalid(
                f"{rows} (context, choice) pairs in one request; the limit is {limits.max_inputs}: split the request",
                413,
            )
        return ChoiceInputs(single, contexts, choices)

    @staticmethod
    def _context(it: Any, where: str) -> str:
        if not isinstance(it, dict) or not isinstance(it.get("text"), str):
            raise invalid(f"{where} must be an object with a 'text' string and a 'choices' list")
        return it["text"]

    @staticmethod
    def _choices(it: dict, where: str, limits: Limits) -> list[str]:
        cs = it.get("choices")
        if not isinstance(cs, list):
            raise invalid(f"{where}: 'choices' must be a list of strings, not {describe(cs)}")
        bad = next((c for c in cs if not isinstance(c, str)), "")
        if not isinstance(bad, str):
            raise invalid(f"{where}: each choice must be a string, not {describe(bad)}")
        if len(cs) < MIN_CHOICES:
            raise invalid(f"{where} has {len(cs)} choice(s); give at least {MIN_CHOICES}")
        if len(cs) > limits.max_choices:
            raise invalid(f"{where} has {len(cs)} choices; the limit is {limits.max_choices}", 413)
        chars = len(it["text"]) + sum(len(c) for c in cs)
        if chars > limits.max_input_chars:
            raise invalid(f"{where} has {chars} characters; the limit is {limits.max_input_chars} per input", 413)
        return cs

    def shape(self) -> dict[str, Any]:
        one = {
            "type": "object",
            "properties": {
                "text": {"type": "string"},
                "choices": {"type": "array", "items": {"type": "string"}, "minItems": MIN_CHOICES},
            },
            "required": ["text", "choices"],
        }
        return {"oneOf": [one, {"type": "array", "items": one, "minItems": 1}]}


@dataclass(frozen=True)
class EitherInputs(Spec):
    """Inputs read as ``choose`` when the picked model picks among choices, else as ``otherwise``."""

    choose: Spec
    otherwise: Spec
    description: str | None = None
    required = True

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> Any:
        return (self.choose if ctx.engine.can_choose else self.otherwise).read(body, key, ctx)

    def shape(self) -> dict[str, Any]:
        return {"anyOf": [*self.otherwise.shape()["oneOf"], *self.choose.shape()["oneOf"]]}


@dataclass(frozen=True)
class Flag(Spec):
    """true or false; absent or null: ``default``."""

    default: bool
    description: str | None = None

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> bool:
        v = body.get(key, self.default)
        if v is None:
            return self.default
        if not isinstance(v, bool):
            raise invalid(f"'{key}' must be true or false, not {describe(v)}")
        return v

    def shape(self) -> dict[str, Any]:
        return {"type": "boolean", "default": self.default}


@dataclass(frozen=True)
class Integer(Spec):
    """An integer from ``lo`` to ``hi``; absent or null: ``default``."""

    default: int
    lo: int
    hi: int
    description: str | None = None

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> int:
        v = body.get(key, self.default)
        if v is None:
            return self.default
        if isinstance(v, bool) or not isinstance(v, int) or not self.lo <= v <= self.hi:
            raise invalid(f"'{key}' must be an integer from {self.lo} to {self.hi}")
        return v

    def shape(self) -> dict[str, Any]:
        return {"type": "integer", "default": self.default, "minimum": self.lo, "maximum": self.hi}


def union(name: str, doc: str, *bodies: type[Body]) -> type[Body]:
    """A body of every field of ``bodies`` (the first declaration of a key wins), none of them required: what
    a route that reads one of them, as the model it picks decides (POST /), documents."""
    specs: dict[str, Spec] = {}
    for body in bodies:
        for key, spec in body.specs():
            specs.setdefault(key, Unrequired(spec) if spec.required else spec)
    fields = [(key, Any, declare(spec)) for key, spec in specs.items()]
    made = dataclasses.make_dataclass(name, fields, bases=(Body,), frozen=True)
    made.__doc__ = doc
    return cast(type[Body], made)


@dataclass(frozen=True)
class Unrequired(Spec):
    """``spec``'s field, which a body may leave out (absent or null: None)."""

    spec: Spec

    @property
    def description(self) -> str | None:  # type: ignore[override]
        return self.spec.description

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> Any:
        return None if body.get(key) is None else self.spec.read(body, key, ctx)

    def shape(self) -> dict[str, Any]:
        return self.spec.shape()


@dataclass(frozen=True)
class Nested(Spec):
    """A JSON object whose own fields are declared by the :class:`Body` ``body`` (absent or null: every field's
    default), as the Inference API's ``parameters``."""

    body: type[Body]
    description: str | None = None

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> Any:
        v = body.get(key)
        if v is None:
            v = {}
        if not isinstance(v, dict):
            raise invalid(f"'{key}' must be an object, not {describe(v)}")
        return self.body.parse(v, ctx)

    def shape(self) -> dict[str, Any]:
        return self.body.schema()


@dataclass(frozen=True)
class OneOf(Spec):
    """One of ``values``; absent or null (with ``blank_is_default``: any false value, such as "") is
    ``default`` (None: the model's, which the route fills in)."""

    values: tuple[str, ...]
    default: str | None = None
    blank_is_default: bool = False
    description: str | None = None

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> str | None:
        v = body.get(key)
        if v is None or (self.blank_is_default and not v):
            v = self.default
        if v is not None and v not in self.values:
            raise invalid(f"'{key}' must be " + " or ".join(f"'{x}'" for x in self.values))
        return v

    def shape(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.values), **({"default": self.default} if self.default else {})}


@dataclass(frozen=True)
class NonEmptyText(Spec):
    """A string of at least one character."""

    description: str | None = None
    required = True

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> str:
        v = body.get(key)
        if not isinstance(v, str) or not v:
            raise invalid(f"'{key}' must be a non-empty string")
        return v

    def shape(self) -> dict[str, Any]:
        return {"type": "string", "minLength": 1}


@dataclass(frozen=True)
class Dimensions(Spec):
    """The leading dimensions of an embedding, renormalised: the model's size or one of its Matryoshka
    dimensions (None: the whole vector)."""

    description: str | None = (
        "the vector's leading dimensions, renormalised: one of the model's Matryoshka dimensions (/info)"
    )

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> int | None:
        try:
            return ctx.engine.check_dimensions(body.get(key))
        except CramkitError as exc:
            raise invalid(f"'{key}': {exc}") from None

    def shape(self) -> dict[str, Any]:
        return {"type": "integer"}


@dataclass(frozen=True)
class PromptName(Spec):
    """One of an embedding model's named prompts (TEI's ``prompt_name``), or null for its default; a model
    that does not embed reads none."""

    description: str | None = (
        "one of the model's named prompts (/info), put before each input (TEI's prompt_name); default: the "
        "model's default prompt, if it has one"
    )

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> str | None:
        if not ctx.engine.can_embed:
            return None
        name = body.get(key)
        if name is not None and not isinstance(name, str):
            raise invalid(f"'{key}' must be a string (one of the model's prompts, /info) or null")
        try:
            ctx.engine.prompt_text(name)
        except CramkitError as exc:
            raise invalid(f"'{key}': {exc}") from None
        return name

    def shape(self) -> dict[str, Any]:
        return {"type": "string"}


@dataclass(frozen=True)
class ModelName(Spec):
    """The model's name: read by :meth:`ServerState.pick <cramkit.serve.guard.ServerState.pick>` before the
    body (with ``?model=`` and the default); the field holds the name picked."""

    description: str | None = "the model's name (default: the first one served)"

    def read(self, body: dict[str, Any], key: str, ctx: Context) -> str:
        return ctx.name

    def shape(self) -> dict[str, Any]:
        return {"type": "string"}
