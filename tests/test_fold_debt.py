"""Folds as continuations and as debts, and the gate's lanes (issue 27): a continuation is the
reply's prompt byte for byte plus one task message; a chapter the model cut is kept with what
it has; a debt runs in the slot its reply kept and a reply never preempts it; background work
waits for a gap it fits in; ``!reset``/``!forget`` cancel a fold in flight and nothing said
before reaches the server again."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

from aiohttp import web

from bot.config import LLMConfig, SummaryConfig
from bot.domain import ConversationKey
from bot.llm.gate import LLMGate, hold_for_debt
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import TRUNCATED_MARK, ChatMessage
from bot.llm.tokens import make_counter
from bot.memory.chapter_text import CHAPTER_PROMPT, CONTINUATION_MARK
from bot.memory.store import SqliteStore
from bot.memory.summary import FoldBase, Summarizer
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

KEY = ConversationKey("console", "alice")
UNLIMITED = "bot:\n  rate_limit: {messages: 10000, per_seconds: 1}\n  queue_limit: 100\n"


def _llm(fake: FakeLLM) -> OpenAICompatLLM:
    cfg = LLMConfig.model_validate({"base_url": fake.base_url, "model": "m", "retries": 0})
    return OpenAICompatLLM(config=cfg, env={})


async def _log(store: SqliteStore, n: int) -> list[int]:
    conv = await store.conversation(KEY)
    return [
        await store.add_message(conv.id, role="user" if i % 2 == 0 else "assistant",
                                author="alice" if i % 2 == 0 else "bot",
                                text=f"message {i} about the boat", tokens=5, status="x")
        for i in range(n)
    ]  # fmt: skip


def _base(first_id: int, n: int) -> FoldBase:
    window = [
        ChatMessage("user" if i % 2 == 0 else "assistant", f"message {i} about the boat")
        for i in range(n)
    ]
    return FoldBase((ChatMessage("system", "You are a bot."), *window), first_id)


async def test_a_fold_continues_the_reply_prompt_and_keeps_a_cut_chapter(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    ids = await _log(store, 12)
    llm = _llm(fake_llm)
    summ = Summarizer(store=store, llm=llm, counter=make_counter(),
                      config=SummaryConfig(min_evicted=6))  # fmt: skip
    conv = await store.conversation(KEY)
    base = _base(ids[0], 12)
    # The model never finishes the chapter (max_tokens hit): the fold completes with that.
    fake_llm.script = [("length", "Alice owns a boat. She plans to sail it to")]
    assert summ.maybe_schedule(conv, window_start_id=ids[8], base=base)
    await summ.wait_quiet()
    asks = fake_llm.chat_requests()
    assert len(asks) == 1  # not asked again: a continuation keeps what it has
    sent = asks[0]["messages"]
    assert sent[:-1] == [{"role": m.role, "content": m.content} for m in base.messages]
    task = sent[-1]["content"]
    assert sent[-1]["role"] == "user" and task.startswith(CONTINUATION_MARK)
    assert '"message 8 about the boat"' in task  # where the chapter ends
    assert task.rsplit("\n", 1)[1].startswith("(At most ")  # the word limit is last
    chapter = (await store.summaries(conv))[0]
    assert chapter.text == "Alice owns a boat." + TRUNCATED_MARK
    assert (chapter.first_message_id, chapter.last_message_id) == (ids[0], ids[7])
    assert summ.stats.continued == 1
    await llm.close()


async def test_a_block_outside_the_reply_window_is_asked_for_on_its_own(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    ids = await _log(store, 12)
    llm = _llm(fake_llm)
    summ = Summarizer(store=store, llm=llm, counter=make_counter(),
                      config=SummaryConfig(min_evicted=6))  # fmt: skip
    conv = await store.conversation(KEY)
    fake_llm.reply = "Alice and the bot talked about the boat."
    # The reply's window starts after the block's first message: no continuation possible.
    assert summ.maybe_schedule(conv, window_start_id=ids[8], base=_base(ids[2], 10))
    await summ.wait_quiet()
    sent = fake_llm.chat_requests()[0]["messages"]
    assert len(sent) == 2 and not sent[-1]["content"].startswith(CONTINUATION_MARK)
    assert (await store.summaries(conv))[0].text == "Alice and the bot talked about the boat."
    await llm.close()


async def test_a_debt_runs_in_the_slot_its_reply_kept_and_a_reply_never_preempts_it(
    fake_llm: FakeLLM,
) -> None:
    llm = _llm(fake_llm)
    gate = LLMGate(llm=llm, limit=1)
    answers = {"q1": "first answer", "q2": "second answer", "t": "the chapter of the debt"}
    fake_llm.reply_fn = lambda body: answers[body["messages"][-1]["content"]]
    hold_for_debt()  # as the responder does for a reply with a debt fold after it
    await gate.foreground.complete([ChatMessage("user", "q1")], max_tokens=5)
    # Another reply comes before the debt: the slot is kept for the debt, which goes first.
    other = asyncio.create_task(gate.foreground.complete([ChatMessage("user", "q2")], max_tokens=5))
    await asyncio.sleep(0.2)
    assert not other.done() and len(fake_llm.chat_requests()) == 1
    fake_llm.script = [("slow", 0.1)]  # a debt of a few words, one every 0.1 s
    debt = await gate.debt.complete([ChatMessage("user", "t")], max_tokens=9)
    assert debt.text == "the chapter of the debt"  # not preempted by the waiting reply
    assert (await other).text == "second answer"
    assert [r["messages"][-1]["content"] for r in fake_llm.chat_requests()] == ["q1", "t", "q2"]
    assert fake_llm.cancelled == 0 and gate.stats.debt_calls == 1
    await llm.close()


async def test_a_slot_kept_for_a_debt_that_never_calls_is_let_go_whoever_kept_one(
    fake_llm: FakeLLM, monkeypatch: Any
) -> None:
    """Two replies on a two-slot gate each keep their slot for a debt that never calls: one
    slot is kept at most, and it is let go, so the gate does not shrink for good (it once
    lost a slot here, and every later reply queued behind the missing one)."""
    monkeypatch.setattr("bot.llm.gate.HOLD_SECONDS", 0.05)
    llm = _llm(fake_llm)
    gate = LLMGate(llm=llm, limit=2)
    fake_llm.reply = "an answer"

    async def reply_keeping(q: str) -> None:
        hold_for_debt()
        await gate.foreground.complete([ChatMessage("user", q)], max_tokens=5)

    fake_llm.script = [("slow", 0.05), ("slow", 0.05)]
    await asyncio.gather(reply_keeping("a"), reply_keeping("b"))
    await asyncio.sleep(0.3)  # past HOLD_SECONDS: no debt came
    assert gate._running == 0 and not gate._held
    await llm.close()


async def test_the_next_turn_waits_for_its_chapter_not_for_a_merge_after_it(
    store: SqliteStore, fake_llm: FakeLLM, monkeypatch: Any
) -> None:
    """A debt fold that makes the chapters long enough to merge: the merge runs in a task of
    its own in the background lane, so ``settle`` ends when the chapter is saved. (It once
    waited for the merge, which waits for a free moment that the turn itself prevents: every
    such turn waited ``SETTLE_LIMIT``, 30 s.)"""
    monkeypatch.setattr("bot.memory.summary.SETTLE_LIMIT", 5.0)
    ids = await _log(store, 14)
    conv = await store.conversation(KEY)
    for n in range(2):  # two long chapters already: the next one makes a merge due
        await store.save_summary(conv.id, text=f"chapter {n} about the boat", tokens=150,
                                 first_message_id=ids[n], last_message_id=ids[n])  # fmt: skip
    llm = _llm(fake_llm)
    gate = LLMGate(llm=llm, limit=1, busy=lambda: True)  # a turn is in progress throughout
    summ = Summarizer(store=store, llm=llm, counter=make_counter(), gate=gate,
                      config=SummaryConfig(min_evicted=6))  # fmt: skip
    fake_llm.reply = "Alice talked about the boat."
    base = _base(ids[2], 12)
    summ.before_reply(conv.id, ids[10])  # the reply that makes the fold due keeps its slot
    await gate.foreground.complete(list(base.messages[:-1]), max_tokens=5)
    assert summ.maybe_schedule(conv, window_start_id=ids[10], base=base)
    await summ.settle(conv.id)
    chapters = await store.summaries(conv)
    assert len(chapters) == 3 and chapters[-1].last_message_id == ids[9]  # the chapter came in
    assert summ.running == 0  # the fold is done; the merge waits for a free moment on its own
    assert gate.stats.debt_calls == 1 and gate.stats.background_completed == 1
    await summ.stop()
    await llm.close()


async def test_background_work_waits_for_a_gap_it_fits_in(fake_llm: FakeLLM) -> None:
    now = [0.0]
    llm = _llm(fake_llm)
    gate = LLMGate(llm=llm, limit=1, clock=lambda: now[0])
    gate.prompt_rate, gate.gen_rate = 100.0, 10.0  # as learned: 10 tokens a second written
    for t in (0.0, 3.0, 6.0, 9.0):  # each reply comes 3 s after the one before ended
        now[0] = t
        await gate.foreground.complete([ChatMessage("user", f"q{t}")], max_tokens=5)
    assert math.isclose(gate.expected_free(), 3.0)
    # 100 tokens to write need 10 s: not in a 3 s gap. It waits (no request is sent) ...
    big = asyncio.create_task(
        gate.background.complete([ChatMessage("user", "summarize")], max_tokens=100)
    )
    await asyncio.sleep(0.3)
    assert not big.done() and len(fake_llm.chat_requests()) == 4
    # ... while 20 tokens (2 s) fit now; and once the person is gone, anything fits.
    small = await gate.background.complete([ChatMessage("user", "s")], max_tokens=20)
    assert small.text
    now[0] = 9.0 + 2 * 3.0 + 5.1  # quiet past twice the longest gap + 5 s
    assert gate.expected_free() == math.inf
    assert (await asyncio.wait_for(big, 5)).text
    await llm.close()


def _is_fold(body: dict[str, Any]) -> bool:
    """A chapter request: a continuation of a reply's prompt, or a block asked on its own."""
    return str(body["messages"][-1]["content"]).startswith(CONTINUATION_MARK) or str(
        body["messages"][0]["content"]
    ).startswith(CHAPTER_PROMPT[:40])


class _HeldFolds(FakeLLM):
    """Holds every fold open (as a slow model would) until the client leaves."""

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if _is_fold(body):
            await asyncio.Event().wait()
        return await super()._answer(request, body)


async def test_reset_and_forget_cancel_a_fold_in_flight(tmp_path: Path, monkeypatch: Any) -> None:
    # The server holds every fold open: the turn after one waits SETTLE_LIMIT for it.
    monkeypatch.setattr("bot.memory.summary.SETTLE_LIMIT", 2.0)
    fake = _HeldFolds()
    await fake.start()
    fake.reply = "a fairly long answer about boats and radios " * 4
    h = await start_harness(
        tmp_path, fake, extra=UNLIMITED, transport=FakeTransport(context_tokens=400)
    )
    try:
        for i in range(30):  # until a fold is sent (and held open by the server)
            await h.say(f"secret number {i} is {1000 + i}")
            if any(_is_fold(r) for r in fake.chat_requests()):
                break
        held = [i for i, r in enumerate(fake.requests) if _is_fold(r)]
        assert held, "a fold was due"
        await h.say("!reset")
        for _ in range(200):
            if held[-1] in fake.disconnected:
                break
            await asyncio.sleep(0.01)
        assert held[-1] in fake.disconnected  # the fold's request was closed
        conv = await h.store.conversation(h.transport_key("alice"))
        assert await h.store.summaries(conv) == []
        before = len(fake.requests)
        await h.say("a new start")
        await h.app.summarizer.wait_quiet()
        for body in fake.requests[before:]:  # nothing said before the reset is sent again
            assert "secret number" not in str(body["messages"])
        # !forget: the same for a fold of the new stretch (none is in flight now: a no-op).
        assert h.app.summarizer.forget("fake", "alice") == 0
    finally:
        await h.app.close()
        await fake.stop()


async def test_a_merge_that_does_not_fit_at_its_fold_runs_at_the_next_idle_tick(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    """A slow server with people writing every 3 s: a merge (about 20 s of work) never fits
    when its fold comes due. It waits for an idle moment (the session keeper's tick), not
    for the next fold that happens to find room (on a slow server, none did: chapters piled
    up unmerged and the oldest fell out of the prompt)."""
    now = [0.0]
    ids = await _log(store, 14)
    conv = await store.conversation(KEY)
    for n in range(2):
        await store.save_summary(conv.id, text=f"chapter {n} about the boat", tokens=150,
                                 first_message_id=ids[n], last_message_id=ids[n])  # fmt: skip
    llm = _llm(fake_llm)
    gate = LLMGate(llm=llm, limit=1, clock=lambda: now[0])
    gate.prompt_rate, gate.gen_rate = 1000.0, 10.0  # as learned: a slow writer
    for t in (0.0, 3.0, 6.0):  # replies 3 s apart: the slot is free 3 s at a time
        now[0] = t
        await gate.foreground.complete([ChatMessage("user", f"q{t}")], max_tokens=5)
    summ = Summarizer(store=store, llm=gate.background, counter=make_counter(), gate=gate,
                      clock=lambda: now[0], config=SummaryConfig(min_evicted=6))  # fmt: skip
    fake_llm.reply = "Alice talked about the boat."
    # The chapter: a debt, as after the reply that made it due (never waits for a gap).
    assert await asyncio.wait_for(summ.refresh(conv, window_start_id=ids[10], lane="debt"), 10)
    assert len(await store.summaries(conv)) == 3  # a merge is due but did not fit
    assert await summ.merge_waiting() == 0  # still no room: nothing sent
    assert len(await store.summaries(conv)) == 3
    now[0] = 60.0  # quiet for long: the slot is expected to stay free
    assert await asyncio.wait_for(summ.merge_waiting(), 10) == 1
    merged = await store.summaries(conv)
    assert len(merged) == 1 and merged[0].first_message_id == ids[0]
    assert await summ.merge_waiting() == 0  # done once
    await llm.close()


async def test_a_fold_still_running_when_its_turn_stops_waiting_is_stopped_and_frees_the_slot(
    store: SqliteStore, monkeypatch: Any
) -> None:
    """A debt fold the server never finishes: the next turn waits ``SETTLE_LIMIT`` for it,
    then the fold is stopped (its request closed) and tried again later, so the reply gets the
    slot at once instead of waiting behind it until the LLM read timeout."""
    monkeypatch.setattr("bot.memory.summary.SETTLE_LIMIT", 0.5)
    fake = _HeldFolds()
    await fake.start()
    llm = _llm(fake)
    try:
        ids = await _log(store, 12)
        conv = await store.conversation(KEY)
        gate = LLMGate(llm=llm, limit=1)
        summ = Summarizer(store=store, llm=gate.background, counter=make_counter(), gate=gate,
                          config=SummaryConfig(min_evicted=6))  # fmt: skip
        base = _base(ids[0], 12)
        summ.before_reply(conv.id, ids[8])
        await gate.foreground.complete(list(base.messages[:-1]), max_tokens=5)
        assert summ.maybe_schedule(conv, window_start_id=ids[8], base=base)
        for _ in range(300):  # the fold's request is at the server, which holds it
            if any(_is_fold(r) for r in fake.chat_requests()):
                break
            await asyncio.sleep(0.01)
        await summ.settle(conv.id)
        assert summ.running == 0  # stopped
        for _ in range(200):  # the server sees its request closed
            if fake.disconnected:
                break
            await asyncio.sleep(0.01)
        assert fake.disconnected
        fake.reply = "the next answer"
        reply = await asyncio.wait_for(
            gate.foreground.complete([ChatMessage("user", "next")], max_tokens=5), 10
        )
        assert reply.text == "the next answer"
        # Not tried again at once: the next reply does not keep its slot for it.
        assert not summ.maybe_schedule(conv, window_start_id=ids[8], base=base)
    finally:
        await llm.close()
        await fake.stop()


async def test_messages_back_to_back_never_wait_for_a_slot_kept_for_a_debt_that_wrote_nothing(
    tmp_path: Path,
) -> None:
    """A person (or a pasted file) writing at once after each answer at a small budget: every
    few turns a reply keeps the slot for its debt fold. A debt that takes no model call (too
    few messages to write, the chapter from the person's own lines, an error) lets the slot go
    at once: before, the next reply waited the whole ``HOLD_SECONDS`` (2 s) four times in 26
    turns."""
    fake = FakeLLM()
    await fake.start()
    fake.reply = "Noted, that is a good plan for the garden this year."
    h = await start_harness(
        tmp_path, fake, extra=UNLIMITED, transport=FakeTransport(context_tokens=300)
    )
    try:
        await h.say("I planted tomatoes in April")
        for i in range(25):
            await h.say(f"unrelated chat number {i}")
        await h.app.summarizer.wait_quiet()
        assert h.app.summarizer.stats.completed >= 3  # folds came due and were written
        assert h.app.gate.stats.debt_calls + h.app.summarizer.stats.extractive >= 1
        assert h.app.gate.stats.holds_expired == 0
    finally:
        await h.app.close()
        await fake.stop()
