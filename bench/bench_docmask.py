"""Document-masked packing against plain packing at equal budget: held-out MLM loss and a fine-tuned task.

Pretraining text is SST-2's training sentences, read by their column (the labels never): every sentence is a
document of about 10-25 tokens, so a 128-token packed sequence holds several and the mask matters as much as
it can. Each model is pretrained for the same number of steps (tiny-cpu), then fine-tuned on the first ROWS labelled
sentences with the default recipe, seeds 0,1,2, scored on SST-2 dev. Held-out loss is each model's own (the
masked model predicts with its documents only, as it was trained).

    python bench/bench_docmask.py GLUE_DIR [--steps 400] [--rows 500] [--work bench/out/docmask]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("glue")
    ap.add_argument("--steps", type=int, default=400, help="pretraining budget in optimizer steps (equal for both)")
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--work", default="bench/out/docmask")
    args = ap.parse_args()
    import cramkit
    from cramkit.train.metrics import read_metrics

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    text = Path(args.glue) / "SST-2" / "train.tsv"
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for masked in (False, True):
        name = "doc_mask" if masked else "plain"
        run = work / name
        t0 = time.time()
        if not (run / "checkpoints" / "latest").exists():
            cramkit.pretrain(
                [str(text)],
                text_field="sentence",
                preset="tiny-cpu",
                budget=f"{args.steps}steps",
                out=run,
                overrides=[f"data.doc_mask={str(masked).lower()}"],
            )
        recs = list(read_metrics(run))
        val = [r["val_loss"] for r in recs if r.get("val_loss") is not None][-1]
        steps = max(r["step"] for r in recs if "step" in r)
        res = cramkit.finetune(
            run, task="glue/sst2", data_dir=args.glue, seeds=seeds, max_train_examples=args.rows, progress=False
        )
        split = next(iter(res["median"]))  # the task's scored dev split
        scores = [s["dev"][split]["score"] for s in res["seeds"]]
        row = {
            "packing": name,
            "steps": steps,
            "val_loss": round(val, 4),
            "sst2_dev": [round(x, 2) for x in scores],
            "median": round(statistics.median(scores), 2),
            "seconds": round(time.time() - t0),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\n# {args.steps} steps of tiny-cpu pretraining on SST-2's sentences; SST-2 dev after {args.rows} labels")
    print("| packing | steps | held-out MLM loss | SST-2 dev accuracy, median (min-max) of seeds " + args.seeds + " |")
    print("|---|---:|---:|---|")
    for r in rows:
        s = r["sst2_dev"]
        spread = f"{r['median']:.2f} ({min(s):.2f}-{max(s):.2f})"
        print(f"| {r['packing']} | {r['steps']} | {r['val_loss']:.3f} | {spread} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
