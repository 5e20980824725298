"""A deadline the model can never meet is refused before queueing: a 422 naming timeout_ms, not
a 504 after. Checked where the request is validated, in the serving process or in an API
process from the engine's reported row time (a round trip to the engine's check would race the
request's own deadline timer there)."""

from __future__ import annotations

from ferry.batcher.cost_model import RowTime
from ferry.server.errors import InvalidInput

# A deadline under this share of one row's fastest time is refused as one that cannot be met.
DEADLINE_FLOOR_SHARE = 0.5


def refuse_unmeetable(row: RowTime | None, longest: int, timeout_s: float) -> None:
    """`row`: the model's time for a row alone on an idle server (the cost model's fastest;
    fitted on a shared machine, its line follows the load: 247 ms for a row measured at 117),
    None until the cost model is fitted. Only a deadline under half of it is refused."""
    if row is None:
        return
    needs_s = row.seconds(longest)
    if timeout_s < needs_s * DEADLINE_FLOOR_SHARE:
        raise InvalidInput(
            "timeout_ms",
            f"{timeout_s * 1000:g} ms cannot be met: this model needs about "
            f"{needs_s * 1000:.1f} ms for one row of {longest} tokens on an idle server",
        )
