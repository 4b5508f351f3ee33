"""The named prompts of an embedding model (sentence-transformers' ``prompts`` and ``default_prompt_name``,
TEI's ``prompt_name``): a text put before each input, e.g. ``query: `` and ``passage: `` for a model trained
E5-style (anchors with the one, positives with the other).

A model records them in its metadata (``extra.prompts``: name -> text, ``extra.default_prompt_name``); the
contrastive stage sets them, exports keep them (``config_sentence_transformers.json`` of the HF export), and
``cramkit.load`` reads them back from a sentence-transformers folder. The rule for a request is
sentence-transformers': an explicit prompt text wins, then a named prompt, then the default prompt (if the
model has one); the prompt's tokens count toward the model's length limit.

For retrieval the two sides follow sentence-transformers' ``encode_query``/``encode_document``: queries get
the prompt named ``query``, documents the first of ``document``, ``passage``, ``corpus``; a model without
that name gives that side its default prompt (or none).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cramkit.errors import CramkitError

QUERY_NAMES = ("query",)
DOCUMENT_NAMES = ("document", "passage", "corpus")


def recorded(extra: Mapping[str, Any], where: str = "the model") -> tuple[dict[str, str], str | None]:
    """(prompts, default prompt name) recorded in a model's ``extra``; malformed entries are one CramkitError."""
    prompts = extra.get("prompts") or {}
    default = extra.get("default_prompt_name") or None
    check(prompts, default, where)
    return dict(prompts), default


def check(prompts: Any, default: Any, where: str) -> None:
    """Prompts must map names to texts, and the default name must be one of them."""
    if not isinstance(prompts, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in prompts.items()
    ):
        raise CramkitError(f"{where}: 'prompts' must map prompt names to texts, got {prompts!r}")
    if default is not None and (not isinstance(default, str) or default not in prompts):
        known = ", ".join(prompts) or "none"
        raise CramkitError(f"{where}: the default prompt name {default!r} is not one of its prompts ({known})")


def resolve(
    prompts: Mapping[str, str],
    default: str | None,
    prompt_name: str | None,
    source: str,
    prompt: str | None = None,
) -> str:
    """The text put before each input: ``prompt`` when given ('' for none), else the prompt named
    ``prompt_name``, else the default prompt's ('' without one). An unknown name is one line naming the known."""
    if prompt is not None:
        if not isinstance(prompt, str):
            raise CramkitError(f"prompt must be a string, got {type(prompt).__name__}")
        return prompt
    if prompt_name is None:
        return prompts[default] if default else ""
    if not isinstance(prompt_name, str):
        raise CramkitError(f"prompt_name must be a string, got {type(prompt_name).__name__}")
    if prompt_name not in prompts:
        if not prompts:
            raise CramkitError(
                f"prompt_name {prompt_name!r}: {source} has no prompts (train it with --query-prompt and "
                "--passage-prompt to record some)"
            )
        raise CramkitError(
            f"prompt_name {prompt_name!r}: {source} has the prompts {', '.join(map(repr, prompts))}"
            + (f" (default {default!r})" if default else "")
        )
    return prompts[prompt_name]


def side(prompts: Mapping[str, str], default: str | None, which: str) -> str | None:
    """The prompt name a retrieval side gets: ``which`` is "query" or "document" (see the module)."""
    names = QUERY_NAMES if which == "query" else DOCUMENT_NAMES
    return next((n for n in names if n in prompts), default)


def prefix(inputs: list[Any], text: str) -> list[Any]:
    """``text`` put before each input (a pair's first text)."""
    if not text:
        return inputs
    return [text + x if isinstance(x, str) else (text + x[0], x[1]) if _pair(x) else x for x in inputs]


def _pair(x: Any) -> bool:
    return isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[0], str)
