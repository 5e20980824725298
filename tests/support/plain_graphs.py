"""Plain ONNX graphs for the tensor-model tests, built with onnx.helper (and skl2onnx).

- masked_mean: data [N, T] FP32 and mask [N, T] INT64 (one axis name, T) -> the masked mean
  [N] and the masked data [N, T]: padding T changes nothing a row's answer depends on.
- every_type: one input per KServe datatype, x_<type> [N, 2], passed through to y_<type>.
- bfloat16: a BF16 input, squared through FP32, with FP32 and BF16 outputs.
- breast-cancer classifiers from scikit-learn's bundled data (scikit-learn, XGBoost, LightGBM),
  through Ferry's exporter (ZipMap on).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = [helper.make_opsetid("", 17)]

EVERY_TYPE = {
    "BOOL": TensorProto.BOOL,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
}


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=OPSET)
    model.ir_version = 8  # what every onnxruntime since 1.14 reads
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def masked_mean(path: Path, axis: str | None = "T") -> Path:
    """`axis` None: the length axis left unnamed, as an export without dynamic-axis names."""
    nodes = [
        helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["data", "maskf"], ["masked"]),
        helper.make_node("Constant", [], ["axis"], value=helper.make_tensor("a", 7, [1], [1])),
        helper.make_node("ReduceSum", ["masked", "axis"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["maskf", "axis"], ["count"], keepdims=0),
        helper.make_node("Div", ["total", "count"], ["mean"]),
    ]
    graph = helper.make_graph(
        nodes,
        "masked_mean",
        [
            helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", axis]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", axis]),
        ],
        [
            helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["N"]),
            helper.make_tensor_value_info("masked", TensorProto.FLOAT, ["N", axis]),
        ],
    )
    return _save(graph, path)


def every_type(path: Path) -> Path:
    nodes = [helper.make_node("Identity", [f"x_{t}"], [f"y_{t}"]) for t in EVERY_TYPE]
    graph = helper.make_graph(
        nodes,
        "every_type",
        [helper.make_tensor_value_info(f"x_{t}", e, ["N", 2]) for t, e in EVERY_TYPE.items()],
        [helper.make_tensor_value_info(f"y_{t}", e, ["N", 2]) for t, e in EVERY_TYPE.items()],
    )
    return _save(graph, path)


def bfloat16(path: Path) -> Path:
    """x [N, 2] BF16 -> its square, as FP32 (`square`) and as BF16 (`square_bf16`), and `same`,
    x itself: ONNX Runtime's CPU kernels take BF16 in Cast and Identity, not in arithmetic."""
    bf16, fp32 = TensorProto.BFLOAT16, TensorProto.FLOAT
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=fp32),
        helper.make_node("Mul", ["xf", "xf"], ["square"]),
        helper.make_node("Cast", ["square"], ["square_bf16"], to=bf16),
        helper.make_node("Identity", ["x"], ["same"]),
    ]
    outputs = [("square", fp32), ("square_bf16", bf16), ("same", bf16)]
    graph = helper.make_graph(
        nodes,
        "bfloat16",
        [helper.make_tensor_value_info("x", bf16, ["N", 2])],
        [helper.make_tensor_value_info(name, kind, ["N", 2]) for name, kind in outputs],
    )
    return _save(graph, path)


def breast_cancer_estimator(estimator: str):
    """A classifier fitted on scikit-learn's bundled breast-cancer data (569 x 30)."""
    from lightgbm import LGBMClassifier
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from xgboost import XGBClassifier

    model = {
        "gradient_boosting": GradientBoostingClassifier(n_estimators=20, random_state=0),
        "logistic_regression": make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)),
        "xgboost": XGBClassifier(n_estimators=20, max_depth=3, n_jobs=1),
        # In a pipeline: a converted booster composes with scikit-learn's steps.
        "lightgbm": make_pipeline(
            StandardScaler(), LGBMClassifier(n_estimators=20, n_jobs=1, verbose=-1)
        ),
    }[estimator]
    x = breast_cancer_rows()
    return model.fit(x, breast_cancer_labels())


def breast_cancer(path: Path, estimator: str) -> Path:
    """The classifier exported as `ferry export sklearn` does (ZipMap on, skl2onnx's default)."""
    from ferry.exporters.sklearn_export import export

    return export(breast_cancer_estimator(estimator), breast_cancer_rows(), path)


def breast_cancer_labels() -> np.ndarray:
    from sklearn.datasets import load_breast_cancer

    return load_breast_cancer(return_X_y=True)[1]


def iris_by_name(path: Path) -> Path:
    """A classifier whose labels are strings: a BYTES output, and ZipMap keyed by name."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    names = np.array(IRIS_NAMES)[y]
    model = LogisticRegression(max_iter=500).fit(x, names)
    onnx.save(to_onnx(model, x[:1], target_opset=17), path)
    return path


IRIS_NAMES = ("setosa", "versicolor", "virginica")


def colour_classifier(path: Path) -> Path:
    """A string input (so no warm-up on zeros: ZipMap's classes are learned from the first
    answer), one-hot encoded before a logistic regression."""
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    x = np.array([[c] for c in COLOURS * 4], dtype=object)
    y = [int(c == "red") for c in COLOURS * 4]
    model = make_pipeline(OneHotEncoder(), LogisticRegression()).fit(x, y)
    types = [("colour", StringTensorType([None, 1]))]
    onnx.save(to_onnx(model, initial_types=types, target_opset=17), path)
    return path


COLOURS = ["red", "green", "blue"]


def breast_cancer_rows() -> np.ndarray:
    from sklearn.datasets import load_breast_cancer

    return load_breast_cancer(return_X_y=True)[0].astype(np.float32)


def iris_graph() -> Path:
    """onnxruntime's own logistic regression: a fixed first axis [3, 2] and ZipMap."""
    import onnxruntime

    return Path(onnxruntime.__file__).parent / "datasets" / "logreg_iris.onnx"


def tiled(path: Path, times: int = 1000) -> Path:
    """x [N, 4] FP32 -> y [N, 4 * times]: an answer `times` larger than its request."""
    repeats = helper.make_tensor("repeats", TensorProto.INT64, [2], [1, times])
    nodes = [
        helper.make_node("Constant", [], ["r"], value=repeats),
        helper.make_node("Tile", ["x", "r"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4 * times])],
    )
    return _save(graph, path)


LOOKUP_ROWS = 100


def lookup(path: Path) -> Path:
    """i [N, 1] INT64 -> y [N, 1, 2]: rows of a 100-row table; an index past it fails ONNX
    Runtime's Gather, for any batch that holds it (a row that poisons its batch)."""
    table = np.arange(LOOKUP_ROWS * 2, dtype=np.float32).reshape(LOOKUP_ROWS, 2)
    nodes = [helper.make_node("Gather", ["table", "i"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "lookup",
        [helper.make_tensor_value_info("i", TensorProto.INT64, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 2])],
        [onnx.numpy_helper.from_array(table, "table")],
    )
    return _save(graph, path)
