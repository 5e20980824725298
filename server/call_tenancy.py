"""The tenancy policy applied to one HTTP call (a hot route's): its priority and its RunAs.

Apart from tenancy.py, which the services object holds: these read the call, which holds the
services."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry.server.tenancy import Prioritized, RunAs, cache_scope

if TYPE_CHECKING:
    from ferry.server.hot import HotCall


def call_priority(call: HotCall, priority: int) -> int:
    """An HTTP request's priority after the policy; a clamp is noted for the response header
    (the gateway adds it)."""
    decided: Prioritized = call.services.priority_policy.apply(priority, call.state.get("tenant"))
    if decided.clamped_from is not None:
        call.state["priority_clamped"] = decided.clamped_from
    return decided.priority


def run_as(call: HotCall, priority: int, cache_salt: str | None) -> RunAs:
    """An HTTP generation's RunAs: the policy applied to its priority, its salt scoped."""
    tenant = call.state.get("tenant")
    return RunAs(call_priority(call, priority), cache_scope(tenant, cache_salt))
