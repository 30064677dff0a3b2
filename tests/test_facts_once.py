"""Each message is read for facts once (issue 17): a summary fold reads its chapter's messages
for facts, and the session's close then reads only what the folds did not (the store's
``facts_through`` mark), so the model is not asked about the same messages twice. A range
whose extraction failed is read by the next one (nothing is skipped). SQLite and a real
PostgreSQL, the real openai client over HTTP to the fake server; extraction requests are
counted."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.config import LLMConfig, SummaryConfig
from bot.domain import ConversationKey
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.tokens import make_counter
from bot.memory.facts import MAX_INPUT_MESSAGES, FactExtractor
from bot.memory.port import MemoryStore
from bot.memory.sessions import SessionKeeper
from bot.memory.summary import Summarizer
from tests.conftest import STORES
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.memory_script import MemoryScript

SHOWN = re.compile(r"^\[(\d+)\] ", re.MULTILINE)


class ShownScript(MemoryScript):
    """Records the message ids each extraction request showed."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: list[list[int]] = []

    def __call__(self, body: dict[str, Any]) -> str:
        system = body["messages"][0]["content"]
        if system.startswith("You keep a short list of durable facts"):
            self.shown.append([int(i) for i in SHOWN.findall(body["messages"][1]["content"])])
        return super().__call__(body)


class Rig:
    def __init__(self, store: MemoryStore, llm: OpenAICompatLLM, script: ShownScript) -> None:
        counter = make_counter()
        self.store, self.llm, self.script = store, llm, script
        self.extractor = FactExtractor(store=store, llm=llm, counter=counter, max_facts=20)
        self.summarizer = Summarizer(store=store, llm=llm, counter=counter,
                                     config=SummaryConfig(), extractor=self.extractor)  # fmt: skip
        self.sessions = SessionKeeper(store=store, llm=llm, counter=counter, gap=3600.0,
                                      extractor=self.extractor)  # fmt: skip

    async def chat(self, n: int) -> list[int]:
        conv = await self.store.conversation(ConversationKey("console", "alice"))
        start = time.time() - 10 * 3600  # the session ended long ago: its close is due
        return [
            await self.store.add_message(
                conv.id, role="user" if i % 2 == 0 else "assistant",
                author="alice" if i % 2 == 0 else "bot", text=f"line {i}", tokens=3,
                status="answered", created_at=start + i,
            )
            for i in range(n)
        ]  # fmt: skip


@pytest.fixture(params=sorted(STORES))
async def rig(
    request: pytest.FixtureRequest, tmp_path: Path, fake_llm: FakeLLM
) -> AsyncIterator[Rig]:
    script = ShownScript()
    fake_llm.reply_fn = script
    store = await STORES[request.param](tmp_path)
    llm = OpenAICompatLLM(
        config=LLMConfig.model_validate({"base_url": fake_llm.base_url, "model": "m",
                                         "retries": 0}), env={},
    )  # fmt: skip
    yield Rig(store, llm, script)
    await llm.close()
    await store.close()


async def test_a_fold_then_the_session_close_read_each_message_once(rig: Rig) -> None:
    ids = await rig.chat(130)
    conv = await rig.store.conversation(ConversationKey("console", "alice"))
    for _ in range(2):  # two chapters of 60 messages: 0..59, 60..119
        assert await rig.summarizer.refresh(conv, window_start_id=ids[120])
        await rig.summarizer.wait_quiet()
    assert rig.script.shown == [ids[0:60], ids[60:120]]  # each fold read its chapter
    assert await rig.store.facts_through(conv.id) == ids[119]
    assert (await rig.sessions.tick()).summarized == 1  # the session (all 130) closes
    # Before the mark, the close read the whole session again: 3 more calls (130 messages in
    # chunks of 60), 120 messages twice. Now it reads the 10 the fold had not.
    assert rig.script.shown[2:] == [ids[120:]]
    read = [i for chunk in rig.script.shown for i in chunk]
    assert sorted(read) == ids  # every message read, none twice
    assert len(rig.script.shown) == 3 == -(-120 // MAX_INPUT_MESSAGES) + 1
    assert await rig.store.facts_through(conv.id) == ids[-1]
    assert (await rig.sessions.tick()).summarized == 0  # nothing left: no call at all
    assert len(rig.script.shown) == 3


async def test_a_range_left_unread_by_a_failed_call_is_read_by_the_next(rig: Rig) -> None:
    """The fold's chapter is written but its facts are not read (as when that call fails);
    the session close then reads from the mark, the chapter's messages included."""
    ids = await rig.chat(40)
    conv = await rig.store.conversation(ConversationKey("console", "alice"))
    rig.summarizer._extractor = None  # this fold extracts nothing (as if its call had failed)
    assert await rig.summarizer.refresh(conv, window_start_id=ids[30])
    await rig.summarizer.wait_quiet()
    assert rig.script.shown == [] and await rig.store.facts_through(conv.id) == 0
    assert (await rig.sessions.tick()).summarized == 1
    assert rig.script.shown == [ids]


async def test_an_extraction_given_a_later_range_reads_the_unread_gap_first(rig: Rig) -> None:
    ids = await rig.chat(20)
    conv = await rig.store.conversation(ConversationKey("console", "alice"))
    await rig.extractor.extract(conv.id, (await rig.store.all_messages(conv.id))[:6])
    assert rig.script.shown == [ids[:6]]
    later = (await rig.store.all_messages(conv.id))[14:]
    await rig.extractor.extract(conv.id, later)  # 6..13 were never read: read them first
    assert rig.script.shown[1:] == [ids[6:]]
    await rig.extractor.extract(conv.id, later)  # all read: no call
    assert len(rig.script.shown) == 2


async def _say(rig: Rig, key: ConversationKey, n: int, *, start: float) -> list[int]:
    conv = await rig.store.conversation(key)
    return [
        await rig.store.add_message(
            conv.id, role="user" if i % 2 == 0 else "assistant",
            author=key.person if i % 2 == 0 else "bot", text=f"{key.transport} line {i}",
            tokens=3, status="answered", created_at=start + i,
        )
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize("unread", ["other", "home"])
async def test_linking_reads_every_message_of_both_accounts_once(rig: Rig, unread: str) -> None:
    """!link joins the other account's messages into the home. Each side had read its
    messages for facts up to its own mark; the side that wrote first left a tail unread whose
    ids lie below the other side's mark. After the link, the next extraction reads that tail
    (and nothing twice): every message of both accounts is read exactly once."""
    home, other = ConversationKey("console", "alice"), ConversationKey("mesh", "!a1b2")
    first, second = (other, home) if unread == "other" else (home, other)
    start = time.time() - 10 * 3600
    early = await _say(rig, first, 10, start=start)  # ids below the other side's
    conv_first = await rig.store.conversation(first)
    await rig.extractor.extract(conv_first.id, (await rig.store.all_messages(conv_first.id))[:4])
    late = await _say(rig, second, 70, start=start + 100)
    conv_second = await rig.store.conversation(second)
    await rig.extractor.extract(conv_second.id, await rig.store.all_messages(conv_second.id))
    assert await rig.store.facts_through(conv_second.id) == late[-1]
    assert await rig.store.link_dm(home, other) == (10 if unread == "other" else 70)
    conv = await rig.store.conversation(home)
    assert [m.id for m in await rig.store.facts_pending(conv.id)] == early[4:]
    newer = await _say(rig, home, 4, start=start + 1000)
    await rig.extractor.extract(conv.id, (await rig.store.all_messages(conv.id))[-4:])
    read = [i for chunk in rig.script.shown for i in chunk]
    assert sorted(read) == sorted([*early, *late, *newer])  # every message, none twice
    assert rig.script.shown[-1] == [*early[4:], *newer]  # the unread tail first, then the new
    assert await rig.store.facts_pending(conv.id) == []
    assert await rig.store.facts_through(conv.id) == newer[-1]
    calls = len(rig.script.shown)
    await rig.extractor.extract(conv.id, await rig.store.all_messages(conv.id))
    assert len(rig.script.shown) == calls  # nothing left unread: no call


async def test_a_pending_message_is_read_even_when_nothing_new_came(rig: Rig) -> None:
    home, other = ConversationKey("console", "alice"), ConversationKey("mesh", "!a1b2")
    start = time.time() - 10 * 3600
    early = await _say(rig, other, 6, start=start)
    late = await _say(rig, home, 6, start=start + 100)
    conv = await rig.store.conversation(home)
    await rig.extractor.extract(conv.id, await rig.store.all_messages(conv.id))
    await rig.store.link_dm(home, other)
    # A session close over messages all below the mark still reads the linked-in ones.
    await rig.extractor.extract(conv.id, (await rig.store.all_messages(conv.id))[:3])
    assert rig.script.shown == [late, early]
    assert await rig.store.facts_pending(conv.id) == []
