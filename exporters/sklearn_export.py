"""`ferry export sklearn`: a fitted scikit-learn estimator to ONNX (skl2onnx), with a parity report.

XGBoost and LightGBM models, alone or at the end of a scikit-learn pipeline, convert through
onnxmltools' converters registered with skl2onnx: their graphs have scikit-learn's outputs
(`output_label`, ZipMap `output_probability`) and serve the same way.

The estimator comes from a joblib or pickle file (your own: loading one runs its code), sample
rows from a .npy or .csv file: they fix the inputs' widths and types and are the rows the parity
report runs. Numeric rows are one float input [N, width]; a .csv with text columns (a pipeline
whose ColumnTransformer one-hot encodes them) is one input per column, [N, 1] float or string,
named by the header (else the estimator's `feature_names_in_`, else column_0, ...). A classifier
keeps skl2onnx's ZipMap output, which Ferry serves as {class: probability} on /predict and as an
[N, C] tensor on KServe. An estimator skl2onnx has no converter for is refused by name
(`Unconvertible`).
"""

from __future__ import annotations

import csv
import importlib
import re
import sys
from collections.abc import Sequence
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


@dataclass(frozen=True)
class Columns:
    """Sample rows with text columns: one [N, 1] array per column, float64 or str (object)."""

    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def feeds(self) -> dict[str, np.ndarray]:
        """The graph's inputs: float32 and strings."""
        return {
            name: column if column.dtype == object else column.astype(np.float32)
            for name, column in self.columns.items()
        }

    def frame(self, estimator: Any) -> Any:
        """What the estimator was fitted on: a data frame if it knows its columns' names (pandas
        is then installed), else an object array."""
        if hasattr(estimator, "feature_names_in_"):
            import pandas as pd

            return pd.DataFrame({name: column[:, 0] for name, column in self.columns.items()})
        return np.concatenate([c.astype(object) for c in self.columns.values()], axis=1)


Rows = np.ndarray | Columns


class Unconvertible(ValueError):
    """skl2onnx cannot convert the estimator (or a step of its pipeline)."""


def load_rows(path: Path, names: Sequence[str] = ()) -> Rows:
    """Sample rows: a .npy array or an all-numeric .csv as float32 (a header line is skipped),
    a .csv with text columns as `Columns`, named by its header, else `names` (the estimator's
    `feature_names_in_`) when as many, else column_0, column_1, ..."""
    if path.suffix == ".npy":
        rows = np.load(path)
    else:
        table = [row for row in csv.reader(path.read_text().splitlines()) if row]
        header = _has_header(table, names)
        body = table[1:] if header else table
        if not body or any(len(row) != len(body[0]) for row in body):
            raise ValueError(f"{path}: sample rows must be a non-empty table of equal rows")
        numeric = [all(_is_number(row[i]) for row in body) for i in range(len(body[0]))]
        if not all(numeric):
            if header:
                names = table[0]
            elif len(names) != len(body[0]):
                names = [f"column_{i}" for i in range(len(body[0]))]
            return Columns(
                {
                    name: np.array(
                        [[float(row[i]) if number else row[i]] for row in body],
                        dtype=np.float64 if number else object,
                    )
                    for i, (name, number) in enumerate(zip(map(str, names), numeric, strict=True))
                }
            )
        rows = np.array([[float(cell) for cell in row] for row in body])
    if rows.ndim != 2 or not len(rows):
        raise ValueError(f"{path}: sample rows must be a non-empty 2-D table, got {rows.shape}")
    return rows.astype(np.float32)


def _has_header(table: list[list[str]], names: Sequence[str]) -> bool:
    """A first line of column names: the estimator's own, or text over a numeric column, or
    (text columns only) what csv.Sniffer takes for one."""
    if not table:
        return False
    first, rest = table[0], table[1:]
    if list(first) == list(names):
        return True
    for i, cell in enumerate(first):
        if not _is_number(cell) and rest and all(_is_number(r[i]) for r in rest if i < len(r)):
            return True
    if all(_is_number(cell) for cell in first):
        return False
    sample = "\n".join(",".join(row) for row in table[:20])
    return csv.Sniffer().has_header(sample)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def export(estimator: Any, rows: Rows, out: Path) -> Path:
    from skl2onnx import to_onnx

    _register_boosters()
    try:
        if isinstance(rows, Columns):
            graph = to_onnx(estimator, initial_types=_column_types(rows), target_opset=OPSET)
        else:
            graph = to_onnx(estimator, rows[:1], target_opset=OPSET)
    except Exception as exc:  # whatever skl2onnx raises: one line naming what it could not do
        raise Unconvertible(_unconvertible(estimator, exc)) from exc
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(graph.SerializeToString())
    return out


def _column_types(rows: Columns) -> list[tuple[str, Any]]:
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType

    return [
        (name, StringTensorType([None, 1]) if c.dtype == object else FloatTensorType([None, 1]))
        for name, c in rows.columns.items()
    ]


def _unconvertible(estimator: Any, exc: Exception) -> str:
    """skl2onnx's "Unable to find a shape calculator for type '<class 'a.B'>'" (a paragraph) as
    one line naming the estimator; any other failure by its first line."""
    kind = type(estimator)
    named = re.search(r"<class '([\w.]+)'>", str(exc))
    name = named.group(1) if named else f"{kind.__module__}.{kind.__qualname__}"
    if type(exc).__name__ in ("MissingShapeCalculator", "MissingConverter"):
        reason = "skl2onnx has no converter for it"
    else:
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return f"cannot convert {name.rsplit('.', 1)[-1]} ({name}) to ONNX: {reason}"


def parity(estimator: Any, graph: Path, rows: Rows, tolerance: float) -> Parity:
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    if isinstance(rows, Columns):
        feeds, given = rows.feeds(), rows.frame(estimator)
    else:
        (name,) = [i.name for i in session.get_inputs()]
        feeds, given = {name: rows}, rows
    outputs = session.run(None, feeds)
    if hasattr(estimator, "predict_proba"):
        label, probabilities = outputs[0], outputs[1]
        if isinstance(probabilities, list):  # ZipMap: one {class: p} per row
            probabilities = np.array([list(row.values()) for row in probabilities])
        diff = np.abs(probabilities - estimator.predict_proba(given)).max()
        agree = int((np.asarray(label) == estimator.predict(given)).sum())
        return Parity(len(rows), "predict_proba", float(diff), agree, tolerance)
    predicted = np.asarray(outputs[0]).reshape(len(rows), -1)
    diff = np.abs(predicted - estimator.predict(given).reshape(len(rows), -1)).max()
    return Parity(len(rows), "predict", float(diff), None, tolerance)


# The boosted models onnxmltools converts: (library, class, skl2onnx's alias, classifier?).
BOOSTERS = [
    ("xgboost", "XGBClassifier", "XGBoostXGBClassifier", True),
    ("xgboost", "XGBRegressor", "XGBoostXGBRegressor", False),
    ("lightgbm", "LGBMClassifier", "LightGbmLGBMClassifier", True),
    ("lightgbm", "LGBMRegressor", "LightGbmLGBMRegressor", False),
    ("lightgbm", "LGBMRanker", "LightGbmLGBMRanker", False),  # its scores, as a regressor's
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
