"""Which of the server's processes this one is: FERRY_PROCESS in its environment, set by the
supervisor for each child it starts (`engine`, `api`, `replica`; `ps e` and the fault tests read
it too), and `server` for a server of one process."""

from __future__ import annotations

import os

ROLE_ENV = "FERRY_PROCESS"
SINGLE = "server"


def process_role() -> str:
    return os.environ.get(ROLE_ENV, SINGLE)
