"""Triton's system shared memory extension in-process (server/kserve/shared_memory.py and its
routes): a 602 KB image tensor read from a client's region and the answer written into another,
regions per API key, and every fault of a region a 4xx naming the field, never a crash (a range
past the end, a region unregistered, shrunk or replaced under a request). The same code over
gRPC, with api_servers = 2 and with NVIDIA's own clients: tests/clients/test_triton_shm.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
import tritonclient.utils.shared_memory as shm

from ferry.bench.shm import IMAGE_BYTES, MODEL, image, image_mean, shm_request
from ferry.server.errors import Forbidden, InvalidInput
from ferry.server.kserve.shared_memory import (
    LocalRegions,
    SharedMemory,
    SharedRegions,
    TensorRef,
)
from ferry.server.settings import Settings
from tests.server.inprocess import serving

pytestmark = pytest.mark.unit

in_module_loop = pytest.mark.asyncio(loop_scope="module")
INFER = f"/v2/models/{MODEL}/infer"
ALICE, BOB = {"Authorization": "Bearer alice-key"}, {"Authorization": "Bearer bob-key"}
SYSTEM = "/v2/systemsharedmemory"


def key(name: str) -> str:
    """A key of this test process's own (helpers and CI jobs share /dev/shm)."""
    return f"/ferry_test_{os.getpid()}_{name}"


@pytest.fixture(scope="module")
def regions() -> Iterator[dict]:
    """The client's regions: the image in `in` (and one byte more), room for the answer in
    `out`, and a small one; destroyed (unlinked) at the end."""
    created = {
        "in": shm.create_shared_memory_region("in", key("in"), IMAGE_BYTES + 1),
        "out": shm.create_shared_memory_region("out", key("out"), 64),
    }
    shm.set_shared_memory_region(created["in"], [image()])
    yield created
    for handle in created.values():
        shm.destroy_shared_memory_region(handle)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client(tmp_path_factory, regions):
    path = image_mean(tmp_path_factory.mktemp("shm") / f"{MODEL}.onnx")
    settings = Settings(
        models=[{"name": MODEL, "path": str(path), "backend": {"kind": "onnxruntime"}}],
        api_keys={"alice": "alice-key", "bob": "bob-key"},
        allow_client_shm=True,
    )
    async with serving(settings) as http:
        for name, size in (("in", IMAGE_BYTES + 1), ("out", 64)):
            body = {"key": key(name), "offset": 0, "byte_size": size}
            response = await http.post(f"{SYSTEM}/region/{name}/register", json=body, headers=ALICE)
            assert response.status_code == 200, response.text
        yield http


def header(**changes) -> dict:
    """bench.shm's request (the image in `in`, the answer to `out`), its parameters changed."""
    import json

    body = json.loads(shm_request("in", "out")[0])
    body["inputs"][0]["parameters"].update(changes.pop("input", {}))
    body["outputs"][0]["parameters"].update(changes.pop("output", {}))
    return body


@in_module_loop
async def test_an_image_in_a_region_and_its_answer_written_into_another(client, regions):
    response = await client.post(INFER, json=header(), headers=ALICE)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    # As from Triton: no data, and no parameters (perf_analyzer reads them as binary data's).
    assert output == {"name": "mean", "datatype": "FP32", "shape": [1, 3]}
    answer = shm.get_contents_as_numpy(regions["out"], np.float32, [1, 3])
    np.testing.assert_allclose(answer, image().mean(axis=(2, 3)), rtol=1e-5)


@in_module_loop
async def test_an_offset_into_the_region(client, regions):
    """The image one byte in: the tensor starts at the offset (a region at any alignment)."""
    shifted = shm.create_shared_memory_region("shifted", key("shifted"), IMAGE_BYTES + 1)
    try:
        shm.set_shared_memory_region(shifted, [image(seed=3)], offset=1)
        body = {"key": key("shifted"), "offset": 0, "byte_size": IMAGE_BYTES + 1}
        await client.post(f"{SYSTEM}/region/shifted/register", json=body, headers=ALICE)
        request = header(input={"shared_memory_region": "shifted", "shared_memory_offset": 1})
        response = await client.post(INFER, json=request, headers=ALICE)
        assert response.status_code == 200, response.text
        answer = shm.get_contents_as_numpy(regions["out"], np.float32, [1, 3])
        np.testing.assert_allclose(answer, image(seed=3).mean(axis=(2, 3)), rtol=1e-5)
    finally:
        await client.post(f"{SYSTEM}/region/shifted/unregister", headers=ALICE)
        shm.destroy_shared_memory_region(shifted)


@in_module_loop
async def test_regions_are_per_api_key(client):
    listed = (await client.get(f"{SYSTEM}/status", headers=ALICE)).json()
    assert {r["name"] for r in listed} >= {"in", "out"}
    assert (await client.get(f"{SYSTEM}/status", headers=BOB)).json() == []
    # Bob cannot use, see, or unregister Alice's regions: to him they do not exist.
    response = await client.post(INFER, json=header(), headers=BOB)
    assert response.status_code == 400
    assert "'in' is not registered" in response.json()["error"]
    status = await client.get(f"{SYSTEM}/region/in/status", headers=BOB)
    assert status.status_code == 400
    await client.post(f"{SYSTEM}/unregister", headers=BOB)
    assert len((await client.get(f"{SYSTEM}/status", headers=ALICE)).json()) >= 2
    # ... and may register his own of the same name.
    body = {"key": key("out"), "offset": 0, "byte_size": 16}
    assert (await client.post(f"{SYSTEM}/region/in/register", json=body, headers=BOB)).is_success
    bob = (await client.get(f"{SYSTEM}/region/in/status", headers=BOB)).json()
    assert bob == [{"name": "in", "key": key("out"), "offset": 0, "byte_size": 16}]
    await client.post(f"{SYSTEM}/region/in/unregister", headers=BOB)


BAD_REQUESTS = {
    "range past the region": (
        {"input": {"shared_memory_offset": 2}},
        "runs past the end of region 'in'",
    ),
    "byte size not the tensor's": (
        {"input": {"shared_memory_byte_size": IMAGE_BYTES - 4}},
        f"{IMAGE_BYTES - 4} bytes of binary data",
    ),
    "offset past the end": (
        {"input": {"shared_memory_offset": 10**12}},
        "runs past the end of region 'in'",
    ),
    "negative offset": ({"input": {"shared_memory_offset": -1}}, "a count of bytes"),
    "region without a size": (
        {"input": {"shared_memory_byte_size": None}},
        "go together",
    ),
    "unknown region": ({"input": {"shared_memory_region": "nope"}}, "'nope' is not registered"),
    "output region too small": (
        {"output": {"shared_memory_byte_size": 8}},
        "output takes 12 bytes",
    ),
    "output range past the region": (
        {"output": {"shared_memory_offset": 60}},
        "runs past the end of region 'out'",
    ),
}


@in_module_loop
@pytest.mark.parametrize("changes, message", BAD_REQUESTS.values(), ids=BAD_REQUESTS)
async def test_a_bad_region_is_a_400_naming_the_tensor(client, changes, message):
    body = header(**changes)
    for tensor in (*body["inputs"], *body["outputs"]):
        tensor["parameters"] = {k: v for k, v in tensor["parameters"].items() if v is not None}
    response = await client.post(INFER, json=body, headers=ALICE)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]


@in_module_loop
async def test_data_both_in_the_request_and_in_a_region_is_refused(client):
    body = header()
    body["inputs"][0]["data"] = [0.0] * (IMAGE_BYTES // 4)
    response = await client.post(INFER, json=body, headers=ALICE)
    assert response.status_code == 400
    assert "both in the request and in a shared memory region" in response.json()["error"]


BAD_REGISTRATIONS = {
    "no such object": ({"key": key("absent"), "byte_size": 8}, "unable to open"),
    "past the object's end": ({"key": key("out"), "byte_size": 65}, "runs past the end"),
    "offset past the end": ({"key": key("out"), "offset": 64, "byte_size": 1}, "past the end"),
    "a path, not a key": ({"key": "/../etc/passwd", "byte_size": 8}, "not a shared memory key"),
    "a directory": ({"key": "/", "byte_size": 8}, "not a shared memory key"),
    "size zero": ({"key": key("out"), "byte_size": 0}, "must be a byte count"),
    "size a string": ({"key": key("out"), "byte_size": "8"}, "must be an integer"),
    "no key": ({"byte_size": 8}, "key is required"),
}


@in_module_loop
@pytest.mark.parametrize("body, message", BAD_REGISTRATIONS.values(), ids=BAD_REGISTRATIONS)
async def test_a_bad_registration_is_a_4xx(client, body, message):
    response = await client.post(f"{SYSTEM}/region/bad/register", json=body, headers=ALICE)
    assert 400 <= response.status_code < 500, response.text
    assert message in response.json()["error"]


@in_module_loop
async def test_a_name_registered_twice_is_refused(client):
    body = {"key": key("out"), "offset": 0, "byte_size": 8}
    response = await client.post(f"{SYSTEM}/region/in/register", json=body, headers=ALICE)
    assert response.status_code == 400 and "registered already" in response.json()["error"]


@in_module_loop
async def test_cuda_shared_memory_is_not_supported(client):
    """None is ever registered: listed empty, unregistering a no-op (Triton's examples do both
    first), registering refused with what to use instead."""
    assert (await client.get("/v2/cudasharedmemory/status", headers=ALICE)).json() == []
    assert (await client.post("/v2/cudasharedmemory/unregister", headers=ALICE)).is_success
    body = {"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 8}
    response = await client.post(
        "/v2/cudasharedmemory/region/gpu/register", json=body, headers=ALICE
    )
    assert response.status_code == 400
    assert "CUDA shared memory is not supported" in response.json()["error"]


@in_module_loop
async def test_the_server_lists_the_extension(client):
    extensions = (await client.get("/v2", headers=ALICE)).json()["extensions"]
    assert "system_shared_memory" in extensions


@pytest.mark.asyncio
async def test_off_unless_allowed(tmp_path):
    """As Triton's --allow-client-shm: a client that registers regions reads what the server's
    user can, so it is the operator's choice; refused, and not listed, when off."""
    async with serving(Settings()) as http:
        response = await http.post(
            f"{SYSTEM}/region/r/register", json={"key": key("out"), "byte_size": 8}
        )
        assert response.status_code == 403 and "allow_client_shm" in response.json()["error"]
        assert "system_shared_memory" not in (await http.get("/v2")).json()["extensions"]


# -- the regions themselves: what happens under a request ------------------------------------


@pytest.fixture
def object_of_64(tmp_path: Path) -> Path:
    """A memory object in a directory of the test's own, standing for /dev/shm."""
    path = tmp_path / "obj"
    path.write_bytes(bytes(range(64)))
    return path


def memory(tmp_path: Path, store=None) -> SharedMemory:
    memory = SharedMemory(store or LocalRegions(), enabled=True, shm_dir=tmp_path)
    memory.register("t", "r", {"key": "/obj", "offset": 0, "byte_size": 64})
    return memory


def test_a_region_unregistered_under_a_request_keeps_its_view_and_refuses_the_next(
    tmp_path, object_of_64
):
    regions = memory(tmp_path)
    view = regions.read("t", TensorRef("r", 8, 8), "x")  # a request's input, being read
    regions.unregister("t", "r")
    assert bytes(view) == bytes(range(8, 16))  # still mapped: no crash under the request
    with pytest.raises(InvalidInput, match="'r' is not registered"):
        regions.write("t", TensorRef("r", 0, 8), b"answer", "y")  # its output: a 4xx


def test_an_object_that_shrank_is_refused_before_it_is_read(tmp_path, object_of_64):
    """A page past the object's end would be a SIGBUS, which no handler turns into a 4xx."""
    regions = memory(tmp_path)
    regions.read("t", TensorRef("r", 0, 8), "x")  # mapped
    os.truncate(object_of_64, 16)
    with pytest.raises(InvalidInput, match="shrank to 16 bytes"):
        regions.read("t", TensorRef("r", 0, 8), "x")


def test_an_object_replaced_under_the_same_key_is_refused(tmp_path, object_of_64):
    """By a process that had not mapped it yet (one that had keeps reading the old object, as
    Triton does). The old one is held open here, as its client would: else the file system
    may give the new one its inode number."""
    regions = memory(tmp_path)
    with object_of_64.open("rb"):
        object_of_64.unlink()
        object_of_64.write_bytes(bytes(64))
        with pytest.raises(InvalidInput, match="names another object"):
            regions.read("t", TensorRef("r", 0, 8), "x")


def test_processes_share_registrations_through_the_run_dir(tmp_path, object_of_64):
    """api_servers / replicas: registered through one process, used and unregistered through
    another (two SharedMemory on one directory stand for two processes)."""
    one = memory(tmp_path, SharedRegions(tmp_path / "regions"))
    other = SharedMemory(SharedRegions(tmp_path / "regions"), enabled=True, shm_dir=tmp_path)
    other.write("t", TensorRef("r", 0, 2), b"hi", "y")
    assert bytes(one.read("t", TensorRef("r", 0, 2), "x")) == b"hi"
    assert other.status("t", None) == one.status("t", None) != other.status("u", None)
    with pytest.raises(InvalidInput, match="registered already"):
        other.register("t", "r", {"key": "/obj", "offset": 0, "byte_size": 8})
    other.unregister("t", None)
    with pytest.raises(InvalidInput, match="not registered"):
        one.read("t", TensorRef("r", 0, 2), "x")


def test_off_refuses_every_call(tmp_path):
    regions = SharedMemory(LocalRegions(), enabled=False, shm_dir=tmp_path)
    with pytest.raises(Forbidden):
        regions.status(None, None)
    with pytest.raises(Forbidden):
        regions.read(None, TensorRef("r", 0, 1), "x")
