"""The turn pipeline end to end: real SQLite file, real openai client over loopback HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.answering import unavailable_notice
from bot.domain import ReplyKind
from tests.conftest import Harness, start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport


async def _messages(h: Harness, sender: str = "alice") -> list[tuple[str, str, str]]:
    rows = await h.store._all(
        "SELECT m.role, m.text, m.status FROM messages m JOIN conversations c "
        "ON c.id = m.conversation_id WHERE c.person = ? ORDER BY m.id",
        (sender,),
    )
    return [(r[0], r[1], r[2]) for r in rows]


async def test_answer_is_sent_and_both_sides_stored(harness: Harness) -> None:
    harness.llm.reply = "Rex is a fine name."
    await harness.say("My dog is called Rex")
    assert harness.transport.texts() == ["Rex is a fine name."]
    assert await _messages(harness) == [
        ("user", "My dog is called Rex", "answered"),
        ("assistant", "Rex is a fine name.", "delivered"),
    ]
    assert harness.transport.working_for == ["My dog is called Rex"]


async def test_llm_down_apology_is_sent_but_never_stored(harness: Harness) -> None:
    harness.llm.script = [("status", 500, {"error": "boom"})]
    await harness.say("hello?")
    unavailable = unavailable_notice(harness.llm.base_url)
    assert harness.transport.texts() == [unavailable]
    assert harness.transport.sent[0].kind is ReplyKind.NOTICE
    assert await _messages(harness) == [("user", "hello?", "failed")]
    # The next turn still sees the question, and no apology in the prompt.
    harness.llm.reply = "Hi!"
    await harness.say("are you there?")
    prompt = harness.llm.chat_requests()[-1]["messages"]
    joined = " ".join(m["content"] for m in prompt)
    assert "hello?" in joined and unavailable not in joined


async def test_llm_empty_or_huge_answers(harness: Harness) -> None:
    harness.llm.script = [("reply", "   ")]
    await harness.say("one")
    assert harness.transport.texts() == [unavailable_notice(harness.llm.base_url)]
    harness.llm.script = [("reply", "x" * 50_000)]
    await harness.say("two")
    sent = harness.transport.texts()[-1]
    assert 0 < len(sent) <= 16_000
    stored = await _messages(harness)
    assert stored[-1] == ("assistant", sent, "delivered")


async def test_memory_keeps_the_whole_answer_and_the_outbox_what_was_sent(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    transport = FakeTransport(byte_limit=40)
    h = await start_harness(tmp_path, fake_llm, transport=transport)
    try:
        fake_llm.reply = "é" * 100 + " and a long tail that cannot fit 😀"
        await h.say("tell me")
        sent = transport.texts()[0]
        assert len(sent.encode()) <= 40
        assert (await _messages(h))[-1][1] == fake_llm.reply  # memory is not cut by the radio
        rows = await h.store._all("SELECT text, state FROM outbox")
        assert [tuple(r) for r in rows] == [(sent, "delivered")]
    finally:
        await h.app.close()


async def test_turns_of_one_person_run_in_order(harness: Harness) -> None:
    harness.llm.reply_fn = lambda body: "re: " + body["messages"][-1]["content"].split("\n")[-1]
    harness.llm.script = [("sleep", 0.2), "ok", "ok"]
    for text in ("first", "second", "third"):
        await harness.transport.say(text)  # no waiting between them
    await harness.app.responder.wait_idle()
    assert harness.transport.texts() == ["re: first", "re: second", "re: third"]


async def test_people_run_concurrently_but_llm_calls_are_bounded(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm, extra="  concurrency: 2\n")
    try:
        fake_llm.script = [("sleep", 0.3)] * 4
        for who in ("a", "b", "c", "d"):
            await h.transport.say("hi", sender=who)
        await asyncio.wait_for(h.app.responder.wait_idle(), 10)
        assert len(h.transport.sent) == 4
        assert fake_llm.peak_in_flight == 2  # people in parallel, never above the bound
    finally:
        await h.app.close()


async def test_default_llm_concurrency_is_one(harness: Harness) -> None:
    harness.llm.script = [("sleep", 0.2)] * 3
    for who in ("a", "b", "c"):
        await harness.transport.say("hi", sender=who)
    await harness.app.responder.wait_idle()
    assert len(harness.transport.sent) == 3
    assert harness.llm.peak_in_flight == 1


async def test_queue_limit_and_rate_limit_reply_politely_once(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    extra = "bot:\n  queue_limit: 2\n  rate_limit: {messages: 3, per_seconds: 60}\n"
    h = await start_harness(tmp_path, fake_llm, extra=extra)
    try:
        fake_llm.script = [("sleep", 0.3)]
        for i in range(4):
            await h.transport.say(f"msg {i}")
        await h.app.responder.wait_idle()
        texts = h.transport.texts()
        notices = [r.text for r in h.transport.sent if r.kind is ReplyKind.NOTICE]
        assert len(notices) == 1 and "waiting" in notices[0]
        assert len(texts) == 3  # two answers + one notice
        stored = await _messages(h)
        assert [s for _, _, s in stored].count("limited") == 2
        assert len([r for r in stored if r[0] == "user"]) == 4  # nothing lost
    finally:
        await h.app.close()


async def test_rate_limit_notice(tmp_path: Path, fake_llm: FakeLLM) -> None:
    h = await start_harness(
        tmp_path, fake_llm, extra="bot:\n  rate_limit: {messages: 2, per_seconds: 600}\n"
    )
    try:
        for i in range(4):
            await h.say(f"m{i}")
        notices = [r.text for r in h.transport.sent if r.kind is ReplyKind.NOTICE]
        assert len(notices) == 1 and notices[0].startswith("Slow down: at most 2 messages")
        assert len([r for r in h.transport.sent if r.kind is ReplyKind.ANSWER]) == 2
    finally:
        await h.app.close()


async def test_bad_input_is_handled_and_nothing_lost(harness: Harness) -> None:
    harness.llm.reply = "ok"
    nasty = [
        'say "hi" * NEAR( OR col: AND -x',
        "'; DROP TABLE messages; --",
        "emoji 😀👩‍👩‍👧 and RTL مرحبا بالعالم",
        "nul\x00byte and \x07bell and \x1b[31mansi",
        "x" * 100_000,
    ]
    for text in nasty:
        await harness.say(text)
    assert harness.transport.texts() == ["ok"] * len(nasty)
    stored = [t for role, t, _ in await _messages(harness) if role == "user"]
    assert stored[0] == nasty[0] and stored[1] == nasty[1] and stored[2] == nasty[2]
    assert stored[3] == "nulbyte and bell and [31mansi"
    assert len(stored[4]) == 100_000  # stored whole ...
    prompt = harness.llm.chat_requests()[-1]
    assert len(prompt["messages"][-1]["content"]) < 10_000  # ... but cut for the model
    # FTS5 syntax in later questions still retrieves instead of crashing.
    await harness.say('what about "DROP" NEAR( col:x')
    assert harness.transport.texts()[-1] == "ok"


async def test_empty_message_gets_a_hint_and_is_not_stored(harness: Harness) -> None:
    await harness.say("   \n\t ")
    assert "empty" in harness.transport.texts()[0]
    assert await _messages(harness) == []
    assert harness.llm.chat_requests() == []


async def test_long_message_note_is_shown(harness: Harness) -> None:
    harness.llm.reply = "ok"
    await harness.say("word " * 20_000)
    assert harness.transport.sent[-1].note is not None


async def test_pending_message_is_answered_after_restart(tmp_path: Path, fake_llm: FakeLLM) -> None:
    h = await start_harness(tmp_path, fake_llm)
    await h.app.responder.drain(timeout=1)  # shutting down: new messages only get stored
    await h.transport.say("are you still there?")
    await h.app.close()
    assert h.transport.sent == []
    fake_llm.reply = "Yes, back now."
    h2 = await start_harness(tmp_path, fake_llm)
    try:
        await h2.app.responder.wait_idle()
        assert h2.transport.texts() == ["Yes, back now."]
    finally:
        await h2.app.close()


async def test_storage_failure_is_reported_to_the_person(harness: Harness) -> None:
    await harness.store._db.execute("PRAGMA query_only = ON")  # simulate a store refusing writes
    await harness.say("will this be saved?")
    assert harness.transport.texts() == [
        "I could not save your message (storage problem), so I did not answer. Try later."
    ]
    assert harness.llm.chat_requests() == []
    await harness.store._db.execute("PRAGMA query_only = OFF")
    await harness.say("and now?")
    assert harness.transport.texts()[-1] == "Hello from fake"


async def test_a_reset_that_ran_while_a_message_was_being_stored_is_honoured(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn may reuse the conversation its message's intake read (one read less) only when
    nothing ran for anyone's commands since: here a ``!reset`` runs to its end while the
    message is being stored, so the turn reads the conversation again and the old talk stays
    out of the prompt."""
    await harness.say("my boat is called Seagull")
    store = harness.store
    real_add = store.add_message
    storing, release = asyncio.Event(), asyncio.Event()

    async def slow_add(*args: object, **kwargs: object) -> int:
        storing.set()
        await release.wait()
        return await real_add(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "add_message", slow_add)
    message = asyncio.create_task(harness.transport.say("what is my boat called?"))
    await asyncio.wait_for(storing.wait(), timeout=10)
    monkeypatch.setattr(store, "add_message", real_add)
    await harness.say("!reset")  # runs to its end while the question is being stored
    release.set()
    await message
    await harness.app.responder.wait_idle()
    prompt = harness.llm.chat_requests()[-1]["messages"]
    text = "\n".join(str(m["content"]) for m in prompt)
    assert "what is my boat called?" in text
    assert "Seagull" not in text
