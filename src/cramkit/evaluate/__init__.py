"""How good a model's sentence embeddings are, as they are (no fine-tuning): STS (:mod:`cramkit.evaluate.sts`:
the correlation of cosine similarity with gold scores) and retrieval over a folder in BEIR's layout
(:mod:`cramkit.evaluate.retrieval`: nDCG@10, recall, MRR, MAP), by exact search or through an index. Both read
the data, embed with the model's own pooling (any model ``cramkit.load`` opens, through
:class:`cramkit.infer.Engine`), score (:mod:`cramkit.evaluate.metrics`), and write ``results.json`` (last: its
presence means the evaluation finished), ``results.md`` and ``scores.png`` (:mod:`cramkit.evaluate.results`).

    cramkit.evaluate_sts("hf:models/minilm", "STS-B/dev.tsv")          # or `cramkit eval sts`
    cramkit.evaluate_retrieval("hf:models/minilm", "scifact/")         # or `cramkit eval retrieval`

``cramkit.evaluate`` itself is the suites' verb (:func:`cramkit.api.evaluate`): ``import cramkit`` imports this
package first, so that importing it later cannot take the verb's place; the functions are reached through
``from cramkit.evaluate.sts import evaluate_sts`` (or ``cramkit.evaluate_sts``), never as attributes of
``cramkit.evaluate``. This package must stay light (no numpy, no torch).
"""

CUTOFF = 10  # the cut-off of nDCG and MRR by default (BEIR's): the metrics and `cramkit eval`'s help read it
