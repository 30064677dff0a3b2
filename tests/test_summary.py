"""Summary chapters: one per fold, appended, merged when long; in the background, never
delaying a reply."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.config import SummaryConfig
from bot.domain import ConversationKey
from bot.llm.gate import BackgroundPreempted, LLMGate
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import ChatMessage
from bot.llm.tokens import make_counter
from bot.memory.store import SqliteStore
from bot.memory.summary import Summarizer
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

KEY = ConversationKey("console", "alice")


def _llm(fake: FakeLLM) -> OpenAICompatLLM:
    from bot.config import LLMConfig

    cfg = LLMConfig.model_validate({"base_url": fake.base_url, "model": "m", "retries": 0})
    return OpenAICompatLLM(config=cfg, env={})


async def _log(store: SqliteStore, n: int) -> list[int]:
    conv = await store.conversation(KEY)
    return [
        await store.add_message(conv.id, role="user" if i % 2 == 0 else "assistant",
                                author="alice" if i % 2 == 0 else "bot", text=f"message {i}",
                                tokens=3, status="x")
        for i in range(n)
    ]  # fmt: skip


async def test_folds_append_chapters_with_their_ranges(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    ids = await _log(store, 20)
    llm = _llm(fake_llm)
    summ = Summarizer(store=store, llm=llm, counter=make_counter(),
                      config=SummaryConfig(min_evicted=6))  # fmt: skip
    conv = await store.conversation(KEY)
    fake_llm.reply = "Messages 0 to 7."
    assert await summ.refresh(conv, window_start_id=ids[8])
    first = await store.latest_summary(conv)
    assert first is not None and (first.first_message_id, first.last_message_id) == (ids[0], ids[7])
    fake_llm.reply = "Messages 8 to 15."
    assert not await summ.refresh(conv, window_start_id=ids[10])  # only 2 new: not enough
    assert await summ.refresh(conv, window_start_id=ids[16])
    second = await store.latest_summary(conv)
    assert second is not None and second.text == "Messages 8 to 15."
    # A chapter of its own, after the first one (which stays: the prefix up to it survives).
    assert (second.first_message_id, second.last_message_id) == (ids[8], ids[15])
    chapters = await store.summaries(conv)
    assert [(c.text, c.first_message_id, c.last_message_id) for c in chapters] == [
        ("Messages 0 to 7.", ids[0], ids[7]),
        ("Messages 8 to 15.", ids[8], ids[15]),
    ]
    prompt = fake_llm.chat_requests()[-1]["messages"][1]["content"]
    assert "Earlier chapter (context only): Messages 0 to 7." in prompt
    assert "message 8" in prompt and "message 7" not in prompt
    await llm.close()


async def test_chapters_merge_into_one_when_too_long(store: SqliteStore, fake_llm: FakeLLM) -> None:
    ids = await _log(store, 40)
    llm = _llm(fake_llm)
    cfg = SummaryConfig(min_evicted=6, max_tokens=40)  # merge above 60 tokens of chapters
    summ = Summarizer(store=store, llm=llm, counter=make_counter(), config=cfg)
    conv = await store.conversation(KEY)
    fake_llm.reply = "message " * 25  # ~25 tokens a chapter
    assert await summ.refresh(conv, window_start_id=ids[8])
    assert await summ.refresh(conv, window_start_id=ids[16])
    assert len(await store.summaries(conv)) == 2
    fake_llm.script = [("reply", "message " * 25), ("reply", "merged message summary")]
    assert await summ.refresh(conv, window_start_id=ids[24])  # third chapter: over 60 tokens
    chapters = await store.summaries(conv)
    assert [(c.text, c.first_message_id, c.last_message_id) for c in chapters] == [
        ("merged message summary", ids[0], ids[23])
    ]
    assert (
        "Merge these consecutive summary chapters"
        in (fake_llm.chat_requests()[-1]["messages"][0]["content"])
    )
    await llm.close()


async def test_cut_summary_is_asked_shorter_and_never_saved_as_complete(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    ids = await _log(store, 20)
    llm = _llm(fake_llm)
    summ = Summarizer(store=store, llm=llm, counter=make_counter(),
                      config=SummaryConfig(min_evicted=6))  # fmt: skip
    conv = await store.conversation(KEY)
    fake_llm.script = [("length", "Alice likes tea. She plans a trip to"), ("length", "Alice lik")]
    assert await summ.refresh(conv, window_start_id=ids[8])
    asks = fake_llm.chat_requests()
    assert len(asks) == 2  # asked once more, shorter
    first_words = int(asks[0]["messages"][-1]["content"].split("At most ")[1].split()[0])
    second_words = int(asks[1]["messages"][-1]["content"].split("At most ")[1].split()[0])
    assert second_words < first_words
    # The word limit closes the request: the retry repeats the first one up to its last line.
    first, second = asks[0]["messages"], asks[1]["messages"]
    assert first[:-1] == second[:-1]
    head = first[-1]["content"].rsplit("\n", 1)[0]
    assert second[-1]["content"].rsplit("\n", 1)[0] == head
    chapter = (await store.summaries(conv))[0]
    assert chapter.text.endswith("[…]")  # visibly incomplete, not passed off as whole
    fake_llm.script = [
        ("length", "Alice likes tea. She plans a trip to"),
        ("reply", "Short: Alice."),
    ]
    assert await summ.refresh(conv, window_start_id=ids[16])
    assert (await store.summaries(conv))[-1].text == "Short: Alice."
    await llm.close()


async def test_failure_keeps_last_good_summary_and_retries_later(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    ids = await _log(store, 20)
    now = [0.0]
    llm = _llm(fake_llm)
    summ = Summarizer(store=store, llm=llm, counter=make_counter(),
                      config=SummaryConfig(min_evicted=6, retry_seconds=60),
                      clock=lambda: now[0])  # fmt: skip
    conv = await store.conversation(KEY)
    fake_llm.reply = "good message"
    await summ.refresh(conv, window_start_id=ids[8])
    fake_llm.script = [("status", 500, {"error": "x"})]
    assert summ.maybe_schedule(conv, window_start_id=ids[18])
    while summ.running:
        await asyncio.sleep(0.01)
    assert (await store.latest_summary(conv)).text == "good message"  # type: ignore[union-attr]
    assert not summ.maybe_schedule(conv, window_start_id=ids[18])  # backing off
    now[0] = 61
    fake_llm.reply = "better message"
    assert summ.maybe_schedule(conv, window_start_id=ids[18])
    while summ.running:
        await asyncio.sleep(0.01)
    assert (await store.latest_summary(conv)).text == "better message"  # type: ignore[union-attr]
    await summ.stop()
    await llm.close()


async def test_background_call_yields_to_a_reply(fake_llm: FakeLLM) -> None:
    llm = _llm(fake_llm)
    gate = LLMGate(llm=llm, limit=1)
    # The summary would hold the only slot for 30 s; the reply must not wait for it. No clock
    # is read: if the gate did not preempt, the summary would finish with "ok" instead of
    # raising BackgroundPreempted, and its request would not be cancelled.
    fake_llm.script = [("sleep", 30), "ok"]
    fake_llm.reply = "reply"
    bg = asyncio.create_task(gate.background.complete([ChatMessage("user", "s")], max_tokens=5))
    while fake_llm.in_flight == 0:
        await asyncio.sleep(0.01)
    out = await gate.foreground.complete([ChatMessage("user", "q")], max_tokens=5)
    assert out.text == "reply"
    assert not bg.done() or bg.exception() is not None  # the summary did not complete first
    try:
        await bg
        raise AssertionError("background call should have been preempted")
    except BackgroundPreempted:
        pass
    for _ in range(100):
        if fake_llm.cancelled:
            break
        await asyncio.sleep(0.01)
    assert fake_llm.cancelled == 1  # the summary's HTTP request was dropped, not left running
    await llm.close()


async def test_summary_runs_after_turns_leave_the_window(tmp_path: Path, fake_llm: FakeLLM) -> None:
    extra = "memory:\n  summary: {min_evicted: 4}\nbot:\n  rate_limit: {messages: 100}\n"
    h = await start_harness(
        tmp_path, fake_llm, extra=extra, transport=FakeTransport(context_tokens=300)
    )
    try:
        fake_llm.reply_fn = (
            lambda body: (
                "SUMMARY of the questions with padding"  # (a number not in its turns is refused)
                if "summar" in body["messages"][0]["content"][:60]
                or "summary task" in body["messages"][-1]["content"]
                else "answer " * 20
            )
        )
        for i in range(12):
            await h.say(f"question number {i} " + "padding " * 15)
            await asyncio.sleep(0)
        while h.app.summarizer.running:
            await asyncio.sleep(0.01)
        conv = await h.store.conversation(h.transport_key("alice"))
        summary = await h.store.latest_summary(conv)
        assert summary is not None and summary.text.startswith("SUMMARY of the questions")
        await h.say("and now?")
        reply = [r for r in fake_llm.chat_requests() if "and now?" in r["messages"][-1]["content"]]
        assert "SUMMARY" in reply[-1]["messages"][0]["content"]
    finally:
        await h.app.close()
