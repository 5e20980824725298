"""Constrained decoding on onnxruntime-genai: the one way a grammar reaches it.

Ferry's grammars are llguidance's (JSON schema, regex, Lark with `%json`): onnxruntime-genai
compiles llguidance in. The serving layer checks each grammar before any work (in checker
processes: `grammar_check.py`, `grammar_pool.py`), so a schema the engine would refuse is a 400
naming its offending part before anything is queued.
"""

from __future__ import annotations

from typing import Any

from ferry.llm.base import Guidance
from ferry.llm.errors import GenerationFailed, GrammarFailed, LLMError

# How onnxruntime-genai words llguidance's errors ("Error creating grammar: ...", "Error
# committing tokens: Parser Error: Current row has 5000 items; max is 2000", "lexer error").
_GRAMMAR_ERRORS = ("grammar", "parser error", "lexer error", "committing tokens", "mask")


def apply_guidance(target: Any, guidance: Guidance | None) -> None:
    """Set `guidance` on an og.TurnOptions or og.GeneratorParams (both take kind and data).

    enable_ff_tokens (GeneratorParams only) stays off: with it one step may add several tokens,
    and both lanes deliver one token per step."""
    if guidance is not None:
        target.set_guidance(guidance.kind, guidance.data)


def request_error(exc: Exception, guidance: Guidance | None, prefix: str = "") -> LLMError:
    """What one request's failure in the engine is: GrammarFailed (a 400 naming the grammar's
    field) when llguidance stopped its grammar, GenerationFailed (a 500) otherwise."""
    message = str(exc)
    if guidance is not None and any(m in message.lower() for m in _GRAMMAR_ERRORS):
        first = message.strip().split("\n", 1)[0]
        param = guidance.param
        return GrammarFailed(param, f"{param} cannot be used for constrained decoding: {first}")
    return GenerationFailed(f"{prefix}{message}")
