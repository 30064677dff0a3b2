"""The web view with several gateways on one PostgreSQL memory: each gateway shows its own
outbox rows and names the other gateways it sees in the shared store."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import pytest

from bot.app import build
from tests import pg_server
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport
from tests.web_harness import WEB, base_url

pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")


async def test_each_gateway_shows_its_own_view_and_names_the_others(
    tmp_path: Path, fake_llm: FakeLLM, url: str
) -> None:
    fake_llm.reply = "An answer."
    env = {pg_server.PASSWORD_ENV: pg_server.BOT_PASSWORD}
    apps = {}
    transports = {}
    try:
        for name in ("north", "south"):
            home = tmp_path / name
            home.mkdir()
            config = make_config(
                home, fake_llm.base_url,
                WEB + f"storage:\n  url: '{url}'\n  password_env: {pg_server.PASSWORD_ENV}\n"
                f"  gateway: {name}\n",
            )  # fmt: skip
            transports[name] = FakeTransport()
            apps[name] = await build(config, env=env, transports=[transports[name]])
            await apps[name].start()
        await transports["north"].say("hello from the north", sender="person-7f3k")
        await apps["north"].responder.wait_idle()
        pages = {}
        for name, app in apps.items():
            assert app.web is not None
            await app.web.sample()
            async with aiohttp.ClientSession(base_url=base_url(app)) as http:
                for path in ("/", "/people", "/metrics"):
                    async with http.get(path) as r:
                        assert r.status == 200
                        pages[name, path] = await r.text()
        assert (
            "gateway <b>north</b>; other gateways on this store: none seen" in pages["north", "/"]
        )
        assert re.search(
            r"gateway <b>south</b>; other gateways on this store: north \(\d+ s ago\)",
            pages["south", "/"],
        )
        assert "this gateway's rows (north)" in pages["north", "/people"]
        assert 'meshsage_outbox_rows{state="delivered"} 1' in pages["north", "/metrics"]
        assert 'meshsage_outbox_rows{state="delivered"} 0' in pages["south", "/metrics"]
        for text in pages.values():
            assert "hello from the north" not in text and "person-7f3k" not in text
    finally:
        for app in apps.values():
            await app.close()
