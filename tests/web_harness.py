"""A running app with the web view on: the real Meshtastic transport on the fake radio (or no
radio), the fake LLM over HTTP, a real SQLite file, and the web server on 127.0.0.1 (any free
port). Shared by the web view's tests and the browser tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from bot.app import App, build
from bot.transports.base import Transport
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport
from tests.fakes.mesh_harness import Harness

WEB = "web:\n  enabled: true\n  port: 0\n  refresh: 0.2\n"


@contextlib.asynccontextmanager
async def web_app(
    tmp_path: Path,
    llm: FakeLLM,
    h: Harness | None,
    *,
    extra: str = "",
    env: dict[str, str] | None = None,
) -> AsyncIterator[App]:
    """The app with the harness's transport (or a fake chat transport when ``h`` is None: no
    radio configured), started, its web view listening."""
    config = make_config(tmp_path, llm.base_url, WEB + extra)
    transports: list[Transport] = [h.transport] if h is not None else [FakeTransport()]
    app = await build(config, env=env or {}, transports=transports)
    try:
        await app.start()
        if h is not None:
            await h.connected()
        assert app.web is not None and app.web.port
        yield app
    finally:
        await app.close()


def base_url(app: App) -> str:
    assert app.web is not None
    return f"http://127.0.0.1:{app.web.port}"


@contextlib.asynccontextmanager
async def client(app: App) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=base_url(app)) as session:
        yield session
