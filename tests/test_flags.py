"""The command line's flags are frozen: every option of every verb is listed in tests/flags.txt. A new knob is
a field of the verb's settings, reachable by ``--set KEY=VALUE`` (and ``--config``), not a new flag; where a flag
is truly needed, add its line to tests/flags.txt in the same change, and say why in the commit."""

from __future__ import annotations

import argparse
from pathlib import Path

from cramkit.cli import build_parser

FROZEN = Path(__file__).with_name("flags.txt")


def _flags(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    out: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _flags(sub, [*words, name])
        elif action.option_strings and not isinstance(action, argparse._HelpAction):
            out.append(" ".join([*words, *sorted(action.option_strings)]))
    return out


def test_the_flag_list_is_frozen() -> None:
    now = sorted(_flags(build_parser(), ["cramkit"]))
    frozen = [line for line in FROZEN.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    added, removed = sorted(set(now) - set(frozen)), sorted(set(frozen) - set(now))
    assert not added, f"new flags {added}: make each a setting (--set KEY=VALUE), or add it to {FROZEN.name}"
    assert not removed, f"flags gone {removed}: users' command lines break; keep them, or drop them from {FROZEN.name}"


def _actions(parser: argparse.ArgumentParser, words: list[str]) -> list[tuple[str, argparse.Action]]:
    out: list[tuple[str, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _actions(sub, [*words, name])
        elif action.option_strings and action.help:
            out.append((" ".join([*words, action.option_strings[-1]]), action))
    return out


def test_a_flag_help_states_its_default_from_the_default_itself() -> None:
    """A default is decided once: a help that names its flag's default reads it (``%(default)s``, or the library's
    constant in an f-string), so changing the default cannot leave the help saying another value."""
    import re

    stale = []
    for flag, action in _actions(build_parser(), ["cramkit"]):
        default = action.default
        if default in (None, False, True, argparse.SUPPRESS) or isinstance(default, list):
            continue
        # "default 5", "default: 5" or a bare "(5)"
        value = re.escape(str(default))
        if re.search(rf"default:? {value}\b|\({value}\)", action.help or ""):
            stale.append(f"{flag}: {action.help!r}")
    assert not stale, "write %(default)s instead of the value:\n" + "\n".join(stale)
