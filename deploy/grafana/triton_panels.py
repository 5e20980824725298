"""Ferry / Triton: Triton Inference Server behind Ferry, from its :8002/metrics.

Triton's metric names are its own (docs/user_guide/metrics.md of triton-inference-server/server).
"""

from __future__ import annotations

from dashboard_kit import M, Panel, rate_by

SUCCESS = "nv_inference_request_success"


def per_model(counter: str) -> str:
    return rate_by("model", counter)


def per_request_ms(counter: str) -> str:
    """Triton's latencies are cumulative microsecond counters: per successful request, in ms.

    (Failures carry an extra `reason` label in recent Triton, so they are not added in here.)
    """
    return f"{per_model(counter)} / {per_model(SUCCESS)} / 1000"


TRITON = (
    Panel(
        "Requests/s",
        (
            ("{{model}} ok", per_model(SUCCESS)),
            ("{{model}} failed", per_model("nv_inference_request_failure")),
        ),
        unit="reqps",
        description="Requests Triton answered (a batched request counts once).",
    ),
    Panel(
        "Inferences/s and executions/s",
        (
            ("{{model}} inferences", per_model("nv_inference_count")),
            ("{{model}} executions", per_model("nv_inference_exec_count")),
        ),
        unit="ops",
        description="Items inferred and model executions (batches) per second.",
    ),
    Panel(
        "Mean batch size",
        (
            (
                "{{model}}",
                f"{per_model('nv_inference_count')} / {per_model('nv_inference_exec_count')}",
            ),
        ),
        description="Inferences per execution: Triton's dynamic batching at work.",
    ),
    Panel(
        "Latency per request (mean)",
        (
            ("{{model}} total", per_request_ms("nv_inference_request_duration_us")),
            ("{{model}} queue", per_request_ms("nv_inference_queue_duration_us")),
            ("{{model}} compute", per_request_ms("nv_inference_compute_infer_duration_us")),
        ),
        unit="ms",
        description="Triton's latencies are cumulative counters, so means only.",
    ),
    Panel(
        "Compute breakdown (mean)",
        (
            ("{{model}} input", per_request_ms("nv_inference_compute_input_duration_us")),
            ("{{model}} infer", per_request_ms("nv_inference_compute_infer_duration_us")),
            ("{{model}} output", per_request_ms("nv_inference_compute_output_duration_us")),
        ),
        unit="ms",
        description="Time in the framework backend: input copy, inference, output copy.",
    ),
    Panel(
        "Pending requests",
        (("{{model}}", f"sum by (model) (nv_inference_pending_request_count{{{M}}})"),),
        description="Requests queued in Triton's scheduler.",
    ),
    Panel(
        "GPU utilisation",
        (("{{gpu_uuid}}", "nv_gpu_utilization"),),
        unit="percentunit",
        description="Per GPU, from DCGM (0-1).",
    ),
    Panel(
        "GPU memory",
        (
            ("{{gpu_uuid}} used", "nv_gpu_memory_used_bytes"),
            ("{{gpu_uuid}} total", "nv_gpu_memory_total_bytes"),
        ),
        unit="bytes",
        description="Per GPU, from DCGM.",
    ),
)
