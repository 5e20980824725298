"""Graphs that break naive batching, built in code (onnx.helper; ONNX Runtime's quantizer): each
answers differently when requests are padded to each other's shapes, stacked along the wrong
axis, or run beside neighbours. Every one is served exactly only if Ferry batches it by its rule.

- identity_fp32 / identity_bytes: Triton's generated identity models: INPUT<i> [batch, var_2i]
  passed through to OUTPUT<i> [batch, var_2i+1], each output axis named apart from its input's.
- detection: an image [batch, 3, height, width] to boxes [batch, anchors, 5], anchors following
  the image's size (a stride-4 convolution's cells).
- segmentation: two 3x3 convolutions with biases: padding shows at every border.
- pooled_audio: frames [batch, time, 8] averaged over time without a mask, then a dense layer.
- gru_seq_first: a GRU over x [time, batch, 8] (ONNX's default layout) to y [time, 1, batch, 6].
- int8_mlp: a dense layer through quantize_dynamic: one int8 scale for the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]
RNG = np.random.default_rng(48)
FLOAT = TensorProto.FLOAT


def _weights(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.normal(0, 0.5, shape).astype(np.float32), name)


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=OPSET)
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def identity(path: Path, kind: int = FLOAT) -> Path:
    """As Triton's qa/common/gen_qa_identity_models.py writes them: the batch axis unnamed (None),
    each variable axis named apart (`var_<n>`), outputs too."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]) for i in range(2)],
        "identity",
        [
            helper.make_tensor_value_info(f"INPUT{i}", kind, [None, f"var_{2 * i}"])
            for i in range(2)
        ],
        [
            helper.make_tensor_value_info(f"OUTPUT{i}", kind, [None, f"var_{2 * i + 1}"])
            for i in range(2)
        ],
    )
    return _save(graph, path)


def detection(path: Path) -> Path:
    nodes = [
        helper.make_node(
            "Conv", ["image", "w", "b"], ["cells"], kernel_shape=[4, 4], strides=[4, 4]
        ),
        helper.make_node(
            "Constant", [], ["flat"], value=helper.make_tensor("f", 7, [3], [0, 5, -1])
        ),
        helper.make_node("Reshape", ["cells", "flat"], ["grid"]),
        helper.make_node("Transpose", ["grid"], ["boxes"], perm=[0, 2, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "detection",
        [helper.make_tensor_value_info("image", FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("boxes", FLOAT, ["batch", "anchors", 5])],
        [_weights("w", 5, 3, 4, 4), _weights("b", 5)],
    )
    return _save(graph, path)


def segmentation(path: Path) -> Path:
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["h"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Conv", ["r", "w2", "b2"], ["classes"], kernel_shape=[3, 3], pads=[1] * 4),
    ]
    graph = helper.make_graph(
        nodes,
        "segmentation",
        [helper.make_tensor_value_info("image", FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("classes", FLOAT, ["batch", 2, "height", "width"])],
        [
            _weights("w1", 4, 3, 3, 3),
            _weights("b1", 4),
            _weights("w2", 2, 4, 3, 3),
            _weights("b2", 2),
        ],
    )
    return _save(graph, path)


def pooled_audio(path: Path) -> Path:
    nodes = [
        helper.make_node("ReduceMean", ["frames"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "w"], ["embedding"]),
    ]
    graph = helper.make_graph(
        nodes,
        "pooled_audio",
        [helper.make_tensor_value_info("frames", FLOAT, ["batch", "time", 8])],
        [helper.make_tensor_value_info("embedding", FLOAT, ["batch", 4])],
        [_weights("w", 8, 4)],
    )
    return _save(graph, path)


def gru_seq_first(path: Path) -> Path:
    hidden = 6
    nodes = [helper.make_node("GRU", ["x", "W", "R", "B"], ["y"], hidden_size=hidden)]
    graph = helper.make_graph(
        nodes,
        "gru",
        [helper.make_tensor_value_info("x", FLOAT, ["time", "batch", 8])],
        # Every first axis dynamic: Triton's rule alone would stack requests along time.
        [helper.make_tensor_value_info("y", FLOAT, ["time", 1, "batch", hidden])],
        [
            _weights("W", 1, 3 * hidden, 8),
            _weights("R", 1, 3 * hidden, hidden),
            _weights("B", 1, 6 * hidden),
        ],
    )
    return _save(graph, path)


def int8_mlp(path: Path) -> Path:
    from onnxruntime.quantization import quantize_dynamic

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("logits", FLOAT, ["batch", 4])],
        [_weights("w1", 16, 32), _weights("w2", 32, 4)],
    )
    float_path = _save(graph, path.with_suffix(".float.onnx"))
    quantize_dynamic(float_path, path)
    return path


# name -> (builder, a request's feeds by a random draw of its shape)
Feeds = Callable[[np.random.Generator], dict[str, np.ndarray]]


def _image(rng: np.random.Generator, sizes: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    height, width = sizes[int(rng.integers(len(sizes)))]
    rows = int(rng.integers(1, 3))
    return {"image": rng.normal(size=(rows, 3, height, width)).astype(np.float32)}


def _identity(rng: np.random.Generator, strings: bool) -> dict[str, np.ndarray]:
    feeds = {}
    rows = int(rng.integers(1, 3))
    for name in ("INPUT0", "INPUT1"):
        shape = (rows, int(rng.choice([3, 8])))
        if strings:
            words = [f"w{rng.integers(1000)}" for _ in range(shape[0] * shape[1])]
            feeds[name] = np.array(words, object).reshape(shape)
        else:
            feeds[name] = rng.normal(size=shape).astype(np.float32)
    return feeds


CORPUS: dict[str, tuple[Callable[[Path], Path], Feeds]] = {
    "identity_fp32": (identity, lambda rng: _identity(rng, False)),
    "identity_bytes": (
        lambda path: identity(path, TensorProto.STRING),
        lambda rng: _identity(rng, True),
    ),
    "detection": (detection, lambda rng: _image(rng, [(32, 48), (40, 40)])),
    "segmentation": (segmentation, lambda rng: _image(rng, [(12, 16), (16, 12), (16, 16)])),
    "pooled_audio": (
        pooled_audio,
        lambda rng: {
            "frames": rng.normal(size=(int(rng.integers(1, 3)), int(rng.choice([5, 9])), 8)).astype(
                np.float32
            )
        },
    ),
    "gru_seq_first": (
        gru_seq_first,
        lambda rng: {
            "x": rng.normal(size=(int(rng.choice([5, 40])), int(rng.integers(1, 3)), 8)).astype(
                np.float32
            )
        },
    ),
    # The same GRU, served with batch_axis = 1 declared: batched along it.
    "gru_batch_axis": (
        gru_seq_first,
        lambda rng: {
            "x": rng.normal(size=(int(rng.choice([5, 40])), int(rng.integers(1, 3)), 8)).astype(
                np.float32
            )
        },
    ),
    "int8_mlp": (
        int8_mlp,
        lambda rng: {"x": rng.normal(size=(int(rng.integers(1, 4)), 16)).astype(np.float32)},
    ),
}


def build_corpus(folder: Path) -> dict[str, Path]:
    return {name: build(folder / f"{name}.onnx") for name, (build, _) in CORPUS.items()}
