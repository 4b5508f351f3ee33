"""What ``cramkit predict``/``cramkit.predict`` and ``cramkit export``/``cramkit.export`` take, declared once
(:mod:`cramkit.request`): the command line's flags and the functions' keywords come from here, and so do the
checks of what combines with what and the default output file, made once for both doors."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

from cramkit.backends.base import ExportedModel
from cramkit.errors import CramkitError
from cramkit.infer import TARGETS
from cramkit.infer.options import Offload, Passes
from cramkit.model.loaded import LoadedModel
from cramkit.request import param
from cramkit.text.reading import Encoding

MODEL_HELP = "a model directory (cramkit finetune --out), a run, a checkpoint or hf:DIR"


@dataclass
class PredictRequest(Passes, Offload, Encoding):
    """A model over the rows of a file: the model, the file, and the predictions file written."""

    model: str | os.PathLike | LoadedModel | ExportedModel = param(
        flags=("--from",), required=True, metavar="MODEL", help=MODEL_HELP
    )
    input_file: str | os.PathLike = param(
        positional=True, metavar="FILE", help=".csv, .tsv, .jsonl (a header / named fields) or .txt (one per line)"
    )
    out: str | os.PathLike | None = param(
        None, help="predictions file: .jsonl, .csv or .tsv (default: FILE.predictions.jsonl)"
    )
    _: KW_ONLY
    text_a: str | None = param(None, help="the text column (default: text, sentence, sentence1, ...)")
    text_b: str | None = param(None, help="the second text of a pair (default: text_b or sentence2 when present)")
    choices: str | list[str] | None = param(
        None,
        metavar="COL[,COL...]",
        help="multiple-choice model: the choice columns, or one JSONL field holding a list (default: the columns "
        "it was trained on, else choices)",
    )
    label: str | None = param(
        "auto",
        help="gold label column, scored when present, its values checked against the model's labels first "
        "(default: the column the model was trained on, else label; 'none': no scoring)",
    )
    task: str | None = param(None, help="of a model fine-tuned on a mixture: the task whose head predicts")
    base: str | os.PathLike | LoadedModel | None = param(
        None,
        metavar="MODEL",
        help="of a deep-prompt directory (finetune --method ptuning): the base model it was trained on",
    )
    keep_text: bool = param(False, help="copy each row's input text into the predictions")
    top_k: int = param(5, help="fill-mask: candidates per [MASK]")
    max_length: int | None = param(None, help="cut inputs to this many tokens (default: the model's)")
    backend: str = param(
        "auto",
        command_line=False,
        help="auto (the model's own: an export's format, else torch), torch, or an export format (a torch model "
        "is exported at startup)",
    )

    def resolved(self) -> PredictRequest:
        """The request checked (one line for a combination that does not hold, before anything is read), with
        its defaults decided: the predictions file, the label column (None: no scoring), the choice columns."""
        from cramkit.infer.offload import check_expert_cache
        from cramkit.loading import is_export

        check_expert_cache(self.expert_cache, self.offload_experts)
        if self.task is not None and isinstance(self.model, (str, os.PathLike)) and is_export(self.model):
            raise CramkitError(f"--task applies to a model trained on a mixture; {self.model} is an export of one task")
        choices = self.choices
        if isinstance(choices, str):
            choices = [c.strip() for c in choices.split(",") if c.strip()]
            if not choices:
                raise CramkitError(f"--choices {self.choices!r}: name the column(s), e.g. --choices choice1,choice2")
        out = self.out if self.out is not None else f"{Path(self.input_file).with_suffix('')}.predictions.jsonl"
        label = None if self.label is None or self.label.lower() == "none" else self.label
        return dataclasses.replace(self, out=Path(out), label=label, choices=choices)


@dataclass
class ExportRequest:
    """A model written as a Hugging Face directory or in an export format."""

    model: str | os.PathLike | LoadedModel = param(
        positional=True, metavar="MODEL", help="a run, a checkpoint, a model directory (finetune --out) or hf:DIR"
    )
    out: str | os.PathLike = param(required=True, help="the directory to write (replaced atomically)")
    _: KW_ONLY
    format: str = param("hf", help="hf (default), onnx, ct2, openvino or a registered format")
    quantize: str | None = param(
        None,
        help="--format onnx: int8 (dynamic int8 weights); --format ct2: the stored weight type, int8, int8_float32, "
        "float32 (default) or bfloat16; --format openvino: bf16 (bf16 compute where the CPU has it; fp32 weights)",
    )
    target: str | None = param(
        None,
        metavar="|".join(TARGETS),
        help="instead of --format/--quantize, the format and quantization fastest on this machine's CPU, by a "
        "race of the installed formats here (a few seconds of the model's forward, short and long texts, one "
        "thread and all; the fastest whose outputs agree with fp32 torch): cpu for batch work (predict, embed, "
        "index build), cpu-serve for cramkit serve (calls of a few short texts). The race is kept in the "
        "manifest and cached per CPU model; where it cannot run, the CPU flags' rule decides",
    )
    race: bool | None = param(
        None,
        help="with --target: --race races again (a cached race is not reused), --no-race takes the CPU flags' "
        "rule without racing (default: $CRAMKIT_RACE, 1 or 0, else a matching cached race or a new one)",
    )
    step: int | None = param(None, help="export checkpoint step-N of a run instead of the latest")
    task: str | None = param(None, help="of a model fine-tuned on a mixture: the task whose head to export")
    base: str | os.PathLike | LoadedModel | None = param(
        None,
        help="of a deep-prompt directory (finetune --method ptuning): the base model it was trained on (--format "
        "onnx writes one standalone graph of both)",
    )
    mlm_head: bool = param(True, flags=("--no-mlm-head",), help="export the encoder only (BertModel)")
    force: bool = param(
        False,
        help="replace an export of another format in --out (only the files its manifest lists; a directory an "
        "export did not make is never replaced)",
    )
    progress: bool = param(True, command_line=False, help="the export's progress lines")
    options: dict[str, Any] = param({}, command_line=False, help="the format's own (ONNX: isa, opset)")

    def check(self) -> None:
        """What combines with what (the target, the format, its quantization, a loaded model's step and base):
        one line for the first that does not, before any model is read."""
        from cramkit import backends

        if self.target is not None:
            if self.target not in TARGETS:
                import difflib

                close = difflib.get_close_matches(self.target, TARGETS, n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise CramkitError(f"target must be one of {', '.join(TARGETS)}, got {self.target!r}{hint}")
            if self.format != "hf" or self.quantize is not None:
                raise CramkitError(
                    f"--target {self.target} picks the format and quantization itself; drop --format and --quantize "
                    "(or --target)"
                )
        elif self.race is not None:
            raise CramkitError("--race and --no-race apply to --target cpu or cpu-serve; add --target (or drop them)")
        elif self.format != "hf":
            if self.format not in backends.names():
                raise CramkitError(f"format must be one of {', '.join(('hf', *backends.names()))}, got {self.format!r}")
            backends.get(self.format).check_quantize(self.quantize)
        elif self.quantize or self.options:
            raise CramkitError(
                "the hf format takes no quantize or options; quantize applies to "
                + ", ".join(f"{b.name} ({'/'.join(q for q in b.quantize if q)})" for b in backends.backends().values())
            )
        if isinstance(self.model, LoadedModel) and self.step is not None:
            raise CramkitError("step applies to a run directory, not to a loaded model")
        if isinstance(self.model, LoadedModel) and self.base is not None:
            raise CramkitError("base applies to a deep-prompt directory, not to a loaded model (load it with its base)")
