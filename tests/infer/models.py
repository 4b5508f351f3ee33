"""Models for the inference and server tests, built through the real commands (once: conftest puts them in the zoo)."""

from __future__ import annotations

from pathlib import Path

from clirun import cli, ok

__all__ = ["cli", "finetuned", "ok", "onnx_export", "sst2"]


def sst2(glue_dir: Path, split: str) -> list[tuple[str, str]]:
    lines = (glue_dir / "SST-2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [tuple(line.split("\t")[:2]) for line in lines]


def finetuned(base: Path, pretrained_run: Path, glue_dir: Path) -> Path:
    """`cramkit finetune` of the tiny pretraining run on 400 SST-2 training sentences (--out), once."""
    out = base / "ft-sst2"
    rows = sst2(glue_dir, "train")[:400]
    train = base / "sst2-train.tsv"
    train.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows), encoding="utf-8")
    ok(
        "finetune",
        "--from",
        str(pretrained_run),
        "--train",
        str(train),
        "--text-a",
        "sentence",
        "--out",
        str(out),
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--set",
        "batch_size=16",
        "--no-progress",
    )
    return out


def onnx_export(base: Path, model: Path, quantize: bool) -> Path:
    """`cramkit export MODEL --format onnx [--quantize int8]`, once."""
    out = base / (f"{model.name}-onnx" + ("-int8" if quantize else ""))
    ok(
        "export",
        str(model),
        "--format",
        "onnx",
        "--out",
        str(out),
        *(["--quantize", "int8"] if quantize else []),
    )
    return out
