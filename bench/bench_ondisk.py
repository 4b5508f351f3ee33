"""On-disk IVF index (issue 31, item 2): build an index too big for one process's memory in parts, merge
it into Faiss's on-disk inverted lists, and search it memory-mapped; against the in-RAM IVF build of the same
vectors in the same run.

    PYTHONPATH=src python bench/bench_ondisk.py --n 10000000 --dim 64 --workers 2 --work /tmp/bod

Vectors: ``bench_index.synthetic`` (clustered, low-rank, L2-normalised), written once to WORK/vectors.npy;
1000 fresh queries from the same process (not in the index).

Each step runs in its own process, so its memory is its own: a sampler reads /proc every 0.2 s and keeps
the peak resident set (VmRSS) and the peak anonymous part of it (RssAnon: memory the process owns, as
opposed to pages of memory-mapped files, which the kernel drops under pressure) over the step's process
and its children; every step also reports its own VmHWM. Steps:

- ``ram``: the baseline, today's in-RAM build: ``ann.build_and_tune`` with ``IVF{nlist},SQ8`` (train, add
  every vector into one index in RAM, tune to recall@10 >= 0.95 on 1000 held-out vectors), written to a file.
- ``prepare``: train the same index on the same sample (``ondisk.prepare``).
- ``fill``: the parts filled by ``--workers`` processes (``ondisk.fill_parts``); the peak RSS of each.
- ``merge``: merge into ``lists.ivfdata``, tune, write (``ondisk.merge``).
- ``query``: recall@10 of both against exact search on the fresh queries; latency of one query at a time
  (median) and queries/s of a batch of 1000, the in-RAM index read into memory against the on-disk one
  memory-mapped. ``--skip-ram`` leaves the in-RAM baseline out (at 20M vectors it takes hours).
- ``autofaiss`` (``--autofaiss PYTHON``, a virtual environment with autofaiss): autofaiss's own build of the
  same vectors under the same memory budget, tuned by autofaiss for 10 ms a query; recall@10 against the
  same exact search (``bench/autofaiss_step.py``).

``--cgroup DIR``: the bench runs inside a cgroup v1 memory group (for instance one limited to 4 GiB:
``mkdir /sys/fs/cgroup/memory/b && echo 4G > /sys/fs/cgroup/memory/b/memory.limit_in_bytes``, then start the
bench from a shell whose PID is written to ``b/cgroup.procs``); each step then also reports the group's peak
(``memory.max_usage_in_bytes``: anonymous memory and the page cache of memory-mapped files together, what the
kernel holds to the limit) and how often the limit made the kernel reclaim (``memory.failcnt``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, val = line.partition(":")
            if key in ("VmRSS", "RssAnon", "VmHWM"):
                out[key] = int(val.split()[0])
    except (OSError, ValueError):
        pass
    return out


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        for task in Path(f"/proc/{p}/task").glob("*") if Path(f"/proc/{p}/task").is_dir() else []:
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return pids


def run_step(args: argparse.Namespace, step: str, cmd: list[str] | None = None) -> dict:
    """Run ``step`` in a child process (this script, or ``cmd``); its JSON result with the sampled peaks (MiB)."""
    cmd = cmd or [sys.executable, __file__, "--step", step, *sys.argv[1:]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak = {"rss": 0, "anon": 0, "anon_per_process": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            stats = [_status(p) for p in _tree(proc.pid)]
            peak["rss"] = max(peak["rss"], sum(s.get("VmRSS", 0) for s in stats))
            peak["anon"] = max(peak["anon"], sum(s.get("RssAnon", 0) for s in stats))
            peak["anon_per_process"] = max([peak["anon_per_process"], *(s.get("RssAnon", 0) for s in stats)])
            time.sleep(0.2)

    t = threading.Thread(target=sample, daemon=True)
    cg = Path(args.cgroup) if args.cgroup else None
    if cg:  # the group's peak, page cache of memory-mapped files included, counted from here
        (cg / "memory.max_usage_in_bytes").write_text("0")
        fails = int((cg / "memory.failcnt").read_text())
    t0 = time.perf_counter()
    t.start()
    out, _ = proc.communicate()
    done.set()
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"step {step} failed ({proc.returncode})")
    res = json.loads(out.strip().splitlines()[-1])
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["sampled_peak_rss_mib"] = round(peak["rss"] / 1024)
    res["sampled_peak_anon_mib"] = round(peak["anon"] / 1024)
    res["sampled_peak_anon_per_process_mib"] = round(peak["anon_per_process"] / 1024)
    if cg:
        res["cgroup_peak_mib"] = round(int((cg / "memory.max_usage_in_bytes").read_text()) / 2**20)
        res["cgroup_limit_hits"] = int((cg / "memory.failcnt").read_text()) - fails
    print(f"[{step}] {json.dumps(res)}", file=sys.stderr, flush=True)
    return res


def step(args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(HERE))
    from cramkit.index import ann, ondisk

    work = Path(args.work)
    vpath, qpath = work / "vectors.npy", work / "queries.npy"
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    budget = ann.parse_memory(args.memory)
    if args.step == "gen":
        from bench_index import synthetic

        if not (vpath.is_file() and np.load(vpath, mmap_mode="r").shape == (args.n, args.dim)):
            synthetic(args.n, args.dim, seed=0, out=vpath)
        np.save(qpath, synthetic(1000, args.dim, seed=7))
        return {"n": args.n, "dim": args.dim, "bytes": vpath.stat().st_size}
    vectors = np.load(vpath, mmap_mode="r")
    n, d = vectors.shape
    plan_disk = ann.plan_index(n, d, budget, "ivfsq8", on_disk=True)
    if args.step == "ram":
        t0 = time.perf_counter()
        index, params, recall = ann.build_and_tune(vectors, ann.plan_index(n, d, budget, "ivfsq8"), log=log)
        ann.write(index, work / "ram.index")
        return {"seconds": round(time.perf_counter() - t0, 1), "params": params, "recall": recall,
                "vmhwm_mib": ondisk.peak_rss_mb(), "index_bytes": (work / "ram.index").stat().st_size}  # fmt: skip
    od = work / "ondisk"
    parts = ondisk.part_count(n, args.workers, 1)
    if args.step == "prepare":
        t0 = time.perf_counter()
        ondisk.prepare(vpath, plan_disk, od, parts=parts, log=log)
        return {"seconds": round(time.perf_counter() - t0, 1), "parts": parts, "vmhwm_mib": ondisk.peak_rss_mb()}
    if args.step == "fill":
        t0 = time.perf_counter()
        ondisk.fill_parts(od, vpath, list(range(parts)), parts, workers=args.workers, log=log)
        recs = [json.loads((od / f"{ondisk.part_name(p, parts)}.json").read_text()) for p in range(parts)]
        return {"seconds": round(time.perf_counter() - t0, 1), "part_vmhwm_mib": [r["peak_rss_mb"] for r in recs],
                "part_seconds": [r["seconds"] for r in recs], "vmhwm_mib": ondisk.peak_rss_mb()}  # fmt: skip
    if args.step == "merge":
        data = work / "disk"
        data.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        params, recall, build = ondisk.merge(od, vpath, plan_disk, data, target=0.95, parts=parts, log=log)
        (data / "params.json").write_text(json.dumps(params))
        return {"seconds": round(time.perf_counter() - t0, 1), "params": params, "recall": recall,
                "ivfdata_bytes": (data / "lists.ivfdata").stat().st_size, "vmhwm_mib": ondisk.peak_rss_mb(),
                **build}  # fmt: skip
    if args.step == "query":
        vectors = ann.open_rows(vpath)  # as ``cramkit.index`` opens them for queries: no read-ahead
        q = np.load(qpath)
        if (work / "truth.npy").is_file():  # computed by an earlier query step: the search alone is measured
            truth = np.load(work / "truth.npy", allow_pickle=False)
        else:
            _, truth = ann.exact_search(vectors, q, 10)
            np.save(work / "truth.npy", truth)  # (and the autofaiss step's)
        out = {}
        for name in ("disk",) if args.skip_ram else ("ram", "disk"):
            if name == "ram":
                index = ann._faiss().read_index(str(work / "ram.index"))  # read into memory
                plan, params = ann.plan_index(n, d, budget, "ivfsq8"), args.ram_params
            else:
                index = ann.read_on_disk(work / "disk" / "faiss.index", work / "disk" / "lists.ivfdata", rows=n, dim=d)
                plan, params = plan_disk, json.loads((work / "disk" / "params.json").read_text())
            t0 = time.perf_counter()
            _, ids = ann.search(index, vectors, plan, params, q, 10)
            batch = time.perf_counter() - t0
            lat = []
            for i in range(200):
                t1 = time.perf_counter()
                ann.search(index, vectors, plan, params, q[i : i + 1], 10)
                lat.append(time.perf_counter() - t1)
            out[name] = {"recall_at_10": round(ann.recall_at(ids, truth, 10), 4), "batch_qps": round(len(q) / batch),
                         "single_ms_p50": round(1000 * float(np.median(lat)), 2),
                         "single_ms_p90": round(1000 * float(np.percentile(lat, 90)), 2), "params": params}  # fmt: skip
            del index
        return out
    raise SystemExit(f"unknown step {args.step}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--memory", default="4GB")
    p.add_argument("--work", default="/tmp/bench-ondisk")
    p.add_argument("--step", default=None)
    p.add_argument("--ram-params", type=json.loads, default=None)
    p.add_argument("--keep", action="store_true", help="keep WORK (default: removed at the end)")
    p.add_argument("--cgroup", metavar="DIR", help="a cgroup v1 memory group this process runs in: its peak per step")
    p.add_argument("--skip-ram", action="store_true", help="no in-RAM baseline (at sizes where it takes hours)")
    p.add_argument("--autofaiss", metavar="PYTHON", help="also build with autofaiss, run by this interpreter")
    p.add_argument("--autofaiss-key", help="the index autofaiss builds (a Faiss factory string; default: its choice)")
    args = p.parse_args()
    if args.step:
        print(json.dumps(step(args)), flush=True)
        return
    Path(args.work).mkdir(parents=True, exist_ok=True)
    res = {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores", "load_start": os.getloadavg()}
    res["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.cgroup:
        res["cgroup_limit_mib"] = round(int((Path(args.cgroup) / "memory.limit_in_bytes").read_text()) / 2**20)
    for s in ("gen", "ram", "prepare", "fill", "merge"):
        if not (s == "ram" and args.skip_ram):
            res[s] = run_step(args, s)
    if not args.skip_ram:
        sys.argv += ["--ram-params", json.dumps(res["ram"]["params"])]
    res["query"] = run_step(args, "query")
    if args.autofaiss:
        cmd = [args.autofaiss, str(HERE / "autofaiss_step.py"), "--work", args.work, "--memory", args.memory]
        cmd += ["--index-key", args.autofaiss_key] if args.autofaiss_key else []
        res["autofaiss"] = run_step(args, "autofaiss", cmd)
    res["load_end"] = os.getloadavg()
    print(json.dumps(res, indent=1))
    if not args.keep:
        import shutil

        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
