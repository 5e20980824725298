"""POST /predict: text or token ids in, model outputs per item out, through the micro-batcher."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from ferry.batcher import TokenSequence
from ferry.batcher.errors import InvalidInput
from ferry.server.disconnect import ClientDisconnected, gather_unless_disconnected
from ferry.server.model_runtime import ModelRuntime
from ferry.server.request_limits import check_request_size
from ferry.server.schemas import PredictRequest, PredictResponse, Usage, error_responses

router = APIRouter()

ERROR_RESPONSES = error_responses(401, 404, 413, 422, 429, 500, 503, 504)


def sequences_for(body: PredictRequest, model: ModelRuntime) -> list[TokenSequence]:
    if body.inputs is not None:
        return model.tokenizer.encode(body.texts(), truncate=body.truncate)
    ids, mask = body.token_lists()
    if mask is not None and len(mask) != len(ids):
        raise InvalidInput(
            "attention_mask", f"attention_mask has {len(mask)} items but input_ids has {len(ids)}"
        )
    return [
        TokenSequence.from_ids(item, None if mask is None else mask[i])
        for i, item in enumerate(ids)
    ]


@router.post("/predict", response_model=PredictResponse, responses=ERROR_RESPONSES)
async def predict(body: PredictRequest, request: Request) -> PredictResponse | Response:
    model = request.app.state.registry.get(body.model)
    request.state.model_name = model.name
    outputs = model.select_outputs(body.outputs)
    sequences = sequences_for(body, model)
    check_request_size(sequences, request.app.state.settings, "inputs")
    timeout_s = body.timeout_ms / 1000 if body.timeout_ms else None
    futures = model.submit(sequences, timeout_s)
    try:
        rows = await gather_unless_disconnected(request, futures)
    except ClientDisconnected:
        # Nobody is listening; 499 is what nginx logs for this.
        return Response(status_code=499)
    tokens = sum(seq.length for seq in sequences)
    body = PredictResponse(
        model=model.name,
        outputs=[model.render(row, outputs) for row in rows],
        usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
    )
    # Serialized once, in pydantic's Rust core: FastAPI would validate and encode it again.
    return Response(body.model_dump_json(), media_type="application/json")
