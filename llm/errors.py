"""Domain errors raised by LLM engines; server/ maps them to HTTP status codes in one place."""


class LLMError(Exception):
    """Base class for every error an LLM engine raises on purpose."""


class InvalidSampling(LLMError):
    """A sampling setting is out of range; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class PromptTooLong(LLMError):
    """The prompt leaves no room for a single generated token in the model's context."""

    def __init__(self, prompt_tokens: int, max_context_tokens: int) -> None:
        super().__init__(
            f"This model's maximum context length is {max_context_tokens} tokens, "
            f"but the prompt has {prompt_tokens} tokens."
        )
        self.prompt_tokens = prompt_tokens
        self.max_context_tokens = max_context_tokens


class EngineOverloaded(LLMError):
    """Running and waiting slots are all taken; shed the request instead of queueing it."""


class EngineDead(LLMError):
    """The engine stopped or crashed; no request can be served until it is restarted."""


class GenerationFailed(LLMError):
    """The runtime failed this one request; the engine itself is still healthy."""


class ModelNotFound(LLMError):
    """No engine serves the requested model name."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.")
        self.model = model


class InvalidAdapter(LLMError):
    """A LoRA adapter cannot be loaded (name taken, limit reached, bad file); `field` names why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
