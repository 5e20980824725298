"""`ferry export sklearn`: a fitted scikit-learn estimator to ONNX (skl2onnx), with a parity report.

XGBoost and LightGBM models, alone or at the end of a scikit-learn pipeline, convert through
onnxmltools' converters registered with skl2onnx: their graphs have scikit-learn's outputs
(`output_label`, ZipMap `output_probability`) and serve the same way.

The estimator comes from a joblib or pickle file (your own: loading one runs its code), sample
rows from a .npy or numeric .csv file: they fix the input's width and type and are the rows the
parity report runs. A classifier keeps skl2onnx's ZipMap output, which Ferry serves as
{class: probability} on /predict and as an [N, C] tensor on KServe.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# ai.onnx.ml 3: the newest TreeEnsemble onnxmltools writes (skl2onnx would pick 5 and fail).
OPSET = {"": 17, "ai.onnx.ml": 3}


@dataclass(frozen=True)
class Parity:
    """The ONNX graph against the estimator on the same rows."""

    rows: int
    compared: str  # predict_proba, or predict for a regressor
    max_abs_diff: float
    labels_agree: int | None  # rows whose label matches predict (classifiers)
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance and self.labels_agree in (None, self.rows)

    def describe(self) -> str:
        lines = [
            f"parity on {self.rows} rows against {self.compared}:",
            f"  max |onnx - sklearn| = {self.max_abs_diff:.3g} (tolerance {self.tolerance:g})",
        ]
        if self.labels_agree is not None:
            lines.append(f"  labels equal to predict: {self.labels_agree}/{self.rows}")
        lines.append("  ok" if self.ok else "  NOT OK: the graph does not match the estimator")
        return "\n".join(lines)


def load_estimator(path: Path) -> Any:
    import joblib  # scikit-learn's own dependency

    return joblib.load(path)


def load_rows(path: Path) -> np.ndarray:
    """Sample rows, float32: a .npy array, or a numeric .csv (a header line is skipped)."""
    if path.suffix == ".npy":
        rows = np.load(path)
    else:
        first = path.read_text().splitlines()[0].split(",")
        header = not all(_is_number(cell) for cell in first)
        rows = np.loadtxt(path, delimiter=",", skiprows=int(header), ndmin=2)
    if rows.ndim != 2 or not len(rows):
        raise ValueError(f"{path}: sample rows must be a non-empty 2-D table, got {rows.shape}")
    return rows.astype(np.float32)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def export(estimator: Any, rows: np.ndarray, out: Path) -> Path:
    from skl2onnx import to_onnx

    _register_boosters()
    graph = to_onnx(estimator, rows[:1], target_opset=OPSET)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(graph.SerializeToString())
    return out


def parity(estimator: Any, graph: Path, rows: np.ndarray, tolerance: float) -> Parity:
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    (name,) = [i.name for i in session.get_inputs()]
    outputs = session.run(None, {name: rows})
    if hasattr(estimator, "predict_proba"):
        label, probabilities = outputs[0], outputs[1]
        if isinstance(probabilities, list):  # ZipMap: one {class: p} per row
            probabilities = np.array([list(row.values()) for row in probabilities])
        diff = np.abs(probabilities - estimator.predict_proba(rows)).max()
        agree = int((np.asarray(label) == estimator.predict(rows)).sum())
        return Parity(len(rows), "predict_proba", float(diff), agree, tolerance)
    predicted = np.asarray(outputs[0]).reshape(len(rows), -1)
    diff = np.abs(predicted - estimator.predict(rows).reshape(len(rows), -1)).max()
    return Parity(len(rows), "predict", float(diff), None, tolerance)


# The boosted models onnxmltools converts: (library, class, skl2onnx's alias, classifier?).
BOOSTERS = [
    ("xgboost", "XGBClassifier", "XGBoostXGBClassifier", True),
    ("xgboost", "XGBRegressor", "XGBoostXGBRegressor", False),
    ("lightgbm", "LGBMClassifier", "LightGbmLGBMClassifier", True),
    ("lightgbm", "LGBMRegressor", "LightGbmLGBMRegressor", False),
]
CONVERTERS = {
    "xgboost": ("onnxmltools.convert.xgboost.operator_converters.XGBoost", "convert_xgboost"),
    "lightgbm": ("onnxmltools.convert.lightgbm.operator_converters.LightGbm", "convert_lightgbm"),
}


def _register_boosters() -> None:
    """Teach skl2onnx the XGBoost and LightGBM models. Only libraries already imported: loading
    an estimator of theirs imported them, and neither is needed otherwise."""
    from skl2onnx import update_registered_converter
    from skl2onnx.common import shape_calculator

    for library, name, alias, classifier in BOOSTERS:
        if library not in sys.modules:
            continue
        module, function = CONVERTERS[library]
        convert = getattr(importlib.import_module(module), function)
        if classifier:  # the options skl2onnx gives a classifier: ZipMap, labels kept or not
            shapes = shape_calculator.calculate_linear_classifier_output_shapes
            options: dict[str, Any] = {"nocl": [True, False], "zipmap": [True, False, "columns"]}
        else:
            shapes = shape_calculator.calculate_linear_regressor_output_shapes
            options = {"split": None} if library == "lightgbm" else {}
        estimator = getattr(sys.modules[library], name)
        update_registered_converter(estimator, alias, shapes, convert, options=options)
