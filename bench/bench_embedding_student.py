"""The embedding student (issue 65, item 4): fewer FLOPs at the same quality.

``cramkit distill --teacher hf:all-MiniLM-L6-v2 --student layers:3`` on ``--sentences`` English sentences of
WikiText-2 (validation and test, detokenised, sentences with ``<unk>`` dropped; then the nltk-abc news if more are
asked), then teacher and student scored the way bench/bench_contrastive.py scores a model: MRPC's dev split as a
retrieval set (``bench/make_beir.py``: nDCG@10, recall@1 and recall@10, x100, ``cramkit.evaluate_retrieval``) and as
STS (Spearman of the cosine with the 0/1 paraphrase label, x100, ``cramkit.evaluate_sts``); none of MRPC is in the
training text. Speed: texts/s of teacher and student through ``cramkit.infer.Engine`` at ``--threads`` (1)
thread(s) on MRPC's short sentences, each ``--backends`` path (torch at the CPU's default precision; ct2: a
CTranslate2 export made by the engine), both models interleaved round by round in one run, the median.

    python bench/bench_embedding_student.py --glue ../shared/data/glue --sentences 20000 --layers 3

``--sts FILE`` (STS benchmark's sts-test.csv: tab-separated genre, file, year, id, score, sentence1, sentence2,
not in ../shared: the user brings it) adds its Spearman x100 for teacher and student (``cramkit.evaluate_sts``).
``--score DIR ...`` scores models already made (no training): ``--score hf:TEACHER DIR1 DIR2``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_beir import make_beir, read_mrpc, write_beir

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _detok(line: str) -> str:
    line = line.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    line = re.sub(r" ([.,;:!?')])", r"\1", line)
    return re.sub(r"([(]) ", r"\1", line).replace(" 's", "'s").replace(" n't", "n't")


def sentences(data: Path, n: int) -> list[str]:
    """Up to ``n`` different English sentences of 5 to 50 words: WikiText-2's, then nltk-abc's, then the novels'."""
    out: dict[str, None] = {}
    wiki = [data / "wikitext-2" / f"wiki.{s}.tokens" for s in ("valid", "test")]
    for path in wiki:
        for para in path.read_text(encoding="utf-8").splitlines():
            para = para.strip()
            if not para or para.startswith("="):
                continue
            for sent in re.split(r"(?<= [.!?]) ", para):
                if "<unk>" not in sent and 5 <= len(sent.split()) <= 50:
                    out[_detok(sent)] = None
    abc = sorted((data / "corpus" / "nltk-abc").glob("*.txt"))
    novels = sorted((data / "corpus" / "english-novels-100").glob("*.txt"))  # past abc's ~30k, when asked
    for path in abc + novels:
        if len(out) >= n:
            break
        text = " ".join(path.read_text(encoding="utf-8-sig", errors="replace").split())
        for sent in re.split(r"(?<=[.!?]) (?=[A-Z])", text):
            if len(out) >= n:
                break
            if 5 <= len(sent.split()) <= 50:
                out[sent] = None
    return list(out)[:n]


def scores(model: str, beir: Path, sts: Path) -> dict[str, float]:
    """bench_contrastive's scores, with recall@10: MRPC dev as retrieval and as STS (x100)."""
    import cramkit

    r = cramkit.evaluate_retrieval(model, beir, None, split="dev", progress=False, device="cpu")
    s = cramkit.evaluate_sts(
        model, sts, None, text_a="#1 String", text_b="#2 String", label="Quality", progress=False, device="cpu"
    )
    m = r["metrics"]
    return {"ndcg@10": m["ndcg@10"], "recall@1": m["recall@1"], "recall@10": m["recall@10"],
            "sts_spearman": s["metrics"]["spearman"]}  # fmt: skip


def stsb_pairs(path: Path, work: Path) -> Path:
    """STS benchmark's csv (no header; score in column 5, the sentences in 6 and 7; some rows carry extra
    columns after them) as a TSV with GLUE's header, which ``cramkit eval sts`` reads."""
    rows = ["sentence1\tsentence2\tscore"]
    for line in path.read_text(encoding="utf-8").splitlines():
        cols = line.split("\t")
        if len(cols) >= 7:
            rows.append(f"{cols[5]}\t{cols[6]}\t{cols[4]}")
    out = work / f"{path.stem}.tsv"
    out.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return out


def stsb(model: str, tsv: Path) -> float:
    import cramkit

    return cramkit.evaluate_sts(model, tsv, None, progress=False, device="cpu")["metrics"]["spearman"]


def stsb_beir(test_csv: Path, out: Path, at_least: float = 4.0) -> dict[str, int]:
    """A paraphrase retrieval set from the STS benchmark: each test pair scored >= ``at_least`` a query (the
    first sentence) and its one relevant document (the second), among every other sentence of the benchmark's
    files beside ``test_csv`` (train, dev, test: ~14k) as distractors; query texts kept out of the corpus."""
    pairs, sentences = [], {}
    for path in sorted(test_csv.parent.glob("sts-*.csv")):
        for line in path.read_text(encoding="utf-8").splitlines():
            cols = line.split("\t")
            if len(cols) < 7:
                continue
            sentences.setdefault(cols[5], None)
            sentences.setdefault(cols[6], None)
            if path == test_csv and float(cols[4]) >= at_least and cols[5] != cols[6]:
                pairs.append((cols[5], cols[6]))
    queries = {a: None for a, _ in pairs}
    pairs = [(a, b) for a, b in pairs if b not in queries]
    corpus = {t: f"d{i}" for i, t in enumerate(t for t in sentences if t not in queries)}
    qids = {a: f"q{i}" for i, a in enumerate(dict.fromkeys(a for a, _ in pairs))}
    qrels = [(qids[a], corpus[b]) for a, b in pairs]
    write_beir(out, {cid: t for t, cid in corpus.items()}, {qid: t for t, qid in qids.items()}, qrels, "test")
    return {"queries": len(qids), "corpus": len(corpus), "qrels": len(dict.fromkeys(pairs))}


def stsb_retrieval(model: str, beir: Path) -> dict[str, float]:
    import cramkit

    m = cramkit.evaluate_retrieval(model, beir, None, split="test", progress=False, device="cpu")["metrics"]
    return {"ndcg@10": m["ndcg@10"], "recall@1": m["recall@1"], "recall@10": m["recall@10"]}


def texts_per_s(models: dict[str, str], texts: list[str], backends: list[str], rounds: int, threads: int) -> dict:
    """Median texts/s of each (model, backend) through ``Engine.embed`` on ``texts``, interleaved round by round."""
    import torch

    import cramkit
    from cramkit.infer import Engine

    torch.set_num_threads(threads)
    engines = {}
    for backend in backends:
        for name, path in models.items():
            try:
                if backend == "ct2-int8":  # cramkit's fastest path for MiniLM on these CPUs (bench/RESULTS.md)
                    where = Path(path.removeprefix("hf:")).parent / f"{Path(path).name}-ct2-int8"
                    if not where.is_dir():
                        cramkit.export(path, where, format="ct2", quantize="int8", progress=False)
                    eng = Engine(str(where), device="cpu", threads=threads)
                else:
                    eng = Engine(path, backend=backend, device="cpu", threads=threads)
            except Exception as exc:  # a format not installed here: said, skipped
                print(f"# {backend} for {name}: {str(exc)[:160]}", flush=True)
                continue
            eng.embed(texts[:32])  # warm
            engines[f"{name}/{backend}"] = eng
    got: dict[str, list[float]] = {k: [] for k in engines}
    for r in range(rounds):
        for key, eng in engines.items():
            t0 = time.perf_counter()
            eng.embed(texts)
            got[key].append(len(texts) / (time.perf_counter() - t0))
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in got.items()), flush=True)
    precision = {k: getattr(e.runner, "precision", None) or getattr(getattr(e.runner, "inner", None), "precision", "")
                 for k, e in engines.items()}  # fmt: skip
    return {
        k: {"texts_per_s": statistics.median(v), "rounds": v, "precision": str(precision[k])} for k, v in got.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--glue", default=str(SHARED / "glue"))
    ap.add_argument("--teacher", default="/work/models/minilm", help="a sentence-transformers folder (hf:DIR)")
    ap.add_argument("--sentences", type=int, default=20000)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--set", action="append", default=[], help="more distill settings, KEY=VALUE")
    ap.add_argument("--threads", default="1", help="threads of the speed rounds (with --score: a list, 1,2)")
    ap.add_argument("--backends", default="torch,ct2", help="torch, ct2, ct2-int8 (an int8 export); 'none'")
    ap.add_argument("--cache", default=None, help="the teacher's embeddings (default WORK/cache): reuse across runs")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default="bench-embedding-student")
    ap.add_argument("--sts", default=None, help="STS benchmark's sts-test.csv (or sts-dev.csv): its Spearman too")
    ap.add_argument("--score", nargs="+", default=None, help="score these models only (no training)")
    args = ap.parse_args()
    import cramkit
    from bench_infer import machine

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"# {machine()}", flush=True)
    sts_b = stsb_pairs(Path(args.sts), work) if args.sts else None
    if sts_b is not None:
        print(f"# STS-B retrieval set: {stsb_beir(Path(args.sts), work / 'stsb-beir')}", flush=True)
    if args.score:
        print("| model | STS-B Spearman | STS-B paraphrase retrieval nDCG@10 / recall@1 / recall@10 |")
        for model in args.score:
            if sts_b is None:
                break
            r = stsb_retrieval(model, work / "stsb-beir")
            print(f"| {model} | {stsb(model, sts_b):.2f} | {r['ndcg@10']:.2f} / {r['recall@1']:.2f} / "
                  f"{r['recall@10']:.2f} |", flush=True)  # fmt: skip
        if args.backends != "none":
            short = sorted({s for _, _, _, a, b in read_mrpc(Path(args.glue) / "MRPC" / "dev.tsv") for s in (a, b)})
            for threads in (int(t) for t in str(args.threads).split(",")):
                speed = texts_per_s(dict(enumerate(args.score)), short, args.backends.split(","), args.rounds, threads)
                for key, v in speed.items():
                    print(f"| {threads} thread(s) | {key} | median {v['texts_per_s']:.0f} texts/s | fastest round "
                          f"{max(v['rounds']):.0f} | {v['precision']} |", flush=True)  # fmt: skip
        return
    texts = sentences(SHARED, args.sentences)
    src = work / f"sentences-{len(texts)}.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    teacher = f"hf:{args.teacher}"
    extra = dict(kv.split("=", 1) for kv in args.set)
    named = "".join(f"-{k}{v}" for k, v in extra.items())  # --set seed=1: a folder of its own
    out = work / f"student-l{args.layers}-{len(texts)}-e{args.epochs:g}-lr{args.lr:g}{named}"
    t0 = time.time()
    rep = cramkit.distill(teacher, student=f"layers:{args.layers}", unlabelled=src, out=out, epochs=args.epochs,
                          lr=args.lr, batch_size=args.batch, cache=args.cache or work / "cache", **extra)  # fmt: skip
    print(f"# distilled in {time.time() - t0:.0f} s: {rep['summary']}", flush=True)
    print(f"# training {json.dumps(rep['training'])}; teacher embeddings {json.dumps(rep['teacher_embeddings'])}")
    beir = work / "mrpc-dev"
    if not (beir / "corpus.jsonl").is_file():
        make_beir(Path(args.glue) / "MRPC" / "dev.tsv", beir, "dev")
    sts = Path(args.glue) / "MRPC" / "dev.tsv"
    quality = {"teacher": scores(teacher, beir, sts), "student": scores(str(out), beir, sts)}
    if sts_b is not None:
        quality["teacher"]["stsb"], quality["student"]["stsb"] = stsb(teacher, sts_b), stsb(str(out), sts_b)
        for name, model in (("teacher", teacher), ("student", str(out))):
            quality[name]["stsb_retrieval"] = stsb_retrieval(model, work / "stsb-beir")
            print(f"STS-B retrieval, {name}: {quality[name]['stsb_retrieval']}")
        t_b, s_b = quality["teacher"]["stsb"], quality["student"]["stsb"]
        print(f"STS-B Spearman ({args.sts}): teacher {t_b:.2f}, student {s_b:.2f} ({s_b / t_b:.3f})")
    short = sorted({s for _, _, _, a, b in read_mrpc(Path(args.glue) / "MRPC" / "dev.tsv") for s in (a, b)})
    backends = [] if args.backends == "none" else args.backends.split(",")
    threads = int(str(args.threads).split(",")[0])
    speed = texts_per_s({"teacher": teacher, "student": str(out)}, short, backends, args.rounds, threads)
    print("\n| model | layers | MRPC STS Spearman | nDCG@10 | recall@1 | recall@10 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, q in quality.items():
        n_layers = 6 if name == "teacher" else args.layers
        print(f"| {name} | {n_layers} | {q['sts_spearman']:.2f} | {q['ndcg@10']:.2f} | {q['recall@1']:.2f} | "
              f"{q['recall@10']:.2f} |")  # fmt: skip
    t, s = quality["teacher"], quality["student"]
    ratio = {k: s[k] / t[k] for k in ("sts_spearman", "ndcg@10", "recall@10")}
    print(f"\nstudent/teacher: STS {ratio['sts_spearman']:.3f}, nDCG@10 {ratio['ndcg@10']:.3f}, recall@10 "
          f"{ratio['recall@10']:.3f}")  # fmt: skip
    print(f"\nspeed ({len(short)} MRPC dev sentences, {threads} thread(s), median of {args.rounds} rounds):")
    for backend in backends:
        a, b = speed.get(f"teacher/{backend}"), speed.get(f"student/{backend}")
        if a and b:
            print(f"  {backend} ({a['precision']}): teacher {a['texts_per_s']:.0f} texts/s, student "
                  f"{b['texts_per_s']:.0f} texts/s: {b['texts_per_s'] / a['texts_per_s']:.2f}x")  # fmt: skip
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
