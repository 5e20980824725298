"""Triton python-backend model that runs a Ferry ONNX export with ONNX Runtime (the CPU flavour).

Copied as `<model>/1/model.py` by `ferry export triton --flavour python`; it runs inside Triton's
python stub (its own venv, numpy < 2), never inside Ferry. Inputs are declared
`allow_ragged_batch`, so Triton's dynamic batcher hands `execute` requests of different lengths
together; they are right-padded here into one ONNX Runtime run and cut back out per request.
Only the outputs some request of the batch asked for are fetched, and each request gets back
only its own (Triton lists every output as requested when a client names none).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

INPUTS = ("input_ids", "attention_mask")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = Path(args["model_repository"]) / args["model_version"]
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = int(params.get("intra_op_threads", "1"))
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(folder / params.get("onnx_file", "model.onnx")),
            options,
            providers=["CPUExecutionProvider"],
        )
        self.outputs = [o["name"] for o in config["output"]]
        # Outputs whose first non-batch dim is variable follow the input's sequence axis.
        self.sequence_outputs = {
            o["name"] for o in config["output"] if len(o["dims"]) >= 2 and int(o["dims"][0]) == -1
        }
        self.pad_token_id = int(params.get("pad_token_id", "0"))

    def execute(self, requests: list) -> list:
        arrays = [
            {name: pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in INPUTS}
            for r in requests
        ]
        # Triton checks each tensor against the config, not the two against each other.
        bad = {i for i, a in enumerate(arrays) if a["input_ids"].shape != a["attention_mask"].shape}
        good = [i for i in range(len(arrays)) if i not in bad]
        ran = self._run([arrays[i] for i in good], [requests[i] for i in good]) if good else []
        results = iter(ran)
        error = pb_utils.TritonError(
            "input_ids and attention_mask must have the same shape",
            pb_utils.TritonError.INVALID_ARG,
        )
        return [
            pb_utils.InferenceResponse(error=error) if i in bad else next(results)
            for i in range(len(arrays))
        ]

    def _run(self, arrays: list[dict[str, np.ndarray]], requests: list) -> list:
        rows = [a["input_ids"].shape[0] for a in arrays]
        widths = [a["input_ids"].shape[1] for a in arrays]
        width = max(widths)
        ids = np.full((sum(rows), width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((sum(rows), width), dtype=np.int64)
        start = 0
        for a, n, w in zip(arrays, rows, widths, strict=True):
            ids[start : start + n, :w] = a["input_ids"]
            mask[start : start + n, :w] = a["attention_mask"]
            start += n
        wanted = [set(r.requested_output_names()) for r in requests]
        names = [name for name in self.outputs if any(name in w for w in wanted)]
        values = self.session.run(names, {"input_ids": ids, "attention_mask": mask})
        responses = []
        start = 0
        for n, w, asked in zip(rows, widths, wanted, strict=True):
            tensors = []
            for name, value in zip(names, values, strict=True):
                if name not in asked:
                    continue
                part = value[start : start + n]
                if name in self.sequence_outputs:
                    part = part[:, :w]
                tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(part)))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += n
        return responses
