"""Discord answering 5xx: one answer on screen, whether the error came before the message was
created or AFTER it (a gateway timeout behind which the write happened: the world does this)
(issue 18). The whole app on SQLite and on a real PostgreSQL, discord.py against the loopback
Discord, which honours ``enforce_nonce`` like Discord (a repeated nonce returns the first
message and creates nothing) and can answer 5xx after doing the write (``fail_after_write``).

Before the fix every post carried discord.py's random nonce, so a post repeated by the outbox
or by a stream's finish (after a 503, which discord.py raises at once) created a second
message. 500/502/504 are retried by discord.py itself with the same nonce (1 s later).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import discord.http
import pytest

from bot.app import App
from tests import test_discord_restart as restart
from tests.fakes.fake_discord import CHANNEL_ID, FakeDiscord
from tests.fakes.fake_llm import FakeLLM
from tests.test_discord_restart import SHORT, Backend, backend, screen, until

__all__ = ["backend"]  # the fixture: each test on SQLite and on PostgreSQL


@contextlib.asynccontextmanager
async def started(
    tmp_path: Path, llm: FakeLLM, fake: FakeDiscord, backend: Backend, *, stream: bool
) -> AsyncIterator[App]:
    async with restart.started(
        tmp_path, llm, fake, backend, edit_seconds=0.2, stream=stream
    ) as app:
        yield app


async def _ask(fake: FakeDiscord, app: App, llm: FakeLLM) -> None:
    """Ask a new question and wait until its turn is over. Waits for the model's request, not
    for a busy responder: a turn whose post fails at once can start and end between two polls."""
    before = len(llm.chat_requests())
    await fake.say(fake.guild_message("what is LoRa?", mention_bot=True))
    await until(lambda: len(llm.chat_requests()) > before)
    await app.responder.wait_idle()


async def test_a_post_refused_before_the_write_is_sent_once_later(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord, backend: Backend
) -> None:
    await _refused_then_sent(tmp_path, fake_llm, fake_discord, backend, 503)


class _HttpAsyncio:
    """``discord.http``'s view of ``asyncio``: every ``sleep`` it asks for is recorded and
    waited ``SCALE`` of; everything else is asyncio itself."""

    SCALE = 0.01

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float, result: Any = None) -> Any:
        self.waits.append(delay)
        return await asyncio.sleep(delay * self.SCALE, result)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_post_refused_past_discord_py_retries_is_sent_once_later(
    tmp_path: Path,
    fake_llm: FakeLLM,
    fake_discord: FakeDiscord,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """502 five times: past discord.py's own retries (it waits 1, 3, 5, 7 and 9 s between
    its five tries; those waits are recorded and run at 1/100 here: 25 s of idle time), then
    the outbox's round sends it once. On SQLite only: what the store does (the row kept, then
    delivered once) is the 503 test's path, which runs on both backends; this test adds
    discord.py's retries, which no backend changes."""
    http_asyncio = _HttpAsyncio()
    monkeypatch.setattr(discord.http, "asyncio", http_asyncio)
    await _refused_then_sent(tmp_path, fake_llm, fake_discord, backend, 502)
    # every one of discord.py's 5xx retries ran (its rate-limit waits are 0 s here)
    assert [w for w in http_asyncio.waits if w] == [1, 3, 5, 7, 9]


async def _refused_then_sent(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord, backend: Backend, status: int
) -> None:
    fake_llm.reply = SHORT
    fake_discord.fail_status = status
    fake_discord.fail_requests = 1 if status == 503 else 5  # 502: past discord.py's retries
    async with started(tmp_path, fake_llm, fake_discord, backend, stream=False) as app:
        await _ask(fake_discord, app, fake_llm)
        assert screen(fake_discord) == []  # nothing was created
        assert len(await app.store.undelivered(transports=["discord"])) == 1  # kept
        await app.responder.redeliver()  # the next outbox round
        await until(lambda: bool(screen(fake_discord)))
        await app.responder.wait_idle()
        assert screen(fake_discord) == [SHORT]
        assert await app.store.undelivered(transports=["discord"]) == []
    assert len(fake_llm.chat_requests()) == 1


@pytest.mark.parametrize("status", [503, 504])
async def test_a_post_answered_5xx_after_discord_created_it_shows_once(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord, backend: Backend, status: int
) -> None:
    """503: discord.py gives up at once, the outbox repeats the post later (fails before the
    fix: two messages). 504: discord.py repeats it itself a second later."""
    fake_llm.reply = SHORT
    fake_discord.fail_status = status
    fake_discord.fail_after_write = 1
    async with started(tmp_path, fake_llm, fake_discord, backend, stream=False) as app:
        await _ask(fake_discord, app, fake_llm)
        if status == 503:
            assert len(await app.store.undelivered(transports=["discord"])) == 1
            await app.responder.redeliver()
            await until(lambda: fake_discord.deduped > 0)
            await app.responder.wait_idle()
        assert screen(fake_discord) == [SHORT]
        assert fake_discord.deduped == 1  # the repeat created nothing
        assert await app.store.undelivered(transports=["discord"]) == []


async def test_a_stream_post_answered_5xx_after_the_write_is_finished_not_repeated(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord, backend: Backend
) -> None:
    """The stream's first post is created, then answered 503: streaming stops, and ``finish``
    posts the part again with the same nonce, getting the first message, which it edits into
    the whole answer (before the fix: the half answer stayed and a second message followed)."""
    fake_llm.reply = SHORT
    fake_llm.script = [("slow", 0.05)]
    fake_discord.fail_after_write = 1
    async with started(tmp_path, fake_llm, fake_discord, backend, stream=True) as app:
        await _ask(fake_discord, app, fake_llm)
        assert screen(fake_discord) == [SHORT]
        assert fake_discord.deduped == 1
        assert await app.store.undelivered(transports=["discord"]) == []


async def test_a_stream_edit_answered_5xx_after_the_write_still_ends_whole(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord, backend: Backend
) -> None:
    """An edit (PATCH) done by Discord but answered 503: editing again is harmless; the one
    message ends showing the whole answer."""
    fake_llm.reply = SHORT
    fake_llm.script = [("slow", 0.05)]
    async with started(tmp_path, fake_llm, fake_discord, backend, stream=True) as app:
        await fake_discord.say(fake_discord.guild_message("what is LoRa?", mention_bot=True))
        await until(lambda: bool(fake_discord.sent))  # the stream's first message is up
        fake_discord.fail_after_write = 1  # the next edit is done, then answered 503
        await until(lambda: not app.responder.idle)
        await app.responder.wait_idle()
        if await app.store.undelivered(transports=["discord"]):
            await app.responder.redeliver()  # the finish fell on the 503: the outbox's turn
            await app.responder.wait_idle()
        assert fake_discord.fail_after_write == 0  # an edit did get the 503
        assert screen(fake_discord) == [SHORT]
        assert await app.store.undelivered(transports=["discord"]) == []


async def test_a_stream_post_lost_to_a_5xx_and_a_restart_is_reused_by_the_next_stream(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord, backend: Backend
) -> None:
    """The stream's first post is created but answered 503, so its id is never known; the app
    stops while the model still writes. After the restart the new stream posts that part with
    the nonce the first one recorded, gets the half message back and finishes it (before the
    fix: the half answer stayed and the whole one was posted below it)."""
    fake_llm.reply = SHORT
    fake_llm.script = [("stall", 6)]
    fake_discord.fail_after_write = 1
    async with started(tmp_path, fake_llm, fake_discord, backend, stream=True):
        await fake_discord.say(fake_discord.guild_message("what is LoRa?", mention_bot=True))
        await until(lambda: bool(fake_discord.sent) and fake_discord.fail_after_write == 0)
        await asyncio.sleep(0.3)  # the stream has given up on edits; the model stalls
    [half] = fake_discord.visible(CHANNEL_ID)
    assert SHORT.startswith(half.content) and half.content != SHORT
    async with started(tmp_path, fake_llm, fake_discord, backend, stream=True) as app:
        await until(lambda: screen(fake_discord) == [SHORT])
        await app.responder.wait_idle()
        assert [s.id for s in fake_discord.visible(CHANNEL_ID)] == [half.id]
        assert fake_discord.deduped == 1
        assert await app.store.undelivered(transports=["discord"]) == []
