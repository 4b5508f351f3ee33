"""`cramkit data build|join|inspect`: their flags are :mod:`cramkit.data.request`'s, their work
:mod:`cramkit.data.verbs`'."""

from __future__ import annotations

import argparse

from cramkit import request
from cramkit.commands.tokenizer import _help
from cramkit.data.request import DataBuildRequest, DataInspectRequest, DataJoinRequest


def register(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="build and inspect token stores")
    dsub = data.add_subparsers(dest="data_command", metavar="VERB")
    for name, cls, text in (
        ("build", DataBuildRequest, "tokenise text into a memory-mapped token store (Megatron .bin/.idx)"),
        ("join", DataJoinRequest, "join the shards of `data build --shard i/N` into one store (NAME.json)"),
        ("inspect", DataInspectRequest, "counts, a length histogram and decoded samples of a store"),
    ):
        p = dsub.add_parser(name, help=text)
        request.add_arguments(p, cls)
        p.set_defaults(func=run, request_class=cls)
    data.set_defaults(func=lambda a: _help(data))


def run(args: argparse.Namespace) -> int:
    from cramkit.data.verbs import data_build, data_inspect, data_join

    req = request.from_args(args.request_class, args)
    if isinstance(req, DataInspectRequest):
        print(data_inspect(req))
    elif isinstance(req, DataJoinRequest):
        data_join(req)
    else:
        data_build(req)
    return 0
