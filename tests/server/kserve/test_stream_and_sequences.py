"""gRPC ModelStreamInfer and sequence batching on a real server, with tritonclient as Triton's
users drive them: answers as each request completes, errors in the stream's messages (the
stream goes on), Triton's refusals for requests outside a started sequence (HTTP and gRPC),
concurrent sequences that never mix, and the model config clients read."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

PROTOCOLS = {"http": triton_http, "grpc": triton_grpc}


@pytest.fixture
def served(triton_models):
    """The session's server of Triton's example models (tests/conftest.py)."""
    return triton_models


@pytest.fixture(params=sorted(PROTOCOLS))
def client(request, served):
    module = PROTOCOLS[request.param]
    address = served.grpc_address if request.param == "grpc" else served.http_address
    client = module.InferenceServerClient(address)
    yield module, client
    client.close()


def simple_inputs(module, first: np.ndarray, second: np.ndarray) -> list:
    inputs = []
    for name, value in (("INPUT0", first), ("INPUT1", second)):
        tensor = module.InferInput(name, list(value.shape), "INT32")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def one_value(module, value: int, name: str = "INPUT", rows: int = 1, width: int = 1) -> list:
    tensor = module.InferInput(name, [rows, width], "INT32")
    tensor.set_data_from_numpy(np.full((rows, width), value, dtype=np.int32))
    return [tensor]


def test_a_stream_answers_every_request_and_carries_errors_in_its_messages(served):
    answers: queue.Queue = queue.Queue()
    rows = np.arange(16, dtype=np.int32).reshape(1, 16)
    with triton_grpc.InferenceServerClient(served.grpc_address) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for index in range(6):
            inputs = simple_inputs(triton_grpc, rows * index, rows)
            if index == 2:  # not one of simple's inputs: this request alone fails
                inputs[1] = one_value(triton_grpc, 1, "INPUT9", width=16)[0]
            client.async_stream_infer("simple", inputs, request_id=str(index))
        received = [answers.get(timeout=60) for _ in range(6)]
        # The stream goes on after an error.
        client.async_stream_infer("simple", simple_inputs(triton_grpc, rows, rows), request_id="6")
        received.append(answers.get(timeout=60))
        client.stop_stream()
    errors = [error for _, error in received if error is not None]
    assert len(errors) == 1 and "INPUT9" in str(errors[0])
    results = {r.get_response().id: r for r, error in received if error is None}
    assert sorted(results) == ["0", "1", "3", "4", "5", "6"]
    for request_id, result in results.items():
        index = 1 if request_id == "6" else int(request_id)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), rows * index + rows)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), rows * index - rows)


def sequence_infer(module, client, value: int, model="simple_sequence", **kwargs):
    result = client.infer(model, one_value(module, value), **kwargs)
    return int(result.as_numpy("OUTPUT")[0, 0])


@pytest.mark.parametrize(
    ("model", "rows", "sequence", "message"),
    [
        (
            "simple_sequence",
            1,
            {"sequence_id": 4242},
            "inference request for sequence 4242 to model 'simple_sequence' must specify the "
            "START flag on the first request of the sequence",
        ),
        (
            "simple_sequence",
            1,
            {},
            "inference request to model 'simple_sequence' must specify a non-zero or "
            "non-empty correlation ID",
        ),
        (
            "simple_sequence",
            2,
            {"sequence_id": 4243, "sequence_start": True},
            "must specify batch-size 1 due to requirements of sequence batcher",
        ),
        ("simple", 1, {"sequence_id": 7, "sequence_start": True}, "not a stateful model"),
    ],
)
def test_requests_outside_a_started_sequence_are_refused(client, model, rows, sequence, message):
    module, client = client
    if model == "simple":
        inputs = simple_inputs(module, *[np.ones((rows, 16), dtype=np.int32)] * 2)
    else:
        inputs = one_value(module, 1, rows=rows)
    with pytest.raises(InferenceServerException, match=message) as refused:
        client.infer(model, inputs, **sequence)
    assert refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def test_a_control_input_is_the_servers_to_fill(client):
    module, client = client
    inputs = one_value(module, 1) + one_value(module, 1, "START")
    with pytest.raises(InferenceServerException, match="START"):
        client.infer("simple_sequence", inputs, sequence_id=77, sequence_start=True)


def test_a_sequence_ends_at_its_end_request(client):
    module, client = client
    assert sequence_infer(module, client, 5, sequence_id=88, sequence_start=True) == 6
    assert sequence_infer(module, client, 5, sequence_id=88, sequence_end=True) == 5
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        sequence_infer(module, client, 5, sequence_id=88)


def accumulator_steps(sequence_id: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """(value, expected answer) of each request of one string-dyna sequence: the running sum,
    with the sequence id added at the end."""
    values = rng.integers(-50, 50, size=6).tolist()
    totals = np.cumsum(values).tolist()
    totals[-1] += sequence_id
    return list(zip(values, totals, strict=True))


def test_concurrent_sequences_never_mix(served):
    """16 sequences at once: 8 interleaved on one gRPC stream, 8 over HTTP from threads."""
    rng = np.random.default_rng(3)
    steps = {sid: accumulator_steps(sid, rng) for sid in range(3000, 3016)}
    model = "simple_string_dyna_sequence"

    def flags(sid: int, index: int) -> dict:
        last = len(steps[sid]) - 1
        return {
            "sequence_id": str(sid),
            "sequence_start": index == 0,
            "sequence_end": index == last,
        }

    def over_http(sid: int) -> list[int]:
        with triton_http.InferenceServerClient(served.http_address) as client:
            return [
                sequence_infer(triton_http, client, value, model, **flags(sid, index))
                for index, (value, _) in enumerate(steps[sid])
            ]

    answers: queue.Queue = queue.Queue()
    streamed = list(steps)[:8]
    with ThreadPoolExecutor(8) as pool:
        http_answers = pool.map(over_http, list(steps)[8:])
        with triton_grpc.InferenceServerClient(served.grpc_address) as client:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            for index in range(6):  # each sequence's requests sent without waiting
                for sid in streamed:
                    value = steps[sid][index][0]
                    inputs = one_value(triton_grpc, value)
                    request_id = f"{sid}_{index}"
                    client.async_stream_infer(
                        model, inputs, request_id=request_id, **flags(sid, index)
                    )
            received = [answers.get(timeout=60) for _ in range(6 * len(streamed))]
            client.stop_stream()
        got = dict(zip(list(steps)[8:], http_answers, strict=True))
    assert all(error is None for _, error in received), [e for _, e in received if e]
    for result, _ in received:
        sid, index = map(int, result.get_response().id.split("_"))
        got.setdefault(sid, [0] * 6)[index] = int(result.as_numpy("OUTPUT")[0, 0])
    assert got == {sid: [total for _, total in s] for sid, s in steps.items()}


def test_model_config_and_metadata_show_a_sequence_model(served):
    with triton_http.InferenceServerClient(served.http_address) as client:
        config = client.get_model_config("simple_string_dyna_sequence")
        metadata = client.get_model_metadata("simple_string_dyna_sequence")
    batching = config["sequence_batching"]
    assert "dynamic_batching" not in config
    assert batching["max_sequence_idle_microseconds"] == 10_000_000
    assert batching["oldest"]["max_candidate_sequences"] == 1024
    controls = {c["name"]: c["control"][0] for c in batching["control_input"]}
    assert controls["START"] == {"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}
    assert controls["CORRID"] == {"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_STRING"}
    assert batching["state"] == [
        {
            "input_name": "INPUT_STATE",
            "output_name": "OUTPUT_STATE",
            "data_type": "TYPE_INT32",
            "dims": [1],
        }
    ]
    # Clients see, and send, only the model's own input.
    assert [i["name"] for i in config["input"]] == ["INPUT"]
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT"]
    with triton_grpc.InferenceServerClient(served.grpc_address) as client:
        parsed = client.get_model_config("simple_sequence").config
    assert parsed.sequence_batching.HasField("direct")
    assert [c.name for c in parsed.sequence_batching.control_input] == ["START", "READY"]


def test_stream_requests_of_one_sequence_keep_their_order_under_other_traffic(served):
    """A stream's sequence requests sent back to back while other clients load the model."""
    stop = threading.Event()

    def load(sid: int) -> None:  # one-request sequences
        with triton_http.InferenceServerClient(served.http_address) as client:
            while not stop.is_set():
                flags = {"sequence_start": True, "sequence_end": True}
                sequence_infer(triton_http, client, 1, sequence_id=sid, **flags)

    threads = [threading.Thread(target=load, args=(5000 + n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    try:
        answers: queue.Queue = queue.Queue()
        with triton_grpc.InferenceServerClient(served.grpc_address) as client:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            for index, value in enumerate(range(10, 30)):
                client.async_stream_infer(
                    "simple_sequence",
                    one_value(triton_grpc, value),
                    request_id=str(index),
                    sequence_id=6001,
                    sequence_start=index == 0,
                    sequence_end=index == 19,
                )
            received = [answers.get(timeout=60) for _ in range(20)]
            client.stop_stream()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    outputs = {int(r.get_response().id): int(r.as_numpy("OUTPUT")[0, 0]) for r, _ in received}
    # START is 1 on the first request only: any other order would move the +1.
    assert outputs == {index: value + (index == 0) for index, value in enumerate(range(10, 30))}
