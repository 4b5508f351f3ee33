"""The request bodies, declared once (cramkit.serve.declare): what a body's reading refuses and what its schema
says come from the same declaration, so they agree. No model: a stub stands for the engine."""

from __future__ import annotations

import json
import types

import pytest
from starlette.testclient import TestClient

from cramkit.errors import CramkitError
from cramkit.serve import Limits, create_app
from cramkit.serve.bodies import EmbedRequest, FillMaskRequest, PredictRequest, RerankRequest, SearchRequest
from cramkit.serve.declare import Body, ChoiceInputs, Context, Flag, Integer, OneOf
from cramkit.serve.guard import ApiError
from cramkit.serve.routes import TABLE


class Stub:
    """What a field reads of the picked model."""

    can_embed = True
    can_choose = False
    trained_inputs = "single"
    hidden_size = 64

    def check_dimensions(self, d: object) -> int | None:
        if d is None or d == 64:
            return None
        raise CramkitError(f"dimensions {d!r}: stub answers 64")

    def prompt_text(self, name: str | None) -> str:
        if name not in (None, "query"):
            raise CramkitError("stub has the prompts 'query'")
        return "query: " if name else ""


LIMITS = Limits(max_inputs=4, max_input_chars=20, max_choices=3)
BODIES = [route.body for route in TABLE if route.body is not None]


def ctx(**engine: object) -> Context:
    stub = Stub()
    for k, v in engine.items():
        setattr(stub, k, v)
    return Context(LIMITS, stub, "m")


def refusal(kind: type[Body], body: dict, c: Context | None = None) -> ApiError:
    with pytest.raises(ApiError) as info:
        kind.parse(body, c or ctx())
    return info.value


@pytest.mark.parametrize("kind", BODIES, ids=lambda k: k.__name__)
def test_the_schema_and_the_reading_agree(kind: type[Body]) -> None:
    schema = kind.schema()
    keys = [key for key, _ in kind.specs()]
    assert list(schema["properties"]) == keys
    c = ctx()
    good = {key: ("q" if key == "query" else "a text") for key in schema["required"]}
    parsed = kind.parse(good, c)
    for key, spec in kind.specs():
        prop = schema["properties"][key]
        if key in schema["required"]:  # without it: refused
            assert refusal(kind, {k: v for k, v in good.items() if k != key}, c).status == 422
        if isinstance(spec, Flag | Integer | OneOf) and "default" in prop:  # absent: the default the schema says
            assert getattr(parsed, key) == prop["default"]
        if isinstance(spec, Flag):
            assert prop["type"] == "boolean"
            err = refusal(kind, {**good, key: "yes"}, c)
            assert (err.status, err.message) == (422, f"'{key}' must be true or false, not a string")
        if isinstance(spec, Integer):
            for v in (prop["minimum"], prop["maximum"]):
                assert getattr(kind.parse({**good, key: int(v)}, c), key) == v
            for v in (prop["minimum"] - 1, prop["maximum"] + 1, 2.5, True):
                err = refusal(kind, {**good, key: v}, c)
                assert err.message == f"'{key}' must be an integer from {spec.lo} to {spec.hi}"
        if isinstance(spec, OneOf):
            for v in prop["enum"]:
                assert getattr(kind.parse({**good, key: v}, c), key) == v
            assert refusal(kind, {**good, key: "other"}, c).message.startswith(f"'{key}' must be ")


def test_the_first_wrong_field_in_declared_order_is_the_answer() -> None:
    err = refusal(EmbedRequest, {"normalize": "yes"})  # inputs is declared first: its absence is the answer
    assert err.message == "missing field 'inputs': give a string or a list of strings"
    err = refusal(EmbedRequest, {"inputs": "a", "truncate": 1, "pooling": "max"})
    assert err.message == "'truncate' must be true or false, not a number"
    err = refusal(EmbedRequest, {"inputs": "a", "dimensions": 7, "prompt_name": 3})
    assert err.message == "'dimensions': dimensions 7: stub answers 64"
    err = refusal(EmbedRequest, {"inputs": "a", "prompt_name": "doc"})
    assert err.message == "'prompt_name': stub has the prompts 'query'"
    err = refusal(RerankRequest, {"query": "q" * 21, "texts": [1]})  # the query's length is checked last
    assert err.message == "texts[0] is a number; each input must be a string"
    assert refusal(RerankRequest, {"query": "q" * 21, "texts": ["t"]}).status == 413


def test_inputs_lines_and_statuses() -> None:
    cases = [
        ({"inputs": []}, 422, "Empty", "'inputs' is an empty list; give at least one input"),
        ({"inputs": {"a": 1}}, 422, "Validation", "'inputs' must be a string or a list of strings, not an object"),
        ({"inputs": ["a", None]}, 422, "Validation", "inputs[1] is null; each input must be a string"),
        ({"inputs": ["a"] * 5}, 413, "Validation", "5 inputs in one request; the limit is 4: split the request"),
        ({"inputs": ["x" * 21]}, 413, "Validation", "inputs[0] has 21 characters; the limit is 20 per input"),
    ]
    for body, status, kind, message in cases:
        err = refusal(FillMaskRequest, body)
        assert (err.status, err.error_type, err.message) == (status, kind, message)
    assert FillMaskRequest.parse({"inputs": "a"}, ctx()).inputs.single
    assert not SearchRequest.parse({"inputs": ["a"]}, Context(LIMITS)).inputs.single


def test_predict_reads_pairs_or_choices_by_the_model() -> None:
    err = refusal(PredictRequest, {"inputs": ["a", "b"]})  # TEI's pair, to a model of single texts
    assert "fine-tuned on single texts" in err.message
    pair = PredictRequest.parse({"inputs": ["a", "b"]}, ctx(trained_inputs="pairs")).inputs
    assert pair == type(pair)([("a", "b")], True)
    mc = ctx(can_choose=True)
    got = PredictRequest.parse({"text": "t", "choices": ["x", "y"]}, mc).inputs  # the body itself is the input
    assert got == ChoiceInputs(True, ["t"], [["x", "y"]])
    err = refusal(PredictRequest, {"inputs": [{"text": "t", "choices": ["a", "b", "c", "d"]}]}, mc)
    assert (err.status, err.message) == (413, "inputs[0] has 4 choices; the limit is 3")


def test_openapi_holds_each_declared_body() -> None:
    app = create_app({"m": types.SimpleNamespace(max_batch_tokens=256)})
    doc = TestClient(app).get("/openapi.json").json()
    for route in TABLE:
        op = doc["paths"][route.path]["post" if route.body else "get"]
        assert op["summary"] == route.summary
        if route.body is not None:
            schema = op["requestBody"]["content"]["application/json"]["schema"]
            assert json.loads(json.dumps(schema)) == json.loads(json.dumps(route.body.schema())), route.path
