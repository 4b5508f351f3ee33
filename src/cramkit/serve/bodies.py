"""The request bodies of the POST routes, each declared once (:mod:`cramkit.serve.declare`): a route reads
its body with ``XRequest.parse(body, ctx)`` and the app describes it with ``XRequest.openapi()``.

The field names and defaults are text-embeddings-inference's where the routes overlap (``inputs``,
``normalize``, ``truncate``, ``raw_scores``, ``prompt_name``, ...); ``model`` picks one of the models served.
"""

from __future__ import annotations

from dataclasses import dataclass

from cramkit.model.pooling import POOLINGS
from cramkit.serve.declare import (
    Body,
    ChoiceInputs,
    Choices,
    Context,
    Dimensions,
    EitherInputs,
    Flag,
    Inputs,
    Integer,
    ModelName,
    Nested,
    NonEmptyText,
    OneOf,
    PromptName,
    Texts,
    declare,
    union,
)
from cramkit.serve.guard import invalid


@dataclass(frozen=True)
class EmbedRequest(Body):
    """POST /embed (TEI's)."""

    inputs: Inputs = declare(Texts())
    normalize: bool = declare(Flag(True))
    truncate: bool = declare(Flag(True, "cut inputs to the model's limit"))
    pooling: str | None = declare(OneOf(POOLINGS, description="default: the model's"))
    dimensions: int | None = declare(Dimensions())
    prompt_name: str | None = declare(PromptName())
    model: str = declare(ModelName())


@dataclass(frozen=True)
class OpenAIEmbeddingsRequest(Body):
    """POST /v1/embeddings (OpenAI's shape)."""

    input: Inputs = declare(Texts())
    encoding_format: str = declare(OneOf(("float", "base64"), "float", blank_is_default=True))
    dimensions: int | None = declare(Dimensions())
    prompt_name: str | None = declare(PromptName())
    model: str = declare(ModelName())


@dataclass(frozen=True)
class RerankRequest(Body):
    """POST /rerank (TEI's): a query and the texts to order by relevance to it."""

    query: str = declare(NonEmptyText())
    texts: Inputs = declare(Texts())
    raw_scores: bool = declare(Flag(False, "the logit margin, not a probability"))
    return_text: bool = declare(Flag(False))
    truncate: bool = declare(Flag(True))
    model: str = declare(ModelName())

    def check(self, ctx: Context) -> None:
        limit = ctx.limits.max_input_chars
        if len(self.query) > limit:
            raise invalid(f"'query' has {len(self.query)} characters; the limit is {limit}", 413)


@dataclass(frozen=True)
class TokenizeRequest(Body):
    """POST /tokenize (TEI's)."""

    inputs: Inputs = declare(Texts())
    add_special_tokens: bool = declare(Flag(True))
    truncate: bool = declare(Flag(True, "cut at the model's limit"))
    prompt_name: str | None = declare(PromptName())
    model: str = declare(ModelName())


@dataclass(frozen=True)
class PredictRequest(Body):
    """POST /predict (TEI's): texts or pairs to classify; a multiple-choice model's {text, choices}."""

    inputs: Inputs | ChoiceInputs = declare(
        EitherInputs(
            choose=Choices(),
            otherwise=Texts(pairs=True),
            description="a text, a [text, text] pair, or a list of texts and pairs; multiple choice: "
            "{text, choices} or a list of them",
        )
    )
    raw_scores: bool = declare(Flag(False, "logits instead of probabilities"))
    truncate: bool = declare(Flag(True))
    model: str = declare(ModelName())


@dataclass(frozen=True)
class ClassificationParameters(Body):
    """The ``parameters`` of the Inference API's text-classification, which huggingface_hub's
    ``InferenceClient.text_classification`` sends."""

    top_k: int = declare(Integer(0, 0, 100_000, "the best top_k labels per input (0, the default: every label)"))
    function_to_apply: str | None = declare(
        OneOf(
            ("softmax", "sigmoid", "none"), description="the scores: default the model's (softmax, multilabel: sigmoid)"
        )
    )


@dataclass(frozen=True)
class TextClassificationRequest(PredictRequest):
    """POST / (and /invocations) of a classifier: /predict's body with the Inference API's ``parameters``; the
    answer is a list of labels per input, a single text's too (the shape huggingface_hub reads)."""

    parameters: ClassificationParameters = declare(Nested(ClassificationParameters))


# POST / and /invocations (TEI's, SageMaker's): the body of the route of the model's kind, which it reads as that
# route does; its schema lists every field of the three, none required by itself
KindRequest = union(
    "KindRequest",
    "POST / (TEI's) and /invocations (SageMaker's): /rerank's body for a cross-encoder given a query, /predict's "
    "(with the Inference API's parameters) for a classifier, /embed's otherwise.",
    TextClassificationRequest,
    EmbedRequest,
    RerankRequest,
)


@dataclass(frozen=True)
class FillMaskRequest(Body):
    """POST /fill-mask: texts with [MASK] tokens."""

    inputs: Inputs = declare(Texts())
    top_k: int = declare(Integer(5, 1, 100))
    truncate: bool = declare(Flag(True))
    model: str = declare(ModelName())


@dataclass(frozen=True)
class SearchRequest(Body):
    """POST /search: queries for the index (it reads no model: the index has its own encoder)."""

    inputs: Inputs = declare(Texts())
    k: int = declare(Integer(10, 1, 1000))
