"""Two classification tasks from real text whose labels are its source, for the few-shot benchmarks (issue 28):

- ``abc``: the Australian Broadcasting Commission's 2006 news, rural vs science (../shared/data/corpus/nltk-abc), one
  sentence a row: a topic task;
- ``webtext``: informal web text by where it was written (../shared/data/corpus/nltk-webtext): Firefox bug reports,
  overheard conversations, personal ads, wine notes (4 classes; the two film scripts are left out), one line a row.

Rows of at least ``--min-words`` words, each text once; shuffled with seed 0; ``--dev`` rows per class go to
dev.tsv (at most half of a class), the rest to train.tsv (``text`` and ``label`` columns, tabs and quotes removed
from the text).

    python bench/make_source_tasks.py --corpus ../shared/data/corpus --out tasks
    python bench/bench_fewshot.py --model hf:MINILM --tasks files:tasks/abc,files:tasks/webtext --methods head,setfit
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

TASKS = {
    "abc": ("nltk-abc", ["rural", "science"]),
    "webtext": ("nltk-webtext", ["firefox", "overheard", "singles", "wine"]),
}


def read_lines(path: Path) -> list[str]:
    """The file's lines as text: UTF-8, else Latin-1 (some webtext files are); any line end (CRLF, U+0085)."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return [" ".join(line.replace('"', " ").split()) for line in text.splitlines()]


def write_task(corpus: Path, name: str, out: Path, min_words: int, dev_per_class: int) -> dict[str, int]:
    folder, labels = TASKS[name]
    rng = random.Random(0)
    train, dev = [], []
    for label in labels:
        lines = read_lines(corpus / folder / f"{label}.txt")
        rows = list(dict.fromkeys(t for t in lines if len(t.split()) >= min_words))
        rng.shuffle(rows)
        cut = min(dev_per_class, len(rows) // 2)  # a small class keeps half its rows for training
        dev += [(t, label) for t in rows[:cut]]
        train += [(t, label) for t in rows[cut:]]
    rng.shuffle(train)
    rng.shuffle(dev)
    (out / name).mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("dev", dev)):
        lines = ["text\tlabel", *(f"{t}\t{label}" for t, label in rows)]
        (out / name / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"train": len(train), "dev": len(dev)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="../shared/data/corpus")
    ap.add_argument("--out", default="tasks")
    ap.add_argument("--min-words", type=int, default=6)
    ap.add_argument("--dev", type=int, default=250, help="dev rows per class")
    args = ap.parse_args()
    for name in TASKS:
        sizes = write_task(Path(args.corpus), name, Path(args.out), args.min_words, args.dev)
        print(f"{args.out}/{name}: {sizes['train']:,} train rows, {sizes['dev']:,} dev rows")


if __name__ == "__main__":
    main()
