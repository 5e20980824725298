"""Tenants: who a request comes from, and what that lets it do.

A tenant is the name of the API key a request was sent with (`api_keys`, and `api_key` as
"default"); with no key configured every request is anonymous (None). Two things follow from it:

- Prefix reuse (the LLM prefix cache, vLLM's automatic prefix caching) happens only within one
  scope, `cache_scope(tenant, cache_salt)`, handed to the engine as its `cache_salt`: requests
  under different keys, or with different `cache_salt`s, never reuse each other's prompts, so
  `cached_tokens` and the time to the first token say nothing about another tenant's prompts.
  Anonymous requests without a salt share one scope, as in vLLM: clients that must not see each
  other send a `cache_salt` of their own (or get keys).
- Priority is a privilege: a priority below DEFAULT_PRIORITY (more urgent than the default) is
  allowed only to the keys named in `priority_keys` ("*": everyone). Anyone else's is refused
  (403 naming `priority`) or, with `priority_below_default = "clamp"`, run at the default and
  said so in the `ferry-priority-clamped` response header (gRPC: trailing metadata). So keyless
  clients cannot jump the queue, and what a privileged key sends ahead is still held to the
  batcher's admission (batcher/admission.py): a newcomer that would make an admitted request
  miss its deadline is refused, not the admitted one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ferry.server.errors import Forbidden

DEFAULT_PRIORITY = 0
EVERYONE = "*"
CLAMPED_HEADER = b"ferry-priority-clamped"  # its value: the priority the request asked for


def cache_scope(tenant: str | None, cache_salt: str | None) -> str | None:
    """The engine's `cache_salt` for a request: its tenant and its own salt, unambiguously
    joined (a tuple's repr quotes both), None for an anonymous request without a salt."""
    if tenant is None and cache_salt is None:
        return None
    return repr((tenant, cache_salt))


@dataclass(frozen=True)
class RunAs:
    """What a generation runs as, decided from its tenant: its priority after the policy, and
    the engine's `cache_salt` (cache_scope)."""

    priority: int = DEFAULT_PRIORITY
    cache_salt: str | None = None


@dataclass(frozen=True)
class Prioritized:
    priority: int  # what the request runs at
    clamped_from: int | None = None  # what it asked for, when that was not allowed


class PriorityPolicy:
    def __init__(self, allowed: Sequence[str], mode: str) -> None:
        self._everyone = EVERYONE in allowed
        self._allowed = frozenset(allowed)
        self._clamp = mode == "clamp"

    def apply(self, priority: int, tenant: str | None) -> Prioritized:
        """The priority a request of `tenant` runs at (Forbidden when refused)."""
        if priority >= DEFAULT_PRIORITY or self._everyone or tenant in self._allowed:
            return Prioritized(priority)
        if self._clamp:
            return Prioritized(DEFAULT_PRIORITY, priority)
        who = "requests without an API key" if tenant is None else f"API key {tenant!r}"
        raise Forbidden(
            "priority",
            f"priority {priority} is more urgent than the default ({DEFAULT_PRIORITY}), which "
            f"{who} may not ask for (priority_keys); send {DEFAULT_PRIORITY} or more",
        )
