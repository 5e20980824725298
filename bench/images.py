"""Image serving (issue 34's image targets): ResNet-18 at 224 with random weights, exported by
`ferry export vision`, 64 clients on KServe v2 JSON.

- FP32 tensors [1, 3, 224, 224]: Ferry (`ferry serve --model`, its batcher) against the strong
  unbatched server (bench/unbatched_tensor_server.py: a session of one thread per core, as many
  pool threads, orjson), the same bodies to both;
- JPEGs of mixed sizes (scikit-learn's sample photos cropped from 97 x 97 to 427 x 640) sent as
  BYTES (base64) and decoded by Ferry in its worker processes, while a thread polls /health/live
  every 10 ms: its slowest answers tell whether the event loop stalled. The same poll on the
  idle server, and under the FP32 load (no decoding), tells the machine's own share; Ferry's own
  `ferry_event_loop_lag_seconds` over each load (wakes later than 5, 10 and 20 ms) tells how much
  of a slow answer was its loop's;
- the machine's floor: the same poll, during the JPEG load, of a bare uvloop server in a process
  of its own (bench/bare_http.py): what the box's scheduler alone adds under that load;
- without HTTP: the gaps between 1 ms ticks of an event loop while Ferry's image decoder
  decodes those JPEGs 64 at a time in its workers, and while the loop decodes them itself.

    python -m ferry.bench.images [--duration 10] [--clients 64]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from ferry.bench.loadgen import LoadResult
from ferry.bench.loop_lag_scrape import describe_lag, lag_buckets
from ferry.bench.multiload import load_pool, run_load_processes
from ferry.bench.processes import ManagedProcess, free_port, http_ok, running
from ferry.bench.tabular import ferry_process, line, ratios, unbatched_process

MODEL = "resnet18"
INPUT, OUTPUT = "pixel_values", "logits"
SIZE = 224
TENSORS = 8  # distinct tensor bodies
# (height, width) crops of the 427 x 640 sample photos: each request a different size.
CROPS = ((427, 640), (300, 200), (97, 97), (255, 129), (64, 400), (333, 500), (200, 300))
POLL_S = 0.01
LIVE_REQUEST = b"GET /health/live HTTP/1.1\r\nHost: ferry\r\n\r\n"


def export_model(out: Path) -> Path:
    from ferry.exporters import vision_export

    model = vision_export.build("resnet18", 1000, 64, None, seed=0)
    return vision_export.export(model, vision_export.preprocess(SIZE, None), out / "model.onnx")


def tensor_bodies() -> list[dict]:
    rng = np.random.default_rng(0)
    bodies = []
    for _ in range(TENSORS):
        pixels = rng.standard_normal(3 * SIZE * SIZE).round(3)  # short JSON numbers
        tensor = {"name": INPUT, "shape": [1, 3, SIZE, SIZE], "datatype": "FP32"}
        bodies.append(
            {"inputs": [{**tensor, "data": pixels.tolist()}], "outputs": [{"name": OUTPUT}]}
        )
    return bodies


def jpeg_bodies() -> list[dict]:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    bodies = []
    for index, photo in enumerate(load_sample_images().images):
        for height, width in CROPS:
            buffer = io.BytesIO()
            Image.fromarray(photo[:height, index * 5 : index * 5 + width]).save(buffer, "JPEG")
            data = base64.b64encode(buffer.getvalue()).decode()
            tensor = {"name": INPUT, "shape": [1], "datatype": "BYTES", "data": [data]}
            bodies.append({"inputs": [tensor], "outputs": [{"name": OUTPUT}]})
    return bodies


class LivePoll:
    """/health/live every POLL_S from a thread, over one keep-alive connection; `latencies_s`
    of each answer. The request is written and the answer read on a bare socket: httpx took
    2.5 ms of this box's CPU a poll (http.client 1.5), as much as the server's own answer, and a
    kubelet's probe costs it nothing of the kind."""

    def __init__(self, url: str) -> None:
        self._address = urlsplit(url).hostname, urlsplit(url).port
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self.latencies_s: list[float] = []

    def __enter__(self) -> LivePoll:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _poll(self) -> None:
        with socket.create_connection(self._address, timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while not self._done.wait(POLL_S):
                started = time.perf_counter()
                sock.sendall(LIVE_REQUEST)
                status = read_answer(sock)
                self.latencies_s.append(time.perf_counter() - started)
                assert status == 200, f"/health/live answered {status}"

    def describe(self) -> str:
        ms = np.array(self.latencies_s) * 1000
        return (
            f"{len(ms)} polls, p50 {np.percentile(ms, 50):.2f} ms, p99 {np.percentile(ms, 99):.2f} "
            f"ms, max {ms.max():.2f} ms, over 5 ms: {int((ms > 5).sum())}"
        )


def read_answer(sock: socket.socket) -> int:
    """One HTTP/1.1 answer read whole off `sock` (its body by Content-Length); its status."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += _received(sock)
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in lines if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += _received(sock)
    return int(lines[0].split()[1])


def _received(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionError("the server closed the connection")
    return chunk


async def loop_gaps(jpegs: list[bytes], model: Path, pooled: bool) -> list[float]:
    """The event loop's gaps (ms) between 1 ms ticks while Ferry's image decoder decodes every
    JPEG 64 at a time: in its workers (`pooled`), or inline on the loop (the counterfactual)."""
    import onnxruntime as ort

    from ferry.backends.image_spec import declared, plan
    from ferry.backends.tensor_signature import read_signature
    from ferry.server.image_decode import decode_image
    from ferry.server.image_inputs import ImageInputs

    session = ort.InferenceSession(str(model))
    spec = declared(session.get_modelmeta().custom_metadata_map, None)
    assert spec is not None, "the exported graph declares its preprocessing"
    image_plan = plan(spec, read_signature(session))
    decoder = ImageInputs(image_plan, MODEL, max_pending=len(jpegs))
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append((now - last) * 1000)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    for start in range(0, len(jpegs), 64):
        chunk = np.array(jpegs[start : start + 64], dtype=object)
        if pooled:
            await decoder.decode(chunk)
        else:
            for item in chunk:
                decode_image(item, image_plan, INPUT)
                await asyncio.sleep(0)
    done.set()
    await ticker
    decoder.close()
    return gaps


def describe_gaps(gaps: list[float]) -> str:
    ms = np.array(gaps)
    p50, p99 = np.percentile(ms, 50), np.percentile(ms, 99)
    return f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {ms.max():.2f} ms"


def measure(
    pool: ProcessPoolExecutor, url: str, payloads: list[dict], clients: int, duration_s: float
) -> LoadResult:
    """Closed-loop clients from a process of `pool`: the poll thread (LivePoll) is alone with
    this process's GIL, which it shared with the load's parsing when both ran here."""
    path = f"/v2/models/{MODEL}/infer"
    run_load_processes(pool, 1, url, payloads[:clients], min(clients, len(payloads)), 1.0, path)
    return run_load_processes(pool, 1, url, payloads, clients, duration_s, path)


def bare_server(work: Path) -> ManagedProcess:
    """bench/bare_http.py on a free port: the floor Ferry's probe answers are measured against."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "ferry.bench.bare_http", "--port", str(port)]
    return ManagedProcess("bare", command, work / "bare.log", http_ok(url), url=url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="Seconds per measurement.")
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args(argv)
    tensors, jpegs = tensor_bodies(), jpeg_bodies()
    results: dict[str, LoadResult] = {}
    with (
        load_pool(1, niceness=10) as pool,
        tempfile.TemporaryDirectory(prefix="ferry-images-") as tmp,
    ):
        work = Path(tmp)
        model = export_model(work)
        with running(ferry_process(model, work, MODEL)) as ferry:
            with LivePoll(ferry.url) as idle:
                time.sleep(2)
            lags = [lag_buckets(ferry.url)]
            with LivePoll(ferry.url) as tensor_load:
                results["ferry"] = measure(pool, ferry.url, tensors, args.clients, args.duration)
            lags.append(lag_buckets(ferry.url))
            with (
                running(bare_server(work)) as bare,
                LivePoll(ferry.url) as decoding,
                LivePoll(bare.url) as floor,
            ):
                results["ferry jpeg"] = measure(pool, ferry.url, jpegs, args.clients, args.duration)
            lags.append(lag_buckets(ferry.url))
        with running(unbatched_process(model, work, MODEL)) as peer:
            results["unbatched"] = measure(pool, peer.url, tensors, args.clients, args.duration)
        raw = [base64.b64decode(b["inputs"][0]["data"][0]) for b in jpegs] * 10
        pooled = asyncio.run(loop_gaps(raw, model, pooled=True))
        inline = asyncio.run(loop_gaps(raw, model, pooled=False))
    print(f"images: resnet18 at {SIZE}, random weights, 1 image/request, {args.clients} clients")
    for name, result in results.items():
        print(line(name, result))
    print(ratios("ferry / unbatched (FP32 tensors)", results["ferry"], results["unbatched"]))
    print(f"/health/live, idle: {idle.describe()}")
    print(f"/health/live, FP32 tensors: {tensor_load.describe()}")
    print(f"/health/live, decoding JPEGs: {decoding.describe()}")
    print(f"a bare uvloop server beside it (the machine's floor): {floor.describe()}")
    print(f"Ferry's event-loop lag, FP32 tensors: {describe_lag(lags[0], lags[1])}")
    print(f"Ferry's event-loop lag, decoding JPEGs: {describe_lag(lags[1], lags[2])}")
    print(f"in-process loop gaps, {len(raw)} JPEGs decoded in the pool: {describe_gaps(pooled)}")
    print(f"in-process loop gaps, the same decoded on the loop: {describe_gaps(inline)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
