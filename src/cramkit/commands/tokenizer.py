"""`cramkit tokenizer train`: its flags are :class:`~cramkit.text.request.TokenizerTrainRequest`'s, its work
:func:`cramkit.text.verbs.tokenizer_train`'s."""

from __future__ import annotations

import argparse
import sys

from cramkit import request
from cramkit.text.request import TokenizerTrainRequest


def register(sub: argparse._SubParsersAction) -> None:
    tok = sub.add_parser("tokenizer", help="train a WordPiece tokenizer")
    tsub = tok.add_subparsers(dest="tokenizer_command", metavar="VERB")
    train = tsub.add_parser("train", help="train a BERT WordPiece tokenizer on text")
    request.add_arguments(train, TokenizerTrainRequest)
    train.set_defaults(func=run)
    tok.set_defaults(func=lambda a: _help(tok))


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from cramkit.text.verbs import tokenizer_train

    tokenizer_train(request.from_args(TokenizerTrainRequest, args))
    return 0
