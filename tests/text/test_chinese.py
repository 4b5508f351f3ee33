"""Chinese out of the box: the character-level tokenizer mode, detecting Chinese text, and `cramkit
pretrain` on a Chinese corpus with no language flags (tiny-zh) fine-tuned on FewCLUE files."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from clirun import cli as cramkit
from conftest import TINY_MODEL_SETS, _need
from cramkit.text.sources import detect_language, iter_documents
from cramkit.text.tokenizer import is_cjk_char, load_tokenizer, train_tokenizer

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="session")
def fewclue(shared_data: Path) -> Path:
    return _need(shared_data / "fewclue")


def _write_corpus(path: Path, sources: list[tuple[Path, str]], limit: int | None = None) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for src, field in sources:
            for line in [line for line in src.read_text(encoding="utf-8").split("\n") if line.strip()][:limit]:
                text = json.loads(line)[field].replace("#idiom#", "")
                fh.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return path


@pytest.fixture(scope="session")
def zh_corpus(fewclue: Path, tmp_path_factory) -> Path:
    """3,000 reviews of FewCLUE eprstmt's unlabelled text as a JSON Lines corpus (field ``text``)."""
    path = tmp_path_factory.mktemp("zh") / "reviews.jsonl"
    return _write_corpus(path, [(fewclue / "eprstmt" / "unlabeled.json", "sentence")], 3000)


@pytest.fixture(scope="session")
def zh_full_corpus(fewclue: Path, tmp_path_factory) -> Path:
    """All of FewCLUE's unlabelled text (eprstmt reviews, chid news without its #idiom# gaps): 1.8M characters."""
    path = tmp_path_factory.mktemp("zh") / "fewclue.jsonl"
    sources = [
        (fewclue / "eprstmt" / "unlabeled.json", "sentence"),
        (fewclue / "chid" / "unlabeled.json", "content"),
    ]
    return _write_corpus(path, sources)


@pytest.fixture(scope="session")
def zh_tok_dir(zh_full_corpus: Path, tmp_path_factory) -> tuple[Path, str]:
    """`cramkit tokenizer train` on FewCLUE's unlabelled text with no --lang: (directory, its output)."""
    out = tmp_path_factory.mktemp("zh-tok")
    proc = cramkit("tokenizer", "train", str(zh_full_corpus), "--out", str(out), "--force")
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def _texts(path: Path, *fields: str) -> list[str]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    return [row[f] for row in rows for f in fields]


def test_detection():
    assert detect_language(["质量非常差，iPhone 8贴上去四周翘边非常严重。"] * 3).lang == "zh"
    english = detect_language(["The quick brown fox jumps over the lazy dog 中国."] * 3)
    assert english.lang == "generic" and 0 < english.cjk_share < 0.1
    assert detect_language([]).lang == "generic"
    # only the sample is read: a Chinese file after 200,000 English characters does not change the guess
    docs = iter(["english words " * 1000] * 20 + ["中文"] * 10**6)
    guess = detect_language(docs)
    assert guess.lang == "generic" and guess.chars == 200_000 and guess.documents < 20


def test_tokenizer_cli_picks_chinese(zh_tok_dir, fewclue):
    out, log = zh_tok_dir
    assert "are Chinese characters: Chinese, one token per character" in log
    tok = load_tokenizer(out)
    vocab = tok.get_vocab()
    # a corpus of 1.8M characters: all its 4,846 distinct characters are in, with Latin pieces and digits
    assert 4846 < len(vocab) < 21128
    assert not [t for t in vocab if t.startswith("##") and any(is_cjk_char(c) for c in t)]
    assert not [t for t in vocab if len(t) > 1 and any(is_cjk_char(c) for c in t)]
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["do_lower_case"] is True and config["strip_accents"] is False

    enc = tok.encode("质量非常差，iPhone 8贴上去", add_special_tokens=False)
    assert enc.tokens == ["质", "量", "非", "常", "差", "，", "iphone", "8", "贴", "上", "去"]
    assert tok.normalizer.normalize_str("Café ガ") == "café ガ"  # Latin lowercased, accents and kana kept
    latin = tok.encode("bluetooth headphones", add_special_tokens=False).tokens
    assert "[UNK]" not in latin and any(t.startswith("##") for t in latin)  # word pieces

    # [UNK] on FewCLUE's test text (another task's too) stays below 1%
    for task, fields in (
        ("eprstmt", ("sentence",)),
        ("ocnli", ("sentence1", "sentence2")),
        ("iflytek", ("sentence",)),
    ):
        texts = _texts(fewclue / task / "test_public.json", *fields)
        ids = [i for e in tok.encode_batch(texts, add_special_tokens=False) for i in e.ids]
        assert ids.count(tok.token_to_id("[UNK]")) / len(ids) < 0.01, task


def test_chinese_vocabulary_keeps_the_frequent_characters(zh_corpus):
    docs = list(iter_documents([str(zh_corpus)]))
    full = train_tokenizer(docs, 21128, lang="zh")
    small = train_tokenizer(docs, 1000, lang="zh")
    assert small.get_vocab_size() == 1000  # the rare characters give way instead of overflowing the size
    from collections import Counter

    counts = Counter(c for d in docs for c in d if is_cjk_char(c))
    kept = {t for t in small.get_vocab() if len(t) == 1 and is_cjk_char(t)}
    ranked = [c for c, _ in counts.most_common()]
    assert set(ranked[: len(kept)]) == kept and len(kept) >= 500
    assert len([t for t in full.get_vocab() if is_cjk_char(t[0])]) == len(counts)
    # ids are contiguous after the rare characters are taken out, and training is deterministic
    assert sorted(small.get_vocab().values()) == list(range(1000))
    assert train_tokenizer(docs, 1000, lang="zh").get_vocab() == small.get_vocab()


def test_generic_text_keeps_the_generic_tokenizer(tmp_path, builtin_docs):
    src = tmp_path / "en.txt"
    src.write_text("\n\n".join(builtin_docs[:200]), encoding="utf-8")
    proc = cramkit("tokenizer", "train", str(src), "--out", str(tmp_path / "tok"), "--vocab-size", "2000")
    assert proc.returncode == 0, proc.stderr
    assert "generic WordPiece" in proc.stdout
    assert json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())["strip_accents"] is True


def test_bad_language_setting(zh_corpus, tmp_path):
    proc = cramkit("pretrain", str(zh_corpus), "--out", str(tmp_path / "r"), "--set", "tokenizer.lang=klingon")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("cramkit: error: tokenizer.lang must be auto")
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


# a smaller model than tiny-zh's, to keep the test fast; nothing about the language is given
SMALL = ["--budget", "20steps", "--no-progress"] + [a for s in TINY_MODEL_SETS for a in ("--set", s)]


def test_pretrain_chinese_without_flags_then_finetune(zh_corpus, fewclue, tmp_path):
    run = tmp_path / "run"
    proc = cramkit("pretrain", str(zh_corpus), "--out", str(run), *SMALL)
    assert proc.returncode == 0, proc.stderr
    assert "using the tiny-zh preset and a Chinese tokenizer" in proc.stdout
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["data"]["masking"] == "whole_word" and cfg["tokenizer"]["lang"] == "zh"
    assert json.loads((run / "run.json").read_text())["preset"] == "tiny-zh"
    tok = load_tokenizer(run / "tokenizer")
    assert tok.encode("耳机", add_special_tokens=False).tokens == ["耳", "机"]

    data = fewclue / "eprstmt"
    ft = tmp_path / "ft"
    proc = cramkit(
        "finetune",
        "--train",
        str(data / "train_0.json"),
        "--dev",
        str(data / "dev_0.json"),
        "--test",
        str(data / "test_public.json"),
        "--text-a",
        "sentence",
        "--label",
        "label",
        "--from",
        str(run),
        "--out",
        str(ft),
        "--set",
        "epochs=1",
        "--set",
        "min_steps=0",
        "--set",
        "max_length=64",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((ft / "results.json").read_text())
    assert 0 <= results["median"]["dev"]["metrics"]["accuracy"] <= 100
    predictions = (ft / "predictions").glob("*test*")
    assert len(next(predictions).read_text().splitlines()) == 1 + len(_texts(data / "test_public.json", "id"))


def test_without_jieba_chinese_masks_characters(zh_corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "jieba", None)  # `import jieba` raises ImportError, as when not installed
    run = tmp_path / "run"
    proc = cramkit("pretrain", str(zh_corpus), "--out", str(run), *SMALL[:1], "2steps", *SMALL[2:])
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stdout.splitlines() if "segmenter jieba" in line]
    assert len(notes) == 1 and "masking single characters instead" in notes[0] and "pip install" in notes[0]
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["masking"] == "wordpiece"
    # asked for explicitly, whole-word masking without jieba is one clear error
    proc = cramkit(
        "pretrain",
        str(zh_corpus),
        "--out",
        str(tmp_path / "r2"),
        *SMALL[:1],
        "2steps",
        *SMALL[2:],
        "--set",
        "data.masking=whole_word",
    )
    assert proc.returncode == 2 and "jieba" in proc.stderr and "Traceback" not in proc.stderr


def test_nproc_names_and_checks_the_run_by_the_preset_it_trains(zh_corpus, tmp_path, monkeypatch):
    """`cramkit pretrain zh.txt --nproc 2` named its run runs/tiny-cpu-... and checked the pipeline degree against
    tiny-cpu, while the processes trained tiny-zh: the launcher decides the preset as the run does."""
    import dataclasses

    import yaml

    import cramkit.train.launch as launch
    from clirun import cli
    from cramkit.recipes.pretrain_request import PretrainRequest
    from cramkit.request import read_request

    seen: list[list[str]] = []
    requests: list[dict] = []

    def launched(nproc, argv, **kw):
        seen.append(argv)
        requests.append(yaml.safe_load(Path(argv[argv.index("--request") + 1]).read_text(encoding="utf-8")))
        req = read_request(PretrainRequest, argv[argv.index("--request") + 1], "pretrain")
        # every field of the request reaches the processes (a field added to it too): no flag rebuilt by hand
        assert set(requests[-1]["pretrain"]) == {f.name for f in dataclasses.fields(req) if f.name != "_"}
        return 0

    monkeypatch.setattr(launch, "launch", launched)
    proc = cli("pretrain", zh_corpus, "--nproc", "2", "--budget", "1steps", "--set", "train.lr=1e-3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert seen[0][:2] == ["pretrain", "--request"]
    # the processes receive the request decided once: the run named by the preset it trains
    sent = requests[0]["pretrain"]
    assert Path(sent["out"]).name.startswith("tiny-zh-") and sent["preset"] == "tiny-zh", sent
    assert sent["inputs"] == [str(zh_corpus)] and sent["budget"] == "1steps" and sent["overrides"] == ["train.lr=1e-3"]
    # the degree checked against tiny-zh's 4 layers (tiny-cpu has as many: a degree that divides neither)
    bad = cli("pretrain", zh_corpus, "--nproc", "2", "--set", "parallel.pp=3", cwd=tmp_path)
    assert bad.returncode == 2 and "parallel.pp=3" in bad.stderr and len(seen) == 1
