"""Two classification tasks from real text whose labels are its source, for the few-shot benchmarks (issue 28):

- ``abc``: the Australian Broadcasting Commission's 2006 news, rural vs science (../shared/data/corpus/nltk-abc), one
  sentence a row: a topic task;
- ``webtext``: informal web text by where it was written (../shared/data/corpus/nltk-webtext): Firefox bug reports,
  overheard conversations, personal ads, wine notes (4 classes; the two film scripts are left out), one line a row;
- ``novels``: a sentence's era, ``early`` (a novel of 1875 or before) or ``late`` (1905 or after), from
  ../shared/data/corpus/english-novels-100: prose unlike the web text today's encoders learn from. Dev sentences
  come from other authors than training sentences (every fourth author of each era, by name), so the task is the
  era's language, not its characters' names; at most ``--per-novel`` sentences of 8-60 words from each novel.

Rows of at least ``--min-words`` words, each text once; shuffled with seed 0; ``--dev`` rows per class go to
dev.tsv (at most half of a class), the rest to train.tsv (``text`` and ``label`` columns, tabs and quotes removed
from the text).

    python bench/make_source_tasks.py --corpus ../shared/data/corpus --out tasks
    python bench/bench_adapt.py --model hf:MINILM --task files:tasks/novels --labels 500 --labels 1000
    python bench/bench_fewshot.py --model hf:MINILM --tasks files:tasks/abc,files:tasks/webtext --methods head,setfit
"""

from __future__ import annotations

import argparse
import random
import re
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
    return write_rows(out / name, train, dev)


def novel_sentences(path: Path) -> list[str]:
    """A novel's sentences: paragraphs split at blank lines, sentences at ., ! or ? before a capital or quote."""
    text = path.read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    out = []
    for para in re.split(r"\n\s*\n", text):
        flat = " ".join(para.replace('"', " ").split())
        out += [t for t in re.split(r"(?<=[.!?])\s+(?=[A-Z'])", flat) if 8 <= len(t.split()) <= 60]
    return out


def write_novels(corpus: Path, out: Path, per_novel: int, dev_per_class: int) -> dict[str, int]:
    """The ``novels`` task (module docstring): train and dev sentences from disjoint authors of each era."""
    rng = random.Random(0)
    by_era: dict[str, dict[str, list[Path]]] = {"early": {}, "late": {}}
    for path in sorted((corpus / "english-novels-100").glob("*_*_*.txt")):
        year = int(path.stem.rsplit("_", 1)[1])
        era = "early" if year <= 1875 else "late" if year >= 1905 else None
        if era:
            by_era[era].setdefault(path.stem.split("_", 1)[0], []).append(path)
    train, dev = [], []
    for era, authors in by_era.items():
        pool: dict[bool, list[str]] = {True: [], False: []}
        for i, author in enumerate(sorted(authors)):
            for path in authors[author]:
                rows = novel_sentences(path)
                rng.shuffle(rows)
                pool[i % 4 == 3] += rows[:per_novel]
        rng.shuffle(pool[True])
        dev += [(t, era) for t in pool[True][:dev_per_class]]
        train += [(t, era) for t in pool[False]]
    rng.shuffle(train)
    rng.shuffle(dev)
    return write_rows(out / "novels", train, dev)


def write_rows(folder: Path, train: list[tuple[str, str]], dev: list[tuple[str, str]]) -> dict[str, int]:
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("dev", dev)):
        lines = ["text\tlabel", *(f"{t}\t{label}" for t, label in rows)]
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"train": len(train), "dev": len(dev)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="../shared/data/corpus")
    ap.add_argument("--out", default="tasks")
    ap.add_argument("--min-words", type=int, default=6)
    ap.add_argument("--dev", type=int, default=250, help="dev rows per class")
    ap.add_argument("--per-novel", type=int, default=300, help="novels: sentences from each novel at most")
    args = ap.parse_args()
    for name in [*TASKS, "novels"]:
        if name == "novels":
            sizes = write_novels(Path(args.corpus), Path(args.out), args.per_novel, args.dev)
        else:
            sizes = write_task(Path(args.corpus), name, Path(args.out), args.min_words, args.dev)
        print(f"{args.out}/{name}: {sizes['train']:,} train rows, {sizes['dev']:,} dev rows")


if __name__ == "__main__":
    main()
