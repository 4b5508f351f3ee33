"""WordPiece tokenizers (Hugging Face `tokenizers`): train, save, load, hash.

The tokenizer is BERT's: BertNormalizer (lowercase and accent stripping configurable, CJK characters
split into single tokens), BertPreTokenizer, WordPiece with "##" continuations, the special tokens
[PAD] [UNK] [CLS] [SEP] [MASK], and BERT's [CLS] x [SEP] template as post-processor, so that
`transformers.BertTokenizerFast.from_pretrained(dir)` behaves the same. The token store encodes
documents with ``add_special_tokens=False`` and inserts [SEP]/[CLS] itself when packing.

Two modes (``lang``): "generic", BERT's WordPiece for space-separated text, and "zh", character-level
WordPiece for Chinese as bert-base-chinese has it: every CJK ideograph is a token of its own (the most
frequent ones first when they do not all fit), none has a "##" form, Latin words and numbers are word
pieces, and accents are kept (stripping them decomposes kana and Hangul; lowercasing leaves CJK alone).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cramkit.errors import CramkitError
from cramkit.text import MIN_FREQUENCY, VOCAB_SIZE

if TYPE_CHECKING:
    import tokenizers

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# each special token's role and its spellings: BERT's (WordPiece: BERT, DistilBERT, ELECTRA, ModernBERT, DeBERTa)
# first, then RoBERTa's (BPE and SentencePiece: RoBERTa, XLM-R, CamemBERT; MPNet mixes both)
SPECIAL_ROLES = {
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
    "cls": ("[CLS]", "<s>"),
    "sep": ("[SEP]", "</s>"),
    "mask": ("[MASK]", "<mask>"),
}
LANGS = ("generic", "zh")
MAX_VOCAB_SIZE = 1 << 20  # HF's trainer aborts the process on absurd sizes; no encoder needs more


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    def all(self) -> tuple[int, ...]:
        return (self.pad, self.unk, self.cls, self.sep, self.mask)


def _bert_template(tok: tokenizers.Tokenizer) -> None:
    from tokenizers import processors

    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if cls is None or sep is None:
        return
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )


def train_tokenizer(
    documents: Iterable[str] | Callable[[], Iterable[str]],
    vocab_size: int = VOCAB_SIZE,
    *,
    lowercase: bool = True,
    strip_accents: bool = True,
    min_frequency: int = MIN_FREQUENCY,
    lang: str = "generic",
) -> tokenizers.Tokenizer:
    """Train a BERT WordPiece tokenizer on ``documents``; the special tokens get ids 0..4.

    ``lang="zh"``: character-level for Chinese (see the module's docstring); ``strip_accents`` is not
    applied. The CJK characters of the corpus enter the vocabulary most frequent first, leaving at least a
    tenth of it to the rest (Latin word pieces, digits, punctuation); rarer ones are left to [UNK].

    Deterministic: the same documents give the same vocabulary and ids in every process. Hugging Face's
    trainer alone is not (huggingface/tokenizers#1794: it numbers the "##" continuation symbols in
    hash-map order, and those numbers break ties between equally frequent merges), so a first pass
    collects the characters that can continue a word and registers their "##" forms up front, in
    sorted order. ``documents`` may be a function returning a fresh iterable (read twice, nothing held
    in memory), a sequence, or a one-shot iterator (then held in memory for the two passes).
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise CramkitError(
            f"--vocab-size {vocab_size} is too small; use at least a few hundred ({VOCAB_SIZE} is usual)"
        )
    if vocab_size > MAX_VOCAB_SIZE:
        raise CramkitError(
            f"--vocab-size {vocab_size:,} is too large; use at most {MAX_VOCAB_SIZE:,} ({VOCAB_SIZE} is usual, BERT "
            "uses 30522, multilingual models 250,000)"
        )
    if min_frequency < 1:
        raise CramkitError(f"--min-frequency {min_frequency} must be at least 1")
    if lang not in LANGS:
        raise CramkitError(f"unknown tokenizer language {lang!r}; use one of {', '.join(LANGS)} (or auto)")
    zh = lang == "zh"
    if callable(documents):
        passes = documents
    else:
        if iter(documents) is documents:  # a generator: keep it for the second pass
            documents = list(documents)
        passes = lambda: documents  # noqa: E731

    normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=False if zh else strip_accents,
        lowercase=lowercase,
    )
    chars: Counter[str] = Counter()
    count = 0
    for doc in passes():
        count += 1
        chars.update(normalizer.normalize_str(doc))
    if count == 0:
        raise CramkitError("the corpus holds no documents (all files empty?); give sources with text in them")
    continuations = [f"##{c}" for c in sorted(c for c in chars if _can_continue_word(c))]
    cjk, dropped = _cjk_characters(chars, vocab_size, len(continuations)) if zh else ([], set())

    trainer = trainers.WordPieceTrainer(
        # the trainer puts every character of the corpus in the vocabulary: the rare CJK ones it adds are
        # taken out again below, so it may grow by their number
        vocab_size=vocab_size + len(dropped),
        min_frequency=min_frequency,
        special_tokens=[*SPECIAL_TOKENS, *continuations, *cjk],
        continuing_subword_prefix="##",
        show_progress=sys.stderr.isatty(),  # HF's own progress bar in a terminal
    )
    bare = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    bare.normalizer = normalizer
    bare.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    bare.train_from_iterator(passes(), trainer=trainer)

    # the "##" forms (and CJK characters) were registered as special tokens only to fix their ids: rebuild
    # the tokenizer with them as ordinary vocabulary entries and only BERT's five special tokens
    vocab = bare.get_vocab(with_added_tokens=True)
    if dropped:  # a lone character is never part of a longer entry: take it out and renumber
        kept = sorted((i, t) for t, i in vocab.items() if t not in dropped)
        vocab = {t: n for n, (_, t) in enumerate(kept)}
    tok = Tokenizer(
        models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100)
    )
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    _bert_template(tok)
    return tok


def _cjk_characters(chars: Counter[str], vocab_size: int, continuations: int) -> tuple[list[str], set[str]]:
    """The CJK characters of a corpus (``chars``: character counts) that the vocabulary keeps, in code point
    order, and those it leaves out (the rarest, when they do not all fit)."""
    found = sorted((c for c in chars if is_cjk_char(c)), key=lambda c: (-chars[c], c))
    others = len(chars) - len(found)
    room = vocab_size - len(SPECIAL_TOKENS) - continuations - others - vocab_size // 10
    keep = found[: max(0, room)]
    return sorted(keep), set(found[len(keep) :])


def _can_continue_word(c: str) -> bool:
    """Can ``c`` stand inside a word after BERT's pre-tokenizer (not space, punctuation or CJK)?"""
    if c.isspace():
        return False
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return False
    if unicodedata.category(c).startswith("P"):
        return False
    return not is_cjk_char(c)


# the CJK blocks BERT's normaliser splits into single characters (BertNormalizer's handle_chinese_chars)
_CJK = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def is_cjk_char(c: str) -> bool:
    """Is ``c`` a CJK ideograph (a token of its own after BERT's normaliser)?"""
    cp = ord(c)
    return any(lo <= cp <= hi for lo, hi in _CJK)


def _normalizer_settings(tok: tokenizers.Tokenizer) -> dict:
    spec = json.loads(tok.to_str())
    return spec.get("normalizer") or {}


def save_tokenizer(tok: tokenizers.Tokenizer, out_dir: str | os.PathLike) -> Path:
    """Write tokenizer.json, vocab.txt, tokenizer_config.json and special_tokens_map.json into out_dir.

    Each file is written to a temporary name and renamed. Returns out_dir.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise CramkitError("the tokenizer's ids are not contiguous 0..n-1; it cannot be saved as a BERT vocab.txt")
    norm = _normalizer_settings(tok)
    lowercase = bool(norm.get("lowercase", True))
    strip = norm.get("strip_accents")
    spec = json.loads(tok.to_str())
    if not spec.get("post_processor"):
        # keep the raw tokenizer untouched; the saved one gets BERT's [CLS] x [SEP] template
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(tok.to_str())
        _bert_template(tok)
    bert, specials = special_tokens_map(tok)
    config = {
        # BERT's WordPiece, or any other tokenizer.json (BPE, Unigram) read by transformers' generic class
        "tokenizer_class": "BertTokenizer" if bert else "PreTrainedTokenizerFast",
        "do_lower_case": lowercase,
        "strip_accents": strip if strip is not None else None,
        "tokenize_chinese_chars": bool(norm.get("handle_chinese_chars", True)),
        "model_max_length": 512,
        "clean_up_tokenization_spaces": False,
        **specials,
    }
    files = {
        "tokenizer.json": tok.to_str(pretty=True),
        "vocab.txt": "".join(t + "\n" for t, _ in by_id),
        "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(specials, indent=2) + "\n",
    }
    from cramkit.io import clean_stale

    for name, text in files.items():
        clean_stale(out / name)
        tmp = out / f".{name}.tmp-{os.getpid()}"
        try:
            tmp.write_text(text, encoding="utf-8")
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise CramkitError(
                f"cannot write the tokenizer into {out}: {exc.strerror or exc}; free space there (or fix its "
                "permissions) or choose another output directory"
            ) from None
        os.replace(tmp, out / name)
    return out


def encode_batch(tokenizer: tokenizers.Tokenizer, texts: list[str], **kwargs: Any) -> list[Any]:
    """``tokenizer.encode_batch(texts)``, with a Rust panic (a crafted tokenizer's regex hitting Oniguruma's
    backtracking limit panics instead of failing) turned into one CramkitError."""
    try:
        return tokenizer.encode_batch(texts, **kwargs)
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":  # pyo3's, not importable by name
            raise
        raise CramkitError(
            f"the tokenizer failed on this input ({str(exc).splitlines()[0][:200]}); its pre-tokenizer or "
            "normalizer regex is unusable (catastrophic backtracking): use a tokenizer saved by cramkit"
        ) from None


# a long text is cut to about this many characters per token a model can read before it is tokenised
# (encode_prefixes); a piece with fewer tokens than needed is widened 4x until it has them or is the whole text
_CHARS_PER_TOKEN = 16
_TOKEN_MARGIN = 8


def encode_prefixes(tokenizer: tokenizers.Tokenizer, texts: list[str], tokens: int, **kwargs: Any) -> list[Any]:
    """:func:`encode_batch` of each text's beginning, long enough for its first ``tokens`` tokens and a margin:
    those ids, and whether more follow, are the whole text's, and a 49 MB line costs what its first pages do
    (tokenising it whole took 7.9 GB to keep 128 tokens). A text is cut at a space before ``16 x (tokens + 8)``
    characters (at least 1,024); a piece that yields no more than ``tokens + 8`` tokens is widened 4x until it
    does or is the whole text, so a text of spaces or long words is never cut short."""
    need = max(int(tokens), 0) + _TOKEN_MARGIN
    limit = max(1024, _CHARS_PER_TOKEN * need)
    pieces = [_cut_at_space(t, limit) for t in texts]
    encs = encode_batch(tokenizer, pieces, **kwargs)
    for i, text in enumerate(texts):
        width = limit
        while len(pieces[i]) < len(text) and len(encs[i].ids) <= need:
            width *= 4
            pieces[i] = _cut_at_space(text, width)
            encs[i] = encode_batch(tokenizer, [pieces[i]], **kwargs)[0]
    return encs


def _cut_at_space(text: str, limit: int) -> str:
    """``text`` up to ``limit`` characters, ending before a space in the second half of that where it has one
    (so no word is cut: the tokens before the cut are the whole text's)."""
    if len(text) <= limit:
        return text
    space = max(text.rfind(" ", limit // 2, limit), text.rfind("\n", limit // 2, limit))
    return text[: space if space > 0 else limit]


def load_tokenizer(path: str | os.PathLike) -> tokenizers.Tokenizer:
    """Load a tokenizer from a directory (tokenizer.json, else vocab.txt), a tokenizer.json or a vocab.txt."""
    from tokenizers import Tokenizer

    p = Path(path)
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            p = p / "tokenizer.json"
        elif (p / "vocab.txt").is_file():
            p = p / "vocab.txt"
        else:
            raise CramkitError(
                f"{path} holds no tokenizer.json or vocab.txt; "
                f"train one with `cramkit tokenizer train ... --out {path}`"
            )
        from cramkit.io import folder_file

        # a tokenizer directory's files stay inside it (a vocab.txt linked to ~/.env would leak as tokens)
        p = folder_file(path, p.name)
    if not p.is_file():
        raise CramkitError(f"tokenizer {path} does not exist; give a directory with tokenizer.json or vocab.txt")
    if p.suffix == ".json":
        try:
            tok = Tokenizer.from_file(str(p))
        except Exception as exc:
            raise CramkitError(
                f"{p} is not a valid tokenizer.json ({exc}); re-create it with `cramkit tokenizer train`"
            ) from None
        # a tokenizer.json saved by transformers may truncate and pad (all-MiniLM-L6-v2's cuts at 128):
        # building a token store with it would keep 128 tokens of every document; cramkit sets both itself
        tok.no_truncation()
        tok.no_padding()
        return tok
    return _from_vocab_txt(p)


def _from_vocab_txt(p: Path) -> tokenizers.Tokenizer:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (UnicodeDecodeError, OSError) as exc:
        raise CramkitError(
            f"cannot read vocabulary {p}: {exc}; give a UTF-8 BERT vocab.txt (one token per line)"
        ) from None
    vocab: dict[str, int] = {}
    for line in lines:
        token = line.rstrip("\n")
        if token and token not in vocab:
            vocab[token] = len(vocab)
    if "[UNK]" not in vocab:
        raise CramkitError(f"{p} has no [UNK] token; it is not a BERT WordPiece vocab.txt")
    lowercase, strip = True, None
    from cramkit.io import folder_file, json_loads, json_text

    cfg = folder_file(p.parent, "tokenizer_config.json")
    if cfg.is_file():
        try:
            conf = json_loads(json_text(cfg))
            lowercase = bool(conf.get("do_lower_case", True))
            strip = conf.get("strip_accents")
        except (ValueError, OSError):
            pass
    tok = Tokenizer(
        models.WordPiece(vocab=vocab, unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100)
    )
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    _bert_template(tok)
    return tok


def tokenizer_hash(tok: tokenizers.Tokenizer) -> str:
    """A stable hash of what decides the ids: the vocabulary, the model and the normaliser/pre-tokeniser."""
    spec = json.loads(tok.to_str())
    model = dict(spec.get("model") or {})
    vocab = model.pop("vocab", None)
    if isinstance(vocab, dict):
        vocab = sorted(vocab.items(), key=lambda kv: kv[1])
    added = sorted((a["id"], a["content"]) for a in spec.get("added_tokens") or [])
    key = {
        "model": model,
        "vocab": vocab,
        "added": added,
        "normalizer": spec.get("normalizer"),
        "pre_tokenizer": spec.get("pre_tokenizer"),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, ensure_ascii=True).encode()).hexdigest()[:32]


def special_token(tok: tokenizers.Tokenizer, role: str) -> str | None:
    """The tokenizer's spelling of a special token's ``role`` (pad, unk, cls, sep, mask): BERT's ``[MASK]`` or
    RoBERTa's ``<mask>``; where it has both, the one it declares special (MPNet's vocabulary is BERT's, whose
    ``[CLS]`` is a plain word there, plus its special ``<s>``); None without either."""
    present = [t for t in SPECIAL_ROLES[role] if tok.token_to_id(t) is not None]
    if len(present) > 1:
        declared = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
        present = [t for t in present if t in declared] or present
    return present[0] if present else None


def special_id(tok: tokenizers.Tokenizer, role: str) -> int | None:
    """The id of the special token of ``role`` (see :func:`special_token`), None without one."""
    token = special_token(tok, role)
    return None if token is None else tok.token_to_id(token)


def special_tokens_map(tok: tokenizers.Tokenizer) -> tuple[bool, dict[str, str]]:
    """Whether the tokenizer's special tokens are BERT's names, and transformers' ``special_tokens_map``
    (``pad_token``, ..., ``mask_token``; with RoBERTa's names also ``bos_token``/``eos_token``, its cls/sep)."""
    found = {f"{role}_token": special_token(tok, role) for role in SPECIAL_ROLES}
    specials = {k: v for k, v in found.items() if v is not None}
    bert = all(token in SPECIAL_TOKENS for token in specials.values())
    if not bert:
        specials |= {"bos_token": specials.get("cls_token", "<s>"), "eos_token": specials.get("sep_token", "</s>")}
    return bert, specials


def special_ids(tok: tokenizers.Tokenizer) -> SpecialIds:
    """Ids of the pad, unk, cls, sep and mask tokens ([PAD] ... or <pad> ...); CramkitError naming the missing ones."""
    ids = {role: special_id(tok, role) for role in SPECIAL_ROLES}
    missing = [" or ".join(SPECIAL_ROLES[r]) for r, i in ids.items() if i is None]
    if missing:
        raise CramkitError(
            f"the tokenizer lacks the special token(s) {', '.join(missing)}; use a BERT- or RoBERTa-style "
            "tokenizer (train one with `cramkit tokenizer train`)"
        )
    found = cast("dict[str, int]", ids)  # none missing
    return SpecialIds(found["pad"], found["unk"], found["cls"], found["sep"], found["mask"])
