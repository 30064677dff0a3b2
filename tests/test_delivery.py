"""The durable outbox and the per-person order, end to end: real SQLite, real openai client
against the fake LLM server, the in-process fake transport (which can lose its link)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from bot.delivery import EXPIRED
from bot.domain import ReplyKind
from bot.memory.store import SqliteStore
from bot.responder import ANSWER_NOT_STORED
from tests.conftest import Harness, start_harness
from tests.fakes.fake_llm import FakeLLM


async def _outbox(h: Harness) -> list[tuple[str, str]]:
    rows = await h.store._all("SELECT kind, state FROM outbox ORDER BY id")
    return [(r[0], r[1]) for r in rows]


async def test_an_answer_made_while_the_link_is_down_is_sent_once_when_it_is_back(
    harness: Harness,
) -> None:
    harness.llm.reply = "It is sunny."
    harness.transport.link_down = True
    await harness.say("weather?")
    assert harness.transport.texts() == [] and len(harness.transport.refused) == 1
    assert await _outbox(harness) == [("answer", "pending")]
    harness.transport.link_down = False
    assert await harness.app.responder.redeliver() == 1
    await harness.app.responder.wait_idle()
    assert await harness.app.responder.redeliver() == 0  # nothing left, nothing twice
    await harness.app.responder.wait_idle()
    assert harness.transport.texts() == ["It is sunny."]
    assert await _outbox(harness) == [("answer", "delivered")]
    assert len(harness.llm.chat_requests()) == 1  # sent from the outbox, not asked again


async def _restart(h: Harness, tmp_path: Path, llm: FakeLLM) -> None:
    """A new run on the same database (``h`` now drives it): rows from before it are aged from
    their stored date, while a run ages its own rows on the monotonic clock."""
    await h.app.close()
    new = await start_harness(tmp_path, llm)
    h.app, h.transport = new.app, new.transport
    await h.app.responder.wait_idle()


async def test_an_old_undelivered_answer_expires_instead_of_going_out(
    harness: Harness, tmp_path: Path, fake_llm: FakeLLM
) -> None:
    harness.transport.link_down = True
    await harness.say("weather?")
    await harness.store._db.execute("UPDATE outbox SET created_at = created_at - 7200")
    await _restart(harness, tmp_path, fake_llm)  # the start's round finds it 2 h old
    assert harness.transport.texts() == []
    assert await _outbox(harness) == [("answer", "expired"), ("notice", "pending")]
    await harness.app.responder.redeliver()  # the person is told, once
    await harness.app.responder.wait_idle()
    assert harness.transport.texts() == [EXPIRED]
    assert await harness.app.responder.redeliver() == 0


async def test_several_expired_replies_tell_their_person_once(
    harness: Harness, tmp_path: Path, fake_llm: FakeLLM
) -> None:
    harness.transport.link_down = True
    await harness.say("weather?")
    await harness.say("and tomorrow?")
    await harness.store._db.execute("UPDATE outbox SET created_at = created_at - 7200")
    await _restart(harness, tmp_path, fake_llm)  # both expire; one notice for the person
    await harness.app.responder.redeliver()
    await harness.app.responder.wait_idle()
    assert harness.transport.texts() == [EXPIRED]
    assert await _outbox(harness) == [
        ("answer", "expired"),
        ("answer", "expired"),
        ("notice", "delivered"),
    ]


async def test_a_notice_that_could_not_go_out_is_stored_and_sent_later(harness: Harness) -> None:
    harness.transport.link_down = True
    await harness.say("   ")  # empty: a notice, not an LLM call
    assert await _outbox(harness) == [("notice", "pending")]
    harness.transport.link_down = False
    await harness.app.responder.redeliver()
    await harness.app.responder.wait_idle()
    assert harness.transport.texts()[0].startswith("Your message was empty")
    assert await _outbox(harness) == [("notice", "delivered")]


async def test_undelivered_answers_survive_a_restart(tmp_path: Path, fake_llm: FakeLLM) -> None:
    h = await start_harness(tmp_path, fake_llm)
    fake_llm.reply = "Stored, not sent."
    h.transport.link_down = True
    await h.say("hello")
    await h.app.close()
    h2 = await start_harness(tmp_path, fake_llm)
    try:
        await h2.app.responder.wait_idle()
        assert h2.transport.texts() == ["Stored, not sent."]
        assert len(fake_llm.chat_requests()) == 1
    finally:
        await h2.app.close()


async def test_a_finish_lost_with_the_database_sends_nothing_again(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """``finish_delivery`` does not wait for the flush (PostgreSQL): a database server crash
    may lose it. What is left then is a row still pending, with every part it sent recorded
    durably; after the restart the outbox finishes it and sends nothing twice."""
    h = await start_harness(tmp_path, fake_llm)
    fake_llm.reply = "Sent once."
    await h.say("hello")
    assert h.transport.texts() == ["Sent once."]
    await h.store._exec("UPDATE outbox SET state = 'pending', claimed_by = NULL, claimed_at = NULL")
    await h.store._exec("UPDATE messages SET status = 'sending' WHERE role = 'assistant'")
    await h.app.close()  # the finish never happened, as if lost with the server
    h2 = await start_harness(tmp_path, fake_llm)
    try:
        await h2.app.responder.wait_idle()
        assert h2.transport.texts() == []
        assert await _outbox(h2) == [("answer", "delivered")]
        statuses = await h2.store._all("SELECT status FROM messages WHERE role = 'assistant'")
        assert [r[0] for r in statuses] == ["delivered"]
        assert len(fake_llm.chat_requests()) == 1
    finally:
        await h2.app.close()


async def test_a_second_question_sees_the_answer_to_the_first(harness: Harness) -> None:
    harness.llm.reply_fn = lambda body: "answer to " + body["messages"][-1]["content"][-5:]
    harness.llm.script = [("sleep", 0.3)]
    await harness.transport.say("first")
    await asyncio.sleep(0.05)
    await harness.transport.say("later")  # stored while the first is still being answered
    await harness.app.responder.wait_idle()
    second_prompt = harness.llm.chat_requests()[-1]["messages"]
    contents = [m["content"] for m in second_prompt]
    assert any(c.endswith("answer to first") for c in contents), contents
    assert harness.transport.texts() == ["answer to first", "answer to later"]


async def test_thirty_commands_get_the_limit_and_one_notice(harness: Harness) -> None:
    for _ in range(30):
        await harness.transport.say("!status")
    await harness.app.responder.wait_idle()
    kinds = [r.kind for r in harness.transport.sent]
    assert kinds.count(ReplyKind.NOTICE) == 1
    assert kinds.count(ReplyKind.COMMAND) <= 6  # rate_limit.messages


async def test_the_same_text_twice_is_answered_twice(harness: Harness) -> None:
    await harness.say("!history")
    await harness.say("!history")
    assert [r.kind for r in harness.transport.sent] == [ReplyKind.COMMAND] * 2


async def test_forget_confirmation_window_starts_when_the_prompt_is_delivered(
    harness: Harness,
) -> None:
    await harness.say("remember me")
    harness.transport.link_down = True
    await harness.say("!forget")  # the prompt waits in the outbox
    await harness.store._db.execute("UPDATE outbox SET created_at = created_at - 1")
    harness.transport.link_down = False
    await harness.app.responder.redeliver()
    await harness.app.responder.wait_idle()
    await harness.say("!forget yes")
    assert harness.transport.texts()[-1].startswith("Deleted everything I kept about you: 2")


async def test_disk_full_when_storing_the_answer_still_tells_the_person(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def full(*args: object, **kwargs: object) -> int:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(SqliteStore, "queue_claimed", full)
    await harness.say("hello")
    assert harness.transport.texts() == [ANSWER_NOT_STORED]
