"""Status tells the truth (issue 28 point 4): a transport that stopped, a Discord token
revoked while the bot runs, an unexpected failure inside discord.py's loop, the Message Content
intent off, and an LLM outage each make the status unhealthy with the cause and the fix, while
the watchdog keeps pinging (a restart fixes none of them). A transient failure restarts the
Discord transport with backoff; a refused token leaves it stopped, saying why, its replies kept
in the outbox. Before: ``health_of`` called any transport without ``health()`` running, a
stopped Discord transport was reported ``running`` and ``healthy``, and an LLM outage showed as
0 calls and no error."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import discord
import pytest
from discord.gateway import DiscordWebSocket

from bot.answering import unavailable_notice
from bot.app import App, build
from bot.config import DiscordConfig
from bot.domain import ConversationKey, DeliveryStatus, Inbound, Reply
from bot.memory.records import OutboxEntry
from bot.ops import cli_ops
from bot.ops.status import STATUS_FILE, read, render
from bot.transports.base import health_of
from bot.transports.discord import DiscordTransport, build_discord
from tests.conftest import make_config, start_harness
from tests.fakes.fake_discord import ALICE, CHANNEL_ID, TOKEN, FakeDiscord, user
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport
from tests.test_discord_transport import Echo
from tests.test_sdnotify import Listener, SickTransport


class EndingTransport(FakeTransport):
    """A transport that can end by itself while the bot runs (and reports no health)."""

    def end(self) -> None:
        self._closed.set()


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    sock = Listener(tmp_path / "notify.sock")
    yield sock
    sock.close()


async def test_a_transport_that_ended_makes_status_unhealthy_but_keeps_the_watchdog(
    tmp_path: Path, fake_llm: FakeLLM, listener: Listener
) -> None:
    config = make_config(tmp_path, fake_llm.base_url)
    mesh, chat = SickTransport(name="fake"), EndingTransport(name="chat")
    env = {"NOTIFY_SOCKET": str(listener.path), "WATCHDOG_USEC": "600000"}
    app: App = await build(config, env=env, transports=[mesh, chat])
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        await listener.wait_for("STATUS=serving;")
        path = app.config.database_path.parent / STATUS_FILE
        assert read(path).transports["chat"].link == "unreported"  # never assumed "running"
        chat.link_down = True  # a reply for it waits in the outbox
        await app.store.queue_delivery(OutboxEntry(ConversationKey("chat", "bob"), "answer", "hi"))
        chat.end()
        bad = await listener.wait_for("STATUS=UNHEALTHY")
        assert "chat stopped" in listener.messages()[bad]
        await listener.wait_for("WATCHDOG=1", after=bad)  # a restart would not fix it
        report = read(path)
        while report.healthy:
            await asyncio.sleep(0.05)
            report = read(path)
        assert not report.healthy and report.watchdog_ok
        assert report.transports["chat"].link == "stopped"
        [problem] = report.problems
        assert problem.startswith("chat stopped (1 repl(ies) wait in the outbox): the transport")
        assert "Fix" in problem
        lines, ok = render(report)
        assert not ok and any("NOT SERVING" in line for line in lines)
        assert cli_ops.status(app.config, as_json=True, env={}) == 1  # the HEALTHCHECK fails
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


def test_health_of_never_assumes_running() -> None:
    plain = FakeTransport()
    assert health_of(plain).link == "unreported" and not health_of(plain).problem
    ended = health_of(plain, ended=True)
    assert ended.link == "stopped" and "ended" in ended.problem


async def test_an_llm_outage_is_in_the_status_with_its_start_and_failures(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    await fake_llm.stop()  # the LLM server is down
    h = await start_harness(tmp_path, fake_llm, read_timeout=2)
    try:
        await h.say("hello?")
        await h.say("anyone?")
        assert h.transport.texts() == [unavailable_notice(fake_llm.base_url)] * 2
        assert h.app.monitor is not None
        report = await h.app.monitor.collect()
        assert not report.healthy and report.watchdog_ok
        assert report.llm_failed_calls == 2 and report.llm_outage_failures == 2
        assert report.llm_outage_since is not None
        [problem] = report.problems
        assert problem.startswith("LLM unavailable since") and "Fix" in problem
        assert any(line.startswith("  LLM DOWN:") for line in render(report)[0])
    finally:
        await h.app.close()


async def _discord(
    fake: FakeDiscord, config: DiscordConfig, delays: list[float] | None = None
) -> tuple[DiscordTransport, Echo]:
    async def sleep(seconds: float) -> None:
        if delays is not None:
            delays.append(seconds)
        await asyncio.sleep(0)

    echo = Echo()
    transport = build_discord(config, env={"DISCORD_TOKEN": TOKEN}, sleep=sleep, rand=lambda: 0.0)
    echo.transport = transport
    await transport.start(echo)
    await asyncio.wait_for(fake.ready.wait(), 5)
    await _until_up(transport)
    return transport, echo


async def _until_up(transport: DiscordTransport) -> None:
    """Until discord.py said ready (after the guilds arrived)."""
    for _ in range(1000):
        if transport.health().link == "up":
            return
        await asyncio.sleep(0.01)
    raise AssertionError(transport.health())


async def test_a_token_revoked_while_running_stops_discord_and_keeps_its_replies(
    fake_discord: FakeDiscord, caplog: pytest.LogCaptureFixture
) -> None:
    transport, _ = await _discord(fake_discord, DiscordConfig(channels=(CHANNEL_ID,)))
    assert transport.health().link == "up" and not transport.health().problem
    fake_discord.token = "reset-by-the-owner"
    await fake_discord.disconnect(4004)  # Discord: "authentication failed"
    await asyncio.wait_for(transport.wait_closed(), 10)
    health = transport.health()
    assert health.link == "stopped"
    assert "rejected the token in DISCORD_TOKEN" in health.problem and "Fix" in health.problem
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "rejected the token" in errors[0]
    assert fake_discord.logins == 1  # not retried: a retry cannot fix a refused token
    delivery = await transport.send(Reply(inbound=Inbound("discord", str(ALICE), "x"), text="y"))
    assert delivery.status is DeliveryStatus.PENDING  # stays in the outbox
    await transport.stop()


async def test_an_unexpected_failure_in_discord_py_restarts_with_backoff(
    fake_discord: FakeDiscord, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = DiscordWebSocket.received_message
    armed = {"now": False}

    async def received(self: DiscordWebSocket, msg: Any) -> None:
        if armed["now"]:
            armed["now"] = False
            raise RuntimeError("a bug inside discord.py's gateway loop")
        await original(self, msg)

    monkeypatch.setattr(DiscordWebSocket, "received_message", received)
    delays: list[float] = []
    transport, echo = await _discord(
        fake_discord, DiscordConfig(channels=(CHANNEL_ID,), retry_initial=2), delays
    )
    try:
        assert fake_discord.sessions == 1
        armed["now"] = True
        await fake_discord.dispatch("TYPING_START", {"channel_id": str(CHANNEL_ID)})
        for _ in range(500):
            if fake_discord.sessions == 2:
                break
            await asyncio.sleep(0.01)
        await _until_up(transport)
        assert fake_discord.sessions == 2, transport.health()  # restarted: a new session
        assert delays == [1.0]  # backoff (2 s initial, jitter 0 -> half)
        assert not transport.health().problem
        await fake_discord.say(fake_discord.dm_message("still there?"))
        await echo.wait_delivered(1)  # DMs are answered again
    finally:
        await transport.stop()


async def test_message_content_intent_off_shows_in_health(fake_discord: FakeDiscord) -> None:
    fake_discord.enforce_content_intent = True
    config = DiscordConfig(channels=(CHANNEL_ID,), message_content_intent=False)
    transport, echo = await _discord(fake_discord, config)
    try:
        await fake_discord.say(
            fake_discord.guild_message("chatter for the channel", author=user(ALICE, "alice"))
        )
        await fake_discord.say(fake_discord.guild_message("hi bot", mention_bot=True))
        await echo.wait_delivered(1)  # events are handled in order: the first was decided
        health = transport.health()
        assert health.link == "up"
        assert "Message Content intent is off" in health.problem and "Fix" in health.problem
    finally:
        await transport.stop()


def test_discord_exceptions_sorted_into_retry_or_stay_stopped() -> None:
    from bot.transports.discord_connect import cannot_work

    class Closed(discord.ConnectionClosed):
        def __init__(self, code: int) -> None:
            self.code = code

    assert cannot_work(discord.LoginFailure(), env="T") is not None
    assert cannot_work(Closed(4004), env="T") is not None
    assert cannot_work(Closed(4013), env="T") is not None
    assert cannot_work(Closed(4000), env="T") is None
    assert cannot_work(RuntimeError("bug"), env="T") is None
