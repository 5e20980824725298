"""The direct lane (server/direct_lane.py): a KServe v2 request it serves is answered byte for
byte as the gateway answers it, and only what it may serve takes it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn

from ferry.bench.processes import free_port
from ferry.bench.server_process import FerryProcess, ferry_server
from ferry.server.app import create_app
from ferry.server.connection_limits import ConnectionLimits, protocol_class
from ferry.server.direct_lane import DirectLane, direct_lane
from ferry.server.kserve import turn_groups
from ferry.server.kserve.lookup import find_model
from ferry.server.services import app_services
from ferry.server.settings import Settings
from tests.server.inprocess import serving_app
from tests.support import plain_graphs
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

ROWS = plain_graphs.breast_cancer_rows()
GB = "/v2/models/gb/infer"
JSON = {"content-type": "application/json"}


def tensor(rows: np.ndarray, name: str = "X", datatype: str = "FP32") -> dict[str, Any]:
    return {"name": name, "shape": list(rows.shape), "datatype": datatype, "data": rows.tolist()}


def flat(rows: np.ndarray) -> dict[str, Any]:
    """A tensor's JSON with its data flat, as tritonclient sends it."""
    return {**tensor(rows), "data": rows.ravel().tolist()}


def body(*inputs: dict[str, Any], **more: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **more}).encode()


BINARY, TOP_2 = {"binary_data": True}, {"classification": 2}


def binary(rows: np.ndarray, content_type: str | None, extra: int = 0) -> tuple[bytes, dict]:
    """Triton's binary tensor extension, as tritonclient.http sends it: a JSON header, then
    the raw rows; the header's length in a header of its own (`extra` off by that much)."""
    raw = rows.astype(np.float32).tobytes()
    spec = {"name": "X", "shape": list(rows.shape), "datatype": "FP32"}
    header = body({**spec, "parameters": {"binary_data_size": len(raw)}})
    headers = {"inference-header-content-length": str(len(header) + extra)}
    if content_type is not None:
        headers["content-type"] = content_type
    return header + raw, headers


OCTETS = binary(ROWS[:3], "application/octet-stream")
UNTYPED_BINARY = binary(ROWS[:1], None)
BAD_LENGTH = binary(ROWS[:1], "application/octet-stream", extra=9)
BIG = body(tensor(np.repeat(ROWS, 20, axis=0)))  # over the lane's 256 KiB
# (path, body, headers): every answer compared whole, status, headers and body.
CASES: dict[str, tuple[str, bytes, dict[str, str]]] = {
    "one row": (GB, body(tensor(ROWS[:1])), JSON),
    "untyped": (GB, body(tensor(ROWS[:1])), {}),
    "json with a charset": (
        GB,
        body(tensor(ROWS[:1])),
        {"content-type": "application/json; charset=utf-8"},
    ),
    "rows in chunks": ("/v2/models/gb_chunked/infer", body(tensor(ROWS[:7])), JSON),
    "versioned": ("/v2/models/gb/versions/1/infer", body(tensor(ROWS[:2])), JSON),
    "an id and outputs": (
        GB,
        body(tensor(ROWS[:2]), id="r1", outputs=[{"name": "probabilities"}]),
        {**JSON, "x-request-id": "mine-1"},
    ),
    "binary output": (
        GB,
        body(
            tensor(ROWS[:1]),
            outputs=[{"name": "probabilities", "parameters": {"binary_data": True}}],
        ),
        JSON,
    ),
    "top-k classes": (
        "/v2/models/lr/infer",
        body(
            tensor(ROWS[:2]),
            outputs=[{"name": "output_probability", "parameters": {"classification": 2}}],
        ),
        JSON,
    ),
    "a priority": (GB, body(tensor(ROWS[:1]), parameters={"priority": 5}), JSON),
    "a sequence id": (GB, body(tensor(ROWS[:1]), parameters={"sequence_id": 7}), JSON),
    "a bad priority": (GB, body(tensor(ROWS[:1]), parameters={"priority": "high"}), JSON),
    "wrong width": (GB, body(tensor(ROWS[:1, :3])), JSON),
    "wrong datatype": (GB, body(tensor(ROWS[:1], datatype="INT64")), JSON),
    "unknown input": (GB, body(tensor(ROWS[:1]), tensor(ROWS[:1], name="Y")), JSON),
    "unknown output": (GB, body(tensor(ROWS[:1]), outputs=[{"name": "nope"}]), JSON),
    "unknown key": (GB, body(tensor(ROWS[:1]), extra=1), JSON),
    "not json": (GB, b"{not json", JSON),
    "empty body": (GB, b"", JSON),
    "unknown model": ("/v2/models/nope/infer", body(tensor(ROWS[:1])), JSON),
    "unknown version": ("/v2/models/gb/versions/9/infer", body(tensor(ROWS[:1])), JSON),
    "a text body": (GB, body(tensor(ROWS[:1])), {"content-type": "text/plain"}),
    "gzip body": (GB, gzip.compress(body(tensor(ROWS[:1]))), {**JSON, "content-encoding": "gzip"}),
    "gzip answer": (GB, body(tensor(ROWS[:1])), {**JSON, "accept-encoding": "gzip"}),
    "a query string": (GB + "?x=1", body(tensor(ROWS[:1])), JSON),
    "over the lane's size": (GB, BIG, JSON),
    "binary tensors": (GB, *OCTETS),
    "binary tensors, untyped": (GB, *UNTYPED_BINARY),
    "binary tensors, a wrong header length": (GB, *BAD_LENGTH),
    "octets without the header": (GB, OCTETS[0], {"content-type": "application/octet-stream"}),
}


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("graphs")
    return {
        "gb": plain_graphs.breast_cancer(folder / "gb.onnx", "gradient_boosting"),
        "lr": plain_graphs.breast_cancer(folder / "lr.onnx", "logistic_regression"),
    }


def models(graphs: dict[str, Path]) -> list[dict[str, Any]]:
    return [
        {"name": "gb", "path": str(graphs["gb"])},
        {"name": "gb_chunked", "path": str(graphs["gb"]), "batching": {"max_batch_size": 3}},
        {"name": "lr", "path": str(graphs["lr"]), "outputs": ["output_probability"]},
    ]


@pytest.fixture(scope="module")
def servers(graphs) -> Iterator[dict[bool, FerryProcess]]:
    """The same models with the lane on and off."""
    with (
        ferry_server(models(graphs)) as on,
        ferry_server(models(graphs), {"direct_lane": False}) as off,
    ):
        yield {True: on, False: off}


def answer(server: FerryProcess, path: str, content: bytes, headers: dict[str, str]) -> tuple:
    # httpx asks for compressed answers unless told not to: the lane leaves those to the gateway.
    sent = {"accept-encoding": "identity", **headers}
    reply = httpx.post(server.url + path, content=content, headers=sent, timeout=60)
    kept = {k: v for k, v in reply.headers.items() if k != "date"}
    if "x-request-id" not in headers:
        assert len(kept.pop("x-request-id")) == 32
    return reply.status_code, kept, reply.content


@pytest.mark.parametrize("case", CASES)
def test_every_answer_is_the_gateways(servers, case):
    path, content, headers = CASES[case]
    assert answer(servers[True], path, content, headers) == answer(
        servers[False], path, content, headers
    )


def test_the_requests_are_counted_as_the_gateway_counts_them(servers):
    for server in servers.values():
        for path, content, headers in CASES.values():
            answer(server, path, content, headers)
    counted = {on: infer_series(httpx.get(s.url + "/metrics").text) for on, s in servers.items()}
    assert counted[True] == counted[False]
    assert {dict(labels).get("status") for labels in counted[True]} >= {"200", "400", "404"}


def infer_series(text: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every inference route's request counts and durations' counts, by their labels."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            wanted = ("ferry_requests_total", "ferry_request_duration_seconds_count")
            if sample.name in wanted and "infer" in sample.labels.get("endpoint", ""):
                found[(("name", sample.name), *sorted(sample.labels.items()))] = sample.value
    return found


# -- which requests take it (the real app and protocol in this process, on a socket) --------


LIMITS = ConnectionLimits(
    max_connections=64, header_timeout_s=5, body_timeout_s=5, max_header_bytes=16384, max_headers=50
)


@contextlib.asynccontextmanager
async def served(
    settings: Settings, taken: list[bytes], stopping: list[uvicorn.Server] | None = None
) -> AsyncIterator[str]:
    """The app behind Ferry's protocol and lane; `taken` gets each request body the lane took,
    `stopping` the server (to stop it from the test)."""
    app = create_app(settings)
    lane = direct_lane(app_services(app), app.hot)
    assert lane is not None
    start = lane.start

    def counted(taken_head, headers, content, connection):  # type: ignore[no-untyped-def]
        cycle = start(taken_head, headers, content, connection)
        if cycle is not None:
            taken.append(content)
        return cycle

    lane.start = counted  # type: ignore[method-assign]
    port = free_port()
    config = uvicorn.Config(
        app, port=port, log_config=None, http=protocol_class(LIMITS, direct_lane=lane)
    )
    server = uvicorn.Server(config)
    if stopping is not None:
        stopping.append(server)
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving


# What the gateway serves: it acts on their headers, URL, size or parameters.
GATEWAYS = (
    "gzip body",
    "gzip answer",
    "a query string",
    "over the lane's size",
    "a sequence id",
    "a text body",
)


async def test_a_plain_request_takes_the_lane_and_the_rest_do_not(graphs):
    taken: list[bytes] = []
    async with (
        served(Settings(models=models(graphs)), taken) as url,
        httpx.AsyncClient(base_url=url, headers={"accept-encoding": "identity"}) as http,
    ):
        plain = body(tensor(ROWS[:1]))
        reply = await http.post(GB, content=plain, headers=JSON)
        assert reply.status_code == 200 and taken == [plain]
        reply = await http.post(GB, content=OCTETS[0], headers=OCTETS[1])
        assert reply.status_code == 200 and taken == [plain, OCTETS[0]]
        for case in GATEWAYS:
            path, content, headers = CASES[case]
            await http.post(path, content=content, headers=headers)
        assert taken == [plain, OCTETS[0]]
        # Concurrent requests on many connections: every one answered, every one by the lane.
        rows = [body(tensor(ROWS[i : i + 1])) for i in range(40)]
        replies = await asyncio.gather(*(http.post(GB, content=r, headers=JSON) for r in rows))
        assert {r.status_code for r in replies} == {200}
        assert sorted(taken) == sorted([plain, OCTETS[0], *rows])


@pytest.mark.parametrize(
    "options",
    [
        {"api_key": "k"},
        {"otlp_traces_endpoint": "http://127.0.0.1:9/v1/traces"},
        {"direct_lane": False},
    ],
    ids=["api key", "tracing", "off"],
)
def test_no_lane_where_the_gateway_has_more_to_do(graphs, options):
    app = create_app(Settings(models=models(graphs), **options))
    assert direct_lane(app_services(app), app.hot) is None
    app = create_app(Settings(models=models(graphs)))
    assert isinstance(direct_lane(app_services(app), app.hot), DirectLane)


def raw_post(path: str, content: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: ferry\r\ncontent-type: application/json\r\n"
    return head.encode() + b"content-length: %d\r\n\r\n" % len(content) + content


async def test_a_request_behind_the_lanes_is_answered_after_it(graphs):
    taken: list[bytes] = []
    slow = {"dispatch_when_idle": False, "max_queue_delay_s": 0.3}  # the lane's answer waits
    config = [{**m, "batching": {**m.get("batching", {}), **slow}} for m in models(graphs)]
    async with served(Settings(models=config), taken) as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        plain = body(tensor(ROWS[:1]))
        writer.write(raw_post(GB, plain) + b"GET /v2/models/gb HTTP/1.1\r\nhost: ferry\r\n\r\n")
        await writer.drain()
        first = await reader.readuntil(b"\r\n\r\n")
        length = int(first.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        answer_body = await reader.readexactly(length)
        second = await reader.readuntil(b"\r\n\r\n")
        length = int(second.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        metadata = json.loads(await reader.readexactly(length))
        writer.close()
        assert taken == [plain]
        assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")
        assert json.loads(answer_body)["outputs"][0]["data"]  # the answer, then the metadata
        assert metadata["name"] == "gb" and "platform" in metadata


async def test_a_client_that_leaves_has_its_rows_dropped_and_is_counted(graphs):
    taken: list[bytes] = []
    slow = {"dispatch_when_idle": False, "max_queue_delay_s": 10.0}
    config = [{**m, "batching": {**m.get("batching", {}), **slow}} for m in models(graphs)]
    async with (
        served(Settings(models=config), taken) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        _, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        writer.write(raw_post(GB, body(tensor(ROWS[:1]))))
        await writer.drain()
        while not taken:
            await asyncio.sleep(0.01)
        depth = {"model": "gb"}
        metrics = (await http.get("/metrics")).text
        assert metric_value(metrics, "ferry_queue_depth", **depth) == 1
        writer.close()
        gone = {"model": "gb", "status": "499", "endpoint": "/v2/models/{name}/infer"}
        waited_until = time.monotonic() + 3  # well before the batch's delay is up
        while time.monotonic() < waited_until:
            metrics = (await http.get("/metrics")).text
            if metric_value(metrics, "ferry_queue_depth", **depth) == 0:
                break
            await asyncio.sleep(0.02)
        assert metric_value(metrics, "ferry_requests_total", **gone) == 1
        assert metric_value(metrics, "ferry_queue_depth", **depth) == 0
        assert metric_value(metrics, "ferry_in_flight_requests", endpoint="/v2") == 0


async def test_an_answer_during_shutdown_closes_its_connection(graphs):
    taken: list[bytes] = []
    servers: list[uvicorn.Server] = []
    slow = {"dispatch_when_idle": False, "max_queue_delay_s": 0.5}
    config = [{**m, "batching": {**m.get("batching", {}), **slow}} for m in models(graphs)]
    async with served(Settings(models=config), taken, servers) as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        writer.write(raw_post(GB, body(tensor(ROWS[:1]))))
        await writer.drain()
        while not taken:
            await asyncio.sleep(0.01)
        servers[0].should_exit = True  # uvicorn's shutdown: the connection is told to close
        # The answer, then the close: before the keep-alive timeout (5 s) would close it.
        answered = await asyncio.wait_for(reader.read(-1), 4)
        writer.close()
        head, _, content = answered.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"\r\nconnection: close" in head
        assert json.loads(content)["outputs"][0]["data"]


# -- a connection's repeated head, not parsed again (server/repeated_heads.py) -------------


async def test_a_repeated_head_is_served_as_if_parsed(graphs, servers):
    read = {"takes": 0, "retakes": 0}
    takes, retakes = DirectLane.takes, DirectLane.retakes

    def counted(name, real):  # type: ignore[no-untyped-def]
        def call(*args):  # type: ignore[no-untyped-def]
            read[name] += 1
            return real(*args)

        return call

    # (body, headers): the head repeats but for the length, then another head, then it again.
    sent = [(body(tensor(ROWS[i : i + 1 + i % 2])), JSON) for i in range(4)]
    sent += [(body(tensor(ROWS[i : i + 1])), {**JSON, "x-request-id": f"r{i}"}) for i in (0, 0)]
    sent.append((body(tensor(ROWS[:1, :3])), JSON))  # a bad request, then a good one
    sent.append(sent[0])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DirectLane, "takes", counted("takes", takes))
        patch.setattr(DirectLane, "retakes", counted("retakes", retakes))
        async with served(Settings(models=models(graphs)), []) as url:
            reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
            replies = []
            for content, headers in sent:
                lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
                head = f"POST {GB} HTTP/1.1\r\nhost: ferry\r\n{lines}"
                writer.write(head.encode() + b"content-length: %d\r\n\r\n" % len(content) + content)
                replies.append(await next_answer(reader))
            writer.close()
    assert read == {"takes": 3, "retakes": 5}  # parsed: the first, the one with an id, the next
    ids = [reply[1].pop("x-request-id") for reply in replies]
    assert ids[4:6] == ["r0", "r0"]
    made = ids[:4] + ids[6:]
    assert len(set(made)) == len(made) and {len(i) for i in made} == {32}
    for reply, (content, headers) in zip(replies, sent, strict=True):
        expected = answer(servers[False], GB, content, headers)
        expected[1].pop("x-request-id", None)
        assert reply == expected


async def test_a_repeated_head_takes_the_lane_while_a_head_would(graphs):
    app = create_app(Settings(models=models(graphs)))
    lane = direct_lane(app_services(app), app.hot)
    assert lane is not None
    heads = [
        (b"", [(b"content-type", b"application/json")]),
        (b"mine", [(b"x-request-id", b"mine")]),
        (b"", [(b"x-request-id", b"not one to log\x01")]),  # each answer gets an id of its own
    ]
    for request_id, headers in heads:
        taken = lane.takes(b"POST", GB.encode(), headers)
        assert taken is not None and taken.request_id == request_id
        assert lane.retakes(taken) is taken
    app_services(app).drain.begin()
    assert lane.retakes(taken) is None and lane.takes(b"POST", GB.encode(), []) is None


async def test_a_body_of_a_known_form_is_read_as_if_whole(graphs, servers):
    whole: list[bytes] = []
    read_whole = turn_groups._read_whole

    def counted(plan, model, content):  # type: ignore[no-untyped-def]
        whole.append(content)
        return read_whole(plan, model, content)

    one = tensor(ROWS[:1])
    sent = [body(flat(ROWS[i : i + 1])) for i in range(4)]  # one form, other numbers
    sent += [
        body({**one, "data": [True, *ROWS[0, 1:].tolist()]}),  # a boolean among them
        body({**one, "data": ROWS[0, 1:].tolist()}),  # fewer than the shape says
        body({**one, "data": [*ROWS[0, 1:].tolist(), "1"]}),  # a string
        body(flat(ROWS[:1]), id="x"),  # another form
        body(flat(ROWS[1:2]), id="x"),
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(turn_groups, "_read_whole", counted)
        async with served(Settings(models=models(graphs)), []) as url:
            reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
            replies = []
            for content in sent:
                writer.write(raw_post(GB, content))
                replies.append(await next_answer(reader))
            writer.close()
    assert whole == [sent[0], sent[7]]
    for reply, content in zip(replies, sent, strict=True):
        reply[1].pop("x-request-id")
        expected = answer(servers[False], GB, content, JSON)
        assert reply == expected
    assert [reply[0] for reply in replies] == [200] * 4 + [400] * 3 + [200] * 2


# -- a loop turn's plain requests, queued as one group (server/kserve/turn_groups.py) -------


def burst(count: int) -> list[tuple[bytes, dict[str, str]]]:
    """Requests of every form, plain and not, to be sent at once: each with its own id."""
    forms = [
        lambda i: body(tensor(ROWS[i : i + 1])),
        lambda i: body(tensor(ROWS[i : i + 2]), id=f"r{i}"),
        lambda i: body({**tensor(ROWS[i : i + 2]), "data": ROWS[i : i + 2].ravel().tolist()}),
        lambda i: body(tensor(ROWS[i : i + 1]), outputs=[{"name": "probabilities"}]),
        lambda i: body({**tensor(ROWS[i : i + 1]), "data": [True, *ROWS[i, 1:].tolist()]}),
        lambda i: body(tensor(ROWS[i : i + 1]), parameters={"priority": 1}),
        lambda i: body(tensor(ROWS[i : i + 1, :3])),
        lambda i: body(tensor(ROWS[i : i + 1]), id=i),
        lambda i: body(flat(ROWS[i : i + 1])),  # flat data: a body form, its items joined
        lambda i: body(flat(ROWS[i + 1 : i + 2])),
        lambda i: body({**flat(ROWS[i : i + 1]), "data": [True, *ROWS[i, 1:].tolist()]}),
        lambda i: body({**flat(ROWS[i : i + 1]), "data": [1e300, *ROWS[i, 1:].tolist()]}),
    ]
    return [(forms[i % len(forms)](i), {**JSON, "x-request-id": f"q{i}"}) for i in range(count)]


async def test_a_turn_s_requests_are_grouped_and_each_answered_as_alone(graphs, servers):
    grouped: list[int] = []
    queue = turn_groups.TurnGroups._queue

    def recorded(self, members):  # type: ignore[no-untyped-def]
        grouped.append(len(members))
        return queue(self, members)

    sent = burst(48)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(turn_groups.TurnGroups, "_queue", recorded)
        replies = await in_one_turn(Settings(models=models(graphs)), sent)
    assert max(grouped) > 1  # requests of one turn shared a group
    for reply, (content, headers) in zip(replies, sent, strict=True):
        assert reply == answer(servers[False], GB, content, headers)  # the gateway's, alone


async def test_a_group_s_numbers_are_read_together_each_answered_its_own(graphs, servers):
    joined: list[int] = []
    join = turn_groups.joined_numbers

    def counted(datatype, dtype, lists):  # type: ignore[no-untyped-def]
        array = join(datatype, dtype, lists)
        joined.append(0 if array is None else len(lists))
        return array

    sent = [(body(flat(ROWS[i : i + 1 + i % 2])), JSON) for i in range(16)]  # two forms
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(turn_groups, "joined_numbers", counted)
        replies = await in_one_turn(Settings(models=models(graphs)), sent)
    assert max(joined) > 1  # more than one member's numbers read in one pass
    for reply, (content, headers) in zip(replies, sent, strict=True):
        reply[1].pop("x-request-id")
        assert reply == answer(servers[False], GB, content, headers)


async def test_a_group_plan_does_not_keep_its_graph_alive(graphs):
    # The lane's plans are keyed by graph weakly: a plan that held its graph would keep an
    # unloaded model's graph (and its sessions) for good.
    async with serving_app(Settings(models=models(graphs))) as (app, _):
        services = app_services(app)
        model = find_model(services.registry, services.encoder, "gb", None)
        plan = turn_groups.group_plan(services, model)
        assert plan is not None and plan.graph is model.model
        holders = gc.get_referrers(model.model)
        assert not any(holder is plan or holder is vars(plan) for holder in holders)


async def in_one_turn(settings: Settings, sent: list[tuple[bytes, dict[str, str]]]) -> list:
    """The answers to these requests to GB, each on a connection of its own, sent together."""
    async with served(settings, []) as url:
        port = int(url.rsplit(":", 1)[1])
        connections = [await asyncio.open_connection("127.0.0.1", port) for _ in sent]
        # Written with no await between: the server (this loop) reads them in one turn.
        for (content, headers), (_, writer) in zip(sent, connections, strict=True):
            lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
            head = f"POST {GB} HTTP/1.1\r\nhost: ferry\r\n{lines}"
            writer.write(head.encode() + b"content-length: %d\r\n\r\n" % len(content))
            writer.write(content)
        return [await raw_answer(reader, writer) for reader, writer in connections]


async def test_a_group_whose_answers_are_large_is_answered_member_by_member(graphs, servers):
    # 1024 bytes, about 36 rows of two probabilities as JSON: any group of these is more.
    sizes = [20, 20, 20, 40, 10]
    sent = [(body(tensor(ROWS[:rows])), JSON) for rows in sizes]
    wide = [
        {**m, "batching": {"max_batch_size": 128}} if m["name"] == "gb" else m
        for m in models(graphs)
    ]
    settings = Settings(models=wide, max_response_bytes=1024)
    replies = await in_one_turn(settings, sent)
    for reply, (content, headers), rows in zip(replies, sent, sizes, strict=True):
        reply[1].pop("x-request-id")
        if rows == 40:  # past the bound alone
            assert reply[0] == 400 and b"max_response_bytes" in reply[2]
        else:
            assert reply == answer(servers[False], GB, content, headers)


async def raw_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple:
    """(status, headers but the date, body) of the one answer on a connection, then closed."""
    answered = await next_answer(reader)
    writer.close()
    return answered


async def next_answer(reader: asyncio.StreamReader) -> tuple:
    """(status, headers but the date, body) of the connection's next answer."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status, *lines = head.split("\r\n")[:-2]
    headers = dict(line.split(": ", 1) for line in lines)
    content = await reader.readexactly(int(headers["content-length"]))
    headers.pop("date")
    return int(status.split(" ")[1]), headers, content


async def test_a_group_the_queue_refuses_is_queued_member_by_member(graphs):
    small = {"max_queue_size": 4, "dispatch_when_idle": False, "max_queue_delay_s": 0.2}
    config = [{**m, "batching": {**m.get("batching", {}), **small}} for m in models(graphs)]
    async with served(Settings(models=config), []) as url:
        port = int(url.rsplit(":", 1)[1])
        connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(12)]
        for index, (_, writer) in enumerate(connections):  # all sent before any is read
            writer.write(raw_post(GB, body(tensor(ROWS[index : index + 1]))))
        heads = []
        for reader, writer in connections:
            heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.close()
    statuses = [int(head.split(b" ", 2)[1]) for head in heads]
    # As alone: the queue's four places taken, the rest refused with a time to come back.
    assert sorted(statuses) == [200] * 4 + [429] * 8
    assert all(b"\r\nretry-after: " in head.lower() for head in heads if b" 429 " in head)


async def test_a_group_whose_batch_fails_is_queued_member_by_member(tmp_path):
    # One row indexes past the table: its batch fails, and alone only it does.
    model = {"name": "lookup", "path": str(plain_graphs.lookup(tmp_path / "lookup.onnx"))}
    indices = [3, 7, plain_graphs.LOOKUP_ROWS + 5, 11, 42, 0, 99, 5]
    async with served(Settings(models=[model]), []) as url:
        port = int(url.rsplit(":", 1)[1])
        connections = [await asyncio.open_connection("127.0.0.1", port) for _ in indices]
        for index, (_, writer) in zip(indices, connections, strict=True):  # sent at once
            spec = {"name": "i", "shape": [1, 1], "datatype": "INT64", "data": [index]}
            writer.write(raw_post("/v2/models/lookup/infer", body(spec)))
        answers = []
        for reader, writer in connections:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            answers.append(
                (int(head.split(b" ", 2)[1]), json.loads(await reader.readexactly(length)))
            )
            writer.close()
    for index, (status, content) in zip(indices, answers, strict=True):
        if index >= plain_graphs.LOOKUP_ROWS:
            assert status == 500, content
        else:
            assert status == 200, content
            assert content["outputs"][0]["data"] == [2.0 * index, 2.0 * index + 1]
