"""GLUE MRPC -> a retrieval set in BEIR's layout, for `cramkit eval retrieval`.

Queries: the first sentence (#1 String) of every paraphrase pair (Quality 1). Corpus: every second sentence
(#2 String), and the first sentence of every non-paraphrase pair as a distractor. Judgements: each query's
paraphrase, score 1. Ids are MRPC's sentence ids (a sentence that is both a query and a distractor keeps one
id, so BEIR's rule of leaving out a hit with the query's own id applies to it).

    python bench/make_beir.py --glue-dir ../shared/data/glue --split dev --out /tmp/mrpc-beir
    cramkit eval retrieval --from hf:DIR --data /tmp/mrpc-beir --split dev
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_mrpc(path: Path) -> list[tuple[int, str, str, str, str]]:
    """(quality, #1 ID, #2 ID, #1 String, #2 String) per row of an MRPC train.tsv / dev.tsv."""
    rows = []
    lines = path.read_text(encoding="utf-8-sig").split("\n")
    header = lines[0].rstrip("\r").split("\t")
    if header[:3] != ["Quality", "#1 ID", "#2 ID"]:
        raise SystemExit(f"{path}: not an MRPC file with labels (header {header}); use train.tsv or dev.tsv")
    for line in lines[1:]:
        parts = line.rstrip("\r").split("\t")
        if len(parts) == 5:
            rows.append((int(parts[0]), parts[1], parts[2], parts[3], parts[4]))
    return rows


def write_beir(
    out: Path, corpus: dict[str, str], queries: dict[str, str], qrels: list[tuple[str, str]], split: str
) -> None:
    """out/corpus.jsonl and out/queries.jsonl (id -> text) and out/qrels/SPLIT.tsv (query id, relevant id)."""
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for cid, text in corpus.items():
            f.write(json.dumps({"_id": cid, "title": "", "text": text}) + "\n")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
        for qid, text in queries.items():
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    with open(out / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for qid, cid in dict.fromkeys(qrels):
            f.write(f"{qid}\t{cid}\t1\n")


def make_beir(mrpc_tsv: Path, out: Path, split: str = "test", max_pairs: int | None = None) -> dict[str, int]:
    """Write out/corpus.jsonl, out/queries.jsonl and out/qrels/SPLIT.tsv from ``mrpc_tsv``; the counts."""
    rows = read_mrpc(mrpc_tsv)[:max_pairs]
    corpus: dict[str, str] = {}
    queries: dict[str, str] = {}
    qrels: list[tuple[str, str]] = []
    for quality, id1, id2, s1, s2 in rows:
        corpus.setdefault(id2, s2)
        if quality == 1:
            queries.setdefault(id1, s1)
            qrels.append((id1, id2))
        else:
            corpus.setdefault(id1, s1)
    write_beir(out, corpus, queries, qrels, split)
    return {"pairs": len(rows), "corpus": len(corpus), "queries": len(queries), "qrels": len(dict.fromkeys(qrels))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--glue-dir", required=True, help="GLUE's folder (MRPC/train.tsv, MRPC/dev.tsv)")
    ap.add_argument("--split", default="dev", choices=("train", "dev"), help="the MRPC file to convert (dev)")
    ap.add_argument("--out", required=True, help="the BEIR folder to write")
    ap.add_argument("--max-pairs", type=int, default=None, help="only the first N pairs")
    args = ap.parse_args()
    counts = make_beir(Path(args.glue_dir) / "MRPC" / f"{args.split}.tsv", Path(args.out), args.split, args.max_pairs)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
