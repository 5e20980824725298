"""`ferry export KIND`'s progress, one for every export command (cli.py's and vision_cli.py's)."""

from __future__ import annotations

from ferry.server.progress import Progress


def export_progress(kind: str, total: float) -> Progress:
    """`ferry export KIND`'s progress on stderr: a bar with an ETA on a terminal, a line per
    step elsewhere (results go to stdout once it is closed)."""
    return Progress(f"ferry export {kind}", total)
