"""Domain errors raised by LLM engines; server/ maps them to HTTP status codes in one place."""

import logging

log = logging.getLogger(__name__)


class LLMError(Exception):
    """Base class for every error an LLM engine raises on purpose."""


class InvalidSampling(LLMError):
    """A sampling setting is out of range; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# A client-sent name echoed in a message is cut here: a 2 MiB name is not a 2 MiB answer.
MAX_SHOWN_NAME = 256


def shown_name(name: str) -> str:
    if len(name) <= MAX_SHOWN_NAME:
        return name
    return f"{name[:MAX_SHOWN_NAME]}... ({len(name)} characters)"


class InvalidPrompt(LLMError):
    """A prompt this model cannot run (an empty list of token ids, ids outside its vocabulary);
    `field` names it (`prompt` or `prompt[i]`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class PromptTooLong(InvalidPrompt):
    """The prompt leaves no room for a single generated token in the model's context."""

    def __init__(self, prompt_tokens: int, max_context_tokens: int, field: str = "prompt") -> None:
        # field: `prompt`, `prompt[i]` or `messages`: what to shorten
        super().__init__(
            field,
            f"This model's maximum context length is {max_context_tokens} tokens, "
            f"but the prompt has {prompt_tokens} tokens.",
        )
        self.prompt_tokens = prompt_tokens
        self.max_context_tokens = max_context_tokens


class GrammarFailed(InvalidSampling):
    """The engine's llguidance stopped a request's grammar (one of its ParserLimits met mid-way,
    or a grammar it refused at the start): the request's doing, a 400 naming its field."""


class EngineOverloaded(LLMError):
    """Running and waiting slots are all taken; shed the request instead of queueing it."""


class EngineDead(LLMError):
    """The engine stopped or crashed; no request can be served until it is restarted."""


class EngineStalled(EngineDead):
    """The engine process lives but has sent nothing for its heartbeat timeout (stopped, or its
    event loop blocked): what waited on it ends, a 503 as for a dead one (a retry may find it
    resumed, or restarted)."""


class GenerationFailed(LLMError):
    """The runtime failed this one request; the engine itself is still healthy."""


class AdapterNotLoaded(LLMError):
    """An engine was asked for a LoRA adapter it does not hold (unloaded since the request's
    model was looked up). Unknown model names are the server's error (its registry's)."""

    field = "model"

    def __init__(self, adapter: str) -> None:
        super().__init__(f"The LoRA adapter `{shown_name(adapter)}` is not loaded.")
        self.adapter = adapter


class InvalidAdapter(LLMError):
    """A LoRA adapter cannot be loaded (name taken, limit reached, bad file); `field` names why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def adapter_refused(name: str, path: object, error: BaseException) -> InvalidAdapter:
    """An adapter file the engine would not load: the 400 says so without the server's path
    (nor the runtime's message, which may quote it); the log has both."""
    log.warning("adapter %r not loaded from %s: %s", name, path, error)
    return InvalidAdapter(
        "lora_path",
        f"cannot load adapter {shown_name(name)!r}: the file is not an adapter this model "
        "can load (the server log says why)",
    )


class UnservableModel(LLMError):
    """A model folder this engine would load but not serve right; refused when it is built."""
