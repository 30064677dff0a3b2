"""Followed threads: once @mentioned in a thread the bot answers every message there until
``!stop``, archiving, or silence; catch-up reads followed threads and a DM channel seen for
the first time."""

from __future__ import annotations

from pathlib import Path

from bot.transports.discord_threads import UNFOLLOWED
from tests.fakes.fake_discord import (
    BOB,
    CHANNEL_ID,
    GUILD_ID,
    OTHER_THREAD_ID,
    THREAD_ID,
    FakeDiscord,
    user,
)
from tests.fakes.fake_llm import FakeLLM
from tests.test_discord_app import running


async def test_mentioned_once_in_a_thread_then_every_message_is_answered_until_stop(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        await rig.exchange(
            fake_discord.guild_message("help me here", mention_bot=True, channel_id=THREAD_ID)
        )
        follow_up = await rig.exchange(
            fake_discord.guild_message("and then?", channel_id=THREAD_ID, author=user(BOB, "bob"))
        )
        assert follow_up.channel_id == THREAD_ID  # answered without a mention
        stop = await rig.exchange(fake_discord.guild_message("!stop", channel_id=THREAD_ID))
        assert stop.content == UNFOLLOWED
        ignored = await fake_discord.say(
            fake_discord.guild_message("anyone?", channel_id=THREAD_ID)
        )
        back = await rig.exchange(
            fake_discord.guild_message("back", mention_bot=True, channel_id=THREAD_ID)
        )
        assert back.reference_id != int(ignored["id"])
        assert len(fake_discord.sent) == 4
        # a thread of a channel that is not allowed is never followed
        await fake_discord.say(
            fake_discord.guild_message("hi", mention_bot=True, channel_id=OTHER_THREAD_ID)
        )
        await rig.exchange(fake_discord.guild_message("sentinel", mention_bot=True))
        assert len(fake_discord.sent) == 5


async def test_an_archived_thread_is_no_longer_followed(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        await rig.exchange(
            fake_discord.guild_message("start", mention_bot=True, channel_id=THREAD_ID)
        )
        thread = fake_discord._guild()["threads"][0]
        thread["thread_metadata"]["archived"] = True
        await fake_discord.dispatch("THREAD_UPDATE", thread | {"guild_id": str(GUILD_ID)})
        await fake_discord.say(fake_discord.guild_message("still there?", channel_id=THREAD_ID))
        await rig.exchange(fake_discord.guild_message("sentinel", mention_bot=True))
        assert len(fake_discord.sent) == 2


async def test_catch_up_reads_followed_threads_and_a_new_dm_channel(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    seen = tmp_path / "discord-seen.json"
    async with running(tmp_path, fake_llm, fake_discord, seen=seen) as rig:
        await rig.exchange(
            fake_discord.guild_message("follow this", mention_bot=True, channel_id=THREAD_ID)
        )
    # while the bot is away: a follow-up in the thread, and Bob's first-ever DM
    fake_discord.post_offline(fake_discord.guild_message("missed in thread", channel_id=THREAD_ID))
    first_dm = fake_discord.post_offline(
        fake_discord.dm_message("hello, first time", author=user(BOB, "bob"))
    )
    async with running(tmp_path, fake_llm, fake_discord, seen=seen) as rig:
        await fake_discord.wait_sent(2)
        await rig.app.responder.wait_idle()
        assert fake_discord.sent[1].channel_id == THREAD_ID
        assert len(fake_discord.sent) == 2  # the DM channel is unknown until Bob writes again
        await rig.exchange(fake_discord.dm_message("are you there?", author=user(BOB, "bob")))
        await fake_discord.wait_sent(4)
        await rig.app.responder.wait_idle()
        dm_answers = [
            s for s in fake_discord.sent if s.channel_id == fake_discord.dm_channel_id(BOB)
        ]
        assert dm_answers[0].reference_id == int(first_dm["id"])
        assert len(dm_answers) == 2


async def test_open_threads_answers_a_channel_question_in_a_new_followed_thread(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    keys = "  open_threads: true\n"
    async with running(tmp_path, fake_llm, fake_discord, discord_keys=keys) as rig:
        question = await fake_discord.say(
            fake_discord.guild_message("how far does LoRa reach?", mention_bot=True)
        )
        [answer] = await fake_discord.wait_sent(1)
        await rig.app.responder.wait_idle()
        [(channel, message, name)] = fake_discord.threads_opened
        assert (channel, message, name) == (CHANNEL_ID, int(question["id"]),
                                            "how far does LoRa reach?")  # fmt: skip
        thread_id = answer.channel_id
        assert thread_id != CHANNEL_ID
        # the follow-up in the thread needs no mention and continues the same conversation
        await rig.exchange(fake_discord.guild_message("and in a city?", channel_id=thread_id))
        prompt = rig.prompt()
        assert "how far does LoRa reach?" in prompt and "and in a city?" in prompt
        # a thread cannot be opened (no permission): answered in the channel, as before
        fake_discord.threads_allowed = False
        said = await rig.exchange(fake_discord.guild_message("again", mention_bot=True))
        assert said.channel_id == CHANNEL_ID
