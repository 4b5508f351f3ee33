"""How good a model's sentence embeddings are, as they are (no fine-tuning): STS (:mod:`cramkit.evaluation.sts`:
the correlation of cosine similarity with gold scores) and retrieval over a folder in BEIR's layout
(:mod:`cramkit.evaluation.retrieval`: nDCG@10, recall, MRR, MAP), by exact search or through an index. Both read
the data, embed with the model's own pooling (any model ``cramkit.load`` opens, through
:class:`cramkit.infer.Engine`), score (:mod:`cramkit.evaluation.metrics`), and write ``results.json`` (last: its
presence means the evaluation finished), ``results.md`` and ``scores.png`` (:mod:`cramkit.evaluation.results`).

    cramkit.evaluate_sts("hf:models/minilm", "STS-B/dev.tsv")          # or `cramkit eval sts`
    cramkit.evaluate_retrieval("hf:models/minilm", "scifact/")         # or `cramkit eval retrieval`

The verb ``cramkit.evaluate`` is the suites' (:func:`cramkit.api.evaluate`); this package is its noun. It must
stay light (no numpy, no torch).
"""

CUTOFF = 10  # the cut-off of nDCG and MRR by default (BEIR's): the metrics and `cramkit eval`'s help read it


def results_dir(name: str) -> str:
    """Where an evaluation writes its results when given no folder: eval-NAME (eval-glue, eval-sts, ...)."""
    return f"eval-{name}"
