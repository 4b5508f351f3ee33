"""cramkit: train BERT-style encoders on a budget.

Raw text -> WordPiece tokenizer -> memory-mapped token store -> budgeted masked-LM pretraining
(the Cramming recipe) -> fine-tuning and evaluation -> a kept model to predict with, export, serve,
distil and index. The Python API mirrors the command line::

    run = cramkit.pretrain(["corpus/"], preset="tiny-cpu", budget="5m", out="runs/x")
    res = cramkit.finetune(run, task="glue/sst2", data_dir="glue", out="ft/sst2", seeds=[0, 1, 2])
    model = cramkit.load("ft/sst2")
    cramkit.predict("ft/sst2", "reviews.csv", "reviews.predictions.jsonl")
    cramkit.export("ft/sst2", "hf/sst2")                  # or format="onnx" for ONNX Runtime
    cramkit.evaluate_retrieval("hf:models/minilm", "scifact/")  # embeddings scored as they are (also evaluate_sts)
    cramkit.distill("ft/sst2", student="bilstm", task="glue/sst2", data_dir="glue", out="student")

Every ``cramkit VERB`` of the command line calls the function of the same name here (:mod:`cramkit.api`);
verbs with sub-verbs keep them in their package: ``cramkit.index.build_index``, ``cramkit.serve.serve``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cramkit.api import distill, evaluate, export, finetune, train_embeddings
from cramkit.errors import CramkitError
from cramkit.lazy import lazy_names
from cramkit.loading import LoadedModel, load

if TYPE_CHECKING:
    from cramkit.embeddings.verb import embed_source as embed
    from cramkit.evaluation.retrieval import evaluate_retrieval
    from cramkit.evaluation.sts import evaluate_sts
    from cramkit.infer.predict import predict
    from cramkit.recipes.pretrain import pretrain

# the verbs whose library function is the verb as it is (its checks inside): imported on first use, so that
# `import cramkit` stays light. Verbs are functions and packages are nouns: cramkit.embed is a function,
# cramkit.embeddings its package (and cramkit.distill/distillation, cramkit.evaluate/evaluation,
# cramkit.load/loading)
__getattr__ = lazy_names(
    __name__,
    {
        "embed": "cramkit.embeddings.verb:embed_source",
        "pretrain": "cramkit.recipes.pretrain",
        "predict": "cramkit.infer.predict",
        "evaluate_sts": "cramkit.evaluation.sts",
        "evaluate_retrieval": "cramkit.evaluation.retrieval",
    },
)

__version__ = "0.1.0"
__all__ = [
    "CramkitError",
    "LoadedModel",
    "__version__",
    "distill",
    "embed",
    "evaluate",
    "evaluate_retrieval",
    "evaluate_sts",
    "export",
    "finetune",
    "load",
    "predict",
    "pretrain",
    "train_embeddings",
]
