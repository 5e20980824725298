"""Generations that need log probabilities, on onnxruntime-genai's Generator API.

og.Engine returns tokens only, so a request with `logprobs` or `echo` runs here instead, on the
engine's owner thread, alone and to its end: the Generator exposes the logits (the prompt's, all
positions, after `append_tokens`; then the last position's before each new token), and the log
probabilities are their log-softmax: the model's own distribution, before temperature or top-p.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from ferry.llm.base import FinishReason, GenerationDelta, SamplingSettings
from ferry.llm.logprobs import log_softmax, prompt_logprobs, token_logprob
from ferry.llm.stops import StopMatcher


def run_scored(
    og: Any,
    model: Any,
    tokenizer: Any,
    prompt_ids: list[int],
    sampling: SamplingSettings,
    emit: Callable[[GenerationDelta], None],
) -> None:
    """Generate `prompt_ids`' continuation, emitting one delta per token with its logprobs."""
    top = sampling.logprobs or 0
    params = og.GeneratorParams(model)
    options: dict[str, Any] = {"max_length": len(prompt_ids) + sampling.max_tokens}
    if sampling.temperature == 0:
        options["do_sample"] = False
    else:
        options.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p)
    params.set_search_options(**options)
    generator = og.Generator(model, params)
    try:
        generator.append_tokens(np.asarray(prompt_ids, dtype=np.int32))
        echoed = None
        if sampling.echo:
            echoed = prompt_logprobs(generator.get_output("logits")[0], prompt_ids, top)
        matcher, decoder = StopMatcher(sampling.stop), tokenizer.create_stream()
        reason: FinishReason = "length"
        for generated in range(sampling.max_tokens):
            if generator.is_done():
                reason = "stop"  # end of sequence
                break
            row = log_softmax(generator.get_logits()[0, -1])
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            text = matcher.feed(decoder.decode(token))
            entry = (token_logprob(row, token, top),)
            last = matcher.stopped or generated == sampling.max_tokens - 1
            if matcher.stopped:
                reason = "stop"
            elif last:
                text += matcher.flush()
            emit(GenerationDelta(text, 1, reason if last else None, entry, echoed))
            echoed = None
            if last:
                return
        emit(GenerationDelta(matcher.flush(), 0, reason, (), echoed))
    finally:
        del generator
