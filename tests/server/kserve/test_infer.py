"""The KServe v2 JSON and binary codec in-process (server/kserve/infer.py and the route's
decode/encode), on the real default model: what a client sends in each encoding gives the same
numbers, padding never reaches the model, and bad tensors are 400s (Triton's status) naming the
input."""

from __future__ import annotations

import json
import struct

import numpy as np
import orjson
import pytest
import pytest_asyncio
from tokenizers import Tokenizer

from ferry.bench.server_process import DEFAULT_MODEL, DEFAULT_MODEL_DIR, default_model_config
from ferry.server.errors import InvalidInput
from ferry.server.kserve.infer import request_priority
from ferry.server.kserve.tensor_codec import deserialize_bytes
from ferry.server.settings import Settings
from tests.server.inprocess import serving

pytestmark = pytest.mark.unit

# One server for the module: the tests share its loop.
in_module_loop = pytest.mark.asyncio(loop_scope="module")

INFER = f"/v2/models/{DEFAULT_MODEL}/infer"
HIDDEN, EMBEDDING = "last_hidden_state", "sentence_embedding"
TOKENIZER = Tokenizer.from_file(str(DEFAULT_MODEL_DIR / "tokenizer.json"))
TOKENIZER.no_padding()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client():
    settings = Settings(models=[default_model_config()], allow_client_shm=True)
    async with serving(settings) as http:
        yield http


def ids_input(rows: list[list[int]], name: str = "input_ids") -> dict:
    return {"name": name, "shape": [len(rows), len(rows[0])], "datatype": "INT64", "data": rows}


def text_input(texts: list[str]) -> dict:
    return {"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}


def length_prefixed(texts: list[str]) -> bytes:
    return b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)


async def infer(client, inputs: list[dict], **header) -> dict[str, np.ndarray]:
    response = await client.post(INFER, json={"inputs": inputs, **header})
    assert response.status_code == 200, response.text
    return {
        o["name"]: np.asarray(o["data"], dtype=np.float32).reshape(o["shape"])
        for o in response.json()["outputs"]
    }


async def refused(client, body: bytes | dict, headers: dict | None = None) -> str:
    kwargs = {"json": body} if isinstance(body, dict) else {"content": body}
    response = await client.post(INFER, headers=headers, **kwargs)
    assert response.status_code == 400, response.text  # InvalidInput, as on every v2 route
    return response.json()["error"]


@in_module_loop
async def test_right_padding_is_cut_and_given_back_as_zeros(client):
    short, long = TOKENIZER.encode("hello").ids, TOKENIZER.encode("hello there world").ids
    width = len(long)
    padded = short + [0] * (width - len(short))
    mask = [[1] * len(short) + [0] * (width - len(short)), [1] * width]
    both = await infer(client, [ids_input([padded, long]), ids_input(mask, "attention_mask")])
    alone = await infer(client, [ids_input([short])])
    assert both[HIDDEN].shape == (2, width, 384) and both[EMBEDDING].shape == (2, 384)
    # Row 0 ran as its real length: equal to it alone, zeros where the request padded it.
    np.testing.assert_allclose(both[EMBEDDING][0], alone[EMBEDDING][0], atol=1e-5)
    np.testing.assert_allclose(both[HIDDEN][0, : len(short)], alone[HIDDEN][0], atol=1e-5)
    assert not both[HIDDEN][0, len(short) :].any()


@in_module_loop
async def test_text_gives_what_its_token_ids_give(client):
    texts = ["the quick brown fox", "hi"]
    by_text = await infer(client, [text_input(texts)], outputs=[{"name": EMBEDDING}])
    assert set(by_text) == {EMBEDDING}  # only what was asked for
    for row, text in enumerate(texts):
        by_ids = await infer(client, [ids_input([TOKENIZER.encode(text).ids])])
        np.testing.assert_allclose(by_text[EMBEDDING][row], by_ids[EMBEDDING][0], atol=1e-5)


@in_module_loop
async def test_binary_text_and_binary_outputs_carry_the_json_numbers(client):
    texts = ["one text", "and another one"]
    as_json = await infer(client, [text_input(texts)])
    blob = length_prefixed(texts)
    header = {
        "id": "r7",
        "inputs": [
            {
                "name": "text",
                "shape": [2, 1],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(blob)},
            }
        ],
        "outputs": [{"name": EMBEDDING, "parameters": {"binary_data": True}}, {"name": HIDDEN}],
    }
    head = json.dumps(header).encode()
    response = await client.post(
        INFER,
        content=head + blob,
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    assert response.status_code == 200
    length = int(response.headers["inference-header-content-length"])
    meta = json.loads(response.content[:length])
    assert meta["id"] == "r7" and meta["model_name"] == DEFAULT_MODEL
    outputs = {o["name"]: o for o in meta["outputs"]}
    tail = response.content[length:]
    assert outputs[EMBEDDING]["parameters"]["binary_data_size"] == len(tail) == 2 * 384 * 4
    embedding = np.frombuffer(tail, dtype="<f4").reshape(outputs[EMBEDDING]["shape"])
    # The same request in JSON: the same numbers, bit for bit (both are float32 of one run).
    np.testing.assert_allclose(embedding, as_json[EMBEDDING], atol=1e-5)
    hidden = np.asarray(outputs[HIDDEN]["data"], dtype=np.float32).reshape(outputs[HIDDEN]["shape"])
    np.testing.assert_allclose(hidden, as_json[HIDDEN], atol=1e-5)


@in_module_loop
async def test_token_ids_and_embeddings_by_shared_memory(client):
    """The encoder path reads INT64 ids from a region and writes the embedding into another,
    the numbers JSON gives (plain graphs: test_shared_memory.py)."""
    import os

    import tritonclient.utils.shared_memory as shm

    ids = np.array([TOKENIZER.encode("shared memory").ids], dtype=np.int64)
    tag = f"ferry_test_{os.getpid()}_ids"
    regions = [
        shm.create_shared_memory_region(f"{tag}_in", f"/{tag}_in", ids.nbytes),
        shm.create_shared_memory_region(f"{tag}_out", f"/{tag}_out", 384 * 4),
    ]
    try:
        shm.set_shared_memory_region(regions[0], [ids])
        for name, size in (("in", ids.nbytes), ("out", 384 * 4)):
            body = {"key": f"/{tag}_{name}", "byte_size": size}
            response = await client.post(
                f"/v2/systemsharedmemory/region/{name}/register", json=body
            )
            assert response.status_code == 200, response.text
        region = {"shared_memory_region": "in", "shared_memory_byte_size": ids.nbytes}
        output = {"shared_memory_region": "out", "shared_memory_byte_size": 384 * 4}
        request = {
            "inputs": [{**ids_input(ids.tolist()), "parameters": region}],
            "outputs": [{"name": EMBEDDING, "parameters": output}],
        }
        del request["inputs"][0]["data"]
        response = await client.post(INFER, json=request)
        assert response.status_code == 200, response.text
        embedding = shm.get_contents_as_numpy(regions[1], np.float32, [1, 384])
        expected = await infer(client, [ids_input(ids.tolist())])
        np.testing.assert_allclose(embedding, expected[EMBEDDING], atol=1e-5)
    finally:
        await client.post("/v2/systemsharedmemory/unregister")
        for handle in regions:
            shm.destroy_shared_memory_region(handle)


@in_module_loop
async def test_int32_token_ids_are_widened_as_json_and_as_binary(client):
    """The token model's signature takes INT32 ids (tritonclient's examples send them), read
    by the one decoder every model's requests go through."""
    ids = TOKENIZER.encode("hello there").ids
    wide = await infer(client, [ids_input([ids])], outputs=[{"name": EMBEDDING}])
    narrow = await infer(client, [{**ids_input([ids]), "datatype": "INT32"}])
    blob = np.asarray([ids], dtype="<i4").tobytes()
    spec = {"name": "input_ids", "shape": [1, len(ids)], "datatype": "INT32"}
    head = orjson.dumps(
        {
            "inputs": [{**spec, "parameters": {"binary_data_size": len(blob)}}],
            "outputs": [{"name": EMBEDDING}],
        }
    )
    headers = {"Inference-Header-Content-Length": str(len(head))}
    response = await client.post(INFER, content=head + blob, headers=headers)
    assert response.status_code == 200, response.text
    binary = response.json()["outputs"][0]["data"]
    assert np.array_equal(wide[EMBEDDING], narrow[EMBEDDING])
    assert np.array_equal(wide[EMBEDDING][0], np.asarray(binary, dtype=np.float32))


@in_module_loop
async def test_bad_tensors_are_400s_naming_the_input(client):
    truncated = length_prefixed(["abc"])[:-1]
    head = b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",'
    head += b' "parameters": {"binary_data_size": %d}}]}' % len(truncated)
    message = await refused(
        client, head + truncated, {"Inference-Header-Content-Length": str(len(head))}
    )
    assert "text" in message and "past the end" in message
    mask = ids_input([[1, 1]], "attention_mask")
    assert "attention_mask" in await refused(client, {"inputs": [ids_input([[101, 7, 102]]), mask]})
    both = {"inputs": [ids_input([[101, 102]]), text_input(["x"])]}
    assert "either text or input_ids" in await refused(client, both)
    unknown = {"inputs": [text_input(["x"])], "outputs": [{"name": "logits"}]}
    assert "unknown output 'logits'" in await refused(client, unknown)
    floats = {
        "inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]
    }
    assert "datatype FP32 does not match the model's INT64 (or INT32)" in await refused(
        client, floats
    )
    odd = {"inputs": [{**ids_input([[101, 102]]), "datatype": {}}]}  # found by the fuzzer
    assert "datatype {} does not match the model's INT64" in await refused(client, odd)
    misfit = {"inputs": [{**ids_input([[101, 102]]), "shape": [1, 3]}]}
    assert "2 values do not fit shape [1, 3]" in await refused(client, misfit)


@in_module_loop
@pytest.mark.parametrize(
    ("data", "named"),
    [
        ([101, 7592.9, 102], "input_ids[1]: INT64 data must be integers, got a float (7592.9)"),
        ([101, "7592", 102], 'input_ids[1]: INT64 data must be integers, got a string ("7592")'),
        ([101, True, 102], "input_ids[1]: INT64 data must be integers, got a boolean"),
        ([101, -0.5, 102], "input_ids[1]: INT64 data must be integers, got a float (-0.5)"),
        ([101, 2**70, 102], "input_ids[1]: 1180591620717411303424 is outside INT64's range"),
        ([101, 2**63, 102], "input_ids[1]: 9223372036854775808 is outside INT64's range"),
    ],
)
async def test_int64_data_that_is_not_integers_is_refused_naming_the_item(client, data, named):
    tensor = {"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": data}
    assert (await refused(client, {"inputs": [tensor]})).startswith(named)


def test_length_prefixed_bytes_round_trip_and_truncation_is_named():
    texts = ["", "é", "a" * 300]
    assert deserialize_bytes(length_prefixed(texts), "text").tolist() == [t.encode() for t in texts]
    with pytest.raises(InvalidInput, match="inside an element's length prefix") as err:
        deserialize_bytes(b"\x01\x00", "blob")
    assert err.value.field == "blob"


def test_parameters_priority_is_a_32_bit_integer_or_refused_naming_it():
    assert request_priority() == 0  # not sent
    assert request_priority(-10) == -10
    assert request_priority(2**31 - 1) == 2**31 - 1
    assert request_priority(-(2**31)) == -(2**31)
    for bad in (None, True, "1", 1.5, 2**31, -(2**31) - 1):
        with pytest.raises(InvalidInput) as refused:
            request_priority(bad)
        assert refused.value.field == "priority"
