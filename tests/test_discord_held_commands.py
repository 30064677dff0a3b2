"""A Discord command held in the store when the process died runs exactly once after the
restart, although two paths see it: recovery replays the held command, and catch-up reads the
same message back from channel history (the catch-up mark was not saved before the kill).
Catch-up skips every message id held as a command (held, or released and kept as a
tombstone); recovery skips commands this process held itself. The real app, discord.py against
the loopback Discord (tests/fakes/fake_discord.py), the fake LLM over HTTP, a real SQLite file.

Before: catch-up checked stored messages only (commands are not stored as messages), so the
command ran twice: ``!unremember 1`` removed two facts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import discord
import pytest

from bot.app import App
from bot.domain import DM_SPACE, ConversationKey
from bot.memory.store import SqliteStore
from bot.transports import discord as transport_module
from bot.transports.discord_catchup import SeenMarks
from bot.turn_jobs import CommandJob
from bot.turn_queue import Job, TurnQueue
from tests.conftest import make_config
from tests.fakes.fake_discord import ALICE, CHANNEL_ID, FakeDiscord
from tests.fakes.fake_llm import FakeLLM
from tests.test_discord_app import started_caught_up


def _quick_ready(intents: discord.Intents) -> discord.Client:
    # discord.py waits guild_ready_timeout (2 s) for more guilds before on_ready.
    return discord.Client(
        intents=intents, allowed_mentions=transport_module.NO_MENTIONS, guild_ready_timeout=0.05
    )


async def test_a_command_held_at_a_kill_runs_once_though_catch_up_reads_it_again(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setattr(transport_module, "default_client", _quick_ready)
    config = make_config(tmp_path, fake_llm.base_url, f"discord:\n  channels: [{CHANNEL_ID}]\n")

    async def said(app: App, text: str) -> None:
        before = len(fake_discord.sent)
        await fake_discord.say(fake_discord.dm_message(text))
        await fake_discord.wait_sent(before + 1)
        await app.responder.wait_idle()

    app = await started_caught_up(config, fake_discord)
    try:
        await said(app, "!remember my door code is 4521")
        await said(app, "!remember my boat is the Heron")
        # The kill: the command is held, then the process dies before it runs and before the
        # catch-up mark that covers it reaches the disk.
        put = TurnQueue.put

        def dropping(self: TurnQueue, job: Job) -> None:
            if not isinstance(job, CommandJob):
                put(self, job)

        with monkeypatch.context() as m:
            m.setattr(TurnQueue, "put", dropping)
            m.setattr(SeenMarks, "_save", lambda self: None)
            await fake_discord.say(fake_discord.dm_message("!unremember 1"))
            await asyncio.sleep(0.3)
            await app.responder.wait_idle()
            assert len(await app.store.held_commands(transports=["discord"])) == 1
            before = len(fake_discord.sent)
            await app.close()
    finally:
        await app.close()
    for _ in range(2):  # the restart runs it once; a second start runs nothing
        app = await started_caught_up(config, fake_discord)
        await asyncio.sleep(0.3)
        await app.responder.wait_idle()
        await app.close()
    replies = [s.content for s in fake_discord.sent[before:]]
    assert [r for r in replies if r.startswith("Removed fact")] == [
        "Removed fact 1 and its history; 1 left (!facts)."
    ]
    assert len(replies) == 1, replies
    store = await SqliteStore.open(config.database_path)
    try:
        conv = await store.find_conversation(ConversationKey("discord", str(ALICE), DM_SPACE))
        assert conv is not None
        assert [f.text for f in await store.facts(conv.id)] == ["my boat is the Heron"]
        assert await store.held_commands(transports=["discord"]) == []
    finally:
        await store.close()
