"""Scoring (first, second) text pairs with a cross-encoder: what /rerank, /v1/rerank and
/v1/score share, below their protocols.

Each pair is tokenized as one input with segment ids (query: 0, document: 1), validated and
queued through the one encoder path, so pairs batch with every other request to the model.
A cross-encoder is a head with one logit; its score is the sigmoid of it (TEI's and vLLM's
default), its raw score the logit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from ferry.server.encoder import EncoderServing
from ferry.server.encoder_model import EncoderModel
from ferry.server.encoder_request import Texts, item_field
from ferry.server.errors import InvalidInput
from ferry.server.model_outputs import sigmoid


@dataclass(frozen=True)
class PairScores:
    logits: list[float]  # one per pair, in the request's order
    tokens: int  # every pair's tokens: the request's usage

    def scores(self, raw: bool = False) -> list[float]:
        return list(self.logits) if raw else [sigmoid(logit) for logit in self.logits]


def check_cross_encoder(model: EncoderModel) -> None:
    """Only a one-logit head scores a pair; anything else is refused naming `model`."""
    if not model.outputs.scores:
        raise InvalidInput(
            "model",
            f"model {model.name!r} is not a cross-encoder (a head with one logit, exported "
            "with `ferry export onnx --task rerank`)",
        )


def check_firsts(field: str, texts: Sequence[str], max_chars: int) -> None:
    """The pairs' first texts (a query), named as the route's clients know them; the second
    ones are checked with the tokenizer's own checks, named by the encoder path."""
    for index, text in enumerate(texts):
        name = item_field(field, index, len(texts))
        if not text.strip():
            raise InvalidInput(name, "text must not be empty")
        if len(text) > max_chars:
            raise InvalidInput(name, f"text has {len(text)} characters; at most {max_chars}")


async def score_pairs(
    encoder: EncoderServing,
    model: EncoderModel,
    firsts: Sequence[str],
    seconds: Texts,
    disconnected: asyncio.Future[None] | None = None,
    priority: int = 0,
    first_field: str | None = None,
) -> PairScores:
    """`firsts[i]` with `seconds.texts[i]`, scored; `seconds` names the items in errors, and
    `first_field` the firsts (one query is tokenized once, however many documents)."""
    pairs = Texts(firsts, seconds.field, seconds.truncate, seconds.texts, first_field)
    valid = await encoder.validate(model, pairs, ("logits",), None, priority)
    result = await encoder.run(model, valid, disconnected)
    return PairScores([float(row["logits"][0]) for row in result.rows], result.prompt_tokens)


def ranked(scores: Sequence[float], top_n: int | None = None) -> list[int]:
    """Indices by score, highest first (ties in the request's order), the first `top_n`."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order if not top_n else order[:top_n]
