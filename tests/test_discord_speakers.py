"""Speakers named in shared Discord channels: the model is told who speaks (display name and
stable id), the prompt's earlier turns never change (cache-stable), DMs are unchanged."""

from __future__ import annotations

import re
from pathlib import Path

from tests.fakes.fake_discord import ALICE, BOB, THREAD_ID, FakeDiscord, user
from tests.fakes.fake_llm import FakeLLM
from tests.test_discord_app import CHANNEL_SPACE, running


def _user_texts(request: dict[str, object]) -> list[str]:
    """The person's messages, without the date line a day's first message opens with."""
    messages = request["messages"]
    assert isinstance(messages, list)
    return [re.sub(r"^\[\d+ \w+ \d+\]\n", "", m["content"]) for m in messages
            if m["role"] == "user"]  # fmt: skip


async def test_two_people_in_a_channel_are_told_apart(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        await rig.exchange(fake_discord.guild_message("I am the treasurer", mention_bot=True))
        await rig.exchange(
            fake_discord.guild_message("who am I?", mention_bot=True, author=user(BOB, "bob"))
        )
        alice, bob = fake_llm.chat_requests()
        assert _user_texts(alice)[-1] == f"Alice (id {ALICE}): I am the treasurer"
        assert _user_texts(bob)[-1] == f"Bob (id {BOB}): who am I?"
        # the name is shown, not stored into the words (search and /history see the words)
        [said, _] = await rig.stored(CHANNEL_SPACE)
        assert said.text == "I am the treasurer"
        assert said.author == f"Alice (id {ALICE})"


async def test_earlier_turns_read_the_same_after_a_rename(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        await rig.exchange(fake_discord.guild_message("first question", mention_bot=True))
        renamed = user(ALICE, "alice")
        renamed["global_name"] = "Queen Alice"
        await rig.exchange(
            fake_discord.guild_message("second question", mention_bot=True, author=renamed)
        )
        first, second = fake_llm.chat_requests()
        # the second prompt extends the first byte for byte (a one-slot server's KV cache)
        assert second["messages"][: len(first["messages"])] == first["messages"]
        assert _user_texts(second)[-1] == f"Queen Alice (id {ALICE}): second question"


async def test_threads_name_speakers_and_dms_do_not(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        await rig.exchange(
            fake_discord.guild_message("in the thread", mention_bot=True, channel_id=THREAD_ID)
        )
        await rig.exchange(fake_discord.dm_message("just us"))
        thread, dm = fake_llm.chat_requests()
        assert _user_texts(thread)[-1] == f"Alice (id {ALICE}): in the thread"
        assert _user_texts(dm)[-1] == "just us"
