"""The web view in a real headless browser: Debian's Chromium (/usr/bin/chromium, installed by
.ci/ensure-browser) driven by Playwright, against the running app (real Meshtastic transport on
the fake radio, fake LLM over HTTP, SQLite). Each page loads without a script error; the
airtime chart and the answer count change on screen, without a reload, when the radio reports
new metrics and a person asks a question; after the web server restarts, the open page
reconnects by itself; and no request of the browser's leaves 127.0.0.1.

Skipped (with the reason) where Chromium or Playwright is missing; under CI (CI=true) a
missing browser fails instead, so CI always runs these."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from bot.web.server import WebServer
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import ALICE
from tests.fakes.mesh_harness import mesh_harness
from tests.web_harness import base_url, web_app

CHROMIUM = "/usr/bin/chromium"
FLAGS = [  # Playwright adds --headless (headless=True)
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _missing() -> str | None:
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        return "no Chromium (/usr/bin/chromium); run .ci/ensure-browser as root to install it"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    return None


MISSING = _missing()
if MISSING and os.environ.get("CI") == "true":
    raise RuntimeError(f"CI must run the browser tests, but: {MISSING}")
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"browser tests: {MISSING}")


class Browser:
    def __init__(self, context: Any) -> None:
        self.context = context
        self.requests: list[str] = []
        self.outside: list[str] = []
        self.errors: list[str] = []


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh profile every test
            executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"),
            headless=True,
            args=FLAGS,
        )
        b = Browser(context)

        async def route(r: Any) -> None:
            host = urlsplit(r.request.url).hostname
            if host not in ("127.0.0.1", None) and not r.request.url.startswith("data:"):
                b.outside.append(r.request.url)
                await r.abort()
                return
            await r.continue_()

        await context.route("**/*", route)
        context.on("request", lambda req: b.requests.append(req.url))
        try:
            yield b
        finally:
            await context.close()


async def _wait_above(page: Any, series: str, floor: float) -> None:
    """Until the hour chart's newest point of ``series`` (its bucket's mean) is above
    ``floor``: the chart was redrawn with the new figure."""
    await page.wait_for_function(
        "([s, f]) => { const e = document.querySelector("
        '`#chart-hour [data-series="${s}"]`);'
        " return e !== null && Number(e.getAttribute('data-last') || '-1') > f; }",
        arg=[series, floor],
        timeout=30_000,
    )


async def test_pages_load_charts_update_live_and_nothing_leaves_the_machine(
    tmp_path: Path, fake_llm: FakeLLM, browser: Browser
) -> None:
    fake_llm.reply = "Hello from the bot."
    async with mesh_harness(start=False) as h, web_app(tmp_path, fake_llm, h) as app:
        page = await browser.context.new_page()
        page.on("pageerror", lambda e: browser.errors.append(str(e)))

        def console(message: Any) -> None:
            if message.type == "error":
                browser.errors.append(message.text)

        page.on("console", console)
        url = base_url(app)
        for path, marker in (
            ("/", "Health"),
            ("/airtime", "Last hour"),
            ("/nodes", "Nodes heard"),
            ("/people", "Outbox"),
        ):
            response = await page.goto(url + path)
            assert response is not None and response.status == 200
            assert marker in await page.inner_text("main")
            await page.wait_for_selector("#live.on", timeout=30_000)  # its live stream is open
        await page.goto(url + "/airtime")
        await page.wait_for_selector("#live.on", timeout=30_000)
        await page.evaluate("window.sameDocument = true")  # gone if the page reloads
        assert await page.inner_text("#answers-hour") == "0"
        before = await page.get_attribute('#chart-hour [data-series="others"]', "data-last")
        assert before in ("", "0")  # nothing but the bot on the channel yet
        h.radio.inject_channel_utilization(15.0)  # the fake radio reports new metrics
        await _wait_above(page, "others", 1.0)
        await page.wait_for_function(
            "() => document.getElementById('f-air-now').textContent.includes('15.0%')",
            timeout=30_000,
        )
        h.radio.inject_text("what is the weather?", frm=ALICE)  # a person asks
        await h.until(lambda: len(h.radio.sent_texts()) == 1, "the answer on air")
        await page.wait_for_function(
            "() => document.getElementById('answers-hour').textContent === '1'", timeout=30_000
        )
        assert await page.evaluate("window.sameDocument === true")
        html = await page.content()
        assert "what is the weather" not in html and "Hello from the bot" not in html
        await page.goto(url + "/nodes")
        assert f"!{ALICE:08x}" in await page.inner_text("#f-nodes")
        assert browser.errors == []
    assert browser.outside == []
    assert browser.requests and all(
        urlsplit(u).hostname == "127.0.0.1" for u in browser.requests
    ), browser.requests


async def test_an_open_page_reconnects_after_the_web_server_restarts(
    tmp_path: Path, fake_llm: FakeLLM, browser: Browser
) -> None:
    async with mesh_harness(start=False) as h, web_app(tmp_path, fake_llm, h) as app:
        assert app.web is not None
        page = await browser.context.new_page()
        await page.goto(base_url(app) + "/airtime")
        await page.wait_for_selector("#live.on", timeout=30_000)
        old = app.web
        port = old.port
        await old.stop()  # the bot restarts (its web view goes away and comes back)
        await page.wait_for_selector("#live.off", timeout=30_000)
        config = old._config.model_copy(update={"port": port})
        new = WebServer(config=config, token=None, collector=old._collector)
        await new.start()
        app.web = new  # closed with the app
        try:
            await page.wait_for_selector("#live.on", timeout=60_000)
            before = int(await page.get_attribute("body", "data-updates") or "0")
            h.radio.inject_channel_utilization(22.0)
            await page.wait_for_function(
                "() => document.getElementById('f-air-now').textContent.includes('22.0%')",
                timeout=30_000,
            )
            after = int(await page.get_attribute("body", "data-updates") or "0")
            assert after > before
        finally:
            await asyncio.sleep(0)
    assert browser.outside == []
