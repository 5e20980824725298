"""Constrained decoding's refusals: what a grammar that llguidance stopped becomes.

Ferry's grammars are llguidance's (JSON schema, regex, Lark with `%json`), masked onto the logits
by the engine itself (grammar_rows.py). The serving layer checks each grammar before any work (in
checker processes: `grammar_check.py`, `grammar_pool.py`), so a schema the engine would refuse is
a 400 naming its offending part before anything is queued; what still fails mid-way is mapped
here.
"""

from __future__ import annotations

from ferry.llm.base import Guidance
from ferry.llm.errors import GenerationFailed, GrammarFailed, LLMError

# How llguidance's errors are worded (grammar_rows.py words them as onnxruntime-genai did: "Error
# creating grammar: ...", "Error committing tokens: Parser Error: Current row has 5000 items; max
# is 2000", "lexer error").
_GRAMMAR_ERRORS = ("grammar", "parser error", "lexer error", "committing tokens", "mask")


def request_error(exc: Exception, guidance: Guidance | None, prefix: str = "") -> LLMError:
    """What one request's failure in the engine is: GrammarFailed (a 400 naming the grammar's
    field) when llguidance stopped its grammar, GenerationFailed (a 500) otherwise."""
    message = str(exc)
    if guidance is not None and any(m in message.lower() for m in _GRAMMAR_ERRORS):
        first = message.strip().split("\n", 1)[0]
        param = guidance.param
        return GrammarFailed(param, f"{param} cannot be used for constrained decoding: {first}")
    return GenerationFailed(f"{prefix}{message}")
