"""All nine GLUE tasks (and the AX diagnostic), read from the official files or the Hugging Face hub.

Local layout, as the official download (``download_glue_data.py``) leaves it::

    DIR/CoLA/{train,dev,test}.tsv      DIR/QQP/{train,dev,test}.tsv
    DIR/SST-2/...  DIR/MRPC/...        DIR/MNLI/{train,dev_matched,dev_mismatched,test_matched,test_mismatched}.tsv
    DIR/STS-B/...  DIR/QNLI/...        DIR/RTE/...  DIR/WNLI/...  DIR/diagnostic/diagnostic.tsv

DIR is ``data_dir``, else $CRAMKIT_GLUE_DIR, else ./glue_data. Files are read as plain tab-separated
lines: quotes are text, never CSV quoting (MRPC, QQP and STS-B sentences contain unbalanced quotes).
Each task's quirks: CoLA's train/dev have no header (source, label, original label, sentence) while its
test has ``index<TAB>sentence``; MRPC's header starts with a byte-order mark; the label is taken from
``gold_label`` in MNLI and ``score`` in STS-B; QQP's train file from the original release has rows
broken by stray newlines, which are skipped and counted. Test splits have no labels; their ``index``
(``id`` in QQP) column is kept as Example.idx for the leaderboard files.

Label ids follow the hub's ClassLabel order (nyu-mll/glue), so local and hub data agree.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from cramkit.errors import CramkitError
from cramkit.tasks.registry import Example, PathLike, Suite, Task, register_family, register_suite
from cramkit.text.tables import read_tsv_lines

if TYPE_CHECKING:
    # the columns of text_a, text_b, label, idx
    _Columns = tuple[int, int | None, int | None, int | None]

log = logging.getLogger("cramkit.tasks")

HUB_DATASET = "nyu-mll/glue"
SKIP_HINT = "Fix the file, or pass --skip-bad-rows (skip_bad_rows=True) to skip and count such rows."


@dataclass(frozen=True)
class Layout:
    """Where the fields of one official file are: column names (with a header) or positions (without)."""

    text_a: str | int
    text_b: str | int | None = None
    label: str | int | None = None
    idx: str | int | None = None
    header: bool = True
    ncols: int | None = None  # columns of a header-less file


@dataclass(frozen=True)
class GlueSpec:
    key: str  # "sst2"
    dirname: str  # "SST-2"
    labels: list[str] | None  # label strings as in the files (None: regression)
    metrics: list[str]
    main_metric: str
    files: dict[str, tuple[str, Layout]]  # split -> (file name, layout)
    leaderboard: dict[str, str]  # test split -> leaderboard file name
    hub_config: str
    hub_splits: dict[str, str]  # our split -> hub split
    hub_fields: tuple[str, str | None]
    label_names: list[str] | None = None
    dev_splits: list[str] = field(default_factory=lambda: ["dev"])
    test_splits: list[str] = field(default_factory=lambda: ["test"])
    train_split: str = "train"
    known_bad_rows: frozenset[str] = frozenset()  # splits whose official file has broken rows


_STD_HUB = {"train": "train", "dev": "validation", "test": "test"}


def _std_files(a: str, b: str | None, label: str, idx: str | None = "index") -> dict:
    return {
        "train": ("train.tsv", Layout(a, b, label, idx)),
        "dev": ("dev.tsv", Layout(a, b, label, idx)),
        "test": ("test.tsv", Layout(a, b, None, idx or "index")),
    }


_MNLI_LABELS = ["entailment", "neutral", "contradiction"]

SPECS: dict[str, GlueSpec] = {
    s.key: s
    for s in [
        GlueSpec(
            key="cola",
            dirname="CoLA",
            labels=["0", "1"],
            label_names=["unacceptable", "acceptable"],
            metrics=["mcc", "accuracy"],
            main_metric="mcc",
            files={
                "train": ("train.tsv", Layout(text_a=3, label=1, header=False, ncols=4)),
                "dev": ("dev.tsv", Layout(text_a=3, label=1, header=False, ncols=4)),
                "test": ("test.tsv", Layout("sentence", idx="index")),
            },
            leaderboard={"test": "CoLA.tsv"},
            hub_config="cola",
            hub_splits=_STD_HUB,
            hub_fields=("sentence", None),
        ),
        GlueSpec(
            key="sst2",
            dirname="SST-2",
            labels=["0", "1"],
            label_names=["negative", "positive"],
            metrics=["accuracy"],
            main_metric="accuracy",
            files=_std_files("sentence", None, "label", idx=None),
            leaderboard={"test": "SST-2.tsv"},
            hub_config="sst2",
            hub_splits=_STD_HUB,
            hub_fields=("sentence", None),
        ),
        GlueSpec(
            key="mrpc",
            dirname="MRPC",
            labels=["0", "1"],
            label_names=["not_equivalent", "equivalent"],
            metrics=["f1", "accuracy"],
            main_metric="f1",
            files=_std_files("#1 String", "#2 String", "Quality", idx=None),
            leaderboard={"test": "MRPC.tsv"},
            hub_config="mrpc",
            hub_splits=_STD_HUB,
            hub_fields=("sentence1", "sentence2"),
        ),
        GlueSpec(
            key="stsb",
            dirname="STS-B",
            labels=None,
            metrics=["pearson", "spearman"],
            main_metric="spearman",
            files=_std_files("sentence1", "sentence2", "score"),
            leaderboard={"test": "STS-B.tsv"},
            hub_config="stsb",
            hub_splits=_STD_HUB,
            hub_fields=("sentence1", "sentence2"),
        ),
        GlueSpec(
            key="qqp",
            dirname="QQP",
            labels=["0", "1"],
            label_names=["not_duplicate", "duplicate"],
            metrics=["f1", "accuracy"],
            main_metric="f1",
            files=_std_files("question1", "question2", "is_duplicate", idx="id"),
            leaderboard={"test": "QQP.tsv"},
            hub_config="qqp",
            hub_splits=_STD_HUB,
            hub_fields=("question1", "question2"),
            known_bad_rows=frozenset({"train"}),
        ),
        GlueSpec(
            key="mnli",
            dirname="MNLI",
            labels=_MNLI_LABELS,
            metrics=["accuracy"],
            main_metric="accuracy",
            files={
                "train": ("train.tsv", Layout("sentence1", "sentence2", "gold_label", "index")),
                "dev_matched": ("dev_matched.tsv", Layout("sentence1", "sentence2", "gold_label", "index")),
                "dev_mismatched": (
                    "dev_mismatched.tsv",
                    Layout("sentence1", "sentence2", "gold_label", "index"),
                ),
                "test_matched": ("test_matched.tsv", Layout("sentence1", "sentence2", None, "index")),
                "test_mismatched": ("test_mismatched.tsv", Layout("sentence1", "sentence2", None, "index")),
            },
            leaderboard={"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"},
            hub_config="mnli",
            hub_splits={
                "train": "train",
                "dev_matched": "validation_matched",
                "dev_mismatched": "validation_mismatched",
                "test_matched": "test_matched",
                "test_mismatched": "test_mismatched",
            },
            hub_fields=("premise", "hypothesis"),
            dev_splits=["dev_matched", "dev_mismatched"],
            test_splits=["test_matched", "test_mismatched"],
        ),
        GlueSpec(
            key="qnli",
            dirname="QNLI",
            labels=["entailment", "not_entailment"],
            metrics=["accuracy"],
            main_metric="accuracy",
            files=_std_files("question", "sentence", "label"),
            leaderboard={"test": "QNLI.tsv"},
            hub_config="qnli",
            hub_splits=_STD_HUB,
            hub_fields=("question", "sentence"),
        ),
        GlueSpec(
            key="rte",
            dirname="RTE",
            labels=["entailment", "not_entailment"],
            metrics=["accuracy"],
            main_metric="accuracy",
            files=_std_files("sentence1", "sentence2", "label"),
            leaderboard={"test": "RTE.tsv"},
            hub_config="rte",
            hub_splits=_STD_HUB,
            hub_fields=("sentence1", "sentence2"),
        ),
        GlueSpec(
            key="wnli",
            dirname="WNLI",
            labels=["0", "1"],
            label_names=["not_entailment", "entailment"],
            metrics=["accuracy"],
            main_metric="accuracy",
            files=_std_files("sentence1", "sentence2", "label"),
            leaderboard={"test": "WNLI.tsv"},
            hub_config="wnli",
            hub_splits=_STD_HUB,
            hub_fields=("sentence1", "sentence2"),
        ),
        # The diagnostic set: test only, predicted by an MNLI model, scored by the leaderboard (R3 = MCC).
        GlueSpec(
            key="ax",
            dirname="diagnostic",
            labels=_MNLI_LABELS,
            metrics=["mcc"],
            main_metric="mcc",
            files={"test": ("diagnostic.tsv", Layout("sentence1", "sentence2", None, "index"))},
            leaderboard={"test": "AX.tsv"},
            hub_config="ax",
            hub_splits={"test": "test"},
            hub_fields=("premise", "hypothesis"),
            dev_splits=[],
            train_split="",
        ),
    ]
}

#: the nine GLUE tasks, in the order of the GLUE paper
GLUE_TASKS = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]


def glue_dir(data_dir: PathLike | None = None) -> Path:
    """data_dir, else $CRAMKIT_GLUE_DIR, else ./glue_data."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    return Path(os.environ.get("CRAMKIT_GLUE_DIR", "glue_data")).expanduser()


def _task_folder(spec: GlueSpec, root: Path) -> Path:
    """DIR/TASK; also accepts DIR being the task folder itself (``--data-dir glue_data/SST-2``)."""
    if root.name == spec.dirname and root.is_dir():
        return root
    return root / spec.dirname


def _datasets_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("datasets") is not None


# ---------------------------------------------------------------------------------------------------
# Reading the official files


class BadRow(Exception):
    """A row that cannot be read (internal: turned into a CramkitError or skipped)."""


def parse_label(value, labels: list[str] | None, where: str):
    """Label string -> id (classification) or float (regression); BadRow if outside the set."""
    if labels is None:
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise BadRow(f"{where}: score '{value}' is not a number. {SKIP_HINT}") from None
        if not math.isfinite(x):
            raise BadRow(f"{where}: score '{value}' is not a finite number. {SKIP_HINT}")
        return x
    s = str(value).strip()
    try:
        return labels.index(s)
    except ValueError:
        raise BadRow(f"{where}: label '{s}' is not one of {labels}. {SKIP_HINT}") from None


class TsvSplit:
    """Loader of one official GLUE file: ``TsvSplit()()`` -> list[Example]; ``.skipped`` after a call."""

    def __init__(
        self,
        task: str,
        path: Path,
        layout: Layout,
        labels: list[str] | None,
        skip_bad_rows: bool = False,
        tolerate_broken_rows: bool = False,
        hint: str = "",
    ):
        self.task, self.path, self.layout, self.labels = task, Path(path), layout, labels
        self.skip_bad_rows, self.tolerate_broken_rows, self.hint = skip_bad_rows, tolerate_broken_rows, hint
        self.source = str(self.path)
        self.skipped = 0

    def _columns(self, header: list[str]) -> _Columns:
        lay = self.layout
        names = [c.strip() for c in header]
        out: list[int | None] = []
        for col in (lay.text_a, lay.text_b, lay.label, lay.idx):
            if col is None or isinstance(col, int):
                out.append(col)
            elif col in names:
                out.append(names.index(col))
            else:
                raise CramkitError(
                    f"{self.path}: the header has no column '{col}' (it has: {', '.join(names)}). "
                    f"This is not the official GLUE layout for {self.task}; use the file from the GLUE download."
                )
        return cast("_Columns", tuple(out))  # text_a is never None

    def __call__(self) -> list[Example]:
        if not self.path.is_file():
            raise CramkitError(f"{self.task}: the split needs the file {self.path}, which does not exist. {self.hint}")
        self.skipped = 0
        lines = read_tsv_lines(self.path)
        if self.layout.header:
            first = next(lines, None)
            if first is None:
                raise CramkitError(f"{self.path} is empty; it should hold {self.task} rows after a header")
            ncols = len(first[1])
            ia, ib, il, ii = self._columns(first[1])
        else:
            ncols = cast(int, self.layout.ncols)  # given with every header-less layout
            lay = self.layout  # without a header: column positions
            ia, ib, il, ii = cast("_Columns", (lay.text_a, lay.text_b, lay.label, lay.idx))
        out: list[Example] = []
        for lineno, cols in lines:
            where = f"{self.path}, line {lineno}"
            try:
                if len(cols) > ncols and il == ncols - 1 and max(c for c in (ia, ib, ii) if c is not None) < il:
                    # a stray tab inside the last text field (seen in STS-B): the label is still the last
                    # column, as Hugging Face's GLUE processors read it; rejoin the overflow into the text
                    last_text = max(c for c in (ia, ib) if c is not None)
                    extra = len(cols) - ncols
                    cols = [
                        *cols[:last_text],
                        "\t".join(cols[last_text : last_text + extra + 1]),
                        *cols[last_text + extra + 1 :],
                    ]
                if len(cols) != ncols:
                    raise BadRow(f"{where}: expected {ncols} tab-separated columns, found {len(cols)}. {SKIP_HINT}")
                label = None if il is None else parse_label(cols[il], self.labels, where)
                if ii is None:
                    idx = len(out)
                else:
                    try:
                        idx = int(cols[ii])
                    except ValueError:
                        raise BadRow(f"{where}: index '{cols[ii]}' is not an integer. {SKIP_HINT}") from None
            except BadRow as e:
                if self.skip_bad_rows or (self.tolerate_broken_rows and len(cols) != ncols):
                    self.skipped += 1
                    continue
                raise CramkitError(str(e)) from None
            text_b = None if ib is None else cols[ib].strip()
            out.append(Example(cols[ia].strip(), text_b, label, idx))
        if self.skipped:
            log.warning("%s: skipped %d bad rows of %s", self.task, self.skipped, self.path)
        if not out:
            raise CramkitError(f"{self.path} holds no {self.task} rows; use the file from the GLUE download")
        return out


class HubSplit:
    """Loader of one split from the Hugging Face hub (``datasets`` imported only when called)."""

    def __init__(self, task: str, spec: GlueSpec, split: str, folder: Path):
        self.task, self.spec, self.split, self.folder = task, spec, split, folder
        self.hub_split = spec.hub_splits[split]
        self.source = f"hf:{HUB_DATASET}/{spec.hub_config}[{self.hub_split}]"
        self.skipped = 0

    def __call__(self) -> list[Example]:
        try:
            import datasets
        except ImportError:
            raise CramkitError(_no_data_message(self.task, self.spec, self.folder)) from None
        try:
            ds = datasets.load_dataset(HUB_DATASET, self.spec.hub_config, split=self.hub_split)
        except Exception as e:  # offline, hub down, no such config: one clear message
            raise CramkitError(
                f"{self.task}: there is no folder {self.folder}, and loading {self.source} from the Hugging "
                f"Face hub failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
                + _provide_hint(self.spec, self.folder)
            ) from None
        fa, fb = self.spec.hub_fields
        out = []
        for row in ds:
            lab = row.get("label")
            if lab is None or (not isinstance(lab, float) and lab < 0):  # the hub marks test labels -1
                label = None
            else:
                label = float(lab) if self.spec.labels is None else int(lab)
            out.append(Example(row[fa], row[fb] if fb else None, label, int(row["idx"])))
        return out


def _provide_hint(spec: GlueSpec, folder: Path) -> str:
    files = ", ".join(f for f, _ in spec.files.values())
    return (
        f"Provide the official GLUE files in {folder} ({files}), e.g. from download_glue_data.py, "
        "and point --data-dir (or $CRAMKIT_GLUE_DIR) at their parent folder."
    )


def _no_data_message(task: str, spec: GlueSpec, folder: Path) -> str:
    return (
        f"{task}: no folder {folder}, and the `datasets` package (needed to fetch GLUE from the Hugging "
        f"Face hub) is not installed. {_provide_hint(spec, folder)} Or `pip install cramkit[hf]` when online."
    )


def make_glue_task(key: str, data_dir: PathLike | None = None, skip_bad_rows: bool = False) -> Task:
    """Build glue/KEY from DIR/TASK (else the hub); nothing is read until a split is asked for."""
    spec = SPECS[key]
    name = f"glue/{key}"
    folder = _task_folder(spec, glue_dir(data_dir))
    if folder.is_dir():
        hint = _provide_hint(spec, folder)
        splits: dict[str, TsvSplit | HubSplit] = {
            split: TsvSplit(
                name,
                folder / fname,
                layout,
                spec.labels,
                skip_bad_rows=skip_bad_rows,
                tolerate_broken_rows=split in spec.known_bad_rows,
                hint=hint,
            )
            for split, (fname, layout) in spec.files.items()
        }
    elif _datasets_available():
        splits = {split: HubSplit(name, spec, split, folder) for split in spec.files}
    else:
        raise CramkitError(_no_data_message(name, spec, folder))
    return Task(
        name=name,
        splits=splits,
        labels=list(spec.labels) if spec.labels else None,
        metrics=list(spec.metrics),
        main_metric=spec.main_metric,
        train_split=spec.train_split,
        dev_splits=list(spec.dev_splits),
        test_splits=list(spec.test_splits),
        leaderboard_files=dict(spec.leaderboard),
        label_names=list(spec.label_names) if spec.label_names else None,
        description=f"GLUE {spec.dirname} from {splits[next(iter(splits))].source}",
    )


def glue_tasks(data_dir: PathLike | None = None, skip_bad_rows: bool = False) -> list[Task]:
    """Every GLUE task whose folder is present (all nine from the hub when none is and `datasets` is)."""
    root = glue_dir(data_dir)
    present = [k for k in GLUE_TASKS if _task_folder(SPECS[k], root).is_dir()]
    if not present:
        if not _datasets_available():
            raise CramkitError(
                f"glue: none of the GLUE task folders ({', '.join(SPECS[k].dirname for k in GLUE_TASKS)}) "
                f"is in {root}, and the `datasets` package is not installed to fetch them from the hub. "
                "Put the official GLUE download there, or point --data-dir (or $CRAMKIT_GLUE_DIR) at it."
            )
        present = list(GLUE_TASKS)
    return [make_glue_task(k, data_dir, skip_bad_rows) for k in present]


register_family("glue", SPECS, make_glue_task)


def _glue_suite_average(entries: dict[str, dict[str, float]]) -> float | None:
    from cramkit.tasks.metrics import glue_average

    try:
        return glue_average(entries)
    except CramkitError:
        return None  # only WNLI present: nothing that enters the average


register_suite(
    Suite(
        name="glue",
        task_names=tuple(f"glue/{k}" for k in GLUE_TASKS),
        tasks=glue_tasks,
        average=_glue_suite_average,
        average_note="GLUE average as in Cramming (Table 3): mean of MNLI-m/mm accuracy, SST-2 accuracy, STS-B "
        "Spearman, RTE and QNLI accuracy, QQP and MRPC F1, CoLA MCC (WNLI excluded). References: BERT-base 80.9, "
        "crammed BERT 78.6.",
        data_hint="the official GLUE download (download_glue_data.py), or the hub with `datasets` installed",
    )
)
