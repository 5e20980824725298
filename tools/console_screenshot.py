"""Remake docs/console.png: the console's live view while load arrives in two steps (one client,
then sixteen), taken in Debian's headless Chromium. `python tools/console_screenshot.py`."""

from __future__ import annotations

import io
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from PIL import Image
from playwright.sync_api import sync_playwright

from ferry.bench.server_process import (
    DEFAULT_LLM,
    DEFAULT_LLM_DIR,
    default_model_config,
    ferry_server,
)

OUT = Path(__file__).resolve().parents[1] / "docs" / "console.png"
STEPS = ((1, 12.0), (16, 15.0))  # (clients, seconds)


def load(url: str, clients: int, seconds: float) -> None:
    stop = threading.Event()

    def client(index: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while not stop.is_set():
                http.post("/predict", json={"inputs": [f"Sentence {index} to embed, a short one."]})

    with ThreadPoolExecutor(clients) as pool:
        for i in range(clients):
            pool.submit(client, i)
        time.sleep(seconds)
        stop.set()


def main() -> None:
    llm = {"name": DEFAULT_LLM, "engine": "ortgenai", "path": str(DEFAULT_LLM_DIR)}
    with (
        ferry_server([default_model_config()], llm_models=[llm], ready_timeout_s=400) as server,
        sync_playwright() as driver,
    ):
        browser = driver.chromium.launch(
            executable_path=shutil.which("chromium"), args=["--no-sandbox"]
        )
        page = browser.new_page(viewport={"width": 1200, "height": 560})
        page.goto(f"{server.url}/console")
        time.sleep(3)
        for clients, seconds in STEPS:
            load(server.url, clients, seconds)
        time.sleep(2)
        png = page.screenshot()
        browser.close()
    # A palette of 64 colours: the page is flat colours and thin lines, and the file stays small.
    Image.open(io.BytesIO(png)).convert("RGB").quantize(64).save(OUT, optimize=True)
    print(f"wrote {OUT} ({OUT.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
