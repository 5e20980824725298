"""The KServe v2 / Triton protocol extensions Ferry serves, by Triton's names: the one list the
server metadata reports on HTTP (`GET /v2`) and gRPC (`ServerMetadata`).

An extension is listed only once every route of it is served (docs/apis.md has the table of
all of Triton's, served or not); clients such as perf_analyzer read the list to decide what to
ask for.
"""

from __future__ import annotations

SERVED: tuple[str, ...] = (
    "binary_tensor_data",  # binary tensors after the JSON header (HTTP)
    "classification",  # outputs as top-k "value:index:label" strings
    "model_configuration",  # GET /v2/models/{name}/config
    "model_repository",  # POST /v2/repository/index, .../models/{name}/load and /unload
    "statistics",  # GET /v2/models/{name}/stats
    "sequence",  # sequence_id/start/end for stateful models, and ModelStreamInfer
)
# Served only when the operator allows it (settings.allow_client_shm, as Triton's
# --allow-client-shm): kserve/shared_memory.py.
SYSTEM_SHARED_MEMORY = "system_shared_memory"


def served_extensions(allow_client_shm: bool) -> tuple[str, ...]:
    return (*SERVED, *((SYSTEM_SHARED_MEMORY,) if allow_client_shm else ()))
