"""No forgotten text reaches the model from background memory work, across gateways.

Gateway B runs ``!forget`` (the store's ``forget_person``) while gateway A's background work
on the same person is between two model calls: a chapter between its first attempt and its
"shorter" retry, a merge between its attempts, a session's upkeep between its summary call
and its fact extraction. The fake LLM (real HTTP, the real openai client) records every
request: none after the forget carries the forgotten words, and A's work ends quietly (no
ERROR line, no exception). Each test runs on SQLite (a second connection to the same file) and
on PostgreSQL (two gateways on one database; skipped with a note when no server can start).

Before: the chapter and merge retries were sent with the forgotten text, and the failed save
was logged as an ERROR.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from bot.config import LLMConfig, SummaryConfig
from bot.domain import ConversationKey
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import ChatMessage, Completion
from bot.llm.tokens import make_counter
from bot.memory.facts import FactExtractor
from bot.memory.port import MemoryStore
from bot.memory.sessions import SessionKeeper
from bot.memory.store import SqliteStore
from bot.memory.summary import Summarizer
from tests import pg_server
from tests.conftest import STORES
from tests.fakes.fake_llm import FakeLLM

KEY = ConversationKey("mesh", "!0000abcd")
SECRET = "Selkie-7788"  # the forgotten words


@pytest.fixture(params=sorted(STORES))
async def gateways(
    request: pytest.FixtureRequest, tmp_path: Any
) -> AsyncIterator[tuple[MemoryStore, MemoryStore]]:
    """Gateway A's store and gateway B's, on one database."""
    a = await STORES[request.param](tmp_path)
    if isinstance(a, SqliteStore):
        b: MemoryStore = await SqliteStore.open(a.path)
    else:
        from bot.memory.postgres import PostgresStore

        assert isinstance(a, PostgresStore)
        b = await PostgresStore.open(a.url, password=pg_server.BOT_PASSWORD, gateway="b")
    try:
        yield a, b
    finally:
        await b.close()
        await a.close()


class ForgetAfter:
    """The LLM port in front of the real client: once its ``after``-th call has returned,
    gateway B forgets the person (before A goes on)."""

    def __init__(
        self, inner: OpenAICompatLLM, *, after: int, forget: Callable[[], Awaitable[object]]
    ):
        self._inner, self._after, self._forget = inner, after, forget
        self.calls = 0

    @property
    def model_name(self) -> str:
        return self._inner.model_name

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, **kw: Any
    ) -> Completion:
        completion = await self._inner.complete(messages, max_tokens=max_tokens, **kw)
        self.calls += 1
        if self.calls == self._after:
            await self._forget()
        return completion


def _llm(fake: FakeLLM) -> OpenAICompatLLM:
    cfg = LLMConfig.model_validate({"base_url": fake.base_url, "model": "m", "retries": 0})
    return OpenAICompatLLM(config=cfg, env={})


def _carrying(fake: FakeLLM) -> list[bool]:
    """Per request, whether it holds the forgotten words."""
    return [SECRET in str(r["messages"]) for r in fake.chat_requests()]


async def _chat(store: MemoryStore, n: int, *, at: float | None = None) -> list[int]:
    conv = await store.conversation(KEY)
    start = time.time() if at is None else at
    return [
        await store.add_message(
            conv.id, role="user" if i % 2 == 0 else "assistant",
            author="ana" if i % 2 == 0 else "bot",
            text=f"my door code is {SECRET}, line {i}" if i % 2 == 0 else f"Noted {i}.",
            tokens=8, status="answered", created_at=start + i,
        )
        for i in range(n)
    ]  # fmt: skip


def _no_errors(caplog: pytest.LogCaptureFixture) -> None:
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_forget_between_a_chapter_and_its_retry_sends_nothing_more(
    gateways: tuple[MemoryStore, MemoryStore], fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = gateways
    ids = await _chat(a, 12)
    inner = _llm(fake_llm)
    llm = ForgetAfter(inner, after=1, forget=lambda: b.forget_person(KEY.transport, KEY.person))
    summ = Summarizer(store=a, llm=llm, counter=make_counter(),
                      config=SummaryConfig(min_evicted=6))  # fmt: skip
    conv = await a.conversation(KEY)
    fake_llm.script = [("length", "A chapter cut short by max tokens and so")]  # retry due
    try:
        with caplog.at_level(logging.INFO):
            assert not await summ.refresh(conv, window_start_id=ids[10])
        assert _carrying(fake_llm) == [True]  # the first attempt only; no retry was sent
        assert await a.find_conversation(KEY) is None
        _no_errors(caplog)
    finally:
        await inner.close()


async def test_a_forget_between_merge_attempts_sends_nothing_more(
    gateways: tuple[MemoryStore, MemoryStore], fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = gateways
    ids = await _chat(a, 6)
    conv = await a.conversation(KEY)
    for first, last in ((ids[0], ids[2]), (ids[3], ids[5])):
        await a.save_summary(conv.id, text=f"Ana's door code is {SECRET}.", tokens=8,
                             first_message_id=first, last_message_id=last)  # fmt: skip
    inner = _llm(fake_llm)
    llm = ForgetAfter(inner, after=1, forget=lambda: b.forget_person(KEY.transport, KEY.person))
    summ = Summarizer(store=a, llm=llm, counter=make_counter(), config=SummaryConfig())
    fake_llm.script = [("length", "A merge cut short by max tokens and so")]
    try:
        with caplog.at_level(logging.INFO):
            assert not await summ.merge(conv)
        assert _carrying(fake_llm) == [True]
        _no_errors(caplog)
    finally:
        await inner.close()


@pytest.mark.parametrize("after", [1, 3], ids=["after-summary", "during-long-term"])
async def test_a_forget_during_session_upkeep_sends_nothing_more(
    gateways: tuple[MemoryStore, MemoryStore],
    fake_llm: FakeLLM,
    caplog: pytest.LogCaptureFixture,
    after: int,
) -> None:
    """Gateway A's session upkeep makes three calls: the session summary, fact extraction
    from the same messages, the long-term summary. Gateway B forgets after the first (A is
    between its summary call and its fact extraction) or while the third runs (A's save
    then finds the person gone)."""
    import time

    a, b = gateways
    await _chat(a, 6, at=time.time() - 10 * 3600)  # a session that closed long ago
    inner = _llm(fake_llm)
    forget = lambda: b.forget_person(KEY.transport, KEY.person)  # noqa: E731
    llm = ForgetAfter(inner, after=after, forget=forget)
    extractor = FactExtractor(store=a, llm=llm, counter=make_counter(), max_facts=20)
    keeper = SessionKeeper(store=a, llm=llm, counter=make_counter(), gap=3600.0,
                           extractor=extractor)  # fmt: skip
    fake_llm.reply = "Door code\nAna gave her door code."
    conv = await a.conversation(KEY)
    try:
        with caplog.at_level(logging.INFO):
            assert len(await keeper.close_sessions(conv.id)) == 1
            [session] = await a.sessions(conv.id)
            await keeper.summarize(session)
            await keeper.tick()  # the next round finds nothing of the person
        assert len(fake_llm.chat_requests()) == after  # nothing sent after the forget
        assert _carrying(fake_llm)[:2] == [True, True][:after]  # summary, then facts
        assert await a.conversations_of(KEY.transport, KEY.person) == []
        _no_errors(caplog)
    finally:
        await inner.close()
