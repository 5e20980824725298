"""POST /predict: text or token ids in, model outputs per item out, through the micro-batcher."""

from __future__ import annotations

from fastapi import APIRouter

from ferry.server.dialects import FERRY
from ferry.server.encoder_request import Texts, TokenLists
from ferry.server.hot import HotCall, HotRoutes, register
from ferry.server.replies import Reply, json_reply
from ferry.server.schemas import PredictRequest, PredictResponse, error_responses
from ferry.server.tenancy import call_priority

ERROR_RESPONSES = error_responses(401, 403, 404, 413, 415, 422, 429, 500, 503, 504)
PATH = "/predict"


async def predict(call: HotCall) -> Reply:
    # Parsed and validated in pydantic's Rust core, straight from the bytes.
    body = PredictRequest.model_validate_json(call.body)
    model = call.app_state.registry.get(body.model)
    call.state["model_name"] = model.name
    outputs = model.select_outputs(body.outputs)
    if body.inputs is not None:
        inputs = Texts(body.texts(), "inputs", body.truncate)
    else:
        inputs = TokenLists(*body.token_lists(), "input_ids")
    timeout_s = body.timeout_ms / 1000 if body.timeout_ms else None
    encoder = call.app_state.encoder
    priority = call_priority(call, body.priority)
    valid = await encoder.validate(model, inputs, outputs, timeout_s, priority)
    result = await encoder.run(model, valid, call.disconnected())
    return json_reply(
        {
            "model": model.name,
            "outputs": [model.render(row, outputs) for row in result.rows],
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
        }
    )


def register_routes(router: APIRouter, hot: HotRoutes) -> None:
    register(
        router,
        hot,
        PATH,
        predict,
        FERRY,
        summary="Predict",
        responses=ERROR_RESPONSES,
        body_model=PredictRequest,
        response_model=PredictResponse,
    )
