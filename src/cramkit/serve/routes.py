"""The routes: each POST route reads its declared body (:mod:`cramkit.serve.bodies`) against the model it
picked, reserves room in that model's lane (:mod:`cramkit.serve.guard`), tokenises, waits for its batch and
answers JSON; :data:`TABLE` lists every route with its summary and body, from which the app registers them
and documents them (/openapi.json).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from cramkit.errors import CramkitError
from cramkit.infer.engine import InputTooLong
from cramkit.serve.batcher import Batcher, Search
from cramkit.serve.bodies import (
    EmbedRequest,
    FillMaskRequest,
    KindRequest,
    OpenAIEmbeddingsRequest,
    PredictRequest,
    RerankRequest,
    SearchRequest,
    TextClassificationRequest,
    TokenizeRequest,
)
from cramkit.serve.declare import Body, ChoiceInputs, Context, read_json
from cramkit.serve.guard import ApiError, ServerState, answer_size, invalid, need, queued, reserved, run

# requests this small are tokenised on the event loop; larger ones in a worker thread
INLINE_CHARS = 4000
# answers with more items than this (floats, candidates, hits) are built and serialised in a worker thread
INLINE_ITEMS = 20_000


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON (orjson: numpy arrays written directly, each float32 as its shortest exact decimal;
    10x json.dumps on a 16 x 384 answer)."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def _floats(a: np.ndarray) -> np.ndarray:
    """float32 rows, as :func:`dumps` writes them."""
    return np.ascontiguousarray(a, dtype=np.float32)


def _state(request: Request) -> ServerState:
    return request.app.state.cramkit


async def _tokenize(engine: Any, items: list[Any], truncate: bool) -> Any:
    chars = sum(len(x) if isinstance(x, str) else len(x[0]) + len(x[1]) for x in items)
    try:
        if chars <= INLINE_CHARS:
            return engine.tokenize(items, truncate=truncate)
        return await run_in_threadpool(lambda: engine.tokenize(items, truncate=truncate))
    except InputTooLong as exc:
        raise invalid(str(exc), 413) from None
    except CramkitError as exc:
        raise invalid(str(exc)) from None


async def _response(build: Any, size: int, truncated: np.ndarray | None = None, status: int = 200) -> Response:
    """JSON of ``build()`` (a payload or a function making one); built and serialised in a worker thread
    when the answer holds more than ``INLINE_ITEMS`` items, so that the event loop keeps answering."""

    def body() -> bytes:
        return dumps(build() if callable(build) else build)

    data = await run_in_threadpool(body) if size > INLINE_ITEMS else body()
    headers = {}
    if truncated is not None and truncated.any():
        idx = np.flatnonzero(truncated)
        headers["x-truncated-inputs"] = ",".join(map(str, idx[:100].tolist()))
    return Response(data, status_code=status, media_type="application/json", headers=headers)


# ------------------------------------------------------------------------------------------ embeddings


async def embed(request: Request) -> Response:
    state = _state(request)
    body = await read_json(request)
    name, engine, batcher = state.pick(body, request)
    need(engine.can_embed, name, "embeddings")
    req = EmbedRequest.parse(body, Context(state.limits, engine, name))
    items = engine.with_prompt(req.inputs.items, req.prompt_name)
    with reserved(state, batcher, len(items)):
        enc = await _tokenize(engine, items, req.truncate)
    mean, cls = await run(state, name, batcher, "embed", enc)
    pooling = req.pooling or engine.pooling
    vectors = engine.finish_embeddings(mean if pooling == "mean" else cls, req.normalize, req.dimensions)
    return await _response(lambda: _floats(vectors), vectors.size, enc.truncated)


async def openai_embeddings(request: Request) -> Response:
    state = _state(request)
    body = await read_json(request)
    name, engine, batcher = state.pick(body, request)
    need(engine.can_embed, name, "embeddings")
    req = OpenAIEmbeddingsRequest.parse(body, Context(state.limits, engine, name))
    items = engine.with_prompt(req.input.items, req.prompt_name)
    with reserved(state, batcher, len(items)):
        enc = await _tokenize(engine, items, True)
    mean, cls = await run(state, name, batcher, "embed", enc)
    vectors = engine.finish_embeddings(mean if engine.pooling == "mean" else cls, True, req.dimensions)
    tokens = int(enc.lengths.sum())

    def payload() -> dict[str, Any]:
        if req.encoding_format == "base64":
            rows: Any = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
        else:
            rows = _floats(vectors)
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)],
            "model": name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    return await _response(payload, vectors.size, enc.truncated)


async def tokenize(request: Request) -> Response:
    """TEI's /tokenize: per input, its tokens as the model reads them (id, text, special, start and stop
    offsets in characters; null for a special token), cut at the model's limit when ``truncate``.

    Admitted like /embed (room for its inputs in the model's lane while they are tokenised), and its answer
    bounded like theirs: at most the model's ``max_length`` tokens per input, so that ``truncate: false`` on
    long texts (a 2 MB body answered with 146 MB of tokens) is a 413, not the server's memory."""
    state = _state(request)
    body = await read_json(request)
    name, engine, batcher = state.pick(body, request)
    req = TokenizeRequest.parse(body, Context(state.limits, engine, name))
    items = req.inputs.items
    if engine.can_embed:  # the tokens /embed reads: the prompt first
        items = engine.with_prompt(items, req.prompt_name)
    special = req.add_special_tokens
    most = len(items) * engine.max_length
    from cramkit.text.tokenizer import encode_batch

    def encode() -> list[Any]:
        encs = encode_batch(engine.tokenizer, items, add_special_tokens=special)
        total = sum(min(len(e.ids), engine.max_length) if req.truncate else len(e.ids) for e in encs)
        if total > most:
            raise invalid(
                f"tokenize: {total} tokens in {len(items)} inputs; an answer holds at most {engine.max_length} (the "
                f"model's limit) per input: pass truncate: true, or split the texts",
                413,
            )
        return encs

    def tokens(encs: list[Any]) -> list[list[dict[str, Any]]]:
        out = []
        for enc in encs:
            rows = []
            for tid, tok, (start, stop), sp in zip(
                enc.ids, enc.tokens, enc.offsets, enc.special_tokens_mask, strict=True
            ):
                rows.append(
                    {
                        "id": int(tid),
                        "text": tok,
                        "special": bool(sp),
                        "start": None if sp else int(start),
                        "stop": None if sp else int(stop),
                    }
                )
            if req.truncate and len(rows) > engine.max_length:
                rows = rows[: engine.max_length - 1] + rows[-1:] if special else rows[: engine.max_length]
            out.append(rows)
        return out

    with reserved(state, batcher, len(items)):
        encs = await run_in_threadpool(encode)
    return await _response(lambda: tokens(encs), most, None)


# ------------------------------------------------------------------------------------------ scores


async def rerank(request: Request) -> Response:
    """TEI's /rerank: a cross-encoder scores (query, text) for every text; the texts from the most relevant,
    ``[{"index", "score"[, "text"]}, ...]``."""
    state = _state(request)
    body = await read_json(request)
    name, engine, batcher = state.pick(body, request)
    need(
        engine.can_rerank,
        name,
        f"reranking (/rerank): a cross-encoder fine-tuned on pairs; it is a {engine.kind} model",
    )
    req = RerankRequest.parse(body, Context(state.limits, engine, name))
    texts = req.texts.items
    pairs = [(req.query, t) for t in texts]
    with reserved(state, batcher, len(pairs)):
        enc = await _tokenize(engine, pairs, req.truncate)
    logits = await run(state, name, batcher, "classify", enc)

    def payload() -> Any:
        scores = engine.relevance(logits, req.raw_scores)
        order = np.argsort(-scores, kind="stable")
        return [
            {"index": int(i), "score": float(scores[i]), **({"text": texts[i]} if req.return_text else {})}
            for i in order
        ]

    return await _response(payload, logits.size, enc.truncated)


async def predict(request: Request) -> Response:
    return await _predict(request, pipeline=False)


async def _predict(request: Request, pipeline: bool) -> Response:
    """/predict; ``pipeline`` (POST / of a classifier): the body's Inference API ``parameters`` (top_k,
    function_to_apply) too, and a list of labels per input, a single text's as well (what huggingface_hub's
    ``InferenceClient.text_classification`` reads)."""
    state = _state(request)
    body = await read_json(request)
    name, engine, batcher = state.pick(body, request)
    if not engine.can_choose:
        need(engine.can_classify, name, "classification (/predict); it is a " + engine.kind + " model")
    ctx = Context(state.limits, engine, name)
    req = TextClassificationRequest.parse(body, ctx) if pipeline else PredictRequest.parse(body, ctx)
    if isinstance(req.inputs, ChoiceInputs):
        return await _predict_choices(state, req, req.inputs, name, engine, batcher)
    inputs = req.inputs
    with reserved(state, batcher, len(inputs.items)):
        enc = await _tokenize(engine, inputs.items, req.truncate)
    logits = await run(state, name, batcher, "classify", enc)
    params = req.parameters if isinstance(req, TextClassificationRequest) else None
    function = "none" if req.raw_scores else None
    if params is not None and params.function_to_apply is not None:
        function = params.function_to_apply

    def payload() -> Any:
        out = _predictions(engine, logits, function, params.top_k if params is not None else 0)
        return out[0] if inputs.single and not pipeline else out

    return await _response(payload, logits.size, enc.truncated)


def _predictions(engine: Any, logits: np.ndarray, function: str | None, top_k: int = 0) -> list[list[dict[str, Any]]]:
    """Per input, every label (the best ``top_k``; 0: all) with its score, best first. function: the scores' --
    None the model's own (softmax; a multilabel model's sigmoid), "none" the logits, "softmax", "sigmoid"."""
    from cramkit.infer.engine import probabilities

    if engine.kind == "regression" and function in (None, "none"):
        return [[{"label": "score", "score": float(v)}] for v in logits[:, 0]]
    if function == "none":
        scores = logits
    elif function is None:
        scores = cast(np.ndarray, probabilities(engine.kind, logits))  # not None: no regression here
    else:
        scores = cast(np.ndarray, probabilities("multilabel" if function == "sigmoid" else "classifier", logits))
    names = engine.labels or [str(j) for j in range(logits.shape[1])]
    if engine.kind == "regression":
        names = ["score"]
    out = []
    for row in scores:
        order = np.argsort(-row, kind="stable")[: top_k or None]
        out.append([{"label": names[j], "score": round(float(row[j]), 7)} for j in order])
    return out


async def _predict_choices(
    state: ServerState, req: PredictRequest, inputs: ChoiceInputs, name: str, engine: Any, batcher: Batcher
) -> Response:
    """/predict of a multiple-choice model: per input the chosen choice's index, its text, and every choice's
    probability (with ``raw_scores``: their scores too)."""
    contexts, choices = inputs.contexts, inputs.choices
    rows = sum(len(c) for c in choices)
    chars = sum(len(a) * len(cs) + sum(map(len, cs)) for a, cs in zip(contexts, choices, strict=True))

    def tokenize() -> Any:
        return engine.tokenize_choices(contexts, choices, truncate=req.truncate)

    with reserved(state, batcher, rows):
        try:
            enc = tokenize() if chars <= INLINE_CHARS else await run_in_threadpool(tokenize)
        except InputTooLong as exc:
            raise invalid(str(exc), 413) from None
        except CramkitError as exc:
            raise invalid(str(exc)) from None
    scores = await run(state, name, batcher, "classify", enc.pairs)
    res = engine.choice_result(scores, enc)

    def payload() -> Any:
        out = []
        for i, k in enumerate(res.chosen.tolist()):
            item = {"label": k, "answer": choices[i][k], "probabilities": _floats(res.probs[i])}
            if req.raw_scores:
                item["scores"] = _floats(res.scores[i])
            out.append(item)
        return out[0] if inputs.single else out

    return await _response(payload, rows, res.truncated)


# ------------------------------------------------------------------------------------------ the model's own route


async def by_kind(request: Request) -> Response:
    """TEI's POST / (and SageMaker's /invocations): the route of the picked model's kind, with that route's
    body -- /rerank for a cross-encoder given ``{"query", "texts"}``, /predict for a classifier (a regressor, a
    multiple-choice model; with the Inference API's ``parameters`` and a list of labels per input: what
    huggingface_hub's ``InferenceClient(model=URL).text_classification`` posts and reads), /embed otherwise
    (``feature_extraction``'s)."""
    state = _state(request)
    body = await read_json(request)
    name, engine, _ = state.pick(body, request)
    if engine.can_rerank and "query" in body:
        return await rerank(request)
    if engine.can_classify or engine.can_choose:
        return await _predict(request, pipeline=True)
    if engine.can_embed:
        return await embed(request)
    raise invalid(
        f"model {name!r} (a {engine.kind} model) answers none of /embed, /predict and /rerank, which "
        f"{request.url.path} stands for; use a route it answers (GET /info says what each model does)"
    )


# ------------------------------------------------------------------------------------------ tokens, passages


async def fill_mask(request: Request) -> Response:
    state = _state(request)
    body = await read_json(request)
    name, engine, batcher = state.pick(body, request)
    need(engine.can_fill_mask, name, "fill-mask (it needs a masked-LM model)")
    req = FillMaskRequest.parse(body, Context(state.limits, engine, name))
    items = req.inputs.items
    with reserved(state, batcher, len(items)):
        enc = await _tokenize(engine, items, req.truncate)
    size = answer_size("fill-mask", engine.count_masks(enc), req.top_k, "top_k", state.limits.max_answer_items)
    filled = await run(state, name, batcher, "fill_mask", enc, req.top_k)

    def payload() -> Any:
        out = [
            [[{"token": c["token"], "id": c["id"], "score": round(float(c["score"]), 7)} for c in m] for m in masks]
            for masks in filled
        ]
        return out[0] if req.inputs.single else out

    return await _response(payload, size, enc.truncated)


async def search(request: Request) -> Response:
    state = _state(request)
    body = await read_json(request)
    if state.search is None:
        raise ApiError(404, "this server has no index; start it with cramkit serve ... --index IDX", "NotFound")
    req = SearchRequest.parse(body, Context(state.limits))
    items = req.inputs.items
    size = answer_size("search", len(items), req.k, "k", state.limits.max_answer_items)
    loop = asyncio.get_running_loop()
    job = Search(future=loop.create_future(), loop=loop, n=len(items), cost=len(items), texts=items, k=req.k)
    hits = await queued(state, state.search, job)
    return await _response(lambda: hits[0] if req.inputs.single else hits, size)


# ------------------------------------------------------------------------------------------ the server


async def info(request: Request) -> Response:
    import cramkit

    state = _state(request)
    first = state.engines[state.default]
    model_type: dict[str, Any]
    if first.can_choose:
        model_type = {"multiple_choice": {"max_choices": state.limits.max_choices}}
    elif first.can_classify and first.labels:
        model_type = {
            "classifier": {
                "id2label": dict(enumerate(first.labels)),
                "label2id": {n: i for i, n in enumerate(first.labels)},
            }
        }
    else:
        model_type = {"embedding": {"pooling": first.pooling}}
    payload = {
        "model_id": state.default,
        "model_type": model_type,
        "model_dtype": first.runner.precision,
        "max_input_length": first.max_length,
        "max_batch_tokens": first.max_batch_tokens,
        "max_client_batch_size": state.limits.max_inputs,
        "max_concurrent_requests": state.limits.max_queue,
        "limits": vars(state.limits),
        "version": cramkit.__version__,
        "models": {n: e.info() for n, e in state.engines.items()},
        "index": state.index_path,
    }
    return await _response(payload, 0)


async def health(request: Request) -> Response:
    state = _state(request)
    dead = [lane.name for lane in state.lanes if not lane.alive]
    if dead or state.shutting_down:
        return await _response({"status": "unhealthy", "stopped": dead}, 0, status=503)
    return await _response({"status": "ok", "models": list(state.engines)}, 0)


async def metrics(request: Request) -> Response:
    data, ctype = _state(request).metrics.render()
    return Response(data, media_type=ctype)


# ------------------------------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Route:
    """A route: its path, its handler, what /docs says of it, and its declared body (None: a GET route)."""

    path: str
    endpoint: Callable[[Request], Awaitable[Response]]
    summary: str
    body: type[Body] | None = None


TABLE = (
    Route(
        "/",
        by_kind,
        "The model's own route (TEI's POST /, as huggingface_hub's InferenceClient(model=URL) calls it): /rerank "
        "for a cross-encoder given a query, /predict for a classifier (a list of labels per input, the Inference "
        "API's parameters top_k and function_to_apply), /embed otherwise; the same body as that route",
        KindRequest,
    ),
    Route("/invocations", by_kind, "SageMaker's route: the same as POST /", KindRequest),
    Route("/embed", embed, "Sentence embeddings (TEI's /embed): [[float, ...], ...] in input order", EmbedRequest),
    Route(
        "/predict",
        predict,
        "Classification (TEI's /predict): per input, every label with its score, best first; a multiple-choice "
        "model: per {text, choices} input, the chosen index (label), its text (answer) and every choice's "
        "probability",
        PredictRequest,
    ),
    Route("/v1/embeddings", openai_embeddings, "OpenAI-shaped embeddings", OpenAIEmbeddingsRequest),
    Route(
        "/tokenize",
        tokenize,
        "Tokens as the model reads them (TEI's /tokenize): per input, [{id, text, special, start, stop}, ...]",
        TokenizeRequest,
    ),
    Route(
        "/rerank",
        rerank,
        "Reranking by a cross-encoder (TEI's /rerank): [{index, score[, text]}, ...], the most relevant first",
        RerankRequest,
    ),
    Route(
        "/fill-mask",
        fill_mask,
        "For each [MASK] in each input, the top_k tokens with their probabilities",
        FillMaskRequest,
    ),
    Route(
        "/search",
        search,
        "Nearest passages of the index (cramkit serve --index IDX): per query, [{score, text, doc, source}]",
        SearchRequest,
    ),
    Route("/info", info, "The models served, their limits and the server's"),
    Route("/health", health, "200 while every model's batcher runs"),
    Route("/ping", health, "SageMaker's health check: the same as /health"),
    Route("/metrics", metrics, "Prometheus metrics"),
)
ROUTES = tuple(route.path for route in TABLE)
