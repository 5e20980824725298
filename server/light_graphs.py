"""Whether an ONNX graph is light: its session's work per row is microseconds and one thread's,
so the event loop, not the model, limits how fast it is served (layout_choice.py gives such
models a replica per core even on a small host).

Light is an allow-list of op types: scikit-learn's and XGBoost's converters' ai.onnx.ml ops
(trees, linear models, encoders of features) and elementwise or shape ops, with no matrix
product, convolution, recurrence or attention, whose ONNX Runtime kernels take every core (on
two cores all-MiniLM served 0.56-0.82x as fast by two replicas as by one; the tabular model
2.06x). An op not listed, a graph that cannot be read, or one past LIGHT_GRAPH_BYTES is not
light. The graph is read with protobuf alone (llm/onnx_subset.py): a runtime install has no
`onnx`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from google.protobuf.message import DecodeError

from ferry.llm.onnx_subset import ModelProto

LIGHT_GRAPH_BYTES = 64 * 2**20
ML_OPS = frozenset(
    {
        "ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer",
        "FeatureVectorizer", "Imputer", "LabelEncoder", "LinearClassifier", "LinearRegressor",
        "Normalizer", "OneHotEncoder", "Scaler", "SVMClassifier", "SVMRegressor", "TreeEnsemble",
        "TreeEnsembleClassifier", "TreeEnsembleRegressor", "ZipMap",
    }
)  # fmt: skip
ELEMENTWISE_OPS = frozenset(
    {
        "Abs", "Add", "And", "ArgMax", "ArgMin", "Cast", "Ceil", "Clip", "Concat", "Constant",
        "ConstantOfShape", "Div", "Equal", "Erf", "Exp", "Expand", "Flatten", "Floor", "Gather",
        "Greater", "GreaterOrEqual", "Identity", "IsNaN", "Less", "LessOrEqual", "Log", "Max",
        "Mean", "Min", "Mul", "Neg", "Not", "Or", "Pow", "Reciprocal", "ReduceMax", "ReduceMean",
        "ReduceMin", "ReduceSum", "Relu", "Reshape", "Round", "Shape", "Sigmoid", "Sign",
        "Slice", "Softmax", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh", "Tile", "TopK",
        "Transpose", "Unsqueeze", "Where", "Xor",
    }
)  # fmt: skip
LIGHT_OPS = ML_OPS | ELEMENTWISE_OPS


def light_ops(op_types: Iterable[str]) -> bool:
    """A graph of these nodes' op types is light (none: not light)."""
    types = list(op_types)
    return bool(types) and all(op in LIGHT_OPS for op in types)


def light_graph(path: Path) -> bool:
    """`path` (an .onnx file, or a folder of them) holds only light graphs."""
    files = sorted(path.rglob("*.onnx")) if path.is_dir() else [path]
    return bool(files) and all(_light_file(f) for f in files)


def _light_file(path: Path) -> bool:
    try:
        if path.stat().st_size > LIGHT_GRAPH_BYTES:
            return False
        model = ModelProto.FromString(path.read_bytes())
    except (OSError, DecodeError):
        return False
    return light_ops(node.op_type for node in model.graph.node)
