"""The `cramkit` command: parse, then call one function per verb.

Each area registers its verbs from ``cramkit.commands.<area>``; those modules import heavy
libraries (torch, tokenizers) only inside the functions they run, so ``cramkit --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from cramkit import __version__
from cramkit.errors import CramkitError

# modules under cramkit.commands, each with `register(subparsers)`; missing ones are skipped so the
# command stays usable while an area is being built.
COMMAND_MODULES = ("data", "pretrain", "tasks", "predict", "export", "distill", "serve", "embed", "index")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cramkit",
        description="Train BERT-style encoders on a budget: text -> tokenizer -> token store -> "
        "pretraining -> fine-tuning -> export.",
    )
    parser.add_argument("--version", action="version", version=f"cramkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"cramkit.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"cramkit.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        # no verb at all: the README's main job (pretrain tiny-cpu on the built-in corpus)
        if argv is None and len(sys.argv) <= 1 or argv == []:
            args = parser.parse_args(["pretrain"])
        else:
            parser.print_help()
            return 2
    try:
        result = args.func(args)
    except CramkitError as exc:
        print(f"cramkit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("cramkit: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        # a full disk, a permission problem, ...: name the file and stop without a traceback
        if os.environ.get("CRAMKIT_DEBUG"):
            raise
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        print(f"cramkit: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    return int(result or 0)
