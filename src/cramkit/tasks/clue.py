"""CLUE and FewCLUE: the Chinese classification tasks and CHID (idiom cloze, multiple choice), from their files.

Each task reads the folder DIR/TASK (DIR is ``data_dir``, else $CRAMKIT_CLUE_DIR, else ./clue_data; the
download's ``TASK_public`` name is accepted too), in either layout, told apart by the files present:

- CLUE (https://github.com/CLUEbenchmark/CLUE): ``train.json``, ``dev.json``, ``test.json`` (CHID also
  ``train_answer.json`` / ``dev_answer.json``);
- FewCLUE (https://github.com/CLUEbenchmark/FewCLUE): ``train_K.json`` / ``dev_K.json`` (K = 0..4),
  ``train_few_all.json`` / ``dev_few_all.json``, ``test_public.json`` (labelled) and ``test.json``.

Files are JSON Lines (one object a line) whatever their ``.json`` name says. Fields per task are those of
the official files and the CLUE baselines' preprocessing (``baselines/models_pytorch/classifier_pytorch/
processors/clue.py``): CSL is the pair (keywords joined by spaces, abstract); CLUEWSC marks the noun
with ``_`` and the pronoun with ``[ ]`` in the text; CMNLI/OCNLI rows labelled ``-`` (no gold label)
are skipped and counted. CHID is multiple choice: each blank is one row whose context is a window of
the passage around it (the blank shown as ``[MASK]``, other blanks as ``[UNK]``), so that the blank
survives truncation to max_length.

A FewCLUE task trains on ``train_few_all`` and is scored on ``dev_few_all`` and ``test_public``;
:func:`fewshot_task` gives FewCLUE's protocol split by split (train on ``train_K``, score on ``dev_K``
and ``test_public``). Test predictions are written in the leaderboard's file names and format (JSON
lines ``{"id", "label"}``; CHID ``{"id", "answer"}`` in FewCLUE and one ``{"#idiomN#": answer}`` object
in CLUE). Accuracy everywhere, as CLUE reports.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from cramkit.errors import CramkitError
from cramkit.io import BadJson, json_loads
from cramkit.tasks.glue import SKIP_HINT, BadRow, parse_label
from cramkit.tasks.jsonlines import JsonLinesSplit, NoGold
from cramkit.tasks.registry import Example, PathLike, Suite, Task, register_family, register_suite

log = logging.getLogger("cramkit.tasks")

FEWSHOT_KS = ("0", "1", "2", "3", "4")
FEWCLUE_SPLITS = (
    *(f"{p}_{k}" for k in FEWSHOT_KS for p in ("train", "dev")),
    "train_few_all",
    "dev_few_all",
    "test_public",
    "test",
)
CHID_WINDOW = 48  # characters kept on each side of a blank (about 100 tokens with the choice: fits 128)
_TAG = re.compile(r"#idiom\d*#")

_NLI = ["entailment", "neutral", "contradiction"]
TNEWS_LABELS = [str(100 + i) for i in range(17) if i not in (5, 11)]
TNEWS_NAMES = [
    "news_story",
    "news_culture",
    "news_entertainment",
    "news_sports",
    "news_finance",
    "news_house",
    "news_car",
    "news_edu",
    "news_tech",
    "news_military",
    "news_travel",
    "news_world",
    "news_stock",
    "news_agriculture",
    "news_game",
]
# FewCLUE's datasets/csldcp/labels_all.txt, in its order
CSLDCP_LABELS = [
    "材料科学与工程",
    "作物学",
    "口腔医学",
    "药学",
    "教育学",
    "水利工程",
    "理论经济学",
    "食品科学与工程",
    "畜牧学/兽医学",
    "体育学",
    "核科学与技术",
    "力学",
    "园艺学",
    "水产",
    "法学",
    "地质学/地质资源与地质工程",
    "石油与天然气工程",
    "农林经济管理",
    "信息与通信工程",
    "图书馆、情报与档案管理",
    "政治学",
    "电气工程",
    "海洋科学",
    "民族学",
    "航空宇航科学与技术",
    "化学/化学工程与技术",
    "哲学",
    "公共卫生与预防医学",
    "艺术学",
    "农业工程",
    "船舶与海洋工程",
    "计算机科学与技术",
    "冶金工程",
    "交通运输工程",
    "动力工程及工程热物理",
    "纺织科学与工程",
    "建筑学",
    "环境科学与工程",
    "公共管理",
    "数学",
    "物理学",
    "林学/林业工程",
    "心理学",
    "历史学",
    "工商管理",
    "应用经济学",
    "中医学/中药学",
    "天文学",
    "机械工程",
    "土木工程",
    "光学工程",
    "地理学",
    "农业资源利用",
    "生物学/生物科学与工程",
    "兵器科学与技术",
    "矿业工程",
    "大气科学",
    "基础医学/临床医学",
    "电子科学与技术",
    "测绘科学与技术",
    "控制科学与工程",
    "军事学",
    "中国语言文学",
    "新闻传播学",
    "社会学",
    "地球物理学",
    "植物保护",
]


def _field(row: dict, name: str, where: str):
    if name not in row or row[name] is None:
        raise BadRow(f"{where}: the row has no field '{name}' (it has: {', '.join(row)}). {SKIP_HINT}")
    return row[name]


def _text(row: dict, name: str, where: str) -> str:
    value = _field(row, name, where)
    if not isinstance(value, str):
        raise BadRow(f"{where}: field '{name}' is {type(value).__name__}, not text. {SKIP_HINT}")
    return value


# a reader turns one JSON object into (text_a, text_b, label value or None)
Reader = Callable[[dict, str], tuple[str, "str | None", object]]


def _single(field: str) -> Reader:
    return lambda row, where: (_text(row, field, where), None, row.get("label"))


def _pair(a: str, b: str) -> Reader:
    return lambda row, where: (_text(row, a, where), _text(row, b, where), row.get("label"))


def _nli(row: dict, where: str):
    label = row.get("label")
    if isinstance(label, str) and label.strip() == "-":
        raise NoGold(where)
    return _text(row, "sentence1", where), _text(row, "sentence2", where), label


def _csl(row: dict, where: str):
    keywords = _field(row, "keyword", where)
    if isinstance(keywords, list):
        keywords = " ".join(str(k) for k in keywords)
    return str(keywords), _text(row, "abst", where), row.get("label")


def _wsc(row: dict, where: str):
    """CLUEWSC2020: the text with span1 (the noun) as _noun_ and span2 (the pronoun) as [pronoun], as the
    CLUE baseline marks them; each span must stand at its index."""
    text = _text(row, "text", where)
    target = _field(row, "target", where)
    if not isinstance(target, dict):
        raise BadRow(f"{where}: 'target' is not an object with span1_text/span1_index/span2_*. {SKIP_HINT}")
    spans = []
    for n, (left, right) in ((1, ("_", "_")), (2, ("[", "]"))):
        span, index = target.get(f"span{n}_text"), target.get(f"span{n}_index")
        if not isinstance(span, str) or not span or not isinstance(index, int) or isinstance(index, bool):
            raise BadRow(f"{where}: target needs span{n}_text (text) and span{n}_index (integer). {SKIP_HINT}")
        if index < 0 or not text[index:].startswith(span):
            raise BadRow(
                f"{where}: span{n}_text '{span}' is not at span{n}_index {index} of the text "
                f"(there: '{text[max(index, 0) : max(index, 0) + len(span)]}'). {SKIP_HINT}"
            )
        spans.append((index, index + len(span), left, right))
    for start, end, left, right in sorted(spans, reverse=True):  # the later span first: indices stay valid
        text = text[:start] + left + text[start:end] + right + text[end:]
    label = row.get("label")
    return text, None, label if label is None else str(label).lower()


@dataclass(frozen=True)
class ClueSpec:
    key: str
    title: str
    reader: Reader | None  # None: CHID (multiple choice)
    labels: list[str] | None
    clue_file: str  # CLUE's submission file for test.json
    fewclue_name: str  # FewCLUE's submission file stem: NAME_predict_K.json
    label_names: list[str] | None = None


SPECS: dict[str, ClueSpec] = {
    s.key: s
    for s in [
        ClueSpec("afqmc", "AFQMC", _pair("sentence1", "sentence2"), ["0", "1"], "afqmc_predict.json", "afqmc"),
        ClueSpec(
            "tnews",
            "TNEWS",
            _single("sentence"),
            TNEWS_LABELS,
            "tnews11_predict.json",
            "tnewsf",
            label_names=TNEWS_NAMES,
        ),
        ClueSpec(
            "iflytek",
            "IFLYTEK",
            _single("sentence"),
            [str(i) for i in range(119)],
            "iflytek_predict.json",
            "iflytekf",
        ),
        ClueSpec("cmnli", "CMNLI", _nli, _NLI, "cmnli_predict.json", "cmnli"),
        ClueSpec("ocnli", "OCNLI", _nli, _NLI, "ocnli_50k_predict.json", "ocnlif"),
        ClueSpec("csl", "CSL", _csl, ["0", "1"], "csl_predict.json", "cslf"),
        ClueSpec("cluewsc", "CLUEWSC2020", _wsc, ["true", "false"], "cluewsc11_predict.json", "cluewscf"),
        ClueSpec("chid", "CHID", None, None, "chid11_predict.json", "chidf"),
        ClueSpec(
            "eprstmt",
            "EPRSTMT",
            _single("sentence"),
            ["Negative", "Positive"],
            "eprstmt_predict.json",
            "eprstmt",
        ),
        ClueSpec("csldcp", "CSLDCP", _single("content"), CSLDCP_LABELS, "csldcp_predict.json", "csldcp"),
        ClueSpec("bustm", "BUSTM", _pair("sentence1", "sentence2"), ["0", "1"], "bustm_predict.json", "bustm"),
    ]
}
#: CLUE's classification tasks and CHID, then FewCLUE's own tasks
CLUE_TASKS = list(SPECS)
#: FewCLUE's nine tasks, in its README's order
FEWCLUE_TASKS = ["eprstmt", "csldcp", "tnews", "iflytek", "ocnli", "bustm", "chid", "csl", "cluewsc"]


def clue_dir(data_dir: PathLike | None = None) -> Path:
    """data_dir, else $CRAMKIT_CLUE_DIR, else ./clue_data."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    return Path(os.environ.get("CRAMKIT_CLUE_DIR", "clue_data")).expanduser()


def _folder_names(key: str) -> list[str]:
    names = [key, f"{key}_public"]
    return [*names, "cluewsc2020", "cluewsc2020_public"] if key == "cluewsc" else names


def task_folder(key: str, root: Path) -> Path:
    """DIR/TASK (or DIR/TASK_public); also DIR itself when it is the task's folder."""
    names = _folder_names(key)
    if root.name in names and root.is_dir() and layout(root):
        return root
    for name in names:
        if (root / name).is_dir():
            return root / name
    return root / key


def layout(folder: Path) -> str | None:
    """ "clue" (train.json/dev.json), "fewclue" (train_K.json, test_public.json, ...) or None (no data)."""
    if not folder.is_dir():
        return None
    if any((folder / f"{s}.json").is_file() for s in FEWCLUE_SPLITS if s != "test"):
        return "fewclue"
    if any((folder / f"{s}.json").is_file() for s in ("train", "dev", "test")):
        return "clue"
    return None


def _row_id(row: dict, fallback: int, where: str) -> int:
    for key in ("id", "idx"):
        if key in row:
            try:
                return int(str(row[key]).strip())
            except ValueError:
                raise BadRow(f"{where}: {key} '{row[key]}' is not an integer. {SKIP_HINT}") from None
    return fallback


def _classification_parser(spec: ClueSpec, labelled: bool):
    reader = spec.reader
    assert reader is not None  # CHID (no reader) has _chid_parser

    def parse(row: dict, where: str, n: int) -> list[Example]:
        text_a, text_b, label = reader(row, where)
        if not labelled:
            label_id = None
        elif label is None:
            raise BadRow(f"{where}: the row has no label. {SKIP_HINT}")
        else:
            label_id = parse_label(label, spec.labels, where)
        return [Example(text_a.strip(), None if text_b is None else text_b.strip(), label_id, _row_id(row, n, where))]

    return parse


def _window(before: str, after: str) -> str:
    """The blank as [MASK] with CHID_WINDOW characters of text on each side."""
    return before[-CHID_WINDOW:] + "[MASK]" + after[:CHID_WINDOW]


def _candidates(row: dict, where: str) -> tuple[str, ...]:
    cands = _field(row, "candidates", where)
    if not isinstance(cands, list) or len(cands) < 2 or not all(isinstance(c, str) for c in cands):
        raise BadRow(f"{where}: 'candidates' must be a list of at least two idioms. {SKIP_HINT}")
    return tuple(cands)


def _chid_parser(labelled: bool, answers: dict | None, answer_file: Path | None):
    """FewCLUE rows: one ``#idiom#`` in ``content`` and an ``answer``; CLUE rows: ``content`` is a list of
    passages with ``#idiomNNNNNN#`` blanks whose answers are in ``answer_file`` (train/dev)."""

    def parse(row: dict, where: str, n: int) -> list[Example]:
        cands = _candidates(row, where)
        content = _field(row, "content", where)

        def label_of(answer, what: str) -> int:
            if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(cands):
                raise BadRow(
                    f"{where}: {what} {answer!r} is not an index into the {len(cands)} candidates. {SKIP_HINT}"
                )
            return answer

        if isinstance(content, str):  # FewCLUE: one blank
            count = content.count("#idiom#")
            if count != 1:
                raise BadRow(
                    f"{where}: the content has {count} #idiom# blanks; a FewCLUE CHID row has one. {SKIP_HINT}"
                )
            start = content.index("#idiom#")
            label = label_of(_field(row, "answer", where), "answer") if labelled else None
            text = _window(content[:start], content[start + len("#idiom#") :])
            return [Example(text, None, label, _row_id(row, n, where), choices=cands)]
        if not isinstance(content, list) or not all(isinstance(p, str) for p in content):
            raise BadRow(f"{where}: 'content' must be a text or a list of passages. {SKIP_HINT}")
        out = []
        for j, passage in enumerate(content):
            tags = [m for m in _TAG.finditer(passage) if m.group() != "#idiom#"]
            if labelled and answers is None and tags:
                raise CramkitError(
                    f"{where}: CLUE's CHID passages have their answers in {answer_file}, which does not exist"
                )
            known = [m for m in tags if answers is not None and m.group() in answers]
            if labelled and len(known) != len(tags):
                raise BadRow(
                    f"{where}: passage {j} has {len(tags)} #idiomN# blanks but {len(known)} of them have an "
                    f"answer in {answer_file}. {SKIP_HINT}"
                )
            for m in tags:
                text = _window(_TAG.sub("[UNK]", passage[: m.start()]), _TAG.sub("[UNK]", passage[m.end() :]))
                # (labelled: answers is not None, else the CramkitError above)
                label = (
                    label_of(answers[m.group()], f"the answer to {m.group()}")
                    if answers is not None and labelled
                    else None
                )
                tag_id = int(m.group()[len("#idiom") : -1])
                out.append(Example(text, None, label, tag_id, choices=cands, meta={"tag": m.group()}))
        return out

    return parse


def _read_answers(path: Path) -> dict:
    try:
        answers = json_loads(path.read_text(encoding="utf-8-sig"))
    except OSError as e:
        raise CramkitError(f"CHID: cannot read the answers file {path} ({e.strerror})") from None
    except (BadJson, UnicodeDecodeError) as e:
        raise CramkitError(f'{path} is {e}; it should be one object {{"#idiomN#": answer}}') from None
    if not isinstance(answers, dict):
        raise CramkitError(
            f'{path} holds a JSON {type(answers).__name__}; it should be one object {{"#idiomN#": answer}}'
        )
    return answers


class _ChidCluePart:
    """A CLUE CHID split: its answers file is read when the split is."""

    def __init__(self, split: JsonLinesSplit, answer_file: Path | None):
        self.split, self.answer_file = split, answer_file
        self.source = split.source

    @property
    def skipped(self) -> int:
        return self.split.skipped

    def __call__(self) -> list[Example]:
        labelled = self.answer_file is not None
        answers = (
            _read_answers(self.answer_file) if self.answer_file is not None and self.answer_file.is_file() else None
        )
        self.split.parse = _chid_parser(labelled, answers, self.answer_file)
        return self.split()


@dataclass
class ChidTask(Task):
    """CHID: writes FewCLUE's ``{"id", "answer"}`` lines, or CLUE's one ``{"#idiomN#": answer}`` object."""

    def write_predictions(self, split: str, idx_and_preds: Iterable[tuple[int, object]], out_path: PathLike) -> Path:
        from cramkit.io import write_text_atomic

        preds = {int(i): int(self.format_prediction(p)) for i, p in idx_and_preds}
        rows = self.examples(split)
        expected = {e.idx for e in rows}
        if set(preds) != expected:
            raise CramkitError(
                f"task {self.name} {split}: predictions cover {len(preds)} blanks but the split has {len(expected)}; "
                "predict every example of the split"
            )
        out = Path(out_path)
        if out.suffix not in (".json", ".jsonl"):
            out = out / self.leaderboard_file(split)
        if rows[0].meta and "tag" in rows[0].meta:  # CLUE: {"#idiom000378#": 2, ...}
            text = (
                json.dumps({cast(dict, e.meta)["tag"]: preds[e.idx] for e in rows}, ensure_ascii=False, indent=1) + "\n"
            )
        else:
            text = "".join(json.dumps({"id": i, "answer": preds[i]}) + "\n" for i in sorted(preds))
        return write_text_atomic(out, text)


def _hint(spec: ClueSpec, folder: Path) -> str:
    return (
        f"Put the {spec.title} files there (CLUE: train.json, dev.json, test.json; FewCLUE: train_0.json ... "
        f"test_public.json), and point --data-dir (or $CRAMKIT_CLUE_DIR) at their parent folder."
    )


def make_clue_task(key: str, data_dir: PathLike | None = None, skip_bad_rows: bool = False) -> Task:
    """Build clue/KEY from DIR/KEY in whichever layout is there; nothing is read until a split is asked for."""
    spec = SPECS[key]
    name = f"clue/{key}"
    folder = task_folder(key, clue_dir(data_dir))
    kind = layout(folder)
    if kind is None:
        raise CramkitError(f"{name}: no CLUE or FewCLUE files in {folder}. {_hint(spec, folder)}")
    hint = _hint(spec, folder)
    names = FEWCLUE_SPLITS if kind == "fewclue" else ("train", "dev", "test")
    splits: dict[str, Callable[[], list[Example]]] = {}
    for split in names:
        labelled = split != "test"
        path = folder / f"{split}.json"
        if spec.reader is None and kind == "clue":
            parse = _chid_parser(False, None, None)  # replaced when the answers are read
            loader = JsonLinesSplit(name, path, parse, suite="CLUE", skip_bad_rows=skip_bad_rows, hint=hint)
            splits[split] = _ChidCluePart(loader, folder / f"{split}_answer.json" if labelled else None)
            continue
        parse = _chid_parser(labelled, None, None) if spec.reader is None else _classification_parser(spec, labelled)
        splits[split] = JsonLinesSplit(name, path, parse, suite="CLUE", skip_bad_rows=skip_bad_rows, hint=hint)
    if kind == "fewclue":
        roles: dict[str, Any] = {
            "train_split": "train_few_all",
            "dev_splits": ["dev_few_all", "test_public"],
            "score_splits": ["test_public"],
        }
        files = {"test": f"{spec.fewclue_name}_predict_all.json"}
    else:
        roles = {"train_split": "train", "dev_splits": ["dev"]}
        files = {"test": spec.clue_file}
    cls = ChidTask if spec.reader is None else Task
    return cls(
        name=name,
        splits=splits,
        labels=list(spec.labels) if spec.labels else None,
        metrics=["accuracy"],
        test_splits=["test"],
        leaderboard_files=files,
        label_names=list(spec.label_names) if spec.label_names else None,
        description=f"{'FewCLUE' if kind == 'fewclue' else 'CLUE'} {spec.title} from {folder}",
        kind="multiple_choice" if spec.reader is None else "classification",
        prediction_format="clue",
        **roles,
    )


def is_fewclue(task: Task) -> bool:
    """Whether ``task`` is in FewCLUE's layout (its splits train_K/dev_K/test_public)."""
    return "test_public" in task.splits and "train_0" in task.splits


def parse_fewshot_splits(text: str) -> list[str]:
    """``0-4`` -> 0..4, ``0,2`` -> 0 and 2, ``few_all`` (mixable: ``0-1,few_all``); in the order given."""
    out: list[str] = []
    for part in (p.strip() for p in str(text).split(",")):
        if part in ("few_all", "all"):
            ks = ["few_all"]
        elif re.fullmatch(r"\d+", part):
            ks = [part]
        elif m := re.fullmatch(r"(\d+)-(\d+)", part):
            lo, hi = int(m.group(1)), int(m.group(2))
            ks = [str(k) for k in range(lo, hi + 1)] if lo <= hi else []
        else:
            ks = []
        if not ks:
            raise CramkitError(
                f"--fewshot-splits {text!r}: give FewCLUE split numbers and ranges (0-4, 0,2) or few_all"
            )
        out += [k for k in ks if k not in out]
    return out


def fewshot_task(task: Task, k: str) -> Task:
    """FewCLUE's split K of ``task``: trained on train_K, scored on dev_K and test_public; its test.json
    predictions go to NAME_predict_K.json (FewCLUE's multi-submission names; few_all: _all)."""
    if not is_fewclue(task):
        raise CramkitError(
            f"task {task.name}: --fewshot-splits needs FewCLUE's layout (train_0.json ... test_public.json); "
            f"{task.source(task.train_split)} is not"
        )
    missing = [
        task.source(s)
        for s in (f"train_{k}", f"dev_{k}", "test_public")
        if s not in task.splits or not Path(task.source(s)).is_file()
    ]
    if missing:
        folder = Path(task.source("test_public")).parent
        present = sorted(p.stem for p in folder.glob("*.json"))
        raise CramkitError(
            f"{task.name}: FewCLUE split {k} needs {', '.join(missing)}, which is not there (present: "
            f"{', '.join(present) or 'nothing'}); give --fewshot-splits for the splits you have"
        )
    stem = task.leaderboard_file("test").removesuffix("_all.json")
    suffix = "all" if k == "few_all" else k
    return dataclasses.replace(
        task,
        train_split=f"train_{k}",
        dev_splits=[f"dev_{k}", "test_public"],
        score_splits=["test_public"],
        leaderboard_files={"test": f"{stem}_{suffix}.json"},
    )


def clue_tasks(data_dir: PathLike | None = None, skip_bad_rows: bool = False) -> list[Task]:
    """Every CLUE/FewCLUE task whose folder is in data_dir."""
    root = clue_dir(data_dir)
    present = [k for k in CLUE_TASKS if layout(task_folder(k, root))]
    if not present:
        raise CramkitError(
            f"clue: none of the task folders ({', '.join(CLUE_TASKS)}) with CLUE or FewCLUE files is in {root}. "
            "Put the CLUE or FewCLUE download there (DIR/TASK/train.json ... or DIR/TASK/train_0.json ...), "
            "or point --data-dir (or $CRAMKIT_CLUE_DIR) at it."
        )
    return [make_clue_task(k, data_dir, skip_bad_rows) for k in present]


register_family("clue", SPECS, make_clue_task)


def _clue_average(entries: dict[str, dict[str, float]]) -> float | None:
    scores = [m["accuracy"] for m in entries.values() if "accuracy" in m]
    return sum(scores) / len(scores) if scores else None


def fewclue_tasks(data_dir: PathLike | None = None, skip_bad_rows: bool = False) -> list[Task]:
    """Every FewCLUE task whose folder is in data_dir."""
    by_key = {t.name.split("/")[1]: t for t in clue_tasks(data_dir, skip_bad_rows)}
    tasks = [by_key[k] for k in FEWCLUE_TASKS if k in by_key]
    if not tasks:
        raise CramkitError(
            f"fewclue: none of FewCLUE's task folders ({', '.join(FEWCLUE_TASKS)}) is in {clue_dir(data_dir)}; "
            "point --data-dir (or $CRAMKIT_CLUE_DIR) at FewCLUE's datasets/ folder"
        )
    return tasks


_AVERAGE = (
    "the mean of the tasks' accuracies (a task in FewCLUE's layout: its test_public accuracy, the mean over "
    "the splits run). Published scores average fixed sets of tasks (CLUE 1.1's classification score: AFQMC, "
    "TNEWS, IFLYTEK, OCNLI, CLUEWSC2020, CSL; FewCLUE's score left CHID out): compare over the same tasks."
)
register_suite(
    Suite(
        name="clue",
        task_names=tuple(f"clue/{k}" for k in CLUE_TASKS),
        tasks=clue_tasks,
        average=_clue_average,
        average_note=f"CLUE's way: {_AVERAGE}",
        data_hint="the CLUE download (DIR/TASK/train.json, dev.json, test.json) or FewCLUE's datasets/ "
        "folder (DIR/TASK/train_0.json ... test_public.json)",
    )
)
register_suite(
    Suite(
        name="fewclue",
        task_names=tuple(f"clue/{k}" for k in FEWCLUE_TASKS),
        tasks=fewclue_tasks,
        average=_clue_average,
        average_note=f"FewCLUE's way: {_AVERAGE} FewCLUE's protocol is --fewshot-splits 0-4.",
        data_hint="FewCLUE's datasets/ folder (DIR/TASK/train_0.json ... dev_few_all.json, test_public.json)",
    )
)
