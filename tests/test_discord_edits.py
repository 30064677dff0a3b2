"""Edited Discord messages: what is stored follows the edit (old words gone from memory and
search), the newest question is answered again when its words changed (the old answer
withdrawn), a question not answered yet is answered as edited, and an edit that adds or
removes the mention is handled as what it now is."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.domain import DM_SPACE, ConversationKey
from bot.memory.records import StoredMessage
from bot.responder import WITHDRAWN
from bot.transports.discord import EDITED_NOTE
from tests.fakes.fake_discord import ALICE, FakeDiscord
from tests.fakes.fake_llm import FakeLLM
from tests.test_discord_app import CHANNEL_SPACE, Rig, running


async def _settle(rig: Rig, sent: int) -> None:
    await rig.discord.wait_sent(sent)
    await rig.app.responder.wait_idle()


async def _stored_if_any(rig: Rig) -> list[StoredMessage]:
    conv = await rig.app.store.find_conversation(ConversationKey("discord", str(ALICE), DM_SPACE))
    return [] if conv is None else await rig.app.store.all_messages(conv.id)


async def test_a_password_edited_out_of_a_dm_leaves_memory_and_is_answered_again(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        msg = await fake_discord.say(fake_discord.dm_message("my wifi password is HUNTER2"))
        await _settle(rig, 1)
        await fake_discord.edit_by_author(msg, "my wifi password is (removed)")
        await _settle(rig, 2)
        stored = await rig.stored(DM_SPACE)
        assert [m.text for m in stored if m.role == "user"] == ["my wifi password is (removed)"]
        assert next(m.text for m in stored if m.role == "assistant") == WITHDRAWN
        assert not any("HUNTER2" in m.text for m in stored)
        conv = stored[0].conversation_id
        found = await rig.app.store.search_terms(conv, ["hunter2"], after_id=0, before_id=1 << 62)
        assert found == [[]]
        assert (await rig.app.store.search_terms(conv, ["removed"], after_id=0,
                                                 before_id=1 << 62))[0]  # fmt: skip
        # answered again, marked as the answer to the edit, and the model no longer sees it
        again = fake_discord.sent[1]
        assert EDITED_NOTE in again.content
        assert again.reference_id == int(msg["id"])
        assert "HUNTER2" not in rig.prompt()
        await rig.exchange(fake_discord.dm_message("what did I tell you?"))
        assert "HUNTER2" not in rig.prompt()


async def test_an_unchanged_or_older_message_edit_only_updates_memory(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        first = await fake_discord.say(fake_discord.dm_message("the gate code is 1234"))
        await _settle(rig, 1)
        await rig.exchange(fake_discord.dm_message("thanks"))
        await fake_discord.edit_by_author(first, "the gate code is secret")
        await fake_discord.say(fake_discord.dm_message("bye"))  # events are handled in order
        await _settle(rig, 3)
        assert len(fake_discord.sent) == 3  # an older question: no second answer
        texts = [m.text for m in await rig.stored(DM_SPACE)]
        assert "the gate code is secret" in texts and "the gate code is 1234" not in texts


async def test_an_edit_that_adds_the_mention_is_answered_and_one_that_removes_it_is_not(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        plain = await fake_discord.say(fake_discord.guild_message("what is LoRa?"))
        await fake_discord.edit_by_author(plain, "what is LoRa?", mention_bot=True)
        await _settle(rig, 1)
        assert fake_discord.sent[0].reference_id == int(plain["id"])
        [question, _] = await rig.stored(CHANNEL_SPACE)
        assert question.text == "what is LoRa?"
        # now the mention goes, and the text changes: stored as edited, not answered again
        await fake_discord.edit_by_author(plain, "never mind", mention_bot=False)
        await fake_discord.say(fake_discord.guild_message("next", mention_bot=True))
        await _settle(rig, 2)
        texts = [m.text for m in await rig.stored(CHANNEL_SPACE) if m.role == "user"]
        assert texts == ["never mind", "next"]
        assert len(fake_discord.sent) == 2


async def test_a_question_edited_before_its_answer_is_answered_as_edited(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        fake_llm.script = [("sleep", 1.5)]  # the first answer is still being written
        first = await fake_discord.say(fake_discord.dm_message("one"))
        for _ in range(300):  # (two events at once may be handled in either order)
            if fake_llm.chat_requests():
                break
            await asyncio.sleep(0.01)
        second = await fake_discord.say(fake_discord.dm_message("tpyo here"))
        for _ in range(300):  # stored and waiting: the slot is busy with the first answer
            if any(m.text == "tpyo here" for m in await _stored_if_any(rig)):
                break
            await asyncio.sleep(0.01)
        assert len(fake_llm.chat_requests()) == 1
        await fake_discord.edit_by_author(second, "typo fixed")
        await _settle(rig, 2)
        assert first
        last = fake_llm.chat_requests()[-1]["messages"][-1]["content"]
        assert last == "typo fixed"
        assert len(fake_discord.sent) == 2
