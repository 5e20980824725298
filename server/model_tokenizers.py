"""Any served model's tokenizer, as /tokenize and /detokenize use it: an encoder's or an LLM's.

One view over both kinds, so the routes never ask which kind a model is: its encode and decode,
the longest input it takes, its vocabulary and, for a chat model, its chat template.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.server.errors import InvalidInput
from ferry.server.registry import ModelRegistry


@dataclass(frozen=True)
class ModelTokenizer:
    name: str
    max_model_len: int
    vocab_size: int
    encode: Callable[[str, bool], list[int]]  # (text, add_special_tokens) -> ids
    decode: Callable[[list[int]], str]  # special tokens kept, as transformers' decode does
    token_strs: Callable[[list[int]], list[str]]
    chat: ChatTokenizer | None = None  # a chat model's template

    def encode_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        if self.chat is None:
            raise InvalidInput(
                "messages", f"model {self.name!r} has no chat template; send a prompt"
            )
        return self.chat.encode_chat(messages, add_generation_prompt=add_generation_prompt)

    def check_ids(self, field: str, ids: list[int]) -> None:
        for index, token in enumerate(ids):
            if not 0 <= token < self.vocab_size:
                raise InvalidInput(
                    f"{field}[{index}]",
                    f"token id {token} is outside the vocabulary [0, {self.vocab_size})",
                )


def model_tokenizer(registry: ModelRegistry, name: str | None) -> ModelTokenizer:
    """The tokenizer of model `name` (the default encoder for None); the registry's 404 else."""
    if name is None or name in registry.encoders:
        model = registry.get(name)
        tokenizer = model.tokenizer
        return ModelTokenizer(
            model.name,
            model.manifest.max_length,
            tokenizer.vocab_size,
            tokenizer.token_ids,
            lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            tokenizer.token_strs,
        )
    served = registry.llm(name)
    chat = served.engine.tokenizer
    return ModelTokenizer(
        served.name,
        served.engine.max_context_tokens,
        chat.vocab_size,
        chat.encode_text,
        lambda ids: chat.decode(ids, skip_special_tokens=False),
        chat.token_strs,
        chat,
    )
