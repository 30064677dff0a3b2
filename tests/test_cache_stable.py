"""The cache-stable context and background LLM work, read back from the fake LLM's request log
(issue 9): prefix property between folds, summaries never while a reply waits, a cancelled
streamed summary closes its connection, 400 context errors shrink and retry once, truncation
is marked, malformed answers fall back and then apologise."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from bot.answering import unavailable_notice
from bot.config import LLMConfig
from bot.fitting import TOO_LONG
from bot.llm.gate import BackgroundPreempted, LLMGate
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import TRUNCATED_MARK, ChatMessage, ContextTooLong
from bot.memory.chapter_text import CHAPTER_PROMPT, CONTINUATION_MARK, MERGE_PROMPT
from bot.memory.context import merge_system
from bot.memory.facts import PROMPT as FACTS_PROMPT
from bot.memory.store import ASSISTANT
from tests.conftest import Harness, start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

SUMMARY_PREFIXES = (  # background work: chapters, merges, and facts read at each fold
    *(p.split("{", 1)[0] for p in (CHAPTER_PROMPT, MERGE_PROMPT)),
    FACTS_PROMPT[:60],
)
UNLIMITED = "bot:\n  rate_limit: {messages: 10000, per_seconds: 1}\n  queue_limit: 100\n"


def _is_summary(body: dict[str, Any]) -> bool:
    """Background work: a standalone summary or facts request, or a fold sent as the
    continuation of a reply's prompt (its last message is the task)."""
    messages = body["messages"]
    if str(messages[-1]["content"]).startswith(CONTINUATION_MARK):
        return True
    return str(messages[0]["content"]).startswith(SUMMARY_PREFIXES)


def _answer(body: dict[str, Any]) -> str:
    if _is_summary(body):
        return "They talked about boats, radios and the weather."
    last = str(body["messages"][-1]["content"]).rsplit("\n\n", 1)[-1]
    return f"About {last[:30]}: " + "a fairly long answer with some detail " * 6


async def _converse(h: Harness, turns: int) -> None:
    topics = ["boat Osprey", "sister Ingrid", "repeater 433", "dog Pepper", "solar panel"]
    for i in range(turns):
        await h.say(f"Tell me more about my {topics[i % len(topics)]}, part {i}")
        while h.app.summarizer.running:
            await asyncio.sleep(0.01)


def _llm(fake: FakeLLM, **extra: Any) -> OpenAICompatLLM:
    cfg = LLMConfig.model_validate(
        {"base_url": fake.base_url, "model": "m", "retries": 0, "read_timeout": 5} | extra
    )
    return OpenAICompatLLM(config=cfg, env={})


async def test_each_request_extends_the_previous_until_a_fold(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply_fn = _answer
    # A small budget where every turn keeps a recall note: the window is held whole until its
    # chapter exists only if it fits (900 did until the window's turns carried date lines, 8
    # tokens each where the day changes; 880 did not before either: the margin is that thin).
    h = await start_harness(
        tmp_path, fake_llm, extra=UNLIMITED, transport=FakeTransport(context_tokens=940)
    )
    try:
        await h.say("!remember I live in Tromsø")
        await _converse(h, 40)
    finally:
        await h.app.close()
    replies = [r["messages"] for r in fake_llm.chat_requests() if not _is_summary(r)]
    assert len(replies) == 40
    assert any(_is_summary(r) for r in fake_llm.chat_requests())  # there were folds
    extended = folds = 0
    for before, after in itertools.pairwise(replies):
        stable = before[:-1]  # everything up to the end of the window
        if after[: len(stable)] == stable:
            extended += 1
            continue
        # Otherwise a fold: the system message now has a new chapter, and the oldest window
        # turn of the previous request is gone from the new window.
        folds += 1
        assert after[0] != before[0] and before[1] not in after[1:]
    # Every message here matches earlier ones strongly (the topics repeat), so each turn keeps
    # a recall note (issue 17: only its best part, 3% of the budget; the rest of the recall is
    # sent once at the tail and does not fill the window), and the window folds about every
    # fourth turn at this small budget (the trade-off is measured in docs/memory.md).
    assert folds >= 2 and extended >= 3 * folds


async def test_no_summary_is_requested_while_a_reply_waits(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply_fn = _answer
    h = await start_harness(
        tmp_path, fake_llm, extra=UNLIMITED, transport=FakeTransport(context_tokens=960)
    )
    try:
        for i in range(24):  # people talking without pause: summaries must find gaps
            await h.transport.say(f"message {i} about the boat and the radio", sender="alice")
            await h.transport.say(f"message {i} about the dog and the garden", sender="bob")
            await asyncio.sleep(0)
        await h.app.responder.wait_idle()
        while h.app.summarizer.running:
            await asyncio.sleep(0.01)
    finally:
        await h.app.close()
    requests = fake_llm.chat_requests()
    assert any(_is_summary(r) for r in requests)
    # Replay the event log: a summary never starts while a reply request is open.
    open_replies: set[int] = set()
    for kind, index in fake_llm.events:
        if kind == "start" and not _is_summary(requests[index]):
            open_replies.add(index)
        elif kind == "start":
            assert not open_replies, f"summary {index} started during replies {open_replies}"
        else:
            open_replies.discard(index)


async def test_a_cancelled_streamed_summary_closes_its_connection(fake_llm: FakeLLM) -> None:
    llm = _llm(fake_llm)
    gate = LLMGate(llm=llm, limit=1)
    fake_llm.script = [("slow", 0.5)]  # a summary that streams one word per half second
    fake_llm.reply = "one two three four five six seven eight nine ten eleven twelve"
    bg = asyncio.create_task(gate.background.complete([ChatMessage("user", "s")], max_tokens=50))
    while not fake_llm.events:
        await asyncio.sleep(0.01)
    fake_llm.reply = "reply"
    out = await gate.foreground.complete([ChatMessage("user", "q")], max_tokens=5)
    assert out.text == "reply"
    try:
        await bg
        raise AssertionError("the summary should have been preempted")
    except BackgroundPreempted:
        pass
    for _ in range(200):
        if fake_llm.disconnected:
            break
        await asyncio.sleep(0.01)
    assert fake_llm.disconnected == [0]  # the server saw the summary's client hang up
    assert ("end", 0) not in fake_llm.events  # ... before it finished streaming
    assert fake_llm.requests[0]["stream"] is True
    await llm.close()


async def test_read_timeout_retry_does_not_queue_behind_the_first_attempt(
    fake_llm: FakeLLM,
) -> None:
    llm = _llm(fake_llm, retries=1, retry_backoff=0, read_timeout=0.3)
    fake_llm.script = [("slow", 2.0), "ok"]  # the first attempt stalls between words
    fake_llm.reply = "hello there"
    out = await llm.complete([ChatMessage("user", "q")], max_tokens=5)
    assert out.text == "hello there"
    assert 0 in fake_llm.disconnected  # the first attempt's stream was closed, not left running
    await llm.close()


async def test_context_too_long_shrinks_the_budget_and_never_locks_out(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    no_summaries = "memory:\n  summary: {enabled: false}\n"  # only replies use the script
    h = await start_harness(
        tmp_path,
        fake_llm,
        extra=UNLIMITED + no_summaries,
        transport=FakeTransport(context_tokens=960),
    )
    try:
        for i in range(12):
            await h.say(f"filler message number {i} " + "padding words here " * 8)
        fake_llm.script = ["context_exceeded", "ok"]
        fake_llm.reply = "fits now"
        before = len(fake_llm.chat_requests())
        await h.say("and a question")
        assert h.transport.texts()[-1] == "fits now"
        first, second = fake_llm.chat_requests()[before : before + 2]
        size = sum(len(m["content"]) for m in first["messages"])
        assert sum(len(m["content"]) for m in second["messages"]) < size  # smaller budget
        fake_llm.script = ["context_exceeded", "context_exceeded"]
        before = len(fake_llm.chat_requests())
        await h.say("another question")
        # The fake names 5,000 tokens for any prompt: the rebuild goes straight to the
        # smallest budget; refused there too, the person hears why, not "unavailable".
        assert h.transport.texts()[-1] == TOO_LONG.format(prefix="!")
        assert len(fake_llm.chat_requests()) - before == 2  # no retry at the same size
        await h.say("and now?")  # not locked out
        assert h.transport.texts()[-1] == "fits now"
    finally:
        await h.app.close()


async def test_context_too_long_keeps_the_servers_message(fake_llm: FakeLLM) -> None:
    llm = _llm(fake_llm)
    fake_llm.script = ["context_exceeded"]
    try:
        await llm.complete([ChatMessage("user", "q")], max_tokens=5)
        raise AssertionError("expected ContextTooLong")
    except ContextTooLong as exc:
        assert "exceed context window of 4096" in str(exc)
        assert "context_tokens" in str(exc)  # ... and the fix
    await llm.close()


async def test_truncated_answer_ends_with_a_visible_marker(harness: Harness) -> None:
    harness.llm.script = [("length", "The first three steps are: open the case, then")]
    await harness.say("how do I fix it?")
    assert harness.transport.texts()[-1].endswith(TRUNCATED_MARK)


async def test_malformed_answers_fall_back_then_apologise_and_store_nothing(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    backup = FakeLLM()
    await backup.start()
    # make_config's llm: section is still open, so the fallback lands in it.
    fallback = f"    - base_url: {backup.base_url}\n      model: b\n      api_key_env: null\n"
    h = await start_harness(tmp_path, fake_llm, extra="  fallbacks:\n" + fallback + UNLIMITED)
    try:
        for bad in ("html", "not_json", "no_choices", "no_message"):
            fake_llm.script = [bad]
            backup.reply = f"backup answered {bad}"
            await h.say(f"question {bad}")
            assert h.transport.texts()[-1] == f"backup answered {bad}"
        fake_llm.script = ["html"]
        backup.script = [("reply", "<think>only reasoning</think>")]  # empty after stripping
        await h.say("last question")
        unavailable = unavailable_notice(fake_llm.base_url, fallbacks=1)
        assert h.transport.texts()[-1] == unavailable
        conv = await h.store.conversation(h.transport_key("alice"))
        said = [
            m.text for m in await h.store.recent_messages(conv, limit=50) if m.role == ASSISTANT
        ]
        assert unavailable not in said and not any("html" in s.lower() for s in said[:1])
        assert len(said) == 4  # the four fallback answers, nothing for the apology
    finally:
        await h.app.close()
        await backup.stop()


async def test_control_characters_and_bidi_overrides_never_leave_the_adapter(
    fake_llm: FakeLLM,
) -> None:
    llm = _llm(fake_llm)
    fake_llm.script = [("reply", "Hi\x00 \x1b[31mred\x1b[0m \u202eevil\u202c ok\x07\nline two")]
    out = await llm.complete([ChatMessage("user", "q")], max_tokens=50)
    assert out.text == "Hi red evil ok\nline two"
    await llm.close()


def test_templates_without_a_system_role_get_it_in_the_first_user_message() -> None:
    messages = [
        ChatMessage("system", "S"),
        ChatMessage("user", "u1"),
        ChatMessage("assistant", "a1"),
        ChatMessage("user", "u2"),
    ]
    merged = merge_system(messages)
    assert [m.role for m in merged] == ["user", "assistant", "user"]
    assert merged[0].content == "S\n\nu1"
    assert merge_system([ChatMessage("system", "S"), ChatMessage("user", "u")]) == [
        ChatMessage("user", "S\n\nu")
    ]


async def test_system_role_false_is_sent_merged(fake_llm: FakeLLM) -> None:
    llm = _llm(fake_llm, system_role=False)
    await llm.complete([ChatMessage("system", "rules"), ChatMessage("user", "hi")], max_tokens=5)
    assert fake_llm.requests[-1]["messages"] == [{"role": "user", "content": "rules\n\nhi"}]
    await llm.close()
