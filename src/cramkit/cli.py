"""The `cramkit` command: parse, then call one function per verb.

Each area registers its verbs from ``cramkit.commands.<area>``; those modules import heavy
libraries (torch, tokenizers) only inside the functions they run, so ``cramkit --help`` is instant.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, cast

from cramkit import __version__, errors
from cramkit.errors import CramkitError

if TYPE_CHECKING:
    from collections.abc import Callable

# modules under cramkit.commands, each with `register(subparsers)`, in the order `cramkit --help` lists them
COMMAND_MODULES = (
    "tokenizer",
    "data",
    "pretrain",
    "finetune",
    "eval",
    "predict",
    "export",
    "distill",
    "serve",
    "embed",
    "index",
    "doctor",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cramkit",
        description="Train BERT-style encoders on a budget: text -> tokenizer -> token store -> "
        "pretraining -> fine-tuning -> export.",
    )
    parser.add_argument("--version", action="version", version=f"cramkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"cramkit.commands.{name}").register(sub)
    return parser


def _setting_keys(verb: str | None) -> list[str]:
    """The ``--set`` keys of a verb that has them (a mistyped flag is often one of them)."""
    from dataclasses import fields

    if verb == "pretrain":
        from cramkit.train.config import RunConfig

        return [
            f"{sec.name}.{f.name}"
            for sec in fields(RunConfig)
            for f in fields(cast("Callable[[], Any]", sec.default_factory)())  # every section has a factory
        ]
    if verb in ("finetune", "eval"):
        from cramkit.recipes.contrastive_config import ContrastiveConfig
        from cramkit.recipes.finetune_config import FinetuneConfig

        own = [f.name for f in fields(FinetuneConfig)]
        if verb == "eval":
            return own
        return own + [f.name for f in fields(ContrastiveConfig) if f.name not in own]  # --objective contrastive
    if verb == "distill":
        from cramkit.distillation.config import DistillConfig

        return [f.name for f in fields(DistillConfig)]
    return []


def _verb_parser(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser of the verb ``argv`` names, two-level verbs included (``tokenizer train``), and its words."""
    words: list[str] = []
    for arg in argv:
        if arg.startswith("-"):
            continue
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or arg not in sub.choices:
            break  # a positional argument: the verb ends before it
        parser = sub.choices[arg]
        words.append(arg)
    return parser, words


def _verbs(parser: argparse.ArgumentParser) -> list[str]:
    """The top-level commands (pretrain, finetune, ...)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def _suggest_flags(parser: argparse.ArgumentParser, argv: list[str], extra: list[str]) -> str | None:
    """For an unknown ``--flag`` (the first of ``extra``): the verb's closest flag ("did you mean
    --budget?"), or the closest ``--set`` key when that is nearer ("--epocs 3": "did you mean --set epochs=3?")."""
    target, words = _verb_parser(parser, argv)
    flag_arg = next((a for a in extra if a.startswith("--")), None)
    if flag_arg is None:
        return None
    known = [o for a in target._actions for o in a.option_strings if o.startswith("--")]
    flag, _, value = flag_arg.partition("=")
    if not value and flag_arg in argv:
        i = argv.index(flag_arg)
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            value = argv[i + 1]
    name = flag[2:].replace("-", "_")
    # other tools' names for the text column (--text-column, --text-col, --text, --column): this verb's own
    texts = [k for k in ("--text-field", "--text-a") if k in known]
    if texts and ("text" in name or "column" in name) and flag not in known:
        also = " (and --text-b for a pair's second text)" if texts[0] == "--text-a" and "--text-b" in known else ""
        return f"unknown option {flag}; did you mean {texts[0]}{also}?"
    scored = [(difflib.SequenceMatcher(None, flag, k).ratio(), k) for k in known]
    scored += [
        (
            difflib.SequenceMatcher(None, name, key.rsplit(".", 1)[-1]).ratio(),
            f"--set {key}={value or 'VALUE'}",
        )
        for key in _setting_keys(" ".join(words))
    ]
    best = max(scored, default=(0.0, ""))
    hint = f"; did you mean {best[1]}?" if best[0] >= 0.6 else f"; see {' '.join(['cramkit', *words])} --help"
    return f"unknown option {flag}{hint}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    raw = sys.argv[1:] if argv is None else list(argv)
    if not raw:  # bare `cramkit`: what it can do (the demo is `cramkit pretrain` with no arguments)
        parser.print_help()
        return 0
    verbs = _verbs(parser)
    if raw[0] == "help":
        parser.print_help()
        return 0
    if not raw[0].startswith("-") and raw[0] not in verbs:  # a misspelt command: the nearest one, in one line
        close = difflib.get_close_matches(raw[0], verbs, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        print(f"cramkit: error: unknown command '{raw[0]}'{hint} (commands: {', '.join(verbs)})", file=sys.stderr)
        return 2
    try:
        args, extra = parser.parse_known_args(raw)
    except SystemExit as exc:
        return int(exc.code or 0)
    if extra:
        message = _suggest_flags(parser, raw, extra) or f"unrecognised arguments: {' '.join(extra)}"
        print(f"cramkit: error: {message}", file=sys.stderr)
        return 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except (CramkitError, ImportError, OSError) as exc:
        stopped = isinstance(exc, CramkitError) and exc.exit_code > 128  # a stop that says what it saved
        if errors.INTERRUPTED and not stopped:  # after a Ctrl-C, a library turned its KeyboardInterrupt into this
            return _interrupted()
        return _failed(exc)
    except KeyboardInterrupt:
        return _interrupted()
    return int(result or 0)


def _failed(exc: CramkitError | ImportError | OSError) -> int:
    """The one line for a failure the user can act on, and its exit status."""
    if isinstance(exc, CramkitError):
        # exit status 128+N: stopped by signal N as asked (Ctrl-C, SIGTERM), work saved; not an error
        kind = "" if exc.exit_code > 128 else "error: "
        print(f"cramkit: {kind}{exc}", file=sys.stderr)
        return exc.exit_code
    if isinstance(exc, ImportError):  # an optional dependency that is not installed: the extra that brings it
        missing = errors.missing_extra(exc)
        if missing is None:
            raise exc
        print(f"cramkit: error: {missing}", file=sys.stderr)
        return missing.exit_code
    # a full disk, a permission problem, ...: name the file and stop without a traceback
    if os.environ.get("CRAMKIT_DEBUG"):
        raise exc
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    print(f"cramkit: error: {exc.strerror or exc}{where}", file=sys.stderr)
    return 2


def _interrupted() -> int:
    """A Ctrl-C ended the command: one line, exit status 130."""
    print("cramkit: interrupted", file=sys.stderr)
    if errors.ABORT_AT_ONCE:  # the command line (entry): exit now, see entry()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    return 130


# how long a Ctrl-C may take to reach the command's handler before the process ends anyway
INTERRUPT_GRACE_S = 5.0


class Interrupt:
    """The command line's SIGINT handler outside training (the trainer installs its own, runtime.StopFlag):
    it raises KeyboardInterrupt in the main thread, as Python's default handler does, and guards against
    Python losing it. A KeyboardInterrupt raised while the main thread runs a weakref callback, a
    ``__del__`` or an import lock's cleanup is printed as "Exception ignored" and the command goes on as if
    nothing had been pressed (seen: ``cramkit export`` finished 40 s after a Ctrl-C). So the first signal
    also starts a timer; if the process is still running ``grace`` seconds later, it says so and exits with
    130. Every output is written atomically, so what is on disk stays whole: a partial export or run is a
    temporary directory that is never loaded and is removed on the next start."""

    def __init__(self, grace: float = INTERRUPT_GRACE_S) -> None:
        self.grace = grace
        self.since: float | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        errors.INTERRUPTED = True
        if self.since is None:
            self.since = time.monotonic()
            threading.Thread(target=self._stop_late, name="cramkit-interrupt", daemon=True).start()
        raise KeyboardInterrupt

    def _stop_late(self) -> None:
        time.sleep(self.grace)
        print("\ncramkit: interrupted", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130)


def entry() -> None:
    """The ``cramkit`` console script and ``python -m cramkit``. After an abort (Ctrl-C; a second one during
    training) the process exits at once: background checkpoint writers are not waited for (interpreter
    shutdown would join their threads, which may wait forever on work the abort cut short). What is on disk
    stays intact: an unfinished checkpoint is a ``.tmp`` directory that is never loaded and is removed on
    the next start."""
    errors.ABORT_AT_ONCE = True
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored (nohup, &)
        signal.signal(signal.SIGINT, Interrupt())
    raise SystemExit(main())
