"""Offloaded mixture-of-experts inference: the memory it saves and the throughput it costs (issue 32, item 2).

A small MoE run whose experts hold most of the parameters (default 32 experts, top-2, every block) is trained by
`cramkit pretrain` on WikiText-2 (or ``--run`` names one), then SST-2's dev sentences are embedded on the CPU
(one torch thread) by ``Engine`` with the experts resident, and offloaded with an expert cache of 0, half and all
of the experts per layer (``--offload-experts --expert-cache N``). Each configuration runs in its own process
(so that peaks do not mix), in interleaved rounds; a process reports

- ``load peak``: the peak resident memory (VmHWM) of loading the model and building the engine;
- ``serve peak``: the peak resident memory while embedding, the peak counter reset once the engine is built
  (``/proc/self/clear_refs``), of which ``anon`` (RssAnon: the process's own memory) and ``file`` (RssFile:
  pages of mapped files, here the checkpoint's memory map while an offloaded pass reads its experts) at the end;
- sentences/s over ``--passes`` embeddings of the sentences, after one warm-up pass.

    OMP_NUM_THREADS=1 nice -n 5 python bench/bench_moe_offload.py --steps 30 --rounds 3 --out /tmp/bench-moe-offload
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _shared_data import SHARED

SHAPE = [
    "model.hidden=256",
    "model.layers=4",
    "model.heads=4",
    "model.intermediate=1024",
    "data.seq_len=128",
    "data.validation_fraction=0.02",
    "train.micro_batch=16",
    "train.batch_size=16",
    "train.batch_ramp=0",
    "train.lr=2e-3",
    "train.eval_batches=4",
    "train.eval_every=never",
    "train.checkpoint_every=never",
    "train.log_every=10",
    "train.threads=2",
    "tokenizer.vocab_size=8192",
]


def _status() -> dict[str, int]:
    """This process's memory figures from /proc/self/status, in bytes."""
    out = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def child(run: str, texts_file: str, cache: int | None, passes: int, batch_tokens: int | None) -> dict[str, Any]:
    """One configuration in this process: cache None = all experts resident."""
    import torch

    from cramkit.infer import Engine

    torch.set_num_threads(1)
    texts = json.loads(Path(texts_file).read_text(encoding="utf-8"))
    eng = Engine(
        run, device="cpu", offload_experts=cache is not None, expert_cache=cache, max_batch_tokens=batch_tokens
    )
    loaded = _status()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:  # the peak counter starts again here
        f.write("5")
    eng.embed(texts)  # warm-up: the first pass's allocations
    t0 = time.perf_counter()
    for _ in range(passes):
        eng.embed(texts)
    seconds = time.perf_counter() - t0
    after = _status()
    return {
        "load_peak": loaded["VmHWM"],
        "loaded_rss": loaded["VmRSS"],
        "serve_peak": after["VmHWM"],
        "anon": after["RssAnon"],
        "file": after["RssFile"],
        "sentences_per_s": passes * len(texts) / seconds,
        "traffic": eng.expert_traffic(),
    }


def _sentences(shared: Path, n: int) -> list[str]:
    rows = (shared / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [r.split("\t")[0] for r in rows if r.strip()][:n]


def _train(out: Path, shared: Path, experts: int, steps: int) -> Path:
    """The MoE run (`cramkit pretrain`, one process)."""
    text = [str(shared / "wikitext-2" / "wiki.valid.tokens")]
    moe = [f"model.moe_experts={experts}", "model.moe_top_k=2", "model.moe_every=1"]
    cmd = [sys.executable, "-m", "cramkit", "pretrain", *text, "--budget", f"{steps}steps", "--out", str(out)]
    for item in (*SHAPE, *moe):
        cmd += ["--set", item]
    subprocess.run(cmd, check=True)
    return out


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default=None, help="an MoE run or model directory (default: train one)")
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30, help="pretraining steps of the run it trains")
    ap.add_argument("--sentences", type=int, default=256, help="SST-2 dev sentences embedded per pass")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument(
        "--max-batch-tokens",
        type=int,
        default=None,
        help="padded tokens per forward pass (default: the engine's, 2048 on a CPU); fewer tokens per pass "
        "pick fewer experts",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="/tmp/bench-moe-offload")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: one configuration, JSON out
    ap.add_argument("--texts", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        cache = None if args.child == "resident" else int(args.child)
        print(json.dumps(child(args.run, args.texts, cache, args.passes, args.max_batch_tokens)))
        return

    shared = SHARED
    out = Path(args.out)
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    if args.run is None:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        run = str(_train(out / "run", shared, args.experts, args.steps))
    else:
        out.mkdir(parents=True, exist_ok=True)
        run = args.run
    import cramkit
    from cramkit.model.moe import moe_layers

    model = cramkit.load(run).model
    layers = moe_layers(model)
    if not layers:
        raise SystemExit(f"{run} has no mixture-of-experts layers")
    experts = layers[0].experts
    total = sum(p.numel() for p in model.parameters())
    expert_params = sum(p.numel() for m in layers for n, p in m.named_parameters() if n != "router.weight")
    del model
    texts_file = out / "sentences.json"
    texts_file.write_text(json.dumps(_sentences(shared, args.sentences)), encoding="utf-8")
    configs = ["resident", "0", str(experts // 2), str(experts)]
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    loads = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for c in configs:  # interleaved: every configuration once per round
            cmd = [sys.executable, __file__, "--child", c, "--run", run, "--texts", str(texts_file)]
            if args.max_batch_tokens:
                cmd += ["--max-batch-tokens", str(args.max_batch_tokens)]
            proc = subprocess.run(
                [*cmd, "--passes", str(args.passes)], capture_output=True, text=True, env=env, check=True
            )
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            results[c].append(res)
            print(
                f"round {r + 1}/{args.rounds} {c:>8}: {res['sentences_per_s']:,.1f} sentences/s, serve peak "
                f"{_mib(res['serve_peak'])} MiB, load peak {_mib(res['load_peak'])} MiB (load {loads[-1]:.2f})",
                flush=True,
            )
    loads.append(os.getloadavg()[0])

    def med(c: str, key: str) -> float:
        return statistics.median(x[key] for x in results[c])

    print()
    print(f"{started}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores; load average per round")
    print(f"{', '.join(f'{x:.2f}' for x in loads)}; one torch thread; run {run}")
    print(
        f"model: {total:,} parameters, of which experts {expert_params:,} ({expert_params / total:.0%}; "
        f"{len(layers)} MoE layers x {experts} experts, top-{layers[0].top_k}); {args.sentences} SST-2 dev "
        f"sentences x {args.passes} passes of {args.max_batch_tokens or 'the default'} tokens per forward pass, "
        f"medians of {args.rounds} rounds"
    )
    print()
    print("| experts | serve peak RSS MiB | anon / file at end MiB | load peak MiB | sentences/s | vs resident |")
    print("|---|---|---|---|---|---|")
    base = med("resident", "sentences_per_s")
    for c in configs:
        name = "all resident" if c == "resident" else f"offloaded, cache {c}"
        traffic = results[c][-1]["traffic"]
        if traffic:
            name += f" (reads {traffic['reads']:,}, hits {traffic['hits']:,})"
        print(
            f"| {name} | {_mib(med(c, 'serve_peak'))} | {_mib(med(c, 'anon'))} / {_mib(med(c, 'file'))} | "
            f"{_mib(med(c, 'load_peak'))} | {med(c, 'sentences_per_s'):,.1f} | "
            f"{med(c, 'sentences_per_s') / base:.2f}x |"
        )


if __name__ == "__main__":
    main()
