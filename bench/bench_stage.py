"""Reading a token store from a slow shared file system: in place (mmap), data.mmap=false, data.stage=local.

The slow file system is a FUSE passthrough made here (``--serve``, run with a Python that has mfusepy:
``python3 -m venv $VENVS/stage-fuse && $VENVS/stage-fuse/bin/pip install mfusepy``, and
``apt-get install fuse3``): every read request the kernel sends it sleeps ``--latency-ms`` before a
pread of the real file (a network round trip per request, as on NFS/Lustre/Ceph), and it counts the
requests and bytes. The mount is remounted before each measurement, so the page cache is cold.

Per mode, in a fresh process: the time to the first batch (open the store, build the loader, stage
when asked, gather + mask the first batch), then the loader's steady tokens/s over ``--steps`` batches,
then the bytes read from the mount over one whole epoch (the loader alone: this measures the data path,
not the model). Modes run interleaved, ``--repeats`` rounds.

    python bench/bench_stage.py --fuse-python $VENVS/stage-fuse/bin/python --latency-ms 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _shared_data import SHARED

# label -> (DataConfig settings, whether the node-local cache is emptied first)
MODES = {
    "mmap in place": ([], True),
    "data.mmap=false": (["mmap=false"], True),
    "data.stage=local, cold cache": (["stage=local"], True),
    "data.stage=local, next run": (["stage=local"], False),
}


# ------------------------------------------------------------------------------------------- the FUSE side


def serve(source: str, mount: str, latency_ms: float, stats_path: str, direct_io: bool) -> None:
    """A read-only passthrough of ``source`` at ``mount``: each read sleeps, then preads; counts to stats.

    direct_io: no page cache on the client side (every read goes to the server, as for a store much larger
    than the node's memory); such files cannot be memory-mapped (the kernel answers ENODEV).
    """
    import errno

    import mfusepy as fuse

    counts = {"reads": 0, "bytes": 0}
    lock = threading.Lock()

    class Slow(fuse.Operations):
        def _p(self, path: str) -> str:
            return os.path.join(source, path.lstrip("/"))

        def getattr(self, path, fh=None):
            try:
                st = os.lstat(self._p(path))
            except FileNotFoundError:
                raise fuse.FuseOSError(errno.ENOENT) from None
            keys = ("st_mode", "st_size", "st_nlink", "st_uid", "st_gid", "st_atime", "st_mtime", "st_ctime")
            return {k: getattr(st, k) for k in keys}

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(self._p(path))]

        def open(self, path, flags):
            return os.open(self._p(path), os.O_RDONLY)

        def read(self, path, size, offset, fh):
            time.sleep(latency_ms / 1000)
            data = os.pread(fh, size, offset)
            with lock:
                counts["reads"] += 1
                counts["bytes"] += len(data)
            return data

        def release(self, path, fh):
            os.close(fh)
            return 0

    def dump() -> None:
        while True:
            with lock:
                text = json.dumps(counts)
            tmp = stats_path + ".tmp"
            Path(tmp).write_text(text)
            os.replace(tmp, stats_path)
            time.sleep(0.05)

    threading.Thread(target=dump, daemon=True).start()
    fuse.FUSE(Slow(), mount, foreground=True, ro=True, nothreads=False, direct_io=direct_io)


class SlowMount:
    """The FUSE server as a separate process; ``remount()`` gives a cold page cache."""

    def __init__(self, fuse_python: str, source: Path, mount: Path, latency_ms: float, direct_io: bool) -> None:
        self.args = [
            fuse_python,
            __file__,
            "--serve",
            str(source),
            str(mount),
            str(latency_ms),
            str(int(direct_io)),
        ]
        self.mount, self.stats = mount, mount.parent / "slowfs-stats.json"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.mount.mkdir(exist_ok=True)
        self.stats.unlink(missing_ok=True)
        self.proc = subprocess.Popen([*self.args, str(self.stats)], stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while not os.path.ismount(self.mount):
            if time.time() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"the FUSE mount at {self.mount} did not come up")
            time.sleep(0.05)

    def stop(self) -> None:
        if os.path.ismount(self.mount):
            subprocess.run(["fusermount3", "-u", str(self.mount)], check=False)
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def remount(self) -> None:
        self.stop()
        self.start()

    def counts(self) -> dict:
        time.sleep(0.2)
        return read_counts(self.stats)


def read_counts(path: Path) -> dict:
    return json.loads(Path(path).read_text())


# ------------------------------------------------------------------------------------------- the reader side


def measure(store: str, tok: str, stats: str, sets: list[str], steps: int, micro_batch: int, seq_len: int) -> None:
    """In a fresh process: time to the first batch, steady tokens/s, bytes read from the mount; one JSON line."""
    import torch  # noqa: F401 (imported before the clock starts, as in a training process)

    from cramkit.data.loader import PretrainData
    from cramkit.data.mlm import DataConfig
    from cramkit.data.tokenstore import TokenStore
    from cramkit.text.tokenizer import load_tokenizer, special_ids

    kw: dict = {"seq_len": seq_len}
    for s in sets:
        k, v = s.split("=", 1)
        kw[k] = {"false": False, "true": True}.get(v, v)
    tk = load_tokenizer(tok)
    time.sleep(0.2)
    c0 = read_counts(stats)
    t0 = time.perf_counter()
    data = PretrainData(TokenStore(store), DataConfig(**kw), special_ids(tk), tk.get_vocab_size())
    loader = data.train_loader(micro_batch)
    next(loader)
    first = time.perf_counter() - t0
    time.sleep(0.2)
    c1 = read_counts(stats)
    t1 = time.perf_counter()
    for _ in range(steps):
        next(loader)
    steady = steps * micro_batch * seq_len / (time.perf_counter() - t1)
    time.sleep(0.2)
    c2 = read_counts(stats)
    per_epoch = data.num_train_sequences // micro_batch
    row = {
        "first_s": first,
        "tokens_per_s": steady,
        "epoch_steps": per_epoch,
        "start_bytes": c1["bytes"] - c0["bytes"],
        "step_bytes": (c2["bytes"] - c1["bytes"]) / steps,
        "start_reads": c1["reads"] - c0["reads"],
        "step_reads": (c2["reads"] - c1["reads"]) / steps,
    }
    print(json.dumps(row))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--measure", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument(
        "--fuse-python",
        default=os.environ.get("BENCH_FUSE_PYTHON"),
        help="the python of a venv with mfusepy (or $BENCH_FUSE_PYTHON); required",
    )
    ap.add_argument("--latency-ms", type=float, default=2.0, help="sleep per read request of the mount")
    ap.add_argument(
        "--corpus",
        nargs="*",
        default=None,
        help="text for the store (default: ../shared/data/corpus/english-novels-100)",
    )
    ap.add_argument("--steps", type=int, default=100, help="batches timed for steady tokens/s")
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args()
    if args.serve:
        source, mount, latency, direct_io, stats = args.serve
        serve(source, mount, float(latency), stats, direct_io == "1")
        return
    if args.measure is not None:
        store, tok, stats, *sets = args.measure
        measure(store, tok, stats, sets, args.steps, args.micro_batch, args.seq_len)
        return
    if not args.fuse_python:
        raise SystemExit("give --fuse-python (or $BENCH_FUSE_PYTHON): the python of a venv with mfusepy installed")

    corpus = args.corpus or [str(SHARED / "corpus" / "english-novels-100")]
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-stage-"))
    src, mnt, tok, cache = work / "src", work / "mnt", work / "tok", work / "cache"
    py = [sys.executable, "-m", "cramkit"]
    if not (src / "store" / "train.json").is_file():
        subprocess.run([*py, "tokenizer", "train", *corpus, "--vocab-size", "8000", "--out", str(tok)], check=True)
        subprocess.run(
            [
                *py,
                "data",
                "build",
                *corpus,
                "--tokenizer",
                str(tok),
                "--out",
                str(src / "store"),
                "--shard-size",
                "16MB",
                "--quiet",
            ],
            check=True,
        )
    store_bytes = sum(p.stat().st_size for p in (src / "store").iterdir() if p.suffix in (".bin", ".idx"))
    print(
        f"store {store_bytes / 1e6:.1f} MB (.bin/.idx) in "
        f"{len(json.loads((src / 'store' / 'train.json').read_text())['shards'])} shards",
        flush=True,
    )
    for direct_io in (False, True):
        fs = SlowMount(args.fuse_python, src, mnt, args.latency_ms, direct_io)
        rows: dict[str, list[dict]] = {m: [] for m in MODES}
        try:
            for _ in range(args.repeats):
                for mode, (sets, cold) in MODES.items():  # interleaved: each round runs every mode once
                    if cold:
                        shutil.rmtree(cache, ignore_errors=True)
                    fs.remount()  # a cold page cache of the mount
                    cmd = [
                        sys.executable,
                        __file__,
                        "--steps",
                        str(args.steps),
                        "--micro-batch",
                        str(args.micro_batch),
                        "--seq-len",
                        str(args.seq_len),
                        "--measure",
                        str(mnt / "store"),
                        str(tok),
                        str(fs.stats),
                        *sets,
                        *([f"stage_dir={cache}"] if "stage=local" in sets else []),
                    ]
                    out = subprocess.run(cmd, capture_output=True, text=True)
                    if out.returncode != 0:
                        raise SystemExit(f"{mode}: {out.stderr[-3000:]}")
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    row["note"] = "pread" if "cannot be memory-mapped" in out.stderr else ""
                    rows[mode].append(row)
                    print(mode, "direct_io" if direct_io else "cached", row, flush=True)
        finally:
            fs.stop()
        report(rows, store_bytes, args, direct_io)


def report(rows: dict[str, list[dict]], store_bytes: int, args: argparse.Namespace, direct_io: bool) -> None:
    def med(key: str, rs: list[dict]) -> float:
        xs = sorted(r[key] for r in rs)
        return xs[len(xs) // 2]

    base = med("tokens_per_s", rows["mmap in place"])
    what = "direct_io (no client page cache)" if direct_io else "page cache on"
    print(
        f"\nFUSE passthrough, +{args.latency_ms:g} ms per read request, {what}; micro-batch {args.micro_batch} x "
        f"{args.seq_len} tokens; medians of {args.repeats}"
    )
    print(
        "| mode | time to first batch (s) | steady tokens/s | vs mmap in place | read from the mount: at start | "
        "per step | per epoch (start + steps x per step) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, rs in rows.items():
        tps = med("tokens_per_s", rs)
        start, step = med("start_bytes", rs), med("step_bytes", rs)
        epoch = start + step * rs[0]["epoch_steps"]
        label = mode + (" (cannot mmap: read with pread)" if rs[0]["note"] and mode == "mmap in place" else "")
        print(
            f"| {label} | {med('first_s', rs):.2f} | {tps:,.0f} | {tps / base:.2f}x | {start / 1e6:.1f} MB "
            f"({med('start_reads', rs):,} reads) | {step / 1e3:.1f} kB ({med('step_reads', rs):.1f} reads) | "
            f"{epoch / 1e6:.1f} MB = {epoch / store_bytes:.2f}x the store |"
        )


if __name__ == "__main__":
    main()
