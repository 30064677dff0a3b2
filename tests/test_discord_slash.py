"""Slash commands end to end: discord.py's command tree against the loopback Discord's
interactions (registration, INTERACTION_CREATE, callback, follow-ups), the real responder,
commands and memory behind them. A slash command is its ``!`` form answered another way."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from bot.commands import COMMAND_NAMES
from bot.domain import DeliveryStatus, Inbound, Reply, ReplyKind
from bot.transports.discord_slash import NOT_HERE, NOT_YOU, SPECS
from tests.fakes.fake_discord import (
    ALICE,
    BOB,
    CHANNEL_ID,
    GUILD_ID,
    OTHER_CHANNEL_ID,
    THREAD_ID,
    FakeDiscord,
    user,
)
from tests.fakes.fake_llm import FakeLLM
from tests.test_discord_app import CHANNEL_SPACE, running


def test_every_command_has_a_slash_form() -> None:
    assert [s.name for s in SPECS] == list(COMMAND_NAMES)
    assert [s.name for s in SPECS if s.operator] == ["stats", "model", "repin"]


async def test_commands_are_registered_globally_at_start(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord):
        registered = await fake_discord.interactions.wait_registered()
        assert list(registered) == [None]  # global: every server and DMs
        by_name = {c["name"]: c for c in registered[None]}
        assert list(by_name) == list(COMMAND_NAMES)
        assert [o["name"] for o in by_name["remember"]["options"]] == ["fact"]
        assert by_name["remember"]["options"][0]["required"] is True
        assert by_name["history"]["options"][0]["required"] is False
        # operator commands are hidden from members without Manage Server (0x20)
        assert str(by_name["stats"]["default_member_permissions"]) == "32"
        assert by_name["reset"]["default_member_permissions"] is None


async def test_commands_registered_per_guild_when_configured(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    keys = f"  slash_guilds: [{GUILD_ID}]\n"
    async with running(tmp_path, fake_llm, fake_discord, discord_keys=keys):
        registered = await fake_discord.interactions.wait_registered()
        assert list(registered) == [GUILD_ID]
        assert len(registered[GUILD_ID]) == len(COMMAND_NAMES)


async def test_private_answers_are_ephemeral_in_a_channel_and_use_the_same_memory(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    slash = fake_discord.interactions
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        await slash.wait_registered()
        remembered = await slash.wait(await slash.command("remember", {"fact": "I keep bees"}))
        assert remembered.ephemeral
        assert remembered.callback is not None and remembered.callback["type"] == 5  # deferred
        assert remembered.acked_at is not None
        assert remembered.acked_at - remembered.created <= slash.deadline
        facts = await slash.wait(await slash.command("facts"))
        assert facts.ephemeral and "I keep bees" in facts.text
        # the ! form sees the same fact: one command registry, one memory
        answer = await rig.exchange(fake_discord.guild_message("!facts", mention_bot=True))
        assert "I keep bees" in answer.content
        # nothing of the slash answers went into the channel
        assert [s.content for s in fake_discord.visible(CHANNEL_ID)] == [answer.content]
        assert all(a.ephemeral for a in remembered.answers + facts.answers)


async def test_in_a_dm_the_answer_is_a_normal_message(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    slash = fake_discord.interactions
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        await slash.wait_registered()
        await rig.exchange(fake_discord.dm_message("hello"))
        history = await slash.wait(await slash.command("history", {"count": "2"}, dm=True))
        assert not history.ephemeral
        assert "hello" in history.text
        # the DM's history never shows in a channel's /history
        here = await slash.wait(await slash.command("history"))
        assert "hello" not in here.text


async def test_a_command_where_the_bot_does_not_answer_is_refused_privately(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    slash = fake_discord.interactions
    keys = f"  blocked_users: [{BOB}]\n"
    async with running(tmp_path, fake_llm, fake_discord, discord_keys=keys) as rig:
        await slash.wait_registered()
        elsewhere = await slash.wait(
            await slash.command("remember", {"fact": "secret"}, channel_id=OTHER_CHANNEL_ID)
        )
        assert elsewhere.callback is not None and elsewhere.callback["type"] == 4
        assert elsewhere.ephemeral
        assert elsewhere.text == NOT_HERE.format(name="remember")
        blocked = await slash.wait(await slash.command("facts", author=user(BOB, "bob")))
        assert blocked.ephemeral and blocked.text == NOT_YOU
        # a thread of an allowed channel counts as that channel
        in_thread = await slash.wait(await slash.command("facts", channel_id=THREAD_ID))
        assert in_thread.text != NOT_HERE.format(name="facts")
        await rig.app.responder.wait_idle()
        assert fake_discord.sent == []
        assert (
            await rig.app.store.find_conversation(
                Inbound(
                    "discord", str(ALICE), "", space=f"guild:{GUILD_ID}:ch:{OTHER_CHANNEL_ID}"
                ).key
            )
            is None
        )


async def test_an_interaction_acknowledged_late_is_not_run_and_is_logged(
    tmp_path: Path,
    fake_llm: FakeLLM,
    fake_discord: FakeDiscord,
    caplog: pytest.LogCaptureFixture,
) -> None:
    slash = fake_discord.interactions
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        await slash.wait_registered()
        late = [0.0]
        real = fake_discord.clock
        fake_discord.clock = lambda: real() + late[0]
        # Discord's clock passes 4 s between the event and the bot's callback
        slash.deadline = 3.0
        original_dispatch = fake_discord.dispatch

        async def dispatch_then_wait(event: str, data: dict[str, object]) -> None:
            await original_dispatch(event, data)
            if event == "INTERACTION_CREATE":
                late[0] += 4.0

        fake_discord.dispatch = dispatch_then_wait  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="bot.transport.discord"):
            inv = await slash.command("remember", {"fact": "too late"})
            await slash.wait_acked(inv)
            await rig.app.responder.wait_idle()
        assert inv.refused == [("Unknown interaction", 10062)]
        assert inv.answers == []
        assert any("could not be acknowledged" in r.getMessage() for r in caplog.records)
        # not run: the fact was not pinned
        conv = await rig.app.store.find_conversation(
            Inbound("discord", str(ALICE), "", space=CHANNEL_SPACE).key
        )
        assert conv is None or await rig.app.store.facts(conv.id) == []


async def test_operator_commands_answer_operators_only(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    slash = fake_discord.interactions
    ops = f"bot:\n  operators: ['discord:{ALICE}']\n"
    async with running(tmp_path, fake_llm, fake_discord, sections=ops):
        await slash.wait_registered()
        mine = await slash.wait(await slash.command("stats"))
        assert "Unknown command" not in mine.text
        theirs = await slash.wait(await slash.command("stats", author=user(BOB, "bob")))
        assert "Unknown command" in theirs.text


async def test_an_answer_for_a_forgotten_interaction_is_never_posted_in_the_channel(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        [transport] = [t for t in rig.app.transports if t.name == "discord"]
        inbound = Inbound("discord", str(ALICE), "!facts", space=CHANNEL_SPACE,
                          message_id="slash:123")  # fmt: skip
        delivery = await transport.send(Reply(inbound, "1. I keep bees", kind=ReplyKind.COMMAND))
        assert delivery.status is DeliveryStatus.FAILED
        assert "interaction" in (delivery.detail or "")
        await asyncio.sleep(0)
        assert fake_discord.sent == []


async def test_slash_commands_obey_the_rate_limit_and_each_gets_an_answer(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    """Limited like the ! form; but a slash command shows "thinking..." until answered, so
    every limited one gets the notice (the ! form gets one per window)."""
    slash = fake_discord.interactions
    limits = "bot:\n  rate_limit: {messages: 2, per_seconds: 600}\n"
    async with running(tmp_path, fake_llm, fake_discord, sections=limits):
        await slash.wait_registered()
        runs = [await slash.wait(await slash.command("facts")) for _ in range(4)]
        texts = [r.text for r in runs]
        assert all(texts)
        assert texts[2] == texts[3] != texts[0]  # the limit's notice, to each of them
        assert fake_discord.sent == []
