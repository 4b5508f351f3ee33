"""What `cramkit finetune` prints when it is done: one task's medians over the seeds, a few-shot protocol's splits
with their mean and spread, a mixture's tasks, the contrastive stage's scores. Each reads the request as the
command decided it (its ``out`` set)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cramkit.recipes.contrastive_config import ContrastiveConfig
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.finetune_request import ContrastiveRequest, FinetuneRequest


def report_finetune(req: FinetuneRequest, cfg: FinetuneConfig, res: dict[str, Any]) -> None:
    """One task's fine-tuning: each split's median metrics over the seeds, what was kept and where."""
    out = Path(res.get("self_training", {}).get("model") or str(req.out))
    name = res["task"]
    n = len(cfg.seeds)
    for split, med in res["median"].items():
        metrics = ", ".join(f"{m} {v:.2f}" for m, v in med["metrics"].items())
        each = ", ".join(f"{r['dev'][split]['score']:.2f}" for r in res["seeds"] if split in r.get("dev", {}))
        how = (
            f"median of {n} seeds: {each}" + ("; the mean of the middle two" if n % 2 == 0 else "")
            if n > 1
            else "1 seed"
        )
        print(f"{name} {split}: {metrics} ({how})")
    for split, med in res.get("test", {}).items():
        metrics = ", ".join(f"{m} {v:.2f}" for m, v in med["metrics"].items())
        print(f"{name} {split} (labelled test file): {metrics} (median of {len(cfg.seeds)} seed(s))")
    if cfg.keep == "best":
        steps = ", ".join(str(r.get("best_step", "?")) for r in res["seeds"])
        print(f"kept: the model of the best dev score (step {steps}); that dev score is optimistic, chosen on dev")
    if res.get("method", "head") != "head":
        trained = res.get("trainable_parameters") or 0
        print(
            f"method {res['method']}: {trained:,} parameters trained; "
            f"{res['stored_bytes'] / 2**20:,.2f} MiB stored in {out}"
        )
    rate = sum(r["examples_per_s"] for r in res["seeds"]) / len(res["seeds"])
    print(f"training: {rate:.1f} examples/s; results in {out / 'results.json'}")
    kept = "the median seed" if n % 2 else "the lower of the two middle seeds"
    st = res.get("self_training")
    if st:  # self-training: the model kept is the student or the teacher, the other beside it
        other = f"; the {'student' if st['kept'] == 'teacher' else 'teacher'} is in {st.get('other')}"
        other *= bool(st.get("other"))
        student = f", student {st['student']['score']:.2f}" if st.get("student") else " (no student trained)"
        print(
            f"self-training: teacher {st['teacher']['score']:.2f}{student} ({res['main_metric']}); the "
            f"{st['kept']} is kept, saved in {out}{other}: cramkit predict --from {out} FILE"
        )
        return
    base = f" --base {req.source}" if res.get("method") == "ptuning" else ""  # deep prompts run on their base
    print(
        f"model (seed {res['kept_seed']}, {kept} by dev score) saved in {out}: cramkit predict --from {out}{base} "
        f"FILE; cramkit export {out}{base} --format onnx --out DIR"
        if base
        else f"model (seed {res['kept_seed']}, {kept} by dev score) saved in {out}: cramkit predict --from {out} "
        f"FILE; cramkit export {out} --out DIR"
    )


def report_fewshot(req: FinetuneRequest, res: dict[str, Any]) -> None:
    """``--fewshot-splits`` (FewCLUE's protocol) or ``--few-shot K --splits S`` (LM-BFF's): each split's score,
    then the mean and spread."""
    from cramkit.recipes.evaluate import plus_minus

    name, k = res["task"], req.few_shot
    few = res["fewshot"]
    keys = list(few["per_split"])
    out = Path(str(req.out))
    scored = ", ".join(res["median"])
    tests = res.get("test", {})
    for key, one in few["per_split"].items():
        test = "".join(f"; {s} {one['test'][s]['score']:.2f}" for s in tests if s in one.get("test", {}))
        print(
            f"{name} split {key}: {scored} {res['main_metric']} {one['score']:.2f}{test} (its drawn dev rows "
            f"{one['dev']['score']:.2f})"
        )
    what = f"FewCLUE splits {','.join(keys)}" if k is None else f"{len(keys)} few-shot splits (K={k} per class)"
    print(
        f"{name}: {scored} {res['main_metric']} {few['mean']:.2f}{plus_minus(few)} over {what}; results in "
        f"{out / 'results.json'}" + (f", test.json predictions in {out / 'submission'}" if k is None else "")
    )
    for split, t in tests.items():  # a labelled --test file: scored by every split
        spread = f" ± {t['std']:.2f}" if len(keys) > 1 else ""
        print(f"{name}: {split} (labelled test file) {res['main_metric']} {t['score']:.2f}{spread} over {what}")
    base = few.get("frozen_baseline")
    if base is not None:
        lead = few["mean"] - base["mean"]
        print(
            f"{name}: {base['what']}: {res['main_metric']} {base['mean']:.2f}{plus_minus({**base, 'splits': keys})} "
            f"({lead:+.2f} for {res['method']})"
            + ("; the recipe trails it: try --method setfit or --method auto" if lead < 0 else "")
        )
    kept = res.get("model")
    if kept:  # the folder loads as the model of its best split
        print(
            f"model: split {kept['split']}'s, the best of the {kept['of']} splits on {scored} ({kept['score']:.2f}, "
            f"chosen there: optimistic), copied into {out}: cramkit predict --from {out} FILE; each split's model is "
            f"in {out}/split-S"
        )
    if res.get("self_training"):
        from cramkit.selftraining.recipe import fewshot_line

        print(fewshot_line(res))


def report_mixture(req: FinetuneRequest, res: dict[str, Any]) -> None:
    """A mixture's fine-tuning: each task's dev metrics and batches, the mean score, where the model is."""
    out = Path(str(req.out))
    weighted = res.get("weighting") is not None
    for name, entry in res["tasks"].items():
        for split, r in entry["dev"].items():
            metrics = ", ".join(f"{m} {v:.2f}" for m, v in r["metrics"].items())
            how = f"{entry['batches']} batches" if weighted else f"rate {entry['rate']:.3f}, {entry['batches']} batches"
            print(f"{name} {split}: {metrics} ({how})")
    if res["score"] is not None:
        print(f"mean of the tasks' main scores: {res['score']:.2f}")
    if weighted:
        primary = f", primary {res['primary']}" if res.get("primary") else ""
        print(f"weighting {res['weighting']}{primary}: every step one batch of each task")
    print(
        f"training: {res['examples_per_s']:.1f} examples/s, {res['seconds_per_step']:.3f} s/step; "
        f"results in {out / 'results.json'}"
    )
    print(f"model (one head per task) saved in {out}: cramkit predict --from {out} --task NAME FILE")


def report_contrastive(req: ContrastiveRequest, cfg: ContrastiveConfig, res: dict[str, Any]) -> None:
    """The contrastive stage: the held-out pairs' recall@1 and MRR before and after, the steps, where the model is."""
    before, after = res.get("before"), res.get("after")
    if after:
        was = f" (before: {before['dev_recall_at_1']:.1f}, {before['dev_mrr']:.1f})" if before else ""
        print(
            f"{cfg.objective}: dev recall@1 {after['dev_recall_at_1']:.1f}, MRR {after['dev_mrr']:.1f}{was}, "
            f"x100, over {res['dev_pairs']:,} held-out pairs"
        )
    print(
        f"trained {res['steps']} steps on {res['pairs']:,} pairs ({res['examples_per_s']:.1f} pairs/s)"
        + (f"; {res['skipped_rows']} rows skipped (an empty text)" if res["skipped_rows"] else "")
    )
    out = req.out
    print(f"embedding model saved in {out}: cramkit embed --from {out} FILE; cramkit index build --from {out} ...")
