"""The console at /console in a real browser: Debian's headless Chromium (tools/install_chromium.sh)
driven by Playwright, against one real server with the default encoder and the default chat
model. The page loads with no console errors, each of its three views shows what the server
serves, a chat streams an answer, and the live view's batch chart moves when concurrent
/predict requests arrive. Screenshots go to build/console-*.png for a person to look at."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import sync_playwright

from ferry.bench.server_process import (
    DEFAULT_LLM,
    DEFAULT_MODEL,
    default_model_config,
    ferry_server,
)
from tests.support import images, plain_graphs
from tests.support.llm_configs import default_llm_config

pytestmark = pytest.mark.system

SCREENSHOTS = Path(__file__).resolve().parents[2] / "build"
WAIT_MS = 30_000
IMAGE, TABULAR = "cnn", "tabular"
CLIENTS = 16  # concurrent /predict clients: more than the two sessions run at once


@pytest.fixture(scope="module")
def server(default_model_dir, default_llm_dir, tmp_path_factory):
    graphs = tmp_path_factory.mktemp("graphs")
    image_model = images.tiny_cnn(graphs / "cnn.onnx")  # declares its preprocessing
    tabular_model = plain_graphs.breast_cancer(graphs / "tabular.onnx", "logistic_regression")
    with ferry_server(
        [default_model_config(batching={"max_queue_delay_s": 0.005})],
        llm_models=[default_llm_config()],
        args=["--model", f"{IMAGE}={image_model}", "--model", f"{TABULAR}={tabular_model}"],
        ready_timeout_s=180,  # the models load and calibrate on a shared 2-core box
    ) as handle:
        yield handle


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium missing: `make test` runs tools/install_chromium.sh")
    with sync_playwright() as driver:
        # As root (CI) Chromium's sandbox cannot start; the page is our own.
        launched = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def page(browser, server):
    """One page for the module, opened once; every console error or uncaught exception it
    logs fails the test that was running."""
    opened = browser.new_page(viewport={"width": 1280, "height": 900})
    opened.errors = []
    opened.on("console", lambda m: m.type == "error" and opened.errors.append(m.text))
    opened.on("pageerror", lambda e: opened.errors.append(str(e)))
    opened.goto(f"{server.url}/console")
    yield opened
    opened.close()


@pytest.fixture(autouse=True)
def no_console_errors(page):
    yield
    assert page.errors == []


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"console-{name}.png"), full_page=True)


def card(page, view: str, model: str):
    return page.locator(f"#view-{view} article[data-model='{model}']")


def test_the_page_is_the_servers_own_and_lists_every_model_live(page):
    page.get_by_role("tab", name="Live").click()  # each test opens the view it reads
    response = page.request.get(page.url)
    assert "default-src 'self'" in response.headers["content-security-policy"]
    for model in (DEFAULT_MODEL, DEFAULT_LLM, IMAGE, TABULAR):
        card(page, "live", model).wait_for(timeout=WAIT_MS)
    assert page.locator("#status").inner_text().startswith("updated")


def test_what_is_served_shows_signatures_limits_and_curl(page):
    page.get_by_role("tab", name="What is served").click()
    encoder = card(page, "served", DEFAULT_MODEL)
    encoder.locator("table.signature").wait_for(timeout=WAIT_MS)
    signature = encoder.locator("table.signature").inner_text()
    assert "input_ids" in signature and "sentence_embedding" in signature and "-1" in signature
    facts = encoder.locator("table.facts").inner_text()
    assert "max batch size\t32" in facts and "max queue delay\t5 ms" in facts
    assert "/v1/embeddings" in encoder.locator("pre").inner_text()
    chat = card(page, "served", DEFAULT_LLM)
    assert "/v1/chat/completions" in chat.locator("pre").inner_text()
    assert "context" in chat.locator("table.facts").inner_text()
    shot(page, "served")


def test_the_batch_chart_moves_under_concurrent_load(page, server):
    page.reload()  # the charts start anew: what other tests sent is not on them
    page.get_by_role("tab", name="Live").click()
    batch = card(page, "live", DEFAULT_MODEL).locator("canvas[data-chart=batch]")
    batch.wait_for(timeout=WAIT_MS)
    assert batch.get_attribute("data-max") in (None, "")  # no batch yet, nothing drawn
    stop = threading.Event()

    def client(index: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            while not stop.is_set():
                text = f"Request {index} of the load test, a sentence to embed."
                http.post("/predict", json={"inputs": [text]}).raise_for_status()

    with ThreadPoolExecutor(CLIENTS) as pool:
        running = [pool.submit(client, i) for i in range(CLIENTS)]
        try:
            # Requests joining batches: a second's mean batch size above one request.
            page.wait_for_function(
                """(canvas) => Number(canvas.dataset.max || 0) > 1""",
                arg=batch.element_handle(),
                timeout=WAIT_MS,
            )
            page.wait_for_timeout(2000)  # a few more readings for the screenshot
        finally:
            stop.set()
        for future in running:
            future.result()
    rps = card(page, "live", DEFAULT_MODEL).locator("canvas[data-chart=rps]")
    assert float(rps.get_attribute("data-max")) > 0
    shot(page, "live")


def test_a_chat_streams_an_answer(page):
    page.get_by_role("tab", name="Try a model").click()
    page.select_option("#try-model", DEFAULT_LLM)
    form = page.locator("#form-chat")
    form.locator("[name=temperature]").fill("0")
    form.locator("[name=max_tokens]").fill("24")
    # Counts the answer's text changes: a stream grows it piece by piece, a whole reply once.
    page.evaluate(
        """() => {
            window.answerUpdates = 0;
            new MutationObserver(() => window.answerUpdates++).observe(
                document.getElementById("chat-log"),
                {subtree: true, characterData: true, childList: true});
        }"""
    )
    form.locator("[name=message]").fill("What is the capital of France?")
    form.get_by_role("button", name="Send").click()
    answer = page.locator("#chat-log .message.assistant")
    answer.and_(page.locator("[data-streaming=false]")).wait_for(timeout=WAIT_MS)
    assert "Paris" in answer.inner_text()
    assert page.evaluate("window.answerUpdates") > 3  # two messages added, then the pieces
    assert "tokens/s" in page.locator("#chat-stats").inner_text()
    shot(page, "chat")


def test_two_sentences_are_compared(page):
    page.get_by_role("tab", name="Try a model").click()
    page.select_option("#try-model", DEFAULT_MODEL)
    page.locator("#form-embedding").get_by_role("button", name="Compare").click()
    result = page.locator("#embedding-result[data-cosine]")
    result.wait_for(timeout=WAIT_MS)
    assert 0.3 < float(result.get_attribute("data-cosine")) < 1  # two sentences alike
    assert "384 dimensions" in result.inner_text()


def test_an_uploaded_image_is_classified(page):
    page.get_by_role("tab", name="Try a model").click()
    page.select_option("#try-model", IMAGE)
    form = page.locator("#form-image")
    form.locator("[name=image]").set_input_files(
        files=[{"name": "photo.png", "mimeType": "image/png", "buffer": images.encoded(0, "PNG")}]
    )
    form.get_by_role("button", name="Classify").click()
    page.locator("#image-result table").wait_for(timeout=WAIT_MS)
    classes = page.locator("#image-result table tr")
    assert classes.count() == images.CLASSES  # the logits as probabilities, one row a class


def test_a_row_goes_to_a_tabular_model(page):
    page.get_by_role("tab", name="Try a model").click()
    page.select_option("#try-model", TABULAR)
    form = page.locator("#form-tensor")
    row = form.locator("#tensor-inputs input")
    row.wait_for(timeout=WAIT_MS)
    row.fill(str(plain_graphs.breast_cancer_rows()[0].tolist()))
    form.get_by_role("button", name="Predict").click()
    probabilities = page.locator("#tensor-result table")
    probabilities.wait_for(timeout=WAIT_MS)
    labels = [cell.inner_text() for cell in probabilities.locator("tr td:first-child").all()]
    assert sorted(labels) == ["0", "1"]
    shot(page, "tabular")
