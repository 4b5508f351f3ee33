"""Prompts for the masked-LM head (PET, Schick & Schütze 2021; LM-BFF, Gao et al. 2021): a template that
puts a task's texts around a ``[MASK]``, and label words whose scores at the mask are the labels' logits.

    spec = prompt_spec("{text_a} It was [MASK] .", "positive=great,negative=terrible", ["negative", "positive"],
                       tokenizer, fields={"sentence": "text_a"})
    enc = encode_prompts(tokenizer, spec, texts_a, texts_b, max_length=128)

A template holds its fields in braces (``{text_a}``, ``{text_b}``, or the names the task gives them), one
``[MASK]`` and, optionally, ``[SEP]`` (the inputs after it are the second segment). A label word of several
tokens (a Chinese word of several characters) fills as many masks: the one ``[MASK]`` of the template
becomes that many, and every label's word must have the same number of tokens. Fields are cut to fit
``max_length`` (longest first); the template's own words and masks never are. A ``[MASK]`` inside a text is
read as ``[UNK]``: only the template places masks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from cramkit.data.batching import Encoded, truncate_pair
from cramkit.errors import CramkitError
from cramkit.text.tokenizer import encode_batch, encode_prefixes, special_id

MASK, SEP = "[MASK]", "[SEP]"
# the names a template may give the first and the second text of any task
FIRST = ("text_a", "sentence", "sentence1", "premise", "question", "text", "a")
SECOND = ("text_b", "sentence2", "hypothesis", "b")
_PIECE = re.compile(r"(\{[^{}]*\}|\[MASK\]|\[SEP\])")


@dataclass(frozen=True)
class PromptSpec:
    """A parsed template with its label words turned into token ids (``label_ids``: [labels][masks])."""

    template: str
    parts: tuple[tuple[str, str], ...]  # ("text", words) | ("field", "text_a"|"text_b") | ("mask", "") | ("sep", "")
    label_words: dict[str, str]  # label -> word, in the task's label order
    label_ids: tuple[tuple[int, ...], ...]
    mask_id: int

    @property
    def masks(self) -> int:
        return len(self.label_ids[0])

    @property
    def fields(self) -> set[str]:
        return {name for kind, name in self.parts if kind == "field"}

    def meta(self) -> dict[str, Any]:
        """What a model directory records (``cramkit-model.json``'s ``extra.prompt``): the template in the
        generic field names (a task's own, ``{review}``, are not known where the model is read back)."""
        return {"template": self.canonical_template, "label_words": dict(self.label_words)}

    @property
    def canonical_template(self) -> str:
        """The template rebuilt from its pieces with the fields named {text_a} / {text_b}: it parses back to
        the same pieces."""
        shown = {"text": "{}", "field": "{{{}}}", "mask": MASK, "sep": SEP}
        return " ".join(shown[kind].format(value) for kind, value in self.parts)


def parse_label_words(value: str | Mapping[str, str], what: str = "--label-words") -> dict[str, str]:
    """``"positive=great,negative=terrible"`` (or a mapping) -> {label: word}."""
    if isinstance(value, Mapping):
        pairs = [(str(k), str(v)) for k, v in value.items()]
    else:
        pairs = []
        for item in str(value).split(","):
            if not item.strip():
                continue
            label, sep, word = item.partition("=")
            if not sep or not label.strip() or not word.strip():
                raise CramkitError(
                    f"{what} {value!r}: give LABEL=WORD pairs separated by commas, "
                    "e.g. positive=great,negative=terrible"
                )
            pairs.append((label.strip(), word.strip()))
    if not pairs:
        raise CramkitError(f"{what} is empty: give LABEL=WORD pairs, e.g. positive=great,negative=terrible")
    out: dict[str, str] = {}
    for label, word in pairs:
        if label in out:
            raise CramkitError(f"{what}: label {label!r} is given twice")
        out[label] = word
    return out


def parse_template(template: str, fields: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """The template's pieces; ``fields`` maps a task's own field names to text_a / text_b (besides the
    generic names FIRST and SECOND)."""
    if not isinstance(template, str) or not template.strip():
        raise CramkitError("--prompt is empty: give a template such as '{text_a} It was [MASK] .'")
    names = {n: "text_a" for n in FIRST} | {n: "text_b" for n in SECOND} | dict(fields or {})
    parts: list[tuple[str, str]] = []
    for piece in _PIECE.split(template):
        if not piece.strip():
            continue
        if piece == MASK:
            parts.append(("mask", ""))
        elif piece == SEP:
            parts.append(("sep", ""))
        elif piece.startswith("{"):
            name = piece[1:-1].strip()
            if name not in names:
                known = ", ".join("{" + n + "}" for n in sorted(set(fields or {}) | {"text_a", "text_b"}))
                raise CramkitError(
                    f"--prompt {template!r} names the field {{{name}}}, which the task does not have; "
                    f"its fields: {known}"
                )
            parts.append(("field", names[name]))
        else:
            if "{" in piece or "}" in piece:
                raise CramkitError(f"--prompt {template!r}: an unmatched brace; fields are written {{text_a}}")
            parts.append(("text", piece.strip()))
    masks = sum(kind == "mask" for kind, _ in parts)
    if masks != 1:
        raise CramkitError(
            f"--prompt {template!r} has {masks} [MASK]s; a template holds exactly one (label words of several "
            "tokens fill several masks by themselves), e.g. '{text_a} It was [MASK] .'"
        )
    if not any(kind == "field" for kind, _ in parts):
        raise CramkitError(f"--prompt {template!r} names no field of the task: put {{text_a}} in it")
    if sum(kind == "sep" for kind, _ in parts) > 1:
        raise CramkitError(f"--prompt {template!r}: at most one [SEP] (two segments)")
    return tuple(parts)


def prompt_spec(
    template: str,
    label_words: str | Mapping[str, str],
    labels: Sequence[str],
    tokenizer: Any,
    *,
    fields: Mapping[str, str] | None = None,
) -> PromptSpec:
    """Check a template and label words against a task's labels and a tokenizer; CramkitError (one line)
    for a template without a mask, a field the task lacks, a label without a word (or a word for a label the
    task lacks), a word the vocabulary does not hold, words of different token counts."""
    parts = parse_template(template, fields)
    words = parse_label_words(label_words)
    labels = [str(x) for x in labels]
    missing = [x for x in labels if x not in words]
    if missing:
        raise CramkitError(
            f"--label-words gives no word for label(s) {', '.join(map(repr, missing))}; the task's labels are "
            f"{', '.join(labels)}: give LABEL=WORD for each"
        )
    extra = [x for x in words if x not in labels]
    if extra:
        raise CramkitError(
            f"--label-words names label(s) {', '.join(map(repr, extra))}, which the task does not have; its "
            f"labels are {', '.join(labels)}"
        )
    mask_id = special_id(tokenizer, "mask")
    if mask_id is None:
        raise CramkitError("the model's tokenizer has no [MASK] token; prompts need a masked-LM vocabulary")
    unk = special_id(tokenizer, "unk")
    ids: list[tuple[int, ...]] = []
    encs = encode_batch(tokenizer, [words[x] for x in labels], add_special_tokens=False)
    for label, enc in zip(labels, encs, strict=True):
        got = tuple(int(i) for i in enc.ids)
        if not got or (unk is not None and unk in got):
            raise CramkitError(
                f"--label-words: the word {words[label]!r} (label {label!r}) is not in the model's vocabulary; "
                "choose a word it holds"
            )
        ids.append(got)
    if len({len(x) for x in ids}) > 1:
        counts = ", ".join(f"{words[x]!r} {len(i)}" for x, i in zip(labels, ids, strict=True))
        raise CramkitError(
            f"--label-words: every label word must be the same number of tokens (one mask each), but they are "
            f"{counts}; choose words of one token (English) or of equally many characters (Chinese)"
        )
    return PromptSpec(template, parts, {x: words[x] for x in labels}, tuple(ids), int(mask_id))


def prompt_from_meta(prompt: Any, labels: Any, tokenizer: Any, file: Any, fix: str) -> PromptSpec:
    """The prompt a model directory or an export recorded (``{"template": ..., "label_words": {label: word}}``),
    checked against its labels and its own tokenizer: one CramkitError line naming ``file`` and ending with
    ``fix``, never a traceback (a crafted file: a template without a mask, a word for an unknown label, ...)."""
    if not (
        isinstance(prompt, dict)
        and isinstance(prompt.get("template"), str)
        and isinstance(prompt.get("label_words"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in prompt["label_words"].items())
        and isinstance(labels, list)
        and labels
        and all(isinstance(x, str) for x in labels)
    ):
        raise CramkitError(
            f"{file}: a prompt model needs its prompt (a string template, label_words mapping each label to a "
            f"word) and its labels; the file is damaged or crafted: {fix}"
        )
    try:
        return prompt_spec(
            prompt["template"], prompt["label_words"], labels, tokenizer, fields={k: k for k in ("text_a", "text_b")}
        )
    except CramkitError as exc:
        why = str(exc).replace("\n", "\\n")  # one line, whatever a crafted label holds
        raise CramkitError(f"{file}: its prompt does not fit its labels or tokenizer ({why}); {fix}") from None


def encode_prompts(
    tokenizer: Any,
    spec: PromptSpec,
    texts_a: Sequence[str | None],
    texts_b: Sequence[str | None] | None,
    max_length: int,
    *,
    labels: np.ndarray | None = None,
    idx: np.ndarray | None = None,
) -> Encoded:
    """``[CLS] template-with-texts [SEP]`` per example (``b_start``: where the template's [SEP] ends the
    first segment); the texts are cut longest first so that the template and its masks always fit."""
    cls_id, sep_id = special_id(tokenizer, "cls"), special_id(tokenizer, "sep")
    unk = special_id(tokenizer, "unk")
    unk = int(unk) if unk is not None else 0
    n = len(texts_a)
    literal = [w for kind, w in spec.parts if kind == "text"]
    lit_ids = [list(e.ids) for e in encode_batch(tokenizer, literal, add_special_tokens=False)] if literal else []
    fixed = 2 + sum(len(x) for x in lit_ids) + spec.masks + sum(k == "sep" for k, _ in spec.parts)
    room = max_length - fixed
    if room < len(spec.fields):
        raise CramkitError(
            f"--prompt {spec.template!r} needs {fixed} tokens of its own, leaving no room for the texts within "
            f"max_length {max_length}; shorten the template or raise max_length"
        )
    texts = {"text_a": list(texts_a), "text_b": list(texts_b) if texts_b is not None else [None] * n}
    for name in spec.fields:
        absent = [i for i, t in enumerate(texts[name]) if t is None]
        if absent:
            raise CramkitError(
                f"--prompt {spec.template!r} uses {{{name}}}, but input {absent[0]} has no second text; "
                "the template must name only the texts every input has"
            )
    toks = {
        name: [
            _no_masks(e.ids, spec.mask_id, unk)
            for e in encode_prefixes(tokenizer, cast("list[str]", texts[name]), room, add_special_tokens=False)
        ]
        for name in sorted(spec.fields)
    }
    empty: list[list[int]] = [[] for _ in range(n)]
    toks_a, toks_b = toks.get("text_a", empty), toks.get("text_b", empty)  # once, not per row
    ids, b_start = [], np.empty(n, dtype=np.int64)
    truncated = np.zeros(n, dtype=bool)
    for i in range(n):
        a, b = toks_a[i], toks_b[i]
        na, nb = truncate_pair(len(a), len(b), room)
        truncated[i] = na < len(a) or nb < len(b)
        cut = {"text_a": a[:na], "text_b": b[:nb]}
        seq, lit, start = [cls_id], iter(lit_ids), -1
        for kind, name in spec.parts:
            if kind == "text":
                seq.extend(next(lit))
            elif kind == "field":
                seq.extend(cut[name])
            elif kind == "mask":
                seq.extend([spec.mask_id] * spec.masks)
            else:
                seq.append(sep_id)
                start = len(seq)
        seq.append(sep_id)
        b_start[i] = start if start >= 0 else len(seq)
        ids.append(np.asarray(seq, dtype=np.int64))
    return Encoded(
        ids=ids,
        b_start=b_start,
        lengths=np.asarray([len(s) for s in ids], dtype=np.int64),
        labels=labels,
        idx=idx if idx is not None else np.arange(n, dtype=np.int64),
        truncated=truncated,
    )


def _no_masks(ids: Sequence[int], mask_id: int, unk: int) -> list[int]:
    return [unk if t == mask_id else int(t) for t in ids]
