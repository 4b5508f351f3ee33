"""GLUE-shaped tasks derived from the built-in corpus (the Python standard library's docstrings), for the tests
that need labelled text on a clone without ../shared/data (issue 30). Real sentences, labels that a model can
learn, GLUE's exact file layout (SST-2, CoLA and MRPC's columns, headers and splits), so the registry reads
them as it reads GLUE:

- SST-2 shape (``sentence<TAB>label``): 1 if the sentence opens its paragraph (a docstring's summary line,
  usually "Return ...", "Create ...") else 0;
- CoLA shape (no header: source, label, original label, sentence): 1 for a sentence as written, 0 for the
  same words in a shuffled order;
- MRPC shape (Quality, ids, two strings): 1 for two consecutive sentences of one paragraph, 0 for sentences of
  two different documents.

Deterministic: the same files on every machine and Python of one standard library. Under ``CI=true`` the
real GLUE is used (conftest.glue_dir)."""

from __future__ import annotations

import random
import re
from pathlib import Path

# GLUE's own dev sizes (SST-2 872, CoLA 1,043, MRPC 408), which some tests take slices of
SIZES = {"train": 2000, "test": 200}
DEV = {"SST-2": 872, "CoLA": 1043, "MRPC": 408}


def _paragraphs() -> list[list[str]]:
    from cramkit.text.sources import iter_documents

    out = []
    for doc in iter_documents():
        for para in re.split(r"\n\s*\n", doc):
            sentences = [s for s in re.split(r"(?<=[.!?])\s+", " ".join(para.split())) if 5 <= len(s.split()) <= 40]
            if sentences:
                out.append(sentences)
    return out


def _split(rows: list, task: str) -> dict[str, list]:
    out, at = {}, 0
    for name, n in (("train", SIZES["train"]), ("dev", DEV[task]), ("test", SIZES["test"])):
        out[name] = rows[at : at + n]
        at += n
    return out


def write_glue_like(root: Path) -> Path:
    """Write ``root/SST-2``, ``root/CoLA`` and ``root/MRPC`` (train, dev and test .tsv) and return ``root``."""
    rng = random.Random(20261127)
    paras = _paragraphs()
    rng.shuffle(paras)
    total = sum(SIZES.values()) + max(DEV.values())

    # SST-2 shape: does the sentence open its paragraph?
    opening = [(p[0], 1) for p in paras if len(p) > 1]
    later = [(s, 0) for p in paras for s in p[1:]]
    rng.shuffle(later)
    half = total // 2
    rows = opening[:half] + later[:half]
    rng.shuffle(rows)
    sst = _split(rows, "SST-2")
    d = root / "SST-2"
    d.mkdir(parents=True, exist_ok=True)
    for name in ("train", "dev"):
        (d / f"{name}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in sst[name]))
    (d / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, (s, _) in enumerate(sst["test"])))

    # CoLA shape: the sentence as written, or its words shuffled
    flat = [s for p in paras for s in p]
    rng.shuffle(flat)
    rows = []
    for i, s in enumerate(flat[:total]):
        if i % 2:
            words = s.split()
            while len(set(words)) > 1 and words == s.split():
                rng.shuffle(words)
            rows.append((" ".join(words), 0))
        else:
            rows.append((s, 1))
    cola = _split(rows, "CoLA")
    d = root / "CoLA"
    d.mkdir(parents=True, exist_ok=True)
    for name in ("train", "dev"):
        (d / f"{name}.tsv").write_text("".join(f"std{y}\t{y}\t{'' if y else '*'}\t{s}\n" for s, y in cola[name]))
    (d / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, (s, _) in enumerate(cola["test"])))

    # MRPC shape: consecutive sentences of one paragraph, or sentences of two documents
    pairs = [(p[i], p[i + 1], 1) for p in paras for i in range(len(p) - 1)]
    rng.shuffle(pairs)
    pairs = pairs[: total // 2]
    for a, _, _ in list(pairs):
        pairs.append((a, flat[rng.randrange(len(flat))], 0))
    rng.shuffle(pairs)
    mrpc = _split(pairs, "MRPC")
    d = root / "MRPC"
    d.mkdir(parents=True, exist_ok=True)
    head = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    for name in ("train", "dev"):
        body = "".join(f"{y}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\n" for i, (a, b, y) in enumerate(mrpc[name]))
        (d / f"{name}.tsv").write_text(head + body)
    body = "".join(f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\n" for i, (a, b, _) in enumerate(mrpc["test"]))
    (d / "test.tsv").write_text("index\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + body)
    return root
