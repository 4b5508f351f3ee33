"""`cramkit doctor`: this machine's instruction sets and measured ceilings (cramkit.doctor). Its flags are
:class:`~cramkit.doctor.DoctorRequest`'s."""

from __future__ import annotations

import argparse

from cramkit import request
from cramkit.doctor import DoctorRequest


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
    request.add_arguments(p, DoctorRequest)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cramkit import doctor

    report = doctor.doctor(request.from_args(DoctorRequest, args))
    lines = doctor.format_report(report)
    if "kept_in" in report:
        share = "the best figure of each precision (CPU training runs report their share of it)"
        lines += [*report["kept_earlier"], f"kept in {report['kept_in']}, {share}"]
    elif "not_kept" in report:
        lines.append(f"not kept ({report['not_kept']}): the cache directory is not writable; set XDG_CACHE_HOME")
    print("\n".join(lines))
    return 0
