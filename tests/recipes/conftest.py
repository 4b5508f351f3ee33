"""Helpers of the fine-tuning tests (the tiny pretrained run on SST-2 sentences, ``tiny_run``, is in the zoo)."""

from __future__ import annotations

from pathlib import Path


def write_mrpc_pairs(glue: Path, out: Path, n: int) -> Path:
    """The first ``n`` paraphrases (Quality 1) of GLUE MRPC's training file as a TSV of pairs (s1, s2)."""
    lines = (glue / "MRPC" / "train.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]
    rows = [line.split("\t") for line in lines]
    pairs = [(r[3], r[4]) for r in rows if r[0] == "1"][:n]
    out.write_text("s1\ts2\n" + "".join(f"{a}\t{b}\n" for a, b in pairs), encoding="utf-8")
    return out
