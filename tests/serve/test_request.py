"""`cramkit serve` from its request (issue 64): the server's settings are checked in one place, so the command
line and ``cramkit.serve.serve`` give the same line for the same mistake, before any model is loaded or port
bound; the function takes a request, its fields, or the limits as one object as before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from clirun import cli, one_line
from cramkit.errors import CramkitError


def _same_line(args: list[Any], *calls: Callable[[], Any]) -> str:
    """The command's one error line, and each call's CramkitError is the same line."""
    line = one_line(cli(*args))
    for call in calls:
        with pytest.raises(CramkitError) as exc:
            call()
        assert line == f"cramkit: error: {exc.value}"
    return line


def test_serve_refuses_a_bad_setting_from_both_doors_before_loading() -> None:
    from cramkit.serve import Limits, ServeRequest
    from cramkit.serve.server import serve

    model = "no-such-model"
    said = _same_line(
        ["serve", model, "--port", "70000"],
        lambda: serve([model], port=70000),
        lambda: serve(ServeRequest([model], port=70000)),
    )
    assert "--port must be 0..65535, got 70000" in said
    said = _same_line(
        ["serve", model, "--max-inputs", "0"],
        lambda: serve([model], limits=Limits(max_inputs=0)),  # the limits as one object, as before
        lambda: serve([model], max_inputs=0),
    )
    assert "--max-inputs must be positive, got 0" in said
    said = _same_line(["serve", model, "--timeout", "0"], lambda: serve([model], request_timeout_s=0))
    assert "--timeout, --body-timeout, --header-timeout and --idle-timeout must be positive" in said
