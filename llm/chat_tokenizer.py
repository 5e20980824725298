"""The prompt side of an LLM: chat template and token counts from the model's own tokenizer files.

Uses `tokenizers` and jinja2 only, so serving never imports transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from ferry.llm.chat_template import compile_chat_template

# The special tokens transformers hands a template (its tokenizer's special_tokens_map).
_SPECIAL_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class ChatTokenizer:
    """Reads tokenizer.json + tokenizer_config.json (or chat_template.jinja) from a model folder."""

    def __init__(self, model_dir: str | Path, escape_special_tokens: bool = True) -> None:
        model_dir = Path(model_dir)
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        # No token covers more characters than its vocabulary entry has (byte-level entries
        # count bytes, at least the characters): a text longer than this times the context
        # cannot fit, and is refused before it is rendered and tokenized.
        self.longest_token_chars = max(map(len, self._tokenizer.get_vocab()), default=1)
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        template = config.get("chat_template")
        jinja_path = model_dir / "chat_template.jinja"
        if template is None and jinja_path.exists():
            template = jinja_path.read_text()
        if not isinstance(template, str):
            raise ValueError(f"{model_dir} has no chat template")
        self._template = compile_chat_template(template)
        # A template that reads `tools` has its own tool format; others get the serving layer's.
        self.has_tool_format = "tools" in template
        self._special = {
            key: text for key in _SPECIAL_KEYS if (text := _token_text(config.get(key))) is not None
        }
        self.eos_token: str | None = self._special.get("eos_token")
        # Special tokens typed by a user are text, not control tokens (no role injection),
        # unless the model's config allows them in message content.
        self._escape_specials = escape_special_tokens
        self._special_texts = tuple(
            token.content
            for token in self._tokenizer.get_added_tokens_decoder().values()
            if token.special
        )
        self._as_text = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._as_text.encode_special_tokens = True

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        # As apply_chat_template calls it: `tools` and `documents` are always defined.
        return self._template.render(
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self._special,
        )

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The chat prompt's token ids, each message's content encoded as plain text.

        Only when some content holds a special token's text does this differ from
        `encode(render_chat(messages))`: the template is then rendered around placeholders, its
        own parts keep their control tokens and the contents are encoded with special tokens
        read as text.
        """
        if not self._escape_specials or not any(
            special in message.get("content", "")
            for message in messages
            for special in self._special_texts
        ):
            return self.encode(self.render_chat(messages, tools, add_generation_prompt))
        placeholders = [f"\x00ferry-content-{i}\x00" for i in range(len(messages))]
        rendered = self.render_chat(
            [{**m, "content": p} for m, p in zip(messages, placeholders, strict=True)],
            tools,
            add_generation_prompt,
        )
        ids: list[int] = []
        rest = rendered
        for message, placeholder in zip(messages, placeholders, strict=True):
            before, found, after = rest.partition(placeholder)
            if not found:
                continue  # the template left this message out
            ids += self.encode(before)
            ids += _ids(self._as_text, message["content"])
            rest = after
        return ids + self.encode(rest)

    def encode(self, text: str) -> list[int]:
        # Special tokens in the rendered template are real tokens; the template adds no BOS itself.
        return _ids(self._tokenizer, text)

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's `tokenizers` Tokenizer: the owner thread streams generated text with it
        (its methods may run from any thread)."""
        return self._tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        """A plain text's ids, with the tokenizer's own special tokens if asked (/tokenize)."""
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def token_strs(self, ids: list[int]) -> list[str]:
        return [self._tokenizer.id_to_token(i) or "" for i in ids]

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size()


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """`tokenizer.encode(text).ids` without special tokens, through `encode_batch`, which releases
    the GIL while it runs (`encode` holds it: 8 ms for 30k characters, the event loop stalled).
    Prompts are encoded in a worker thread, so the loop runs meanwhile."""
    return tokenizer.encode_batch([text], add_special_tokens=False)[0].ids


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
