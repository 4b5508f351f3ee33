"""What ``cramkit eval SUITE`` and ``cramkit.evaluate`` take, declared once (:mod:`cramkit.request`): a suite
(glue, clue, ...: fine-tuned and scored, the settings of :class:`~cramkit.recipes.finetune_request.Recipe`) or an
embedding evaluation (sts, retrieval: the model's embeddings scored as they are); which flags belong to which,
and the default output directory, decided here for both doors."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.evaluation import CUTOFF, results_dir
from cramkit.infer.options import Passes
from cramkit.recipes.finetune_request import Recipe, words
from cramkit.request import param

if TYPE_CHECKING:
    from cramkit.recipes.finetune_config import FinetuneConfig

EMBED_EVALS = ("sts", "retrieval")
EMBEDDINGS = "embedding models: cramkit eval sts | retrieval"

# the suites' own options, and the embedding evaluations': each refused on the other side
SUITE_ONLY = {
    "data_dir": "--data-dir",
    "seeds": "--seeds",
    "tasks": "--tasks",
    "fewshot_splits": "--fewshot-splits",
    "config": "--config",
    "few_shot": "--few-shot",
    "method": "--method",
    "prefix_len": "--prefix-len",
    "report_to": "--report-to",
    "overrides": "--set",
    "settings": "--set",
}
EMBED_ONLY = {
    "data": "--data",
    "text_a": "--text-a",
    "text_b": "--text-b",
    "label": "--label",
    "split": "--split",
    "index": "--index",
    "k": "--k",
    "max_batch_tokens": "--max-batch-tokens",
    "dimensions": "--dimensions",
}
STS_ONLY, RETRIEVAL_ONLY = ("text_a", "text_b", "label"), ("split", "index", "k")


@dataclass
class EvalRequest(Recipe, Passes):
    """An evaluation: a suite's tasks fine-tuned and scored, or a model's embeddings scored (sts, retrieval)."""

    source: str | os.PathLike = param(
        flags=("--from",), required=True, metavar="RUN_OR_HF", help="cramkit run / checkpoint directory, or hf:PATH"
    )
    data_dir: str | os.PathLike | None = param(
        None,
        help="the suite's root folder (DIR/TASK/...); default $CRAMKIT_GLUE_DIR or ./glue_data for glue, "
        "$CRAMKIT_CLUE_DIR or ./clue_data for clue",
    )
    out: str | os.PathLike | None = param(None, help="output directory (default: eval-SUITE: eval-glue, eval-sts, ...)")
    _: KW_ONLY
    suite: str = param(
        "glue",
        positional=True,
        metavar="SUITE",
        help="the benchmark: glue, superglue, clue, fewclue (every registered suite); or sts / retrieval: the "
        "model's embeddings scored as they are (see --data). cramkit.evaluate's default: glue",
    )
    tasks: str | Sequence[str] | None = param(
        None, help="only these tasks, comma-separated, e.g. rte,stsb (default: every task present)"
    )
    skip_bad_rows: bool = param(False, help="skip (and count) malformed rows instead of stopping at the first one")
    data: str | os.PathLike | None = param(
        None,
        metavar="FILE_OR_DIR",
        group=EMBEDDINGS,
        help="sts: a TSV/CSV/JSONL file of pairs with a gold score (GLUE STS-B's dev.tsv: sentence1, sentence2, "
        "score); retrieval: a folder in BEIR's layout (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv)",
    )
    text_a: str | None = param(None, group=EMBEDDINGS, help="sts: the first text's column (default sentence1)")
    text_b: str | None = param(None, group=EMBEDDINGS, help="sts: the second text's column (default sentence2)")
    label: str | None = param(None, group=EMBEDDINGS, help="sts: the gold score's column (default score)")
    split: str | None = param(
        None, group=EMBEDDINGS, help="retrieval: the judgements to score, qrels/SPLIT.tsv (default test)"
    )
    index: str | os.PathLike | None = param(
        None,
        metavar="IDX",
        group=EMBEDDINGS,
        help="retrieval: search through this index (cramkit index build DATA/corpus.jsonl --encoder MODEL) instead "
        "of exact search; exact search over its vectors is reported beside it",
    )
    k: int | None = param(
        None,
        flags=("-k", "--k"),
        metavar="K",
        group=EMBEDDINGS,
        help=f"retrieval: the cut-off of nDCG and MRR (default {CUTOFF})",
    )
    dimensions: int | None = param(
        None,
        metavar="N",
        group=EMBEDDINGS,
        help="score the vectors cut to their first N dimensions (a Matryoshka model's: its recorded list)",
    )

    def embeds(self) -> bool:
        """Whether this scores the model's embeddings as they are (sts, retrieval) rather than a suite."""
        return self.suite.lower() in EMBED_EVALS

    def suite_name(self) -> str:
        """The suite's registered name (an unknown one: did-you-mean), or sts / retrieval."""
        if self.embeds():
            return self.suite.lower()
        from cramkit.tasks.registry import get_suite

        return get_suite(self.suite.lower()).name

    def resolve(self) -> FinetuneConfig | None:
        """The fine-tuning settings of a suite (None: sts and retrieval fine-tune nothing), after the rules of which
        flags combine: one line each, the same from both doors."""
        if self.embeds():
            self._check_embedding_eval()
            return None
        given = [flag for name, flag in EMBED_ONLY.items() if getattr(self, name) is not None]
        if given:
            raise CramkitError(
                f"{given[0]} applies to cramkit eval sts / retrieval (embedding models), not to the suite "
                f"{self.suite}; leave it out"
            )
        self.suite_name()  # an unknown suite: did-you-mean, before anything else
        cfg = self.finetune_config()
        self.check_method(cfg, suite=True)
        return cfg

    def own_settings(self) -> dict[str, Any]:
        own = super().own_settings()
        if self.device != "auto":  # a suite fine-tunes there
            own["device"] = self.device
        return own

    def _check_embedding_eval(self) -> None:
        what = self.suite.lower()
        given = [flag for name, flag in SUITE_ONLY.items() if getattr(self, name)]
        if given:
            raise CramkitError(
                f"{given[0]} applies to the fine-tuning suites (glue, clue, ...); cramkit eval {what} scores the "
                "model's embeddings as they are: leave it out"
            )
        if not self.data:
            example = "STS-B/dev.tsv" if what == "sts" else "DIR (corpus.jsonl, queries.jsonl, qrels/test.tsv)"
            raise CramkitError(f"cramkit eval {what} needs --data {example}")
        other, theirs = ("retrieval", RETRIEVAL_ONLY) if what == "sts" else ("sts", STS_ONLY)
        wrong = [EMBED_ONLY[name] for name in theirs if getattr(self, name) is not None]
        if wrong:
            raise CramkitError(f"{wrong[0]} applies to cramkit eval {other}, not {what}; leave it out")

    def out_dir(self) -> str:
        """``out``, else eval-SUITE (eval-glue, eval-sts, eval-retrieval, ...)."""
        return os.fspath(self.out) if self.out is not None else results_dir(self.suite_name())

    def task_names(self) -> list[str] | None:
        """``tasks`` as a list (None: every task of the suite present)."""
        return None if not self.tasks else words(self.tasks, "--tasks", "rte,stsb")
