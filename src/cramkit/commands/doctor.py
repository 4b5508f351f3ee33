"""`cramkit doctor`: this machine's instruction sets and measured ceilings (cramkit.doctor)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="what this machine can compute: instruction sets, measured matrix-product and memory ceilings",
        description="Measure this machine's ceilings: the CPU's instruction sets (AVX2, AVX-512, VNNI, BF16, "
        "AMX) and what precision auto picks on it, the rate of an encoder layer's matrix product in fp32, bf16 "
        "and int8 at one thread and at all usable cores, memory bandwidth, and on a GPU its bf16 and fp8 rates "
        "at the crammed-bert shape. Each CPU figure is the best of several samples, bounded by the instruction "
        "set's theoretical peak (width x cores x clock). The CPU figures are kept in the cache directory, per "
        "precision the best ever measured (a run under load or at smaller shapes never lowers one), and CPU "
        "training runs then report their model FLOP/s as a share of them.",
    )
    p.add_argument(
        "--hidden", type=int, default=384, help="the layer's width (default %(default)s, all-MiniLM-L6-v2's)"
    )
    p.add_argument("--intermediate", type=int, default=1536, help="the MLP's width (default %(default)s)")
    p.add_argument("--tokens", type=int, default=2048, help="tokens per product (default %(default)s: 16 x 128)")
    p.add_argument("--seconds", type=float, default=0.4, help="time per measurement (default %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    p.add_argument("--no-save", action="store_true", help="do not keep the figures in the cache directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cramkit import doctor
    from cramkit.errors import CramkitError
    from cramkit.io import write_json_atomic

    for name in ("hidden", "intermediate", "tokens"):
        if not 1 <= getattr(args, name) <= 65536:
            raise CramkitError(f"--{name} must be between 1 and 65536, got {getattr(args, name)}")
    if not 0.01 <= args.seconds <= 60:
        raise CramkitError(f"--seconds must be between 0.01 and 60, got {args.seconds}")
    report = doctor.examine(args.tokens, args.hidden, args.intermediate, args.seconds)
    for line in doctor.format_report(report):
        print(line)
    if args.json:
        write_json_atomic(args.json, report)
    if not args.no_save:
        try:
            path = doctor.save(report)
            for line in report["kept_earlier"]:
                print(line)
            print(f"kept in {path}, the best figure of each precision (CPU training runs report their share of it)")
        except OSError as e:
            print(f"not kept ({e.strerror or e}): the cache directory is not writable; set XDG_CACHE_HOME")
    return 0
