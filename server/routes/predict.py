"""POST /predict: text or token ids in, model outputs per item out, through the micro-batcher."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter

from ferry.server import json_bodies
from ferry.server.call_tenancy import call_priority
from ferry.server.encoder_request import EncoderInputs, Texts, TokenLists
from ferry.server.hot import HotCall, HotRoutes, register
from ferry.server.image_predict import image_media, predict_image
from ferry.server.large_bodies import LARGE_BODY_BYTES, decoded
from ferry.server.pair_scoring import check_firsts
from ferry.server.registry import ModelRegistry
from ferry.server.replies import Reply, json_reply
from ferry.server.request_bodies import parse_body
from ferry.server.schemas import PredictRequest, PredictResponse, error_responses
from ferry.server.tensor_predict import predict_tensors

ERROR_RESPONSES = error_responses(401, 403, 404, 413, 415, 422, 429, 500, 503, 504)
PATH = "/predict"


async def predict(call: HotCall) -> Reply:
    registry = call.services.registry
    if image_media(call):  # a raw image body, for a model that decodes images
        return json_reply(await predict_image(call))
    if registry.graphs:  # plain graphs served: the body may be theirs
        raw = None
        if len(call.body) >= LARGE_BODY_BYTES:  # its numbers made arrays by a worker
            raw = await json_bodies.parsed_predict(call.body, input_datatypes(registry))
        if raw is None:
            raw = await decoded(len(call.body), partial(json_bodies.plain_body, call.body))
        graph = None if raw is None else registry.graph(raw.get("model"))
        if graph is not None:
            call.state["model_name"] = graph.name
            assert raw is not None  # a model was found in it
            decide = partial(call_priority, call)
            disconnected = call.disconnected()
            limit = call.services.settings.max_response_bytes
            return await predict_tensors(graph, raw, disconnected, decide, len(call.body), limit)
    # Parsed and validated in pydantic's Rust core, straight from the bytes.
    body = await parse_body(PredictRequest, call.body)
    model = call.services.registry.get(body.model)
    call.state["model_name"] = model.name
    outputs = model.outputs.select(body.outputs)
    if body.inputs is not None:
        texts, seconds = body.texts()
        if seconds is not None:
            check_firsts("inputs", texts, call.services.settings.max_chars_per_text)
        inputs: EncoderInputs = Texts(texts, "inputs", body.truncate, pairs=seconds)
    else:
        ids, mask, types = body.token_lists()
        inputs = TokenLists(ids, mask, "input_ids", types)
    timeout_s = body.timeout_ms / 1000 if body.timeout_ms else None
    encoder = call.services.encoder
    priority = call_priority(call, body.priority)
    valid = await encoder.validate(model, inputs, outputs, timeout_s, priority)
    result = await encoder.run(model, valid, call.disconnected())
    return json_reply(
        {
            "model": model.name,
            "outputs": [model.outputs.render(row, outputs) for row in result.rows],
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
        }
    )


def input_datatypes(registry: ModelRegistry) -> dict[str, dict[str, str]]:
    """Each plain graph's inputs' datatypes, by graph name ("": the default model's)."""
    datatypes = {
        name: {spec.name: spec.datatype for spec in graph.signature.inputs}
        for name, graph in registry.graphs.items()
    }
    if registry.default_name in datatypes:
        datatypes[""] = datatypes[registry.default_name]
    return datatypes


def register_routes(router: APIRouter, hot: HotRoutes) -> None:
    register(
        router,
        hot,
        PATH,
        predict,
        summary="Predict",
        responses=ERROR_RESPONSES,
        body_model=PredictRequest,
        response_model=PredictResponse,
    )
