"""Does a model's MLM head read the context at the mask? (issue 28: the prompt's precondition)

A prompt (PET / LM-BFF) asks the MLM head which label word fits the template's ``[MASK]``; that works only if
the head's answer at a mask depends on the sentence. For each model: its top words at the mask of probe
sentences that call for very different words, how many different first words they get, and the task's
built-in prompt scored before any training (``cramkit.recipes.finetune_prompt.zero_shot_logits``: at most 512 evenly
spaced dev rows, and how many labels it predicts at all), and the same scored again with each label's score centred
on its mean over those rows (no labels used: a head whose words carry the task but lean to one label scores
well centred; a head that does not read the context stays at chance either way).

    python bench/bench_heads.py --model runs/minilm-head --model runs/tiny --task glue/sst2 --data-dir glue
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_infer import machine

PROBES = (
    "a gripping , funny and moving film . it was [MASK] .",
    "the worst , most boring movie ever made . it was [MASK] .",
    "the capital of france is [MASK] .",
    "he went to the [MASK] to buy some bread .",
    "she opened the door and [MASK] into the room .",
)


def top_words(loaded, probes: tuple[str, ...], k: int = 5) -> list[list[str]]:
    tok, model = loaded.tokenizer, loaded.model.eval()
    out = []
    for text in probes:
        enc = tok.encode(text)
        ids = torch.tensor([enc.ids])
        with torch.no_grad():
            hidden = loaded.encoder(ids, torch.ones_like(ids), torch.zeros_like(ids))
            logits = model.head(hidden)[0, enc.tokens.index("[MASK]")]
        out.append([tok.id_to_token(int(i)) for i in logits.topk(k).indices])
    return out


def prompt_scores(task, loaded, cfg, prompt) -> tuple[float, int, int, float]:
    """The prompt before training on zero_shot's rows: score, rows, labels predicted, and the score with each
    label's logit less its mean over the rows."""
    from cramkit.recipes.finetune_prompt import zero_shot_logits

    rows, labels, logits = zero_shot_logits(task, loaded, cfg, prompt, 128, torch.device("cpu"))
    score = task.score(task.compute_metrics(logits, labels, rows))
    centred = task.score(task.compute_metrics(logits - logits.mean(0, keepdims=True), labels, rows))
    return score, len(rows), len(set(logits.argmax(1).tolist())), centred


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="a model with an MLM head (repeatable)")
    ap.add_argument("--task", default="glue/sst2")
    ap.add_argument("--data-dir", required=True)
    args = ap.parse_args()
    import cramkit
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.finetune_prompt import resolve_prompt
    from cramkit.tasks.registry import get_task

    task = get_task(args.task, data_dir=args.data_dir)
    cfg = FinetuneConfig(method="prompt")
    print(f"{machine()}; {args.task}'s built-in prompt; top words at the mask of {len(PROBES)} probe sentences\n")
    print("| model | first word at the mask, per probe | different first words | prompt before training | centred |")
    print("|---|---|---:|---|---:|")
    for name in args.model:
        loaded = cramkit.load(name)
        words = top_words(loaded, PROBES)
        prompt = resolve_prompt(task, loaded, cfg)
        assert prompt is not None
        score, examples, predicted, centred = prompt_scores(task, loaded, cfg, prompt)
        firsts = [w[0] for w in words]
        zero = f"{score:.1f} on {examples} rows, {predicted} label(s) predicted"
        print(f"| {Path(name).name} | {' / '.join(firsts)} | {len(set(firsts))} | {zero} | {centred:.1f} |", flush=True)
        for probe, w in zip(PROBES, words, strict=True):
            print(f"  {probe!r}: {', '.join(w)}", file=sys.stderr)


if __name__ == "__main__":
    main()
