"""A verb's request declared once (cramkit.request): the flags, the function's keywords and the request file all
come from the one dataclass, and read back to the same request."""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass

import pytest

from cramkit import request
from cramkit.errors import CramkitError
from cramkit.recipes.pretrain_request import PretrainRequest
from cramkit.request import Training, param


@dataclass
class Toy(Training):
    source: str | None = param(None, positional=True, nargs="?", metavar="FILE", help="the input")
    out: str | None = param(None, help="where to write")
    block: int = param(1024, metavar="N", help="rows per block")
    mode: str = param("fast", choices=("fast", "slow"), help="how")
    exact: bool = param(False, help="be exact")
    settings: dict = param({}, command_line=False, help="the rest")


def _parser(cls: type = Toy) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toy")
    request.add_arguments(p, cls)
    return p


def test_the_flags_come_from_the_declaration() -> None:
    p = _parser()
    flags = {o for a in p._actions for o in a.option_strings}
    assert {"--out", "--block", "--mode", "--exact", "--set", "--no-progress", "--report-to"} <= flags
    assert "--settings" not in flags  # a Python keyword only
    helps = {a.dest: a.help for a in p._actions}
    assert helps["block"].endswith("(default: %(default)s)")  # the default said, read from the default itself
    assert "1024" in p.format_help()
    with pytest.raises(SystemExit):
        p.parse_args(["--mode", "medium"])  # the choices


def test_the_command_line_gives_the_request_the_keywords_give() -> None:
    args = _parser().parse_args(["in.txt", "--block", "8", "--exact", "--no-progress", "--set", "a=1", "--set", "b=2"])
    got = request.from_args(Toy, args)
    assert got == Toy("in.txt", block=8, exact=True, progress=False, overrides=["a=1", "b=2"])
    assert request.from_args(Toy, _parser().parse_args([])) == Toy()  # every default the same through both doors
    assert Toy().overrides is not Toy().overrides  # a list default is each request's own


def test_a_verb_takes_its_request_or_its_fields() -> None:
    @request.verb(Toy, rest="settings")
    def run(req: Toy) -> Toy:
        return req

    assert run("a.txt", block=2) == Toy("a.txt", block=2)
    given = Toy("b.txt")
    assert run(given) is given
    assert run("c.txt", lr=0.1).settings == {"lr": 0.1}  # keywords that are not fields: the settings
    sig = inspect.signature(run)
    assert (
        list(sig.parameters)[:2] == ["source", "out"]
        and sig.parameters["settings"].kind is sig.parameters["settings"].VAR_KEYWORD
    )
    assert sig.return_annotation in (Toy, "Toy")


def test_the_request_file_reads_back_to_the_same_request(tmp_path) -> None:
    req = PretrainRequest(["a.txt", tmp_path / "b"], budget="5m", overrides=["train.lr=1e-3"], progress=False)
    path = tmp_path / "request.yaml"
    request.write_request(req, "pretrain", path)
    assert request.read_request(PretrainRequest, path, "pretrain") == req
    assert req.inputs == ["a.txt", str(tmp_path / "b")]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("pretrain:\n  budgte: 5m\n", "unknown field 'budgte' of pretrain; did you mean 'budget'?"),
        ("pretrain:\n  extend_vocab: many\n", "'extend_vocab' must be int, got 'many'"),
        ("pretrain: [1, 2]\n", "expected the fields of pretrain"),
    ],
)
def test_a_bad_request_file_is_one_line_naming_it(tmp_path, text: str, said: str) -> None:
    path = tmp_path / "request.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CramkitError) as err:
        request.read_request(PretrainRequest, path, "pretrain")
    assert said in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_crafted_request_file_cannot_make_cramkit_build_objects(tmp_path) -> None:
    """YAML tags that would build Python objects are refused by the settings reader (safe loading)."""
    path = tmp_path / "request.yaml"
    path.write_text("pretrain:\n  out: !!python/object/apply:os.system ['echo pwned']\n", encoding="utf-8")
    with pytest.raises(CramkitError):
        request.read_request(PretrainRequest, path, "pretrain")
