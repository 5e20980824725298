"""Latency (p50 and p99) against throughput, one point per concurrency level, as a PNG."""

from __future__ import annotations

from pathlib import Path

from ferry.bench.sweep import Step


def plot_latency_vs_throughput(
    steps: list[Step], path: Path, title: str, ceiling: float | None = None
) -> Path:
    # Agg before pyplot: no display on servers and CI, and no GUI toolkit is imported.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    throughput = [s.throughput for s in steps]
    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        ax.plot(throughput, [s.p50_ms for s in steps], "o-", label="p50")
        ax.plot(throughput, [s.p99_ms for s in steps], "s--", label="p99")
        for s in steps:
            ax.annotate(
                f"c={s.concurrency}",
                (s.throughput, s.p99_ms),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=8,
            )
        if ceiling:
            ax.axvline(ceiling, color="grey", linestyle=":", label="in-process ORT ceiling")
        ax.set_xlabel("throughput (requests/s)")
        ax.set_ylabel("latency (ms)")
        # Latency spans orders of magnitude between 1 and 64 clients.
        ax.set_yscale("log")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path
