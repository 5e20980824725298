"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter, with vLLM's names and bodies.

Behind the API key like every inference route, and with keys set only for those named in
`adapter_keys`. A runtime load reads only from inside an LLM model's configured `adapter_dir`
(symlinks resolved), and the adapter goes on that model. An adapter the config file names is
the operator's: no client unloads it (it could not be loaded back from outside `adapter_dir`).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from ferry.llm.errors import InvalidAdapter, shown_name
from ferry.server.errors import Forbidden
from ferry.server.schemas import error_responses
from ferry.server.services import services_of
from ferry.server.settings import LLMSettings, Settings

router = APIRouter()
PATH_MAX, NAME_MAX = 4096, 255  # Linux's (limits.h), in bytes; checked as the client sent them

# vLLM answers these with a plain-text sentence; errors stay in the one JSON error shape.
RESPONSES = {
    **error_responses(400, 401, 403, 404, 415, 503),
    200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Done"},
}


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._:/-]+$")
    lora_path: str = Field(min_length=1, description="inside a configured adapter_dir")
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None


@router.post("/v1/load_lora_adapter", responses=RESPONSES)
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> PlainTextResponse:
    settings = services_of(request).settings
    check_adapter_right(settings, getattr(request.state, "tenant", None))
    if body.load_inplace:
        raise InvalidAdapter("load_inplace", "load_inplace is not supported: unload, then load.")
    if len(body.lora_name) > settings.max_adapter_name_chars:
        raise InvalidAdapter(
            "lora_name",
            f"lora_name is {len(body.lora_name)} characters; at most "
            f"{settings.max_adapter_name_chars} (max_adapter_name_chars)",
        )
    base, path = adapter_source(body.lora_path, settings.llm_models)
    await services_of(request).registry.load_adapter(body.lora_name, path, base)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter", responses=RESPONSES)
async def unload_lora_adapter(
    body: UnloadLoRAAdapterRequest, request: Request
) -> PlainTextResponse:
    services = services_of(request)
    settings = services.settings
    check_adapter_right(settings, getattr(request.state, "tenant", None))
    if body.lora_int_id is not None:  # Ferry numbers loads itself; a given id cannot be honoured
        raise InvalidAdapter("lora_int_id", "lora_int_id is not supported: give lora_name.")
    if any(body.lora_name in model.adapters for model in settings.llm_models):
        raise Forbidden(
            "lora_name",
            f"adapter {shown_name(body.lora_name)!r} is configured in the server's config file; "
            "a client cannot unload it",
        )
    # Returns once the requests in flight on the adapter finished and it is freed.
    await services.registry.unload_adapter(body.lora_name)
    # Its name came from a request: its series go with it (docs/gpu.md's label promise).
    services.metrics.forget_model(body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def check_adapter_right(settings: Settings, tenant: str | None) -> None:
    """With API keys set, only the keys `adapter_keys` names (or all, "*") load and unload
    adapters: one is a model every tenant's requests may run on (403 otherwise)."""
    if not settings.tenant_keys or "*" in settings.adapter_keys:
        return
    if tenant not in settings.adapter_keys:
        raise Forbidden(
            "lora_name",
            f"API key {tenant!r} may not load or unload LoRA adapters (adapter_keys)",
        )


def adapter_source(lora_path: str, models: tuple[LLMSettings, ...]) -> tuple[str, Path]:
    """The base model whose adapter_dir holds `lora_path` (relative paths are taken inside it),
    and the resolved path; anything outside every adapter_dir is refused. Every refusal is a
    400 naming `lora_path` that quotes only what the client sent, never a server path."""
    roots = [(m.name, m.adapter_dir.resolve()) for m in models if m.adapter_dir is not None]
    if not roots:
        raise InvalidAdapter("lora_path", "Runtime adapter loading is off: no adapter_dir is set.")
    check_path_text(lora_path)
    found = []
    for base, root in roots:
        try:
            path = (root / lora_path).resolve()
        except (OSError, RuntimeError):  # a symlink loop, a name the system refuses
            message = "lora_path cannot be resolved (a symlink loop, or a name the system refuses)"
            raise InvalidAdapter("lora_path", message) from None
        if path != root and path.is_relative_to(root):
            found.append((base, path))
    if not found:
        raise InvalidAdapter(
            "lora_path", f"{shown_name(lora_path)} is not inside a configured adapter_dir."
        )
    if len(found) > 1:
        bases = ", ".join(base for base, _ in found)
        raise InvalidAdapter(
            "lora_path", f"{shown_name(lora_path)} is in the adapter_dir of {bases}."
        )
    base, path = found[0]
    if not path.exists():
        raise InvalidAdapter("lora_path", f"{shown_name(lora_path)} does not exist.")
    return base, path


def check_path_text(lora_path: str) -> None:
    """What no file system takes, refused before any file system call (which would raise
    ValueError or OSError, not an answer): NUL, more than PATH_MAX, a part over NAME_MAX."""
    if "\0" in lora_path:
        raise InvalidAdapter("lora_path", "lora_path contains a NUL character")
    size = len(lora_path.encode(errors="replace"))
    if size > PATH_MAX:
        raise InvalidAdapter("lora_path", f"lora_path is {size} bytes; at most {PATH_MAX}")
    longest = max((len(part.encode(errors="replace")) for part in lora_path.split("/")), default=0)
    if longest > NAME_MAX:
        raise InvalidAdapter(
            "lora_path", f"a part of lora_path is {longest} bytes; at most {NAME_MAX}"
        )
