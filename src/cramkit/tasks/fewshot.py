"""LM-BFF's few-shot protocol for any registered task (Gao et al. 2021, section 3): split ``s`` of a task
is K training examples per class and a dev set of another K per class, both drawn from the task's training
data; the task's own dev split (its own scored splits: GLUE's dev, FewCLUE's test_public) is the test. Scores
are reported as the mean and standard deviation over the splits.

    view = few_shot_task(get_task("glue/sst2", data_dir="glue"), k=16, split=0)
    view.examples("train")     # 32 rows: 16 negative, 16 positive
    view.selection_splits      # ["fewshot_dev"]: what picks the kept checkpoint
    view.scored_splits         # ["dev"]: what is reported

The draw is a function of (k, split) alone (numpy's PCG64 with a fixed seed), so every method and every
model sees the same examples in split s.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cramkit.errors import CramkitError
from cramkit.tasks.registry import Example, Task

FEWSHOT_DEV = "fewshot_dev"


def class_of(task: Task, e: Example) -> int:
    """The class an example is counted in: its label (classification), its right choice (multiple choice)."""
    assert e.label is not None  # few_shot refuses unlabelled rows first
    return int(e.label)


def few_shot_task(task: Task, k: int, split: int) -> Task:
    """Split ``split`` of ``task`` with ``k`` examples per class for training and ``k`` per class for model
    selection; CramkitError (one line) for a regression task, a task without a labelled split to score on,
    or a class with fewer than 2k examples."""
    if k < 1 or split < 0:
        raise CramkitError(f"--few-shot K needs K >= 1 (and --splits >= 1), got K={k}, split {split}")
    if task.is_regression:
        raise CramkitError(f"--few-shot: task {task.name} is a regression task; K examples per class needs classes")
    scored = task.scored_splits
    if not scored:
        raise CramkitError(f"--few-shot: task {task.name} has no labelled dev split to score on")
    rows = task.examples(task.train_split)
    by_class: dict[int, list[Example]] = {}
    for e in rows:
        if e.label is None:
            raise CramkitError(f"--few-shot: task {task.name}'s {task.train_split} split has unlabelled rows")
        by_class.setdefault(class_of(task, e), []).append(e)
    names = task.labels or [str(c) for c in sorted(by_class)]
    classes = range(len(task.labels)) if task.labels is not None else sorted(by_class)
    for c in classes:
        have = len(by_class.get(c, []))
        if have < 2 * k:
            raise CramkitError(
                f"--few-shot {k}: class {names[c] if c < len(names) else c} of task {task.name} has {have} "
                f"training examples, fewer than the {2 * k} that K={k} needs (K for training, K for the dev set); "
                f"the largest K for this task is {min(len(by_class.get(x, [])) for x in classes) // 2}"
            )
    rng = np.random.default_rng([k, split, 13])
    train, dev = [], []
    for c in classes:
        pool = by_class[c]
        pick = rng.permutation(len(pool))[: 2 * k]
        train += [pool[i] for i in pick[:k]]
        dev += [pool[i] for i in pick[k:]]
    order = rng.permutation(len(train))  # classes interleaved (the loader shuffles again, by seed)
    train = [train[i] for i in order]
    splits = {name: task.splits[name] for name in scored}
    splits["train"] = lambda: train
    splits[FEWSHOT_DEV] = lambda: dev
    view = dataclasses.replace(
        task,
        splits=splits,
        train_split="train",
        dev_splits=[FEWSHOT_DEV, *scored],
        score_splits=list(scored),
        test_splits=[],
        _cache={name: task.examples(name) for name in scored},  # read once, by the task itself
    )
    return view
