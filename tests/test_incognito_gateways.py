"""Incognito keeps its word across gateways (issue 17, point 6): a stretch held in memory by
gateway A ends when ``!incognito off``, a new ``!incognito``, ``!reset`` or ``!forget`` arrives
through gateway B (two real apps on one real PostgreSQL), for the same account and for a
linked account on another transport; nothing said in the ended stretch reaches A's next prompt
(the fake LLM's requests are read), any log line, any file or any table. The single-process
case on SQLite with a linked account holds too (the plain one is
tests/regressions/test_ended_incognito_stretch_is_not_sent.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.app import App, build
from tests import pg_server
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport
from tests.test_memory_promises import _marker_anywhere

# No number, id or timestamp can contain it ("4242" once matched a status file's clock).
SECRET = "quokka-vault-zephyr"
RADIO = "!0000abcd"
CHAT = "1001"
# What gateway B is sent; each sequence ends a stretch and leaves the person incognito again.
ENDINGS = {
    "off-on": ["!incognito off", "!incognito"],
    "again": ["!incognito"],
    "reset": ["!reset"],
    "forget": ["!forget", "!forget yes", "!incognito"],
}


class Side:
    def __init__(self, app: App, transport: FakeTransport, sender: str) -> None:
        self.app, self.transport, self.sender = app, transport, sender

    async def say(self, text: str) -> str:
        await self.transport.say(text, sender=self.sender)
        await self.app.responder.wait_idle()
        return self.transport.texts()[-1]


async def _side(tmp: Path, llm: FakeLLM, extra: str, env: dict[str, str], name: str) -> Side:
    transport = FakeTransport(name=name)
    tmp.mkdir()
    app = await build(make_config(tmp, llm.base_url, extra), env=env, transports=[transport])
    await app.start()
    return Side(app, transport, RADIO if name == "mesh" else CHAT)


@pytest.fixture
async def url() -> AsyncIterator[str]:
    pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")
    server = pg_server.shared()
    name = server.new_database()
    yield server.url(name)
    server.drop_database(name)


async def _held_then_ended(
    a: Side, b: Side, ending: list[str], fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    """A holds a stretch with the secret; B ends it; A's next incognito prompt is read."""
    fake_llm.reply = "Noted."
    await a.say("hello there")
    assert (await a.say("!incognito")).startswith("Incognito on")
    await a.say(f"my secret is {SECRET}")
    for text in ending:
        await b.say(text)
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    await a.say("what is new")
    await a.app.summarizer.wait_quiet()
    requests = fake_llm.chat_requests()
    last = requests[-1]
    assert "what is new" in last["messages"][-1]["content"]
    assert "Earlier in this incognito session" not in json.dumps(last)  # a new stretch
    assert SECRET not in json.dumps(last)
    assert sum(SECRET in json.dumps(body) for body in requests) == 1  # only where it was said
    assert SECRET not in caplog.text  # no log line after the stretch ended
    for side in (a, b):
        for path in side.app.config.database_path.parent.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path
    assert await _marker_anywhere(a.app.store, SECRET) == []


@pytest.mark.parametrize("linked", [False, True], ids=["same-account", "linked-account"])
@pytest.mark.parametrize("ending", sorted(ENDINGS))
async def test_a_stretch_ended_on_another_gateway_is_not_sent(
    tmp_path: Path,
    fake_llm: FakeLLM,
    url: str,
    caplog: pytest.LogCaptureFixture,
    ending: str,
    linked: bool,
) -> None:
    extra = f"storage:\n  url: '{url}'\n  password_env: PW\n"
    env = {"PW": pg_server.BOT_PASSWORD}
    a = await _side(tmp_path / "site-a", fake_llm, extra, env, "mesh")
    b = await _side(tmp_path / "site-b", fake_llm, extra, env, "discord" if linked else "mesh")
    try:
        if linked:  # the radio account is the home; the chat account joins it
            code = (await a.say("!link")).split("code is ")[1][:6]
            assert (await b.say(f"!link {code}")).startswith("Linked with your mesh account")
        await _held_then_ended(a, b, ENDINGS[ending], fake_llm, caplog)
    finally:
        await a.app.close()
        await b.app.close()


@pytest.mark.parametrize("ending", ["off-on", "reset"])
async def test_a_linked_account_ends_the_stretch_in_one_process_on_sqlite(
    tmp_path: Path, fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture, ending: str
) -> None:
    mesh, discord = FakeTransport(name="mesh"), FakeTransport(name="discord")
    app = await build(make_config(tmp_path, fake_llm.base_url), env={},
                      transports=[mesh, discord])  # fmt: skip
    await app.start()
    a, b = Side(app, mesh, RADIO), Side(app, discord, CHAT)
    try:
        code = (await a.say("!link")).split("code is ")[1][:6]
        assert (await b.say(f"!link {code}")).startswith("Linked with your mesh account")
        await _held_then_ended(a, b, ENDINGS[ending], fake_llm, caplog)
    finally:
        await app.close()


async def test_a_stretch_goes_on_while_nobody_ends_it(
    tmp_path: Path, fake_llm: FakeLLM, url: str
) -> None:
    """The stretch id does not end a stretch by itself: turns on gateway A keep following it
    while gateway B answers other people and the same person's status."""
    extra = f"storage:\n  url: '{url}'\n  password_env: PW\n"
    env = {"PW": pg_server.BOT_PASSWORD}
    a = await _side(tmp_path / "site-a", fake_llm, extra, env, "mesh")
    b = await _side(tmp_path / "site-b", fake_llm, extra, env, "mesh")
    try:
        fake_llm.reply = "Noted."
        await a.say("!incognito")
        await a.say(f"my secret is {SECRET}")
        assert "Incognito is ON" in await b.say("!status")
        await a.say("what did I say?")
        assert SECRET in json.dumps(fake_llm.chat_requests()[-1])  # still the same stretch
    finally:
        await a.app.close()
        await b.app.close()
