"""A request's grammars checked before any work, off the event loop, errors naming the field.

Every grammar a request carries (`response_format`, `guided_*`, each tool's `parameters` and the
tool-call grammar they make) is checked in the checker processes of `llm/grammar_pool.py`,
against the `grammar_*` bounds in the settings and with the served model's own tokenizer, the
way onnxruntime-genai will use it: a grammar that passes compiles in the engine and allows a
first token. What is refused is a 400 naming the field (and a JSON schema's failing part).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ferry.llm.base import Guidance
from ferry.llm.errors import InvalidSampling
from ferry.llm.grammar_bounds import GrammarLimits, GrammarRefused
from ferry.llm.grammar_check import GrammarChecker
from ferry.llm.grammar_pool import GrammarPool

if TYPE_CHECKING:
    from ferry.server.settings import Settings

# Made Lark grammars by the checker: any_grammar (Lark, or GBNF/EBNF as vLLM's xgrammar takes)
# and choice (a JSON list of strings, one of which is the answer).
SpecKind = Literal["json_schema", "regex", "lark_grammar", "any_grammar", "choice"]


@dataclass(frozen=True)
class GrammarSpec:
    """A grammar as the request gave it, not yet checked; `param` is the field it came from."""

    kind: SpecKind
    text: str
    param: str


class Grammars:
    """Checks GrammarSpecs in `pool`; without one (unit tests that build the serving layer by
    hand) in this process, on the caller's thread."""

    def __init__(
        self,
        limits: GrammarLimits | None = None,
        pool: GrammarPool | None = None,
        tokenizers: Mapping[str, str] | None = None,  # engine name -> its tokenizer.json
    ) -> None:
        self.limits = limits or (pool.limits if pool is not None else GrammarLimits())
        self._pool = pool
        self._tokenizers = dict(tokenizers or {})
        self._inline = GrammarChecker(self.limits) if pool is None else None

    async def check(self, spec: GrammarSpec, engine: str) -> Guidance:
        """`spec` as the engine's Guidance; InvalidSampling naming `spec.param` otherwise."""
        limit = self.limits.max_chars
        if len(spec.text) > limit:  # refused here: not even copied to a checker
            raise InvalidSampling(
                spec.param,
                f"{spec.param} is {len(spec.text)} characters as a grammar; at most {limit} "
                "(grammar_max_chars)",
            )
        tokenizer = self._tokenizers.get(engine)
        try:
            if self._pool is not None:
                grammar = await self._pool.check(spec.kind, spec.text, tokenizer)
            else:
                assert self._inline is not None
                grammar = self._inline.check(spec.kind, spec.text, tokenizer)
        except GrammarRefused as exc:
            param = ".".join((spec.param, *exc.path))
            message = f"{param} cannot be used for constrained decoding: {exc}"
            raise InvalidSampling(param, message) from None
        kind = spec.kind if spec.kind in ("json_schema", "regex") else "lark_grammar"
        return Guidance(kind, grammar, spec.param)

    def check_alternatives(self, count: int, param: str, what: str) -> None:
        """A union the engine would meet as one row of `count` alternatives (tools, choices)."""
        limit = self.limits.max_alternatives
        if count > limit:
            raise InvalidSampling(
                param, f"{param} has {count} {what}; at most {limit} (grammar_max_alternatives)"
            )


def grammar_limits(settings: Settings) -> GrammarLimits:
    return GrammarLimits(
        max_chars=settings.grammar_max_chars,
        max_rules=settings.grammar_max_rules,
        max_depth=settings.grammar_max_depth,
        max_repeat=settings.grammar_max_repeat,
        max_alternatives=settings.grammar_max_alternatives,
        compile_timeout_s=settings.grammar_compile_timeout_s,
    )


async def start_grammars(settings: Settings) -> tuple[Grammars, GrammarPool | None]:
    """The checker processes, started once the server serves an LLM (none otherwise: no
    request can carry a grammar to a model that is not there)."""
    limits = grammar_limits(settings)
    if not settings.llm_models:
        return Grammars(limits), None
    pool = GrammarPool(limits, settings.grammar_workers, settings.grammar_cache_entries)
    await pool.start()
    tokenizers = {
        llm.name: str(llm.path / "tokenizer.json")
        for llm in settings.llm_models
        if (llm.path / "tokenizer.json").is_file()
    }
    return Grammars(limits, pool, tokenizers), pool
