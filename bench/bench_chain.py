"""The in-domain chain (issue 29): MiniLM -> masked-LM on the domain's text -> contrastive stage, against MiniLM
unchanged and MiniLM -> contrastive alone, on a retrieval set built from text no model here was trained on.

Data (``--corpus``, ../shared/data/corpus/nltk-abc): ABC's 2006 rural and science news, one article per block of
lines (blocks split at blank lines, at least 4 lines). Articles are shuffled with seed 0; ``--test`` of them
are held out. A pair is (the article's first line, its headline or lead sentence; the rest of the article, its
first ``--words`` words): the held-out articles make a BEIR-layout set (each query's one relevant passage among
every held-out passage), the others the training pairs of the contrastive stage and the text of the masked-LM
stage (their passages, the queries too).

Models, each scored with ``cramkit.evaluate_retrieval`` (exact search, nDCG@10 and recall@1, x100):
- ``minilm``: all-MiniLM-L6-v2 unchanged;
- ``mlm``: MiniLM after ``cramkit.pretrain(TRAIN_TEXT, init=MINILM, budget=--mlm-budget)`` (the continue preset);
  with ``--anchored`` also ``mlm-anchored``, the same stage with ``train.keep_vectors=1`` and ``data.doc_mask=true``;
- ``minilm+con``, ``mlm+con`` (and ``mlm-anchored+con``): each after the contrastive stage on the training pairs
  (``--steps`` steps of ``--batch`` pairs, in-batch negatives), per ``--seeds``;
- with ``--simcse``, ``minilm+simcse`` and ``mlm+simcse``: the unsupervised mode instead (SimCSE: each training
  headline and passage its own positive through dropout), same steps and batch.

With ``--scratch BUDGET`` instead: a model cramkit pretrains from nothing on the same training text
(``cramkit.pretrain(TRAIN_TEXT, budget=BUDGET)``, the preset the machine gets), then ``scratch+con`` and
``scratch+simcse`` from it: what the contrastive stage and SimCSE do for a cramkit-pretrained model.

With ``--matryoshka 256,128,64`` instead: MiniLM -> contrastive with the loss also on those leading dimensions
(``minilm+con-mat``), against ``minilm+con`` trained without; both scored at the full vector and at each cut
(vectors cut and renormalised, exact search; nDCG@10 computed here, equal to ``evaluate_retrieval``'s at full).

A finished stage is not run again (its results.json), so the bench resumes where it stopped.

    python bench/bench_chain.py --corpus ../shared/data/corpus/nltk-abc --seeds 0,1,2 --work /tmp/chain
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_infer import machine, minilm_dir


def articles(corpus: Path, min_lines: int = 4) -> list[list[str]]:
    out = []
    for f in sorted(corpus.glob("*.txt")):
        block: list[str] = []
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines() + [""]:
            line = " ".join(line.split())
            if line:
                block.append(line)
                continue
            if len(block) >= min_lines:
                out.append(block)
            block = []
    return out


def build(args: argparse.Namespace, work: Path) -> tuple[list[tuple[str, str, None]], Path, Path, dict]:
    docs = articles(Path(args.corpus))
    random.Random(0).shuffle(docs)
    test, train = docs[: args.test], docs[args.test :]

    def pair(doc: list[str]) -> tuple[str, str]:
        return doc[0], " ".join(" ".join(doc[1:]).split()[: args.words])

    beir = work / "beir"
    (beir / "qrels").mkdir(parents=True, exist_ok=True)
    with open(beir / "corpus.jsonl", "w", encoding="utf-8") as c, open(beir / "queries.jsonl", "w") as q:
        for i, doc in enumerate(test):
            query, passage = pair(doc)
            c.write(json.dumps({"_id": f"d{i}", "title": "", "text": passage}) + "\n")
            q.write(json.dumps({"_id": f"q{i}", "text": query}) + "\n")
    judged = "".join(f"q{i}\td{i}\t1\n" for i in range(len(test)))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + judged)
    pairs = [(*pair(d), None) for d in train]
    text = work / "train-text.txt"  # the masked-LM stage's text: the training articles, one per block
    text.write_text("\n\n".join("\n".join(d) for d in train) + "\n", encoding="utf-8")
    return pairs, beir, text, {"articles": len(docs), "test": len(test), "train_pairs": len(pairs)}


def score(model: str | Path, beir: Path) -> dict[str, float]:
    import cramkit

    m = cramkit.evaluate_retrieval(str(model), beir, None, split="test", progress=False, device="cpu")["metrics"]
    return {"ndcg@10": round(m["ndcg@10"], 2), "recall@1": round(m["recall@1"], 2)}


def contrastive(
    model: str, pairs, out: Path, seed: int, args: argparse.Namespace, objective: str, matryoshka: str = ""
) -> dict:
    from cramkit.recipes import contrastive as con
    from cramkit.recipes.contrastive_config import config_from

    cfg = config_from(
        {
            "objective": objective,
            "budget": f"{args.steps}steps",
            "batch_size": args.batch,
            "seed": seed,
            "dev_fraction": 0.0,
            "checkpoint_every": "never",
            "device": "cpu",
            "matryoshka": matryoshka,
        }
    )
    return con.train_embeddings(model, pairs, cfg, out, progress=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="../shared/data/corpus/nltk-abc")
    ap.add_argument("--test", type=int, default=500, help="held-out articles (queries and passages)")
    ap.add_argument("--words", type=int, default=48, help="words of each passage")
    ap.add_argument("--mlm-budget", default="5m")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--work", default="bench-chain")
    ap.add_argument("--anchored", action="store_true", help="also a masked-LM stage held to MiniLM's vectors")
    ap.add_argument("--simcse", action="store_true", help="also SimCSE (text only) from MiniLM and the MLM stage")
    ap.add_argument("--matryoshka", default=None, metavar="DIMS", help="only Matryoshka training against none")
    ap.add_argument("--scratch", default=None, metavar="BUDGET", help="only a model pretrained from nothing, and after")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    pairs, beir, text, counts = build(args, work)
    print(json.dumps({"machine": machine(), **counts, **vars(args)}), flush=True)
    minilm = f"hf:{minilm_dir()}"
    rows = {"minilm": [score(minilm, beir)]}
    print(json.dumps({"model": "minilm", **rows["minilm"][0]}), flush=True)
    if args.matryoshka:
        matryoshka(args, work, pairs, beir, minilm)
        return
    if args.scratch:
        stages = scratch_stages(args, work, text, pairs, beir, rows)
    else:
        stages = minilm_stages(args, work, text, pairs, beir, rows, minilm)
    run_stages(args, work, stages, beir, rows)


def cut_ndcg(model: str | Path, beir: Path, dims: list[int]) -> dict[int, float]:
    """nDCG@10 x100 of the one relevant passage per query (query i -> passage i), vectors cut to each of
    ``dims`` leading dimensions and renormalised, exact search."""
    import numpy as np

    from cramkit.infer import Engine

    queries = [json.loads(line)["text"] for line in (beir / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    passages = [json.loads(line)["text"] for line in (beir / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    engine = Engine(str(model), device="cpu")
    q, c = engine.embed(queries, normalize=False), engine.embed(passages, normalize=False)
    out = {}
    for d in dims:
        qd, cd = q[:, :d], c[:, :d]
        qd = qd / np.linalg.norm(qd, axis=1, keepdims=True)
        cd = cd / np.linalg.norm(cd, axis=1, keepdims=True)
        s = qd @ cd.T
        rank = (s > s[np.arange(len(q)), np.arange(len(q))][:, None]).sum(1)  # passages scored above the right one
        out[d] = round(float(np.where(rank < 10, 1.0 / np.log2(rank + 2), 0.0).mean() * 100), 2)
    return out


def matryoshka(args: argparse.Namespace, work: Path, pairs, beir: Path, minilm: str) -> None:
    dims = [384, *[int(d) for d in args.matryoshka.split(",")]]
    table = {}
    for name, mat in (("minilm+con", ""), ("minilm+con-mat", args.matryoshka)):
        table[name] = []
        for seed in [int(s) for s in args.seeds.split(",")]:
            out = work / f"{name}-{seed}"
            contrastive(minilm, pairs, out, seed, args, "contrastive", mat)
            row = cut_ndcg(out, beir, dims)
            table[name].append(row)
            print(json.dumps({"model": name, "seed": seed, **row}), flush=True)
    print("| model | " + " | ".join(f"{d} dims" for d in dims) + " |")
    print("|---|" + "---:|" * len(dims))
    for name, rs in table.items():
        cells = []
        for d in dims:
            xs = [r[d] for r in rs]
            cells.append(f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


def scratch_stages(args, work: Path, text: Path, pairs, beir: Path, rows: dict) -> list:
    import cramkit

    run = work / "scratch"
    if not (run / "checkpoints").is_dir():
        t0 = time.time()
        cramkit.pretrain([str(text)], budget=args.scratch, out=run, overrides=["train.progress=false"])
        print(f"pretraining from nothing: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    rows["scratch"] = [score(run, beir)]
    print(json.dumps({"model": "scratch", **rows["scratch"][0]}), flush=True)
    texts = [(t, t, None) for t in dict.fromkeys(x for a, b, _ in pairs for x in (a, b))]
    return [("scratch+con", str(run), pairs), ("scratch+simcse", str(run), texts)]


def minilm_stages(args, work: Path, text: Path, pairs, beir: Path, rows: dict, minilm: str) -> list:
    import cramkit

    variants = [("mlm", [])]
    if args.anchored:  # the anchors of `pretrain --from` (RESULTS, "Few labels: adaptation with an anchor")
        variants.append(("mlm-anchored", ["train.keep_vectors=1", "data.doc_mask=true"]))
    stages = [("minilm+con", minilm, pairs)]
    for name, sets in variants:
        mlm = work / name
        if not (mlm / "checkpoints").is_dir():
            t0 = time.time()
            sets = ["train.progress=false", *sets]
            cramkit.pretrain([str(text)], init=minilm, budget=args.mlm_budget, out=mlm, overrides=sets)
            print(f"masked-LM stage {name}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        rows[name] = [score(mlm, beir)]
        print(json.dumps({"model": name, **rows[name][0]}), flush=True)
        stages.append((f"{name}+con", str(mlm), pairs))
    mlm = work / "mlm"
    if args.simcse:  # text only: each training headline and passage once, its own positive (dropout noise)
        texts = [(t, t, None) for t in dict.fromkeys(x for a, b, _ in pairs for x in (a, b))]
        stages += [("minilm+simcse", minilm, texts), ("mlm+simcse", str(mlm), texts)]
    return stages


def run_stages(args, work: Path, stages: list, beir: Path, rows: dict) -> None:
    for name, start, rows_in in stages:
        rows[name] = []
        for seed in [int(s) for s in args.seeds.split(",")]:
            out = work / f"{name}-{seed}"
            t0 = time.time()
            res = contrastive(start, rows_in, out, seed, args, "simcse" if "simcse" in name else "contrastive")
            row = score(out, beir)
            rows[name].append(row)
            print(json.dumps({"model": name, "seed": seed, "pairs_per_s": res["examples_per_s"],
                              "seconds": round(time.time() - t0), **row}), flush=True)  # fmt: skip
    print("| model | nDCG@10 (per seed) | mean ± sd | recall@1 mean |")
    print("|---|---|---|---:|")
    for name, rs in rows.items():
        nd = [r["ndcg@10"] for r in rs]
        sd = statistics.stdev(nd) if len(nd) > 1 else 0.0
        per = " / ".join(f"{x:.2f}" for x in nd)
        r1 = statistics.mean(r["recall@1"] for r in rs)
        print(f"| {name} | {per} | {statistics.mean(nd):.2f} ± {sd:.2f} | {r1:.2f} |")


if __name__ == "__main__":
    main()
