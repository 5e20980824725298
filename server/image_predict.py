"""/predict with a raw image body (`Content-Type: image/jpeg` or `image/png`): one image, the
model named in the query (`?model=NAME`; else the default model), one answer row back."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import numpy as np

from ferry.server.call_tenancy import call_priority
from ferry.server.errors import InvalidInput
from ferry.server.graph_model import prepare
from ferry.server.hot import HotCall
from ferry.server.route_table import IMAGES
from ferry.server.tensor_predict import answer_rows

IMAGE_MEDIA = frozenset(media.encode() for media in IMAGES)
QUERY = ("model",)


def image_media(call: HotCall) -> bool:
    given = call.header(b"content-type") or b""
    return given.partition(b";")[0].strip().lower() in IMAGE_MEDIA


async def predict_image(call: HotCall) -> dict[str, Any]:
    query = parse_qs(call.scope.get("query_string", b"").decode("latin-1"), True)
    unknown = sorted(set(query) - set(QUERY))
    if unknown:
        raise InvalidInput(unknown[0], f"not a parameter of an image body; it takes {list(QUERY)}")
    registry, asked = call.services.registry, query.get("model", [None])[-1]
    model = registry.graph(asked)
    call.state["model_name"] = model.name if model is not None else registry.get(asked).name
    if model is None or not model.signature.images:
        named = call.state["model_name"]
        raise InvalidInput("model", f"model {named!r} declares no image preprocessing")
    (image_input,) = model.signature.images
    others = [name for name in model.signature.input_names if name != image_input]
    if others:
        model.count_invalid()
        raise InvalidInput(
            "model", f"model {model.name!r} also takes {others}: send its inputs as JSON"
        )
    image = np.empty((), dtype=object)  # one image, no row index: errors name the input
    image[()] = call.body
    rows = await prepare(model, {image_input: image})
    outputs = model.select_outputs(None)
    priority = call_priority(call, 0)
    result = await model.infer(rows, outputs, priority=priority, disconnected=call.disconnected())
    return {"model": model.name, "outputs": answer_rows(model, result, outputs)}
