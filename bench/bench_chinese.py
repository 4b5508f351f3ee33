"""Chinese benchmark (issue 18): tiny-zh pretrained on FewCLUE's unlabelled text, scored on FewCLUE.

    python bench/bench_chinese.py --out bench-zh [--budget 6e5tok] [--tasks eprstmt ocnli iflytek]
        [--splits 0-4] [--models random wwm char]   (several at once may share --out)

1. Corpus: FewCLUE's unlabelled text, eprstmt ``sentence`` + chid ``content`` (its ``#idiom#`` gaps
   removed), written as one JSON Lines file.
2. Three models, all tiny-zh with the same character-level tokenizer (trained on that corpus):
   ``wwm`` (whole-word masking, jieba) and ``char`` (single characters masked) pretrained for the same
   token budget; ``random`` is tiny-zh after one step at a learning rate of 1e-12 (its random initial
   weights, the same tokenizer).
3. FewCLUE's protocol through ``cramkit finetune`` with the task's own files: train on ``train_k``,
   score on ``test_public`` (given as ``--dev``, so cramkit scores it; fine-tuning has a fixed recipe and
   no model selection, so ``dev_k`` is not needed), accuracy, mean and spread over k = 0..4.

Everything goes through the CLI (`python -m cramkit`), one process at a time. Each score is appended to
OUT/scores.jsonl as it comes (a rerun skips what is there), OUT/summary.md and OUT/fewclue.png are
rewritten after each. OUT/runs.json records each pretraining's tokens, training time (the engine's
``elapsed``) and the load average. A stopped bench continues where it was when started again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _shared_data import SHARED

DATA = SHARED
FEWCLUE = DATA / "fewclue"
TASKS = {  # FewCLUE task -> text fields, fine-tuning epochs (the few-shot sets are 32 rows; iflytek 928).
    # A tiny model from 32 rows: lr 1e-4 for 20 epochs did not fit the training rows (loss 0.68 -> 0.65);
    # lr 1e-3 (--lr) for 40 epochs does (loss -> 0.00)
    "eprstmt": (["--text-a", "sentence"], 40),
    "ocnli": (["--text-a", "sentence1", "--text-b", "sentence2"], 40),
    "iflytek": (["--text-a", "sentence"], 5),
}
LR = "1e-3"
MODELS = ("random", "wwm", "char")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def cramkit(*args: str, log: Path) -> None:
    cmd = [sys.executable, "-m", "cramkit", *args]
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}; see {log}")


def write_corpus(path: Path) -> int:
    rows = 0
    with open(path, "w", encoding="utf-8") as out:
        for task, field in (("eprstmt", "sentence"), ("chid", "content")):
            with open(FEWCLUE / task / "unlabeled.json", encoding="utf-8") as fh:
                for line in fh:
                    text = json.loads(line)[field].replace("#idiom#", "").strip()
                    if text:
                        out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                        rows += 1
    return rows


def pretrain(out: Path, corpus: Path, budget: str, models: list[str], log: Path) -> None:
    """The wwm and char runs (same budget) and the random-init one, on one tokenizer (wwm's)."""
    runs_file = out / "runs.json"
    runs = json.loads(runs_file.read_text()) if runs_file.is_file() else {}
    plan = {
        "wwm": (budget, []),
        "char": (budget, ["--set", "data.masking=wordpiece"]),
        "random": ("1steps", ["--set", "train.lr=1e-12"]),
    }
    for name, (run_budget, extra) in plan.items():
        run = out / "runs" / name
        if name in runs or (name not in models and (name != "wwm" or (run / "tokenizer").is_dir())):
            continue  # another worker's run (wwm is run by whoever needs its tokenizer first)
        tok = ["--tokenizer", str(out / "runs" / "wwm" / "tokenizer")] if name != "wwm" else []
        before = loadavg()
        if (run / "checkpoints").is_dir():  # the bench was stopped during this run: continue it
            cramkit("pretrain", "--resume", str(run), "--no-progress", log=log)
        else:
            cramkit(
                "pretrain",
                str(corpus),
                "--out",
                str(run),
                "--budget",
                run_budget,
                "--no-progress",
                "--preset",
                "tiny-zh",
                *tok,
                *extra,
                log=log,
            )
        state = read_jsonl(run / "metrics.jsonl")
        last = [r for r in state if "loss" in r][-1]
        evals = [r["val_loss"] for r in state if r.get("val_loss") is not None]
        runs[name] = {
            "budget": run_budget,
            "train_s": last["elapsed"],
            "loadavg_before": before,
            "loadavg_after": loadavg(),
            "tokens": last["tokens"],
            "steps": last["step"],
            "last_lr": last.get("lr"),
            "val_loss": evals[-1] if evals else None,
        }
        if runs_file.is_file():  # another worker may have added its runs since this one read the file
            runs = {**json.loads(runs_file.read_text()), name: runs[name]}
        runs_file.write_text(json.dumps(runs, indent=1))
        print(f"pretrained {name}: {runs[name]}", flush=True)


def finetune(out: Path, tasks: list[str], splits: list[int], models: list[str], log: Path) -> None:
    """Each (task, model, k) once; several benches may share OUT (each takes a job by creating
    OUT/claims/JOB; a stopped bench leaves its claim: delete OUT/claims to redo what is not scored)."""
    scores_file = out / "scores.jsonl"
    (out / "claims").mkdir(exist_ok=True)
    for k in splits:  # every task at split k before the next split: a stopped bench has all tasks
        for task in tasks:
            fields, epochs = TASKS[task]
            for model in models:
                done = (
                    {(r["task"], r["model"], r["k"]) for r in read_jsonl(scores_file)}
                    if scores_file.is_file()
                    else set()
                )
                if (task, model, k) in done:
                    continue
                try:
                    (out / "claims" / f"{task}-{model}-{k}").mkdir()
                except FileExistsError:
                    continue
                ft = out / "finetune" / f"{task}-{model}-{k}"
                t0 = time.time()
                cramkit(
                    "finetune",
                    "--from",
                    str(out / "runs" / model),
                    "--train",
                    str(FEWCLUE / task / f"train_{k}.json"),
                    "--dev",
                    str(FEWCLUE / task / "test_public.json"),
                    *fields,
                    "--label",
                    "label",
                    "--name",
                    task,
                    "--out",
                    str(ft),
                    "--no-progress",
                    "--set",
                    f"lr={LR}",
                    "--set",
                    f"epochs={epochs}",
                    "--set",
                    "eval_every=never",
                    log=log,
                )
                res = json.loads((ft / "results.json").read_text())
                acc = _accuracy(res)
                row = {
                    "task": task,
                    "model": model,
                    "k": k,
                    "accuracy": acc,
                    "wall_s": round(time.time() - t0, 1),
                    "loadavg": loadavg(),
                }
                with open(scores_file, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(f"{task} k={k} {model}: {acc:.2f}", flush=True)
                summarize(out)


def _accuracy(res: dict) -> float:
    """Test accuracy (%) from a fine-tuning results.json (the dev set it was given was test_public)."""
    return float(res["median"]["dev"]["metrics"]["accuracy"])


def summarize(out: Path) -> None:
    rows = read_jsonl(out / "scores.jsonl")
    tasks = [t for t in TASKS if any(r["task"] == t for r in rows)]
    lines = ["| model | " + " | ".join(tasks) + " | mean |", "|---|" + "---:|" * (len(tasks) + 1)]
    table: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        table.setdefault(r["model"], {}).setdefault(r["task"], []).append(r["accuracy"])
    for model in MODELS:
        cells, means = [], []
        for t in tasks:
            accs = table.get(model, {}).get(t, [])
            if accs:
                sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
                cells.append(f"{statistics.mean(accs):.1f} ± {sd:.1f} (n={len(accs)})")
                means.append(statistics.mean(accs))
            else:
                cells.append("-")
        mean = f"{statistics.mean(means):.1f}" if len(means) == len(tasks) and means else "-"
        lines.append(f"| {model} | " + " | ".join(cells) + f" | {mean} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(MODELS)
    for i, model in enumerate(MODELS):
        accs = [table.get(model, {}).get(t, []) for t in tasks]
        means = [statistics.mean(a) if a else 0 for a in accs]
        sds = [statistics.stdev(a) if len(a) > 1 else 0 for a in accs]
        ax.bar([j + i * width for j in range(len(tasks))], means, width, yerr=sds, capsize=3, label=model)
    ax.set_xticks([j + width for j in range(len(tasks))], tasks)
    ax.set_ylabel("test_public accuracy (%)")
    ax.set_title("FewCLUE, tiny-zh: mean ± sd over splits k")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fewclue.png", dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench-zh"))
    ap.add_argument("--budget", default="6e5tok", help="pretraining budget of wwm and char (default 6e5tok)")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--splits", default="0-4", help="FewCLUE splits k, e.g. 0-4 or 0,1")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS, help="(default: all)")
    args = ap.parse_args()
    if "-" in args.splits:
        lo, hi = map(int, args.splits.split("-"))
        splits = list(range(lo, hi + 1))
    else:
        splits = [int(k) for k in args.splits.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "log.txt"
    corpus = args.out / "corpus.jsonl"
    if not corpus.is_file():
        print(f"corpus: {write_corpus(corpus):,} documents -> {corpus}", flush=True)
    pretrain(args.out, corpus, args.budget, args.models, log)
    finetune(args.out, args.tasks, splits, args.models, log)
    print((args.out / "summary.md").read_text())


if __name__ == "__main__":
    main()
