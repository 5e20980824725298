"""`replicas = N`: N whole servers on one port, each with its own models, batchers and backends.

For models small enough to hold N times (tabular, small CNNs, encoders on the CPU): each replica
parses, batches and runs its own requests, so the front end spreads over N cores with no process
hop per request (`api_servers` pays one: every request crosses to the one engine process). The
supervisor (supervisor.py) starts them as it starts API processes: spawned, handed the one
listening socket, replaced when one dies, drained on SIGTERM. Their metrics merge on /metrics as
the API processes' do (metrics_merge.py).

Readiness is the server's, not a replica's: a replica answers /health/ready with 200 only while
every replica serves. Each marks itself in a flag shared with all (`PortRole`) once its models
are started, and clears it as it stops; the supervisor clears a dead one's.

LLM engines are refused with replicas (settings.py): an LLM is large, and N copies of its weights
and KV cache would rarely fit where one does.
"""

from __future__ import annotations

import os
import socket

from ferry.server.logs import configure_logging
from ferry.server.procs.port_role import PortRole
from ferry.server.settings import Settings


def replica_main(settings: Settings, sock: socket.socket, role: PortRole) -> None:
    """A replica process: the usual app and its own models, on the supervisor's socket."""
    # As an API process (supervisor.api_main): its own process group, the socket not inherited
    # by the processes it starts.
    os.setpgrp()
    sock.set_inheritable(False)
    configure_logging(settings.log_level, settings.log_format)
    from ferry.server.app import create_app
    from ferry.server.serve import serve

    serve(create_app(settings, replica=role), settings, sockets=[sock])
